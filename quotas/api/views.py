"""Teams (admins write; members read their own), shares (admins write; everyone logged in reads,
with live usage per GPU type), and the audit log of admin changes (admins only, read-only)."""

from django.db.models import Prefetch
from django_filters import rest_framework as filters
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from config.api import ApiSchema, ApiViewMixin, IsAdmin, IsAdminOrReadOnly
from quotas import services
from quotas.api.serializers import (
    AuditEntrySerializer,
    ShareSerializer,
    ShareWriteSerializer,
    TeamSerializer,
    TeamWriteSerializer,
)
from quotas.choices import ShareState, Strategy
from quotas.models import AuditEntry, Membership, Share, Team


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
    queryset = Share.objects.select_related("team").prefetch_related("capacities").order_by("name")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        if self.request is not None and self.request.method in ("GET", "HEAD", "POST", "PATCH"):
            from quotas.scheduler import load_snapshot

            loaded = load_snapshot(queued=False)
            context["usage"] = services.share_usage(loaded.snapshot, loaded.queued_totals)
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

    def _read(self, share):
        return ShareSerializer(self.queryset.get(pk=share.pk), context=self.get_serializer_context()).data


class AuditFilter(filters.FilterSet):
    object_type = filters.ChoiceFilter(
        choices=[("share", "share"), ("team", "team"), ("node", "node")], help_text="share, team or node."
    )
    object_id = filters.CharFilter(help_text="The object's id.")
    object = filters.CharFilter(field_name="object_repr", help_text="The object's name.")
    actor = filters.CharFilter(field_name="actor_name", help_text="Username of who made the change.")
    action = filters.CharFilter(help_text="create, update, delete, cordon, uncordon, drain.")
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte", help_text="Changes at or after.")

    class Meta:
        model = AuditEntry
        fields = ["object_type", "object_id", "object", "actor", "action", "since"]


class AuditEntryViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    """Every admin change to shares, teams and nodes: who, when, before and after. Newest first."""

    schema = ApiSchema()
    serializer_class = AuditEntrySerializer
    permission_classes = [IsAdmin]
    filterset_class = AuditFilter
    queryset = AuditEntry.objects.order_by("-at", "-id")


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
