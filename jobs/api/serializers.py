"""Serializers of jobs: the submit and priority write shapes (strict: unknown fields are refused), the
list and detail read shapes, attempts, events, queue entries and log reads."""

import functools

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api import StrictSerializer
from config.validators import printable
from jobs import limits
from jobs.api.redaction import EnvRedactionMixin
from jobs.choices import JOB_OPEN_STATES, JobState
from jobs.limits import MAX_INT
from jobs.models import Attempt, Job, JobArray, JobEvent
from jobs.mounts import words as mount_words
from quotas.models import Share


class ShareByName(serializers.SlugRelatedField):
    """A share by name; an unknown (or empty) name is answered with the shares the user may submit to."""

    def __init__(self, **kwargs):
        super().__init__(slug_field="name", queryset=Share.objects.select_related("team"), **kwargs)

    def run_validation(self, data=serializers.empty):
        if data == "":  # DRF's related fields take "" for null: "This field may not be null." said nothing
            raise serializers.ValidationError(f"Give the name of a share. {self._yours()}")
        return super().run_validation(data)

    def _yours(self) -> str:
        request = self.context.get("request")
        qs = Share.objects.order_by("name")
        if request is not None and not request.user.is_superuser:
            qs = qs.filter(team__memberships__user=request.user)
        return f"Shares you can submit to: {', '.join(qs.values_list('name', flat=True)) or 'none'}."

    def to_internal_value(self, data):
        if not isinstance(data, str):
            raise serializers.ValidationError("Give the share by its name.")
        from jobs.queries import share_by_name

        share = share_by_name(data) if len(data) <= 63 else None  # the longest a share name can be
        if share is None:
            raise serializers.ValidationError(f'No share named "{data}". {self._yours()}')
        return share


class LimitedIntegerField(serializers.IntegerField):
    """An integer field held to a limit of jobs.limits. Only parsed here: the service the view calls
    refuses it in the limit's own words (what the form and the CLI say too), together with every other
    bad field of the request, before anything is written; a huge one is that message too, not DRF's,
    and never reaches the database. The bounds are shown in the schema."""

    def __init__(self, limit: limits.IntLimit, **kwargs):
        self.limit = limit
        kwargs.setdefault("help_text", limit.text())
        super().__init__(**kwargs)
        # For the schema only (no validators: the limit may be a setting, read at each check).
        self.min_value, self.max_value = limit.low, limit.top


class ArraySpecSerializer(StrictSerializer):
    size = LimitedIntegerField(limits.ARRAY_SIZE, help_text="Number of tasks (at most MAX_ARRAY_SIZE).")
    start = serializers.IntegerField(
        required=False, default=0, min_value=0, max_value=MAX_INT, help_text="Index of the first task."
    )


class JobSubmitSerializer(StrictSerializer):
    share = ShareByName(help_text="Name of the share to queue the job in.")
    name = serializers.CharField(
        max_length=200, allow_blank=True, required=False, default="", validators=[printable]
    )
    gpu_type = serializers.CharField(max_length=32, help_text="e.g. a10g")
    gpus = LimitedIntegerField(limits.GPUS)
    priority = LimitedIntegerField(
        limits.PRIORITY, required=False, default=0, help_text="0..9999, higher first."
    )
    command = serializers.ListField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        allow_empty=True,
        help_text='argv list, e.g. ["python", "train.py", "--epochs", "3"].',
    )
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False, default=dict
    )
    max_runtime_s = LimitedIntegerField(limits.MAX_RUNTIME, required=False, allow_null=True, default=None)
    preemption_grace_s = LimitedIntegerField(
        limits.PREEMPTION_GRACE, required=False, allow_null=True, default=None
    )
    max_preemptions = LimitedIntegerField(limits.MAX_PREEMPTIONS, required=False, default=-1)
    use_shell = serializers.BooleanField(
        required=False, default=False, help_text="Run command[0] through /bin/sh -c (one string)."
    )
    image = serializers.CharField(
        max_length=255,
        required=False,
        allow_blank=True,
        default="",
        help_text="A container image to run the command in (registry/path[:tag][@digest]), allowed by the "
        "cluster's ALLOWED_IMAGES or the share's allowed_images. Empty: the command runs on the host.",
    )
    mounts = serializers.ListField(
        child=serializers.CharField(max_length=2049, trim_whitespace=False),
        required=False,
        default=list,
        max_length=64,
        help_text="Read-only datasets of a container job: HOST[:CONTAINER] host directories allowed by the "
        "cluster's ALLOWED_MOUNTS or the share's allowed_mounts, e.g. /datasets/imagenet:/data.",
    )
    array = ArraySpecSerializer(
        required=False,
        help_text="Submit an array: `size` tasks alike but for GPUQUOTA_ARRAY_INDEX (start, start+1, ...). "
        "The answer is then the array.",
    )


