"""Teams (admins write; members read their own), shares (admins write; everyone logged in reads,
with live usage per GPU type), and the audit log of admin changes (admins only, read-only)."""

from django.db.models import Prefetch
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.response import Response

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
