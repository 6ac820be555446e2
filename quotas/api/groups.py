"""GET /api/v1/groups/ and /api/v1/groups/{name}/: the organisation tree (issue 37, item 3), each group
with its parent, weight and limits, its child groups and shares, and per GPU type its capacity, use,
what it takes from and lends outside, its fair-share value with its parts and its state in words.
Everyone logged in reads it (groups and shares by name, never a job); admins change the tree through
the layout (POST /api/v1/layout/plan/ with `groups`, then apply), the one path by which it changes."""

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, viewsets
from rest_framework.response import Response

from config.api import ApiSchema, ApiViewMixin, IsAdminOrReadOnly
from quotas import organisation


class OrgValuesSerializer(serializers.Serializer):
    """One group's or share's numbers for one GPU type (quotas.engine.tree.OrgRow)."""

    gpu_type = serializers.CharField()
    capacity = serializers.IntegerField()
    in_use = serializers.IntegerField()
    taken_from_outside = serializers.IntegerField()
    lent_outside = serializers.FloatField()
    weight = serializers.FloatField()
    history = serializers.FloatField()
    fair_share_value = serializers.FloatField(
        help_text="(taken from outside + history) ÷ (weight × capacity)"
    )
    state = serializers.ChoiceField(choices=list(organisation.STATES))
    waiting_to_borrow = serializers.BooleanField()
    fair_part = serializers.FloatField(
        allow_null=True,
        help_text="GPUs: its part of what borrowers may hold now, split among the siblings that wait to "
        "borrow or borrow by weight × max(1, capacity) (rule 5's split); null when it neither waits nor "
        "borrows",
    )
    competing_total_weight = serializers.FloatField(
        allow_null=True, help_text="Those siblings' total of their plain weights, itself included"
    )
    fair_weight = serializers.FloatField(
        help_text="weight × max(1, capacity of the type): what its fair part is in proportion to"
    )
    competing_total_fair_weight = serializers.FloatField(
        allow_null=True, help_text="Those siblings' total of weight × max(1, capacity), itself included"
    )
    may_take = serializers.IntegerField(allow_null=True, help_text="Its borrow limit in GPUs (null: none)")
    may_lend = serializers.IntegerField(allow_null=True, help_text="Its lend limit in GPUs (null: none)")


class GroupSerializer(serializers.Serializer):
    name = serializers.CharField()
    parent = serializers.CharField(allow_null=True, help_text="null: directly under the cluster")
    weight = serializers.FloatField()
    borrow_limit = serializers.IntegerField(help_text="percent of its subtree's capacity per type; -1 none")
    lend_limit = serializers.IntegerField(help_text="percent of its subtree's capacity per type; -1 none")
    depth = serializers.IntegerField(help_text="0: directly under the cluster")
    groups = serializers.ListField(child=serializers.CharField(), help_text="its child groups")
    shares = serializers.ListField(child=serializers.CharField(), help_text="its shares")
    types = OrgValuesSerializer(many=True)


def values_of(node: organisation.Node) -> dict:
    r = node.row
    return {
        "gpu_type": r.gpu_type,
        "capacity": r.capacity,
        "in_use": r.in_use,
        "taken_from_outside": r.taken_from_outside,
        "lent_outside": round(r.lent_outside, 3),
        "weight": r.weight,
        "history": round(r.history, 3),
        "fair_share_value": round(r.fair_share_value, 4),
        "state": r.state,
        "waiting_to_borrow": r.waiting_to_borrow,
        "fair_part": None if r.fair_part is None else round(r.fair_part, 3),
        "competing_total_weight": r.competing_total_weight,
        "fair_weight": r.fair_weight,
        "competing_total_fair_weight": r.competing_total_fair_weight,
        "may_take": node.may_take,
        "may_lend": node.may_lend,
    }


def group_entries(org: organisation.Organisation) -> list[dict]:
    """Every group, by name, with its children and its numbers per type."""
    from quotas.models import Share

    shares_of: dict[str, list[str]] = {}
    for name, group in Share.objects.filter(group__isnull=False).values_list("name", "group__name"):
        shares_of.setdefault(group, []).append(name)
    depth = {}
    for name in sorted(org.groups):
        d, parent = 0, org.groups[name].parent
        while parent is not None:
            d, parent = d + 1, org.groups[parent].parent
        depth[name] = d
    out = []
    for name in sorted(org.groups):
        g = org.groups[name]
        out.append(
            {
                "name": name,
                "parent": g.parent,
                "weight": g.weight,
                "borrow_limit": g.borrow_limit,
                "lend_limit": g.lend_limit,
                "depth": depth[name],
                "groups": sorted(c for c, s in org.groups.items() if s.parent == name),
                "shares": sorted(shares_of.get(name, ())),
                "types": [values_of(n) for n in org.of(name)],
            }
        )
    return out


class GroupViewSet(ApiViewMixin, viewsets.ViewSet):
    schema = ApiSchema()
    permission_classes = [IsAdminOrReadOnly]
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]{1,63}"
    http_method_names = ["get", "head", "options"]

    @extend_schema(responses={200: GroupSerializer(many=True)})
    def list(self, request):
        return Response(group_entries(organisation.load_recent()))

    @extend_schema(responses={200: GroupSerializer})
    def retrieve(self, request, name=None):
        entry = next((g for g in group_entries(organisation.load_recent()) if g["name"] == name), None)
        if entry is None:
            raise Http404("No such group.")
        return Response(entry)
