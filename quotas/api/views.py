"""Teams (admins write; members read their own), shares (admins write; everyone logged in reads,
with live usage per GPU type), the audit log of admin changes (admins only, read-only), and the layout:
the whole of it as one document (admins; a team manager its own team's part), plans and their apply,
versions and temporary changes (admins)."""

from django.db.models import F, Prefetch
from django.urls import reverse
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import exceptions, mixins, renderers, status, viewsets
from rest_framework.decorators import action
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin, IsAdmin, IsAdminOrReadOnly, StrictJSONParser
from quotas import layout, layoutdoc, services, track_record, whatif
from quotas.api.serializers import (
    AuditEntrySerializer,
    LayoutAppliedSerializer,
    LayoutPlanRequestSerializer,
    LayoutPlanSerializer,
    LayoutVersionDetailSerializer,
    LayoutVersionSerializer,
    ShareSerializer,
    ShareWriteSerializer,
    TeamSerializer,
    TeamWriteSerializer,
    TemporaryChangeSerializer,
    TrackRecordQuerySerializer,
    TrackRecordSerializer,
)
from quotas.choices import ShareState, Strategy
from quotas.models import AuditEntry, LayoutPlan, LayoutVersion, Membership, Share, Team, TemporaryChange


class TeamViewSet(ApiViewMixin, viewsets.ModelViewSet):
    schema = ApiSchema()
    serializer_class = TeamSerializer
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "slug"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    queryset = Team.objects.none()  # for the schema; get_queryset() is what answers

    def get_queryset(self):
        qs = Team.objects.prefetch_related(
            Prefetch(
                "memberships", queryset=Membership.objects.select_related("user").order_by("user__username")
            ),
            Prefetch("shares", queryset=Share.objects.order_by("name")),
        ).order_by("name")
        user = self.request.user
        if getattr(self, "swagger_fake_view", False):
            return qs.none()
        if not user.is_superuser:
            qs = qs.filter(memberships__user=user)
        return qs

    def get_serializer_class(self):
        return TeamWriteSerializer if self.action in ("create", "partial_update") else TeamSerializer

    @extend_schema(request=TeamWriteSerializer, responses={201: TeamSerializer})
    def create(self, request, *args, **kwargs):
        data = self._valid(request)
        team = services.team_create(actor=request.user, **data)
        return Response(self._read(team), status=status.HTTP_201_CREATED)

    @extend_schema(request=TeamWriteSerializer, responses={200: TeamSerializer})
    def partial_update(self, request, *args, **kwargs):
        team = self.get_object()
        data = self._valid(request, partial=True)
        team = services.team_update(team=team, actor=request.user, **data)
        return Response(self._read(team))

    def perform_destroy(self, instance):
        services.team_delete(team=instance, actor=self.request.user)

    def _valid(self, request, partial=False):
        serializer = TeamWriteSerializer(data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def _read(self, team):
        return TeamSerializer(self.get_queryset().get(pk=team.pk)).data


class ShareFilter(filters.FilterSet):
    team = filters.CharFilter(field_name="team__slug", help_text="Team slug.")
    state = filters.ChoiceFilter(choices=ShareState.choices)
    strategy = filters.ChoiceFilter(choices=Strategy.choices)

    class Meta:
        model = Share
        fields = ["team", "state", "strategy"]


class ShareViewSet(ApiViewMixin, viewsets.ModelViewSet):
    schema = ApiSchema()
    serializer_class = ShareSerializer
    permission_classes = [IsAdminOrReadOnly]
    filterset_class = ShareFilter
    lookup_field = "name"
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    queryset = Share.objects.select_related("team", "group").prefetch_related("capacities").order_by("name")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.request is not None and self.request.method in ("GET", "HEAD", "POST", "PATCH"):
            from quotas.scheduler import load_snapshot

            loaded = load_snapshot(queued=False)
            context["usage"] = services.share_usage(loaded.snapshot, loaded.queued_totals)
            from quotas import organisation

            # the same moment as usage; one aggregate more (the largest queued job per share and type)
            context["organisation"] = organisation.load(loaded=loaded, teams=False)
        return context

    @extend_schema(request=ShareWriteSerializer, responses={201: ShareSerializer})
    def create(self, request, *args, **kwargs):
        serializer = ShareWriteSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        share = services.share_create(actor=request.user, **serializer.validated_data)
        return Response(self._read(share), status=status.HTTP_201_CREATED)

    @extend_schema(request=ShareWriteSerializer, responses={200: ShareSerializer})
    def partial_update(self, request, *args, **kwargs):
        share = self.get_object()
        serializer = ShareWriteSerializer(data=request.data, partial=True)
        serializer.is_valid(raise_exception=True)
        share = services.share_update(share=share, actor=request.user, **serializer.validated_data)
        return Response(self._read(share))

    def perform_destroy(self, instance):
        services.share_delete(share=instance, actor=self.request.user)

    @extend_schema(
        parameters=[OpenApiParameter("days", int, description="1 to 90 (default 7).")],
        responses={200: TrackRecordSerializer},
    )
    @action(detail=True, methods=["get"], url_path="track-record")
    def track_record(self, request, name=None):
        """GET /api/v1/shares/{name}/track-record/?days=7: how often the share's jobs that waited started
        within the likely range they were first given, and the median error of their ETA (SEMANTICS
        "Track record"). Everyone logged in, as the share itself; the points (job by job) only for the
        share's team and admins."""
        share = self.get_object()
        query = TrackRecordQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        summary = track_record.summary(share, days=query.validated_data["days"])
        summary = track_record.shown(
            summary, jobs_visible=track_record.sees_jobs(request.user, share.team_id)
        )
        return Response(TrackRecordSerializer(summary).data)

    def _read(self, share):
        return ShareSerializer(self.queryset.get(pk=share.pk), context=self.get_serializer_context()).data


class AuditFilter(filters.FilterSet):
    object_type = filters.ChoiceFilter(
        choices=[
            ("share", "share"),
            ("team", "team"),
            ("node", "node"),
            ("gpu", "gpu"),
            ("layout", "layout"),
        ],
        help_text="share, team, node, gpu (its health: a fault, a repair) or layout (a layout version: shares "
        "changed through a plan).",
    )
    object_id = filters.CharFilter(help_text="The object's id.")
    object = filters.CharFilter(field_name="object_repr", help_text="The object's name.")
    actor = filters.CharFilter(field_name="actor_name", help_text="Username of who made the change.")
    action = filters.CharFilter(
        help_text="create, update, delete, cordon, uncordon, drain; apply, rollback, revert (layout)."
    )
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", help_text="Changes at or after.")

    class Meta:
        model = AuditEntry
        fields = ["object_type", "object_id", "object", "actor", "action", "since"]


class AuditEntryViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    """Every admin change to shares, teams and nodes: who, when, what changed (`changes`: each field
    before -> after; a layout version's whole diff), and the records before and after. Newest first."""

    schema = ApiSchema()
    serializer_class = AuditEntrySerializer
    permission_classes = [IsAdmin]
    filterset_class = AuditFilter
    queryset = AuditEntry.objects.order_by("-at", "-id")


# --- the layout --------------------------------------------------------------------------------------


class YAMLRenderer(renderers.BaseRenderer):
    """The layout as YAML (`?format=yaml`, or `Accept: application/yaml`): text the view rendered with
    its comments is sent as it is; anything else (an error) as plain YAML."""

    media_type = "application/yaml"
    format = "yaml"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data.encode()
        import json

        import yaml

        plain = json.loads(json.dumps(data, default=str))  # DRF's ErrorDetail (a str) as a plain str
        return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True).encode()