class JobArraySerializer(serializers.ModelSerializer):
    share = serializers.CharField(source="share.name", read_only=True)
    team = serializers.CharField(source="share.team.slug", read_only=True)
    submitted_by = serializers.CharField(source="submitted_by.username", read_only=True)
    last_index = serializers.IntegerField(read_only=True)
    counts = serializers.SerializerMethodField(help_text="Tasks per state.")
    done = serializers.SerializerMethodField(help_text="Every task has ended.")

    class Meta:
        model = JobArray
        fields = [
            "id",
            "name",
            "share",
            "team",
            "submitted_by",
            "first_index",
            "last_index",
            "size",
            "submitted_at",
            "counts",
            "done",
        ]
        read_only_fields = fields

    def _counts(self, array) -> dict[str, int]:
        known = self.context.get("counts")
        if known is not None and array.pk in known:
            return known[array.pk]
        from jobs.services import array_counts

        return array_counts([array.pk])[array.pk]

    @extend_schema_field(serializers.DictField(child=serializers.IntegerField()))
    def get_counts(self, array):
        return self._counts(array)

    @extend_schema_field(serializers.BooleanField())
    def get_done(self, array) -> bool:
        counts = self._counts(array)
        return not any(counts.get(s, 0) for s in JOB_OPEN_STATES)


class JobPrioritySerializer(StrictSerializer):
    priority = LimitedIntegerField(limits.PRIORITY, help_text="0..9999")


class JobUpdateSerializer(StrictSerializer):
    """PATCH of a job: its priority, its grace, or both (the same limits as a submit: jobs.services.job_update)."""

    priority = LimitedIntegerField(limits.PRIORITY, required=False, help_text="0..9999")
    preemption_grace_s = LimitedIntegerField(limits.PREEMPTION_GRACE, required=False)


class QueuePositionSerializer(serializers.Serializer):
    in_share = serializers.IntegerField(help_text="1 = next in its share.")
    overall = serializers.IntegerField(help_text="1 = next in the whole cluster.")


def _stored_forecast(job):
    """A queued job's stored forecast (quotas.models.QueueForecast), or None. A job just submitted has
    none yet (FRESH): no query for it on the submit path."""
    if getattr(job, FRESH, False):
        return None
    from quotas.services import stored_forecast

    return stored_forecast(job)


FRESH = "_gpuquota_fresh"


