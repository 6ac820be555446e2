"""Serializers of teams and shares: read shapes, and strict write shapes that hand over to services."""

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api import StrictSerializer
from config.validators import printable
from quotas.choices import Role, ShareState, Strategy
from quotas.models import AuditEntry, Share, Team

MAX_INT = 2**31 - 1


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices, default=Role.MEMBER)


class TeamSerializer(serializers.ModelSerializer):
    members = serializers.SerializerMethodField()
    shares = serializers.SerializerMethodField()

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "members", "shares", "created_at"]

    @extend_schema_field(MemberSerializer(many=True))
    def get_members(self, team):
        return [{"username": m.user.get_username(), "role": m.role} for m in team.memberships.all()]

    @extend_schema_field(serializers.ListField(child=serializers.CharField()))
    def get_shares(self, team):
        return [s.name for s in team.shares.all()]


class TeamWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=100, validators=[printable])
    slug = serializers.CharField(max_length=63)
    members = MemberSerializer(many=True, required=False)


class CapacityField(serializers.DictField):
    """{gpu_type: gpus}."""

    child = serializers.IntegerField(min_value=0, max_value=MAX_INT)


@extend_schema_field(
    {
        "type": "object",
        "description": "Per GPU type: own (guaranteed) GPUs in use, borrowed GPUs, GPUs lent to others "
        "(fractional: see SEMANTICS.md), queued GPUs, running and queued jobs.",
        "additionalProperties": {
            "type": "object",
            "properties": {
                "own": {"type": "integer"},
                "borrowed": {"type": "integer"},
                "lent": {"type": "number"},
                "queued_gpus": {"type": "integer"},
                "running_jobs": {"type": "integer"},
                "queued_jobs": {"type": "integer"},
            },
        },
    }
)
class UsageField(serializers.Field):
    def __init__(self, **kwargs):
        kwargs.setdefault("read_only", True)
        kwargs.setdefault("source", "*")
        super().__init__(**kwargs)

    def to_representation(self, share):
        return self.context.get("usage", {}).get(share.name, {})


class ShareSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    capacity = serializers.SerializerMethodField()
    usage = UsageField()

    class Meta:
        model = Share
        fields = [
            "id",
            "name",
            "team",
            "description",
            "capacity",
            "strategy",
            "borrow_limit",
            "in_share_preemption",
            "min_runtime_s",
            "state",
            "usage",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_capacity(self, share):
        return share.capacity_map()


class ShareWriteSerializer(StrictSerializer):
    name = serializers.CharField(max_length=63)
    team = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Team.objects.all(),
        error_messages={"does_not_exist": 'No team with slug "{value}".'},
    )
    description = serializers.CharField(
        max_length=200, allow_blank=True, required=False, validators=[printable]
    )
    capacity = CapacityField(required=False)
    strategy = serializers.ChoiceField(choices=Strategy.choices, required=False)
    borrow_limit = serializers.IntegerField(min_value=-1, max_value=MAX_INT, required=False)
    in_share_preemption = serializers.BooleanField(required=False)
    # Parsed here, held to its limit by the service (jobs.limits.MIN_RUNTIME: the form's and the CLI's
    # words too).
    min_runtime_s = serializers.IntegerField(
        required=False,
        help_text="Protection window (SEMANTICS rule 10): a job of this share runs at least this many "
        "seconds after each start before any reclaim or in-share pre-emption may take it; 0 to "
        "MAX_MIN_RUNTIME_S (86,400 by default).",
    )
    state = serializers.ChoiceField(choices=ShareState.choices, required=False)


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name", read_only=True, help_text="Empty: the system.")

    class Meta:
        model = AuditEntry
        fields = ["id", "at", "actor", "action", "object_type", "object_id", "object_repr", "before", "after"]
        read_only_fields = fields
