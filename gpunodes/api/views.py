"""GPU hosts: read by everyone logged in; admins cordon, uncordon and drain them, and mark a GPU healthy
again after a reset (its agent re-checks it before it takes work)."""

from django.db.models import Count, Q
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api import ApiSchema, ApiViewMixin, IsAdmin
from gpunodes import services
from gpunodes.api.serializers import NodeDetailSerializer, NodeSerializer
from gpunodes.choices import GpuHealth, NodeState
from gpunodes.models import Gpu, Node


class NodeFilter(filters.FilterSet):
    state = filters.ChoiceFilter(choices=NodeState.choices)
    gpu_type = filters.CharFilter()

    class Meta:
        model = Node
        fields = ["state", "gpu_type"]


class NodeViewSet(ApiViewMixin, viewsets.ReadOnlyModelViewSet):
    schema = ApiSchema()
    serializer_class = NodeSerializer
    filterset_class = NodeFilter
    lookup_field = "name"
    lookup_value_regex = r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}"
    queryset = Node.objects.annotate(
        gpu_count=Count("gpus", distinct=True),
        gpus_in_use=Count("gpus__claim", distinct=True),
        gpus_unhealthy=Count("gpus", filter=~Q(gpus__health=GpuHealth.HEALTHY), distinct=True),
    ).order_by("name")

    def get_serializer_class(self):
        return NodeSerializer if self.action == "list" else NodeDetailSerializer

    def get_queryset(self):
        queryset = super().get_queryset()
        return queryset if self.action == "list" else queryset.prefetch_related("gpus")

    def get_permissions(self):
        if self.action in ("cordon", "uncordon", "drain", "mark_healthy"):
            return [IsAdmin()]
        return super().get_permissions()

    def _answer(self, node):
        return Response(NodeDetailSerializer(self.get_queryset().get(pk=node.pk)).data)

    def _act(self, verb):
        return self._answer(verb(node=self.get_object(), actor=self.request.user))

    @extend_schema(request=None, responses={200: NodeDetailSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request, name=None):
        """No new work on the node; running jobs go on."""
        return self._act(services.node_cordon)

    @extend_schema(request=None, responses={200: NodeDetailSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request, name=None):
        """The node takes work again."""
        return self._act(services.node_uncordon)

    @extend_schema(request=None, responses={200: NodeDetailSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, name=None):
        """No new work; running jobs finish, then the node is CORDONED (drained)."""
        return self._act(services.node_drain)

    @extend_schema(request=None, responses={200: NodeDetailSerializer})
    @action(detail=True, methods=["post"], url_path=r"gpus/(?P<index>[0-9]{1,3})/mark-healthy")
    def mark_healthy(self, request, name=None, index=None):
        """Bring a GPU found broken back (after a reset): CHECKING until the node's agent re-checks it,
        then HEALTHY (or UNHEALTHY again, with what the re-check found). Audited. A healthy GPU is left
        as it is; 404 for a GPU the node does not have."""
        node = self.get_object()
        try:
            services.gpu_mark_healthy(node=node, index=int(index), actor=request.user)
        except Gpu.DoesNotExist:
            raise Http404(f"Node {node.name} has no GPU {index}.") from None
        return self._answer(node)