class TextYAMLRenderer(YAMLRenderer):
    media_type = "text/yaml"


def plan_payload(planned: LayoutPlan, request) -> dict:
    """A plan as the API and the CLI read it."""
    effects = dict(planned.effects or {})
    warnings = effects.pop("warnings", [])
    run = whatif.status(planned.whatif_run) if planned.whatif_run else None
    replay = None
    if run is not None:
        replay = {
            "run": run.id,
            "state": "failed" if run.failed else "done" if run.finished else "running",
            "percent": run.percent,
            "errors": run.errors,
            "window": run.window,
            "seconds": run.seconds,
            "result": run.result,
        }
    elif planned.whatif_run:
        replay = {
            "run": planned.whatif_run,
            "state": "expired",
            "percent": 0,
            "errors": [],
            "window": None,
            "seconds": None,
            "result": None,
        }
    changes = [{**c, "words": layoutdoc.describe(c)} for c in planned.diff]
    return {
        "id": planned.pk,
        "state": planned.state,
        "created_at": planned.created_at,
        "created_by": planned.created_by_name,
        "base_hash": planned.base_hash,
        "base_version": planned.base_version,
        "rollback_to": planned.rollback_to,
        "changed": bool(planned.diff),
        "summary": layoutdoc.summary(planned.diff),
        "changes": changes,
        "now": effects,
        "warnings": warnings,
        "temporary": planned.temporary,
        "whatif": replay,
        "version": planned.version.number if planned.version_id else None,
        "apply": request.build_absolute_uri(reverse("api:layout-plan-apply", args=[planned.pk])),
    }


