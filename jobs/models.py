"""Jobs, their attempts, the GPUs an attempt holds, and the event log a user reads."""

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from jobs.choices import (
    ATTEMPT_ACTIVE_STATES,
    AttemptState,
    EventKind,
    JobState,
    LostCause,
    Outcome,
    PreemptionReason,
)
from jobs.limits import MAX_PRIORITY
from quotas.models import gpu_type_validator

__all__ = ["MAX_PRIORITY", "Attempt", "GpuClaim", "Job", "JobArray", "JobEvent", "LogChunk"]


class JobArray(models.Model):
    """N jobs submitted as one that differ only by their index (GPUQUOTA_ARRAY_INDEX): each task is a
    Job of its own, with its own queue entry, attempts and events; the array lists, re-prioritises
    and cancels them as one."""

    share = models.ForeignKey("quotas.Share", on_delete=models.PROTECT, related_name="job_arrays")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="job_arrays"
    )
    name = models.CharField(max_length=200, blank=True)
    first_index = models.PositiveIntegerField(default=0)
    size = models.PositiveIntegerField()
    submitted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [models.CheckConstraint(condition=Q(size__gt=0), name="jobarray_size_positive")]

    def __str__(self) -> str:
        return f"array {self.pk} {self.name}".strip()

    @property
    def last_index(self) -> int:
        return self.first_index + self.size - 1


