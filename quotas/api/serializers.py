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
    # Its place in the organisation tree (changed through the layout) and, per GPU type, its fair-share
    # value with its parts, its state in words and its fair part of what borrowers may hold now.
    group = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True, help_text="null: under the cluster"
    )
    fair_share = serializers.SerializerMethodField()

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
            "group",
            "weight",
            "fair_share",
            "usage",
            "created_at",
            "updated_at",
        ]

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"}})
    def get_capacity(self, share):
        return share.capacity_map()

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "object"}})
    def get_fair_share(self, share):
        """{gpu_type: {fair_share_value, state, history, taken_from_outside, fair_part, ...,
        why_it_waits}}: why_it_waits in the organisation page's words (quotas.organisation.why_it_waits)."""
        from quotas import organisation
        from quotas.api.groups import values_of

        org = self.context.get("organisation")
        if org is None:
            return {}
        return {
            n.row.gpu_type: {
                **values_of(n),
                "why_it_waits": organisation.why_it_waits(org, share.name, n.row.gpu_type),
            }
            for n in org.of(share.name)
        }


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


# --- the layout ------------------------------------------------------------------------------------


class LayoutPlanRequestSerializer(StrictSerializer):
    """A layout to plan (`document`: YAML or JSON text, or the document as an object), or a version to
    roll back to (`rollback`); `whatif` false leaves last week's replay out."""

    document = serializers.JSONField(
        required=False,
        help_text="The whole layout: YAML or JSON text (comments allowed), or the document itself.",
    )
    rollback = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_INT,
        help_text="Plan back to the layout of this version (0: the layout before version 1).",
    )
    whatif = serializers.BooleanField(default=True, help_text="Replay last week with it (the what-if).")

    def validate(self, data):
        if ("document" in data) == ("rollback" in data):
            raise serializers.ValidationError(
                {"document": ["Give the layout to plan (document), or a version to roll back to (rollback)."]}
            )
        return data


_ANY_OBJECT = {"type": "object", "additionalProperties": True}
_OBJECTS = {"type": "array", "items": _ANY_OBJECT}


class LayoutPlanSerializer(serializers.Serializer):
    """A plan: the diff, what it does now, its temporary changes, the what-if (while it runs: its
    progress), and where to apply it."""

    id = serializers.UUIDField()
    state = serializers.CharField(help_text="PLANNED or APPLIED.")
    created_at = serializers.DateTimeField()
    created_by = serializers.CharField()
    base_hash = serializers.CharField(help_text="The hash of the layout this plan started from.")
    base_version = serializers.IntegerField(allow_null=True)
    rollback_to = serializers.IntegerField(allow_null=True)
    changed = serializers.BooleanField()
    summary = serializers.CharField()
    changes = serializers.JSONField(help_text="Share by share, field by field: added, changed, renamed, ...")
    now = serializers.JSONField(help_text="borrowed, never_runnable, overcommit (each with words).")
    warnings = serializers.ListField(child=serializers.CharField())
    temporary = serializers.JSONField()
    whatif = serializers.JSONField(allow_null=True)
    version = serializers.IntegerField(allow_null=True, help_text="The version it became, once applied.")
    apply = serializers.CharField(help_text="POST here to apply it.")


class LayoutAppliedSerializer(serializers.Serializer):
    applied = serializers.BooleanField(help_text="False: the plan changed nothing.")
    version = serializers.IntegerField(allow_null=True)
    summary = serializers.CharField()
    told = serializers.IntegerField(help_text="Queued jobs told they can never run now.")
    detail = serializers.CharField()