class LayoutJSONParser(StrictJSONParser):
    """A layout plan's body: an integer too long for Python (more than 4,300 digits, a ValueError) stays a
    layoutdoc.HugeNumber, so that the plan answers a 400 under `document` naming its field."""

    def parse(self, stream, media_type=None, parser_context=None):
        import json

        from django.conf import settings

        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            return json.loads(stream.read().decode(encoding), parse_int=layoutdoc.read_int)
        except RecursionError as e:
            raise exceptions.ParseError("JSON parse error - the document is nested too deeply.") from e
        except ValueError as e:
            raise exceptions.ParseError(f"JSON parse error - {e}") from e


class LayoutViewSet(ApiViewMixin, viewsets.ViewSet):
    """The whole layout as one document, and plans of a new one."""

    schema = ApiSchema()
    renderer_classes = [
        renderers.JSONRenderer,
        YAMLRenderer,
        TextYAMLRenderer,
        renderers.BrowsableAPIRenderer,
    ]

    def get_permissions(self):
        return [IsAdmin()] if self.action == "plan" else super().get_permissions()

    @extend_schema(
        responses={
            (200, "application/json"): OpenApiResponse(
                {"type": "object", "additionalProperties": True},
                description="The layout document: format, teams (with members), shares. An admin reads "
                "the whole of it; a team manager its own teams' part (marked team_part).",
            ),
            (200, "application/yaml"): OpenApiResponse({"type": "string"}, description="The same, as YAML."),
        },
        parameters=[
            OpenApiParameter("format", str, enum=["json", "yaml"], description="yaml: the document as YAML.")
        ],
    )
    def list(self, request):
        """GET /api/v1/layout/: the layout (JSON, or YAML with comments: ?format=yaml or Accept)."""
        if request.accepted_renderer.format == "yaml":
            response = Response(layout.export_yaml(user=request.user))
        else:
            response = Response(layout.export_data(user=request.user))
        response["X-Layout-Version"] = str(layout.current_version() or 0)
        return response

    @extend_schema(request=LayoutPlanRequestSerializer, responses={201: LayoutPlanSerializer})
    @action(
        detail=False,
        methods=["post"],
        renderer_classes=[renderers.JSONRenderer],
        parser_classes=[LayoutJSONParser],
    )
    def plan(self, request):
        """POST /api/v1/layout/plan/: check and plan a layout (every problem at once, each under its
        path: {"shares[3].capacity.a10g": ["..."]}), or a rollback to a version."""
        serializer = LayoutPlanRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        if "rollback" in data:
            planned = layout.plan_rollback(
                number=data["rollback"], actor=request.user, run_whatif=data["whatif"]
            )
        else:
            planned = layout.plan(source=data["document"], actor=request.user, run_whatif=data["whatif"])
        return Response(plan_payload(planned, request), status=status.HTTP_201_CREATED)