class Job(models.Model):
    share = models.ForeignKey("quotas.Share", on_delete=models.PROTECT, related_name="jobs")
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200, blank=True)
    gpu_type = models.CharField(max_length=32, validators=[gpu_type_validator])
    gpus = models.PositiveIntegerField()
    priority = models.IntegerField(default=0)
    command = models.JSONField(default=list)  # argv list
    use_shell = models.BooleanField(default=False)  # run command[0] through /bin/sh -c, only if asked
    # A container image to run the command in (README "Container images"); "" runs it on the host.
    image = models.CharField(max_length=255, blank=True, default="", db_default="")
    # Its read-only datasets (jobs/mounts.py): [{"host", "container", "allowed_by"}], a container job's only.
    mounts = models.JSONField(default=list, db_default=[], blank=True)
    env = models.JSONField(default=dict, blank=True)
    max_runtime_s = models.PositiveIntegerField(null=True, blank=True)
    preemption_grace_s = models.PositiveIntegerField(default=30)
    max_preemptions = models.IntegerField(default=-1)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    state_reason = models.CharField(max_length=300, blank=True)
    # Keeps its original value when the job is re-queued: a job never loses its place in line.
    submitted_at = models.DateTimeField(default=timezone.now)
    attempt_count = models.PositiveIntegerField(default=0)
    preemption_count = models.PositiveIntegerField(default=0)
    # Strikes in a row: attempts that ended with their host's agent while they ran (NODE_LOST), and the
    # hosts they ended on; strikes on HOLD_AFTER_NODE_LOST different hosts hold the job
    # (jobs.lifecycle.hold_or_requeue). Back to 0 / [] when an attempt ends otherwise or on release.
    node_lost_streak = models.PositiveIntegerField(default=0)
    strike_nodes = models.JSONField(default=list, db_default=[], blank=True)
    # Pre-emptions were decided for this job and it has not been admitted since (rule 7).
    beneficiary = models.BooleanField(default=False)
    # The first pass, since it last entered the queue, that reclaimed GPUs for it or found it waiting
    # for protection (rule 10): its owner's wait for reclaimed GPUs runs from here to its next start.
    # Handed to the attempt at admission (Attempt.reclaim_needed_at) and cleared.
    reclaim_needed_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # A task of an array: its index is in its env as GPUQUOTA_ARRAY_INDEX.
    array = models.ForeignKey(JobArray, on_delete=models.CASCADE, null=True, blank=True, related_name="tasks")
    array_index = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=0, priority__lte=MAX_PRIORITY), name="job_priority_range"
            ),
            models.CheckConstraint(condition=Q(gpus__gt=0), name="job_gpus_positive"),
            models.CheckConstraint(condition=Q(max_preemptions__gte=-1), name="job_max_preemptions_gte_-1"),
            models.CheckConstraint(
                condition=Q(max_runtime_s__isnull=True) | Q(max_runtime_s__gt=0),
                name="job_max_runtime_positive",
            ),
            models.CheckConstraint(condition=Q(state__in=JobState.values), name="job_state_valid"),
        ]
        indexes = [
            models.Index(fields=["state", "share"], name="job_state_share_idx"),
            models.Index(fields=["share", "-submitted_at"], name="job_share_submitted_idx"),
            models.Index(fields=["submitted_by", "state"], name="job_user_state_idx"),
            models.Index(fields=["-submitted_at", "-id"], name="job_submitted_idx"),
            models.Index(fields=["array", "state"], name="job_array_state_idx"),
            # Queue totals per share and type (pages, metrics) by an index-only scan of the queued rows.
            models.Index(
                fields=["share", "gpu_type", "gpus"],
                condition=Q(state="QUEUED"),
                name="job_queued_totals_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name}".strip()


class Attempt(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=AttemptState.choices, default=AttemptState.ADMITTED)
    # [{"node": "g5-1", "gpus": [0, 1]}, ...]: kept after the GPUs are released, for history.
    placement = models.JSONField(default=list)
    nodes = models.ManyToManyField("gpunodes.Node", related_name="attempts", blank=True)
    borrowed = models.BooleanField(default=False)
    reason = models.CharField(max_length=32, blank=True)  # ADMITTED_OWN / ADMITTED_BORROWED
    lenders = models.JSONField(default=list, blank=True)
    admitted_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_deadline = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    preempted_by = models.ForeignKey(Job, on_delete=models.SET_NULL, null=True, blank=True, related_name="+")
    preemption_reason = models.CharField(max_length=16, choices=PreemptionReason.choices, blank=True)
    end_reason = models.CharField(max_length=300, blank=True)
    # The port its rank 0 listens on for the other ranks (MASTER_PORT), chosen at admission, a fresh one
    # per attempt (quotas.scheduler.rendezvous_ports).
    rendezvous_port = models.PositiveIntegerField(null=True, blank=True)
    # The job's latest checkpoint in this attempt, as its host saw it written (or was told), and how
    # many it saw: the attempt's safe point is the later of its start and this (SEMANTICS "Checkpoints
    # and safe points"). (db_default: rows written by a release without these columns, in a rolling
    # upgrade, get their defaults too.)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    checkpoints = models.PositiveIntegerField(default=0, db_default=0)
    # {node: epoch seconds of its latest checkpoint} for the nodes that reported one: an attempt on
    # several nodes is safe up to the oldest of them (last_checkpoint_at).
    checkpoint_by_node = models.JSONField(default=dict, db_default={}, blank=True)
    # Written when the attempt ends: GPUs x its run, and GPUs x (end - safe point) where its work was
    # thrown away (pre-empted, its host lost or fenced; never for a success, a failure or a cancel).
    gpu_seconds_run = models.FloatField(null=True, blank=True)
    gpu_seconds_lost = models.FloatField(null=True, blank=True)
    lost_cause = models.CharField(max_length=16, choices=LostCause.choices, blank=True, db_default="")
    # The seconds its host took to pull its job's image before it started (0: the host had it; null: no
    # image, or an agent that does not say): the forecast's typical pull per image (quotas/services.py).
    pull_s = models.FloatField(null=True, blank=True)
    # Its job's reclaim_needed_at when it was admitted: the owner waited from then to started_at.
    reclaim_needed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job", "number"]
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_unique_number"),
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(state__in=sorted(ATTEMPT_ACTIVE_STATES)),
                name="attempt_one_active_per_job",
            ),
            models.CheckConstraint(condition=Q(number__gte=1), name="attempt_number_positive"),
            models.CheckConstraint(condition=Q(state__in=AttemptState.values), name="attempt_state_valid"),
            # An ended attempt says how it ended; a live one does not yet.
            models.CheckConstraint(
                condition=(Q(state=AttemptState.ENDED) & ~Q(outcome=""))
                | (~Q(state=AttemptState.ENDED) & Q(outcome="")),
                name="attempt_outcome_iff_ended",
            ),
        ]
        indexes = [
            # Not partial: SQLite cannot match a partial index to `state IN (?, ?, ?)` with parameters.
            models.Index(fields=["state"], name="attempt_state_idx"),
            # Lost work and usage over a window (the usage page, its API and CSV).
            models.Index(fields=["ended_at"], name="attempt_ended_at_idx"),
            # The latest successful attempts, for the observed median runtime behind ETAs.
            models.Index(
                fields=["-ended_at"],
                condition=Q(state="ENDED", outcome="SUCCEEDED"),
                name="attempt_succeeded_idx",
            ),
            # The latest pulls of an image, for the forecast's typical pull (only container attempts).
            models.Index(
                fields=["-started_at"],
                condition=Q(pull_s__isnull=False),
                name="attempt_pulled_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number}"

    @property
    def is_active(self) -> bool:
        return self.state in ATTEMPT_ACTIVE_STATES


class GpuClaim(models.Model):
    """A GPU held by a live attempt. Deleted when the attempt releases it: one row, one holder."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="claims")
    gpu = models.OneToOneField("gpunodes.Gpu", on_delete=models.PROTECT, related_name="claim")
    claimed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "GPU claim"

    def __str__(self) -> str:
        return f"{self.gpu} held by {self.attempt}"


class JobEvent(models.Model):
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    attempt_number = models.PositiveIntegerField(null=True, blank=True)
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    reason = models.CharField(max_length=300, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["at", "id"]
        indexes = [
            models.Index(fields=["job", "at"], name="jobevent_job_at_idx"),
            models.Index(fields=["kind", "-at"], name="jobevent_kind_at_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} job {self.job_id} {self.kind} {self.reason}".strip()


class LogChunk(models.Model):
    """A piece of an attempt's output as its host shipped it. (attempt, node, offset) is unique, so a
    duplicated delivery is stored once. `cut`: the control side's note where it stopped storing that
    attempt's output on that node (its team's budget, TEAM_OUTPUT_MAX_BYTES): nothing past it is asked
    for again."""

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="log_chunks")
    node = models.CharField(max_length=63)
    offset = models.BigIntegerField()
    text = models.TextField()
    cut = models.BooleanField(default=False)

    class Meta:
        ordering = ["attempt", "node", "offset"]
        constraints = [
            models.UniqueConstraint(fields=["attempt", "node", "offset"], name="logchunk_unique_offset"),
        ]

    def __str__(self) -> str:
        return f"{self.attempt} on {self.node} @{self.offset}"


class TeamOutput(models.Model):
    """The bytes of stored output (LogChunk text, UTF-8) of a team's jobs, against TEAM_OUTPUT_MAX_BYTES:
    counted as chunks are stored, counted again from the chunks when old output is pruned (hourly)."""

    team = models.OneToOneField("quotas.Team", on_delete=models.CASCADE, primary_key=True, related_name="+")
    bytes = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.team_id}: {self.bytes} bytes of output"


class OctetLength(models.Func):
    """A text's length in bytes (UTF-8), as the agent counts its log."""

    function = "OCTET_LENGTH"
    output_field = models.BigIntegerField()

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="LENGTH(CAST(%(expressions)s AS BLOB))", **extra)
