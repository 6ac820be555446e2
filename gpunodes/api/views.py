"""GPU hosts: read by everyone logged in; admins cordon, uncordon and drain them."""

from django.db.models import Count
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.api import ApiSchema, ApiViewMixin, IsAdmin
from gpunodes import services
from gpunodes.api.serializers import NodeSerializer
from gpunodes.choices import NodeState
from gpunodes.models import Node


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
        gpu_count=Count("gpus", distinct=True), gpus_in_use=Count("gpus__claim", distinct=True)
    ).order_by("name")

    def get_permissions(self):
        if self.action in ("cordon", "uncordon", "drain"):
            return [IsAdmin()]
        return super().get_permissions()

    def _act(self, verb):
        node = verb(node=self.get_object(), actor=self.request.user)
        return Response(NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request, name=None):
        """No new work on the node; running jobs go on."""
        return self._act(services.node_cordon)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request, name=None):
        """The node takes work again."""
        return self._act(services.node_uncordon)

    @extend_schema(request=None, responses={200: NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request, name=None):
        """No new work; running jobs finish, then the node is CORDONED (drained)."""
        return self._act(services.node_drain)