class LayoutPlanViewSet(ApiViewMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """A plan (admins): read it (the what-if's progress and result), apply it."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    queryset = LayoutPlan.objects.select_related("version")
    serializer_class = LayoutPlanSerializer
    lookup_value_regex = r"[0-9a-fA-F-]{32,36}"

    def retrieve(self, request, *args, **kwargs):
        return Response(plan_payload(self.get_object(), request))

    @extend_schema(request=None, responses={200: LayoutAppliedSerializer})
    @action(detail=True, methods=["post"])
    def apply(self, request, pk=None):
        """Apply the plan exactly as planned, in one transaction; 409 when it was applied already, the
        layout changed since it was made, or one of its `until`s has passed."""
        planned = self.get_object()
        # A plan that adds to an over-commit is applied only with {"confirm": true} (else a 400 under
        # "confirm" naming it), as the one-share form's "Save anyway".
        confirm = request.data.get("confirm") if isinstance(request.data, dict) else None
        if confirm not in (None, True, False):
            raise exceptions.ValidationError({"confirm": ["true or false"]})
        applied = layout.apply(plan_id=planned.pk, actor=request.user, overcommit_ok=bool(confirm))
        summary = layoutdoc.summary(applied.plan.diff)
        if applied.version is None:
            detail = "Nothing to apply: the layout already is as planned."
        else:
            detail = f"Applied as version {applied.version.number}: {summary}."
        return Response(
            {
                "applied": applied.version is not None,
                "version": applied.version.number if applied.version else None,
                "summary": summary,
                "told": applied.told,
                "detail": detail,
            }
        )


class LayoutVersionViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    """Every applied layout (admins): who, when, the diff; one version with its whole layout."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    queryset = LayoutVersion.objects.order_by("-number")
    lookup_field = "number"
    lookup_value_regex = r"\d+"

    def get_serializer_class(self):
        return LayoutVersionDetailSerializer if self.action == "retrieve" else LayoutVersionSerializer


class TemporaryChangeViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    """Temporary changes (admins): those still to end first (soonest first), then those done."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    serializer_class = TemporaryChangeSerializer
    queryset = TemporaryChange.objects.select_related("share", "version", "revert_version").order_by(
        F("done_at").asc(nulls_first=True), "until", "id"
    )


class UsageCSVRenderer(BaseRenderer):
    """?format=csv: the usage figures one line per bucket and share (quotas.sharing.Report.csv); a
    refusal as its plain messages."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        if isinstance(data, str):
            return data
        return "".join(
            f"{field}: {' '.join(map(str, msgs if isinstance(msgs, list) else [msgs]))}\n"
            for field, msgs in (data or {}).items()
        )


class UsageView(ApiViewMixin, APIView):
    """GPU-hours used, lent, borrowed and lost by cause per share and team over the last `days` days
    (hourly buckets up to 2 days, else daily), what sharing gained (GPU-hours run on borrowed GPUs) and
    what it cost the owners (their wait for reclaimed GPUs, p50/p95, by priority): the usage page's
    numbers (quotas/sharing.py). Admins. `?format=csv` gives one line per bucket and share."""

    schema = ApiSchema()
    permission_classes = [IsAdmin]
    renderer_classes = [JSONRenderer, UsageCSVRenderer]

    @extend_schema(
        parameters=[
            OpenApiParameter("days", int, description="1 to 90 (default 7)."),
            OpenApiParameter("share", str, description="Only this share."),
            OpenApiParameter("format", str, description="csv: one line per bucket and share."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        from quotas import sharing
        from quotas.forms import UsageForm

        form = UsageForm({k: v for k, v in request.query_params.items() if k in ("days", "share")})
        if not form.is_valid():
            return Response({f: list(e) for f, e in form.errors.items()}, status=status.HTTP_400_BAD_REQUEST)
        share = form.cleaned_data["share"]
        report = sharing.report(days=form.cleaned_data["days"], shares=[share] if share else None)
        if request.accepted_renderer.format == "csv":
            name = f"gpuquota-usage-{form.cleaned_data['days']}d{'-' + share if share else ''}.csv"
            return Response(report.csv(), headers={"Content-Disposition": f'attachment; filename="{name}"'})
        return Response(report.as_dict())