class LayoutVersionSerializer(serializers.Serializer):
    number = serializers.IntegerField()
    applied_at = serializers.DateTimeField()
    actor = serializers.CharField(
        source="actor_name", help_text="Empty: the system (a temporary change ended)."
    )
    kind = serializers.CharField(help_text="apply, rollback or revert.")
    note = serializers.CharField()
    summary = serializers.SerializerMethodField()
    changes = serializers.JSONField(source="diff")
    hash = serializers.CharField()

    @extend_schema_field(serializers.CharField())
    def get_summary(self, version):
        from quotas import layoutdoc

        return layoutdoc.summary(version.diff)


class LayoutVersionDetailSerializer(LayoutVersionSerializer):
    document = serializers.JSONField(help_text="The whole layout after this version.")


class TemporaryChangeSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    share = serializers.CharField(source="share_name", help_text="Its name when the change was applied.")
    share_now = serializers.SerializerMethodField()
    until = serializers.DateTimeField()
    fields = serializers.JSONField(help_text='{"capacity.a100": [before, after], ...}')
    state = serializers.CharField(
        help_text="PENDING, REVERTED, PARTLY (some fields changed since) or SKIPPED."
    )
    outcome = serializers.CharField()
    version = serializers.IntegerField(source="version.number")
    revert_version = serializers.SerializerMethodField()

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_share_now(self, change):
        return change.share.name if change.share_id else None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_revert_version(self, change):
        return change.revert_version.number if change.revert_version_id else None


class TrackRecordQuerySerializer(serializers.Serializer):
    days = serializers.IntegerField(
        required=False,
        default=7,
        min_value=1,
        max_value=90,
        help_text="Jobs that started in the last 1 to 90 days (default 7).",
        error_messages={
            "invalid": "Give a whole number of days, 1 to 90.",
            "min_value": "Give a whole number of days, 1 to 90.",
            "max_value": "Give a whole number of days, 1 to 90.",
        },
    )


class TrackRecordPointSerializer(serializers.Serializer):
    job = serializers.IntegerField()
    kind = serializers.CharField(help_text="bound, estimate or none: what its first ETA rested on.")
    forecast_s = serializers.FloatField(help_text="Its first ETA, as a wait from its submit (seconds).")
    low_s = serializers.FloatField(allow_null=True, help_text="Its likely range's start, from its submit.")
    high_s = serializers.FloatField(allow_null=True, help_text="Its likely range's end, from its submit.")
    actual_s = serializers.FloatField(help_text="Its actual wait: first attempt's start, from its submit.")
    within = serializers.BooleanField(allow_null=True, help_text="Started within its range (null: no range).")


class TrackRecordSerializer(serializers.Serializer):
    """A share's forecast track record (quotas.track_record.summary): the jobs that waited for a forecast
    and started in the last `days` days, against the ETA and likely range they were first given."""

    share = serializers.CharField()
    days = serializers.IntegerField()
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    started = serializers.IntegerField(help_text="Jobs that started in the window (any first forecast).")
    n = serializers.IntegerField(help_text="Of those, the ones first given an ETA.")
    median_error_s = serializers.FloatField(
        allow_null=True, help_text="Median of |start - first ETA| over those n, seconds."
    )
    with_range = serializers.IntegerField(help_text="Started jobs first given a likely range.")
    within_range = serializers.IntegerField(
        help_text="Of those, started inside it (tolerance_s either side allowed)."
    )
    within_fraction = serializers.FloatField(
        allow_null=True, help_text="within_range / with_range: about 0.8 when ranges are right."
    )
    early = serializers.IntegerField(help_text="Started before their range.")
    late = serializers.IntegerField(help_text="Started after their range.")
    tolerance_s = serializers.IntegerField()
    by_kind = serializers.JSONField(
        help_text='{"bound"|"estimate"|"none": {"started": n, "with_range": n, "within_range": n}}'
    )
    waiting_past_range = serializers.IntegerField(
        help_text="Jobs still queued whose first range (or ETA) has ended: not counted until they start."
    )
    points = TrackRecordPointSerializer(
        many=True,
        help_text="The latest starts (at most 500), for a picture; empty for users outside the share's team.",
    )