class JobSerializer(EnvRedactionMixin, serializers.ModelSerializer):
    share = serializers.CharField(source="share.name", read_only=True)
    mounts = serializers.SerializerMethodField(help_text="Its read-only datasets, as HOST:CONTAINER.")
    team = serializers.CharField(source="share.team.slug", read_only=True)
    submitted_by = serializers.CharField(source="submitted_by.username", read_only=True)
    # The stored forecast (SEMANTICS "Forecast"), computed by the control worker after a pass.
    queue_position = serializers.SerializerMethodField()
    eta = serializers.SerializerMethodField()
    eta_low = serializers.SerializerMethodField()
    eta_high = serializers.SerializerMethodField()
    eta_kind = serializers.SerializerMethodField()
    eta_basis = serializers.SerializerMethodField()
    waiting_reason = serializers.SerializerMethodField()
    forecast_at = serializers.SerializerMethodField()
    forecast_age_s = serializers.SerializerMethodField()
    updated_at = serializers.DateTimeField(
        read_only=True,
        help_text="When the job last changed (its state, priority or grace): a forecast_at at or after "
        "it has seen the change.",
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "share",
            "team",
            "submitted_by",
            "gpu_type",
            "gpus",
            "priority",
            "state",
            "state_reason",
            "command",
            "use_shell",
            "image",
            "mounts",
            "env",
            "max_runtime_s",
            "preemption_grace_s",
            "max_preemptions",
            "submitted_at",
            "finished_at",
            "attempt_count",
            "preemption_count",
            "exit_code",
            "array",
            "array_index",
            "queue_position",
            "eta",
            "eta_low",
            "eta_high",
            "eta_kind",
            "eta_basis",
            "waiting_reason",
            "forecast_at",
            "forecast_age_s",
            "updated_at",
        ]
        read_only_fields = fields

    def get_mounts(self, job) -> list[str]:
        return mount_words(job.mounts)

    @extend_schema_field(QueuePositionSerializer(allow_null=True))
    def get_queue_position(self, job):
        f = _stored_forecast(job)
        return {"in_share": f.position_in_share, "overall": f.position_overall} if f else None

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True, help_text="Expected start; never in the past when computed."
        )
    )
    def get_eta(self, job):
        f = _stored_forecast(job)
        return serializers.DateTimeField().to_representation(f.eta) if f and f.eta else None

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True,
            help_text="The likely range's start: 10th percentile of the start (about 8 jobs in 10 start "
            "between eta_low and eta_high); null without an ETA or before the range is computed.",
        )
    )
    def get_eta_low(self, job):
        return self._likely_range(job)[0]

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True,
            help_text="The likely range's end: 90th percentile of the start (a bound: the bound).",
        )
    )
    def get_eta_high(self, job):
        return self._likely_range(job)[1]

    def _likely_range(self, job) -> tuple:
        from quotas.models import likely_range

        f = _stored_forecast(job)
        if f is None:
            return None, None
        field = serializers.DateTimeField()
        return tuple(
            None if t is None else field.to_representation(t)
            for t in likely_range(f.eta, f.eta_low, f.eta_high)
        )

    @extend_schema_field(
        serializers.CharField(
            allow_null=True,
            help_text="bound: rests only on enforced max runtimes; estimate: on a guessed runtime; "
            "none: not within the forecast (see eta_basis).",
        )
    )
    def get_eta_kind(self, job):
        f = _stored_forecast(job)
        return f.kind if f else None

    @extend_schema_field(serializers.CharField(help_text="What the ETA rests on, or why there is none."))
    def get_eta_basis(self, job):
        f = _stored_forecast(job)
        return f.basis if f else ""

    @extend_schema_field(serializers.CharField(help_text="Why it waits now, with numbers."))
    def get_waiting_reason(self, job):
        f = _stored_forecast(job)
        return f.reason if f else ""

    @extend_schema_field(
        serializers.DateTimeField(allow_null=True, help_text="When the forecast was computed.")
    )
    def get_forecast_at(self, job):
        f = _stored_forecast(job)
        return serializers.DateTimeField().to_representation(f.computed_at) if f else None

    @extend_schema_field(serializers.FloatField(allow_null=True, help_text="Age of the forecast, seconds."))
    def get_forecast_age_s(self, job):
        f = _stored_forecast(job)
        return round((timezone.now() - f.computed_at).total_seconds(), 1) if f else None


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = [
            "number",
            "state",
            "placement",
            "borrowed",
            "reason",
            "lenders",
            "admitted_at",
            "started_at",
            "stop_requested_at",
            "ended_at",
            "outcome",
            "exit_code",
            "preempted_by",
            "preemption_reason",
            "end_reason",
            "last_checkpoint_at",
            "checkpoints",
            "gpu_seconds_run",
            "gpu_seconds_lost",
            "lost_cause",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "last_checkpoint_at": {
                "help_text": "Its latest checkpoint its host saw: its safe point, if later than its start."
            },
            "checkpoints": {"help_text": "How many checkpoints its host saw in this attempt."},
            "gpu_seconds_run": {"help_text": "GPUs x its run, once it ended."},
            "gpu_seconds_lost": {
                "help_text": "GPUs x (end - safe point) where its work was thrown away (see lost_cause), once it ended."
            },
            "lost_cause": {
                "help_text": "reclaim, priority, fair_share, node_lost, fenced, gpu_failed, agent_stopped or host_fault "
                "(its agent stopped it for a fault of its host, such as its container runtime dying); empty: "
                "nothing lost."
            },
        }


class JobEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobEvent
        fields = ["at", "kind", "reason", "attempt_number", "detail"]
        read_only_fields = fields


class JobDetailSerializer(JobSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)
    events = JobEventSerializer(many=True, read_only=True)
    last_checkpoint_at = serializers.SerializerMethodField()
    last_checkpoint_age_s = serializers.SerializerMethodField()
    why_it_waits = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [
            *JobSerializer.Meta.fields,
            "why_it_waits",
            "last_checkpoint_at",
            "last_checkpoint_age_s",
            "attempts",
            "events",
        ]
        read_only_fields = fields

    @extend_schema_field(
        serializers.ListField(
            child=serializers.CharField(),
            help_text="A queued job that waits to borrow: what holds its share back, in the organisation "
            "page's words (a group's borrow limit reached; the shares with a lower fair-share value that "
            "go first). Empty otherwise.",
        )
    )
    def get_why_it_waits(self, job) -> list[str]:
        # A job just submitted (FRESH) has met no pass yet: the submit path reads no organisation (its
        # one statement); GET jobs/{id}/ says it after the next pass.
        if job.state != JobState.QUEUED or getattr(job, FRESH, False):
            return []
        from quotas import organisation
        from quotas.choices import Strategy

        if job.share.strategy != Strategy.LEND_AND_BORROW:
            return []  # only a borrower waits to borrow: no organisation to read for the others

        org = organisation.load_recent(teams=False)  # groups and shares by name, never a job
        return organisation.why_it_waits(org, job.share.name, job.gpu_type, job.gpus)

    @staticmethod
    def _last_checkpoint(job):
        return max((a.last_checkpoint_at for a in job.attempts.all() if a.last_checkpoint_at), default=None)

    @extend_schema_field(
        serializers.DateTimeField(
            allow_null=True, help_text="The job's latest checkpoint its hosts saw (any attempt); null: none."
        )
    )
    def get_last_checkpoint_at(self, job):
        at = self._last_checkpoint(job)
        return serializers.DateTimeField().to_representation(at) if at else None

    @extend_schema_field(
        serializers.FloatField(allow_null=True, help_text="Seconds since last_checkpoint_at.")
    )
    def get_last_checkpoint_age_s(self, job):
        at = self._last_checkpoint(job)
        return round((timezone.now() - at).total_seconds(), 1) if at else None


class QueueEntrySerializer(serializers.Serializer):
    """A queued job as the queue shows it. Another team's job shows no name and no owner."""

    id = serializers.IntegerField()
    share = serializers.CharField()
    team = serializers.CharField()
    name = serializers.CharField(allow_null=True)
    submitted_by = serializers.CharField(allow_null=True)
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField()
    priority = serializers.IntegerField()
    submitted_at = serializers.DateTimeField()
    position = QueuePositionSerializer(allow_null=True)
    eta = serializers.DateTimeField(allow_null=True)
    eta_low = serializers.DateTimeField(allow_null=True, help_text="The likely range (10th-90th percentile).")
    eta_high = serializers.DateTimeField(allow_null=True)
    eta_kind = serializers.CharField(allow_null=True)
    eta_basis = serializers.CharField()
    waiting_reason = serializers.CharField()


class QueueSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Jobs queued (in the share, if one was asked for).")
    next = serializers.URLField(allow_null=True, help_text="The next page, or null.")
    previous = serializers.URLField(allow_null=True, help_text="The previous page, or null.")
    share = serializers.CharField(allow_null=True)
    planned = serializers.BooleanField(help_text="False until a forecast has been stored: plain queue order.")
    forecast_at = serializers.DateTimeField(
        allow_null=True, help_text="When the oldest shown forecast was made."
    )
    jobs = QueueEntrySerializer(many=True)


class QueueQuerySerializer(serializers.Serializer):
    share = serializers.CharField(required=False, help_text="Share name; all shares if left out.")


class LogQuerySerializer(serializers.Serializer):
    attempt = serializers.IntegerField(required=False, min_value=1, max_value=MAX_INT)
    tail = serializers.IntegerField(required=False, min_value=-MAX_INT, max_value=MAX_INT)
    after = serializers.IntegerField(required=False, min_value=-MAX_INT, max_value=2**62)
    node = serializers.CharField(required=False, max_length=63)
    rank = serializers.IntegerField(required=False, min_value=0, max_value=MAX_INT)


class LogSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True)
    attempts = serializers.ListField(child=serializers.IntegerField())
    node = serializers.CharField(allow_null=True)
    rank = serializers.IntegerField(allow_null=True, help_text="The node's rank in the attempt.")
    nodes = serializers.ListField(
        child=serializers.CharField(),
        help_text="Every rank's node, in rank order: ?node= or ?rank= reads its log.",
    )
    text = serializers.CharField(allow_blank=True)
    cursor = serializers.IntegerField(help_text="Pass as ?after= to read only what came since.")
    more = serializers.BooleanField(help_text="More text follows: read again with ?after=cursor.")
    finished = serializers.BooleanField(help_text="The attempt has ended: no more text will come.")
    removed = serializers.BooleanField(
        help_text="The job ended more than JOB_OUTPUT_KEEP_DAYS days ago: its output has been removed."
    )


@functools.cache
def _submitted_serializer() -> JobDetailSerializer:
    return JobDetailSerializer()


def submitted_data(job: Job) -> dict:
    """The 201's body for a job job_submit just created (the DRF view and jobs.api.fast_submit). No
    forecast in it: the control worker stores one after the next pass (GET jobs/{id}/). A new job has no
    attempts and one event, all in hand: answered without reading it back, by one serializer kept for
    the purpose (building a ModelSerializer's fields costs more than using them; to_representation
    keeps no state, so threads can share it)."""
    from jobs.services import known_related

    setattr(job, FRESH, True)
    return _submitted_serializer().to_representation(known_related(job))
