"""Teams, their members, and the quota shares they own (SEMANTICS.md, "Shares")."""

import uuid

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from quotas.choices import Role, ShareState, Strategy

SHARE_NAME_RE = r"^[a-z0-9-]{1,63}$"
GPU_TYPE_RE = r"^[a-z0-9][a-z0-9-]{0,31}$"

share_name_validator = RegexValidator(SHARE_NAME_RE, "Use 1 to 63 lower-case letters, digits or hyphens.")
gpu_type_validator = RegexValidator(GPU_TYPE_RE, "A GPU type is a lower-case name such as a10g or h100.")


def min_runtime_validator(value) -> None:
    """A share's protection window within its one limit (jobs.limits.MIN_RUNTIME), in its one sentence:
    what the Django admin says too."""
    from django.core.exceptions import ValidationError

    from jobs.limits import MIN_RUNTIME

    if problem := MIN_RUNTIME.problem(value):
        raise ValidationError(problem)


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    slug = models.SlugField(max_length=63, unique=True)
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="teams", blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="membership_unique_team_user"),
            models.CheckConstraint(condition=Q(role__in=Role.values), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class Group(models.Model):
    """A node of the organisation tree (SEMANTICS.md "Groups: the organisation tree"): a department, a
    team, a project. Its shares are its leaves; it owns no GPUs of its own. Changed only through the
    layout document (quotas.layout), which checks the whole tree (no cycle, at most 4 levels, names
    unique among groups and shares) before it writes."""

    name = models.CharField(max_length=63, unique=True, validators=[share_name_validator])
    # None: directly under the cluster. PROTECT: the layout moves or removes the children first.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.PROTECT, related_name="children"
    )
    weight = models.FloatField(default=1)  # how strongly its subtree competes for idle capacity
    # Percent of its subtree's capacity per type it may take from outside / lend outside; -1 = no limit.
    borrow_limit = models.IntegerField(default=-1)
    lend_limit = models.IntegerField(default=-1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(weight__gt=0), name="group_weight_gt_0"),
            models.CheckConstraint(condition=Q(borrow_limit__gte=-1), name="group_borrow_limit_gte_-1"),
            models.CheckConstraint(
                condition=Q(lend_limit__gte=-1, lend_limit__lte=100), name="group_lend_limit_range"
            ),
        ]

    def __str__(self) -> str:
        return self.name


class FairSharing(models.Model):
    """The cluster's fair-sharing settings (one row, pk 1; part of the layout document's `settings`):
    the half-life of the borrowing history (0: no history) and whether rule 11's fair reclaim is on."""

    fair_share_half_life_s = models.PositiveIntegerField(default=0)
    fair_reclaim = models.BooleanField(default=False)

    class Meta:
        verbose_name_plural = "fair sharing"

    def __str__(self) -> str:
        return (
            f"half-life {self.fair_share_half_life_s} s, fair reclaim {'on' if self.fair_reclaim else 'off'}"
        )

    @classmethod
    def current(cls) -> "FairSharing":
        return cls.objects.filter(pk=1).first() or cls(pk=1)


class FairShareHistory(models.Model):
    """Each share's and group's decayed borrowing history per GPU type (quotas.engine.tree
    .FairShareHistory.to_dict: {"half_life_s", "at", "values": {name: {type: GPUs}}}), advanced by every
    production pass. One row (pk 1): written once per pass, read whole by the next."""

    data = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "fair-share history"

    def __str__(self) -> str:
        return f"fair-share history at {self.updated_at:%Y-%m-%d %H:%M:%S}"


class Share(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[share_name_validator])
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="shares")
    description = models.CharField(max_length=200, blank=True)
    strategy = models.CharField(max_length=16, choices=Strategy.choices, default=Strategy.LEND_AND_BORROW)
    # Percent of own capacity per type that may be borrowed; -1 = no limit. Only LEND_AND_BORROW.
    borrow_limit = models.IntegerField(default=-1, validators=[MinValueValidator(-1)])
    in_share_preemption = models.BooleanField(default=False)
    # Rule 10: an attempt of this share is protected from reclaim and in-share pre-emption until it has
    # run this long since its start (0: never protected). At most MAX_MIN_RUNTIME_S (jobs/limits.py).
    # db_default: rows written by a release without the column (a rolling upgrade) get 0 too.
    min_runtime_s = models.PositiveIntegerField(default=0, db_default=0, validators=[min_runtime_validator])
    state = models.CharField(max_length=16, choices=ShareState.choices, default=ShareState.ENABLED)
    # Its place in the organisation tree (None: directly under the cluster) and how strongly it competes
    # for idle capacity with its siblings. db_default: rows of a release without the columns get them.
    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.PROTECT, related_name="shares")
    weight = models.FloatField(default=1, db_default=1)
    # Container images this share's jobs may run besides the cluster's ALLOWED_IMAGES (jobs/images.py).
    allowed_images = models.JSONField(default=list, db_default=[], blank=True)
    # Host directories its container jobs may mount read-only besides ALLOWED_MOUNTS (jobs/mounts.py).
    allowed_mounts = models.JSONField(default=list, db_default=[], blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(weight__gt=0), name="share_weight_gt_0"),
            models.CheckConstraint(condition=Q(strategy__in=Strategy.values), name="share_strategy_valid"),
            models.CheckConstraint(condition=Q(state__in=ShareState.values), name="share_state_valid"),
            models.CheckConstraint(condition=Q(borrow_limit__gte=-1), name="share_borrow_limit_gte_-1"),
            models.CheckConstraint(condition=Q(min_runtime_s__gte=0), name="share_min_runtime_s_gte_0"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_enabled(self) -> bool:
        return self.state == ShareState.ENABLED

    def capacity_map(self) -> dict[str, int]:
        # Uses the prefetch cache when the caller prefetched `capacities`.
        return {c.gpu_type: c.max_gpus for c in self.capacities.all()}


class ShareCapacity(models.Model):
    share = models.ForeignKey(Share, on_delete=models.CASCADE, related_name="capacities")
    gpu_type = models.CharField(max_length=32, validators=[gpu_type_validator])
    max_gpus = models.PositiveIntegerField()

    class Meta:
        ordering = ["share", "gpu_type"]
        verbose_name_plural = "share capacities"
        constraints = [
            models.UniqueConstraint(fields=["share", "gpu_type"], name="sharecapacity_unique_type"),
            models.CheckConstraint(condition=Q(max_gpus__gte=0), name="sharecapacity_max_gpus_gte_0"),
        ]

    def __str__(self) -> str:
        return f"{self.share}: {self.max_gpus} × {self.gpu_type}"


class SchedulerPass(models.Model):
    """What one scheduling pass saw and did, for operators and the metrics (the last few thousand)."""

    started_at = models.DateTimeField(db_index=True)
    duration_ms = models.FloatField(default=0)
    plan_ms = models.FloatField(default=0)
    trigger = models.CharField(max_length=64, blank=True)
    queued = models.PositiveIntegerField(default=0)
    running = models.PositiveIntegerField(default=0)
    admitted = models.PositiveIntegerField(default=0)
    preempted = models.PositiveIntegerField(default=0)
    ended = models.PositiveIntegerField(default=0)  # attempts ended by the pass (lost nodes, stop timeouts)
    # Since when the control side has heard heartbeats without a gap, as this pass saw it (null: it heard
    # none); a node is declared LOST only once this is NODE_LOST_AFTER_S old (quotas/hearing.py).
    hearing_since = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self) -> str:
        return f"pass at {self.started_at:%H:%M:%S}: +{self.admitted} admitted, {self.preempted} pre-empted"


class UsageSample(models.Model):
    """GPUs a share used at one instant, per type: the history behind the dashboard's charts.

    Written every minute by a beat task (`quotas.tasks.sample_usage`); samples older than a day are
    thinned to one per `resolution_s` bucket and all are pruned after 90 days, so charts stay fast."""

    at = models.DateTimeField()
    share = models.ForeignKey(Share, on_delete=models.CASCADE, related_name="usage_samples")
    gpu_type = models.CharField(max_length=32)
    capacity = models.PositiveIntegerField(default=0)
    own = models.FloatField(default=0)
    borrowed = models.FloatField(default=0)
    lent = models.FloatField(default=0)
    queued_gpus = models.PositiveIntegerField(default=0)
    running_jobs = models.PositiveIntegerField(default=0)
    queued_jobs = models.PositiveIntegerField(default=0)
    resolution_s = models.PositiveIntegerField(default=60)  # 60 while fresh, larger once downsampled

    class Meta:
        ordering = ["at"]
        indexes = [
            models.Index(fields=["at"], name="usagesample_at"),
            models.Index(fields=["share", "gpu_type", "at"], name="usagesample_share_type_at"),
        ]

    def __str__(self) -> str:
        return f"{self.share_id}/{self.gpu_type} at {self.at:%Y-%m-%d %H:%M}"


class AuditEntry(models.Model):
    """Who changed what, when, with the values before and after: every admin change to shares, teams
    and nodes, whichever door (admin, dashboard, API) it came through."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True)  # kept when the user is deleted
    action = models.CharField(max_length=32)  # create / update / delete / cordon / drain / ...
    object_type = models.CharField(max_length=32)  # share / team / node
    object_id = models.CharField(max_length=64)
    object_repr = models.CharField(max_length=200)
    before = models.JSONField(default=dict, blank=True)
    after = models.JSONField(default=dict, blank=True)
    # What changed, field by field: [{"object": "share vision-main", "field": "capacity.a10g",
    # "before": 4, "after": 8}, ...] (a layout version: every change it made; else from before/after).
    changes = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "audit entries"
        indexes = [models.Index(fields=["object_type", "object_id", "at"], name="audit_object_at")]

    def __str__(self) -> str:
        return (
            f"{self.at:%Y-%m-%d %H:%M} {self.actor_name} {self.action} {self.object_type} {self.object_repr}"
        )


class ForecastKind(models.TextChoices):
    BOUND = "bound", "bound"
    ESTIMATE = "estimate", "estimate"
    NONE = "none", "none"


def likely_range(eta, low, high) -> tuple:
    """A stored forecast's likely range as it is shown (SEMANTICS "Ranges"): widened to hold its ETA
    (the range replays may have run on a slightly older state than the point ETA); (None, None) without
    an ETA or before the range replays reached the job. The one reading of QueueForecast's and
    ForecastRecord's eta_low/eta_high: pages, API, CLI and the track record all go through it."""
    if eta is None or low is None or high is None:
        return None, None
    return min(low, eta), max(high, eta)


class QueueForecast(models.Model):
    """A queued job's forecast (SEMANTICS "Forecast"), as the control worker last computed it after a
    pass: its position, ETA with what the ETA rests on, and why it waits. Pages, API and CLI read this
    row and show its age; no web request replays the queue. Rows of jobs no longer queued go at the
    next write."""

    # On PostgreSQL the table is UNLOGGED (migration 0007): a cache rewritten whole after passes, so a
    # crash that empties it costs only the seconds until the next forecast.
    # No foreign key constraint in the database: checking 100k of them at the commit of each stored
    # forecast took 0.85 s of its 9.9 s (bench 5), and a job deleted while the forecast ran would fail
    # the whole write. Deleting a job through the ORM still deletes its row (CASCADE is Django's); a row
    # left by any other delete is never read (readers go through the job) and goes at the next write.
    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="forecast", db_constraint=False
    )
    position_in_share = models.PositiveIntegerField()
    position_overall = models.PositiveIntegerField()
    eta = models.DateTimeField(null=True, blank=True)
    # The likely range of the start (10th to 90th percentile, SEMANTICS "Ranges"); null until the range
    # replays ran for it, and read together with `eta` (a reader widens it to hold the ETA).
    eta_low = models.DateTimeField(null=True, blank=True)
    eta_high = models.DateTimeField(null=True, blank=True)
    kind = models.CharField(max_length=8, choices=ForecastKind.choices)
    basis = models.CharField(max_length=400, blank=True)  # what the ETA rests on, or why there is none
    reason = models.CharField(max_length=400, blank=True)  # why it waits now
    computed_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["position_overall"], name="queueforecast_overall")]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=ForecastKind.values), name="queueforecast_kind_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: #{self.position_overall}, {self.kind}"


class ForecastRecord(models.Model):
    """What a job was told when it was first forecast (its ETA and range, soon after its submit) beside
    when it actually started: a share's track record (SEMANTICS "Track record"). Written once per job by
    the stored forecast that first reached it; `started_at` when its first attempt starts."""

    job = models.OneToOneField(
        "jobs.Job", on_delete=models.CASCADE, primary_key=True, related_name="forecast_record"
    )
    share = models.ForeignKey(Share, on_delete=models.CASCADE, related_name="forecast_records")
    submitted_at = models.DateTimeField()
    forecast_at = models.DateTimeField()  # when that forecast was made
    eta = models.DateTimeField(null=True, blank=True)
    eta_low = models.DateTimeField(null=True, blank=True)
    eta_high = models.DateTimeField(null=True, blank=True)
    kind = models.CharField(max_length=8, choices=ForecastKind.choices)
    started_at = models.DateTimeField(null=True, blank=True)  # its first attempt's start

    class Meta:
        indexes = [
            models.Index(fields=["share", "-forecast_at"], name="forecastrecord_share_at"),
            models.Index(fields=["started_at"], name="forecastrecord_started"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.kind} forecast at {self.forecast_at:%Y-%m-%d %H:%M}"


class PlanState(models.TextChoices):
    PLANNED = "PLANNED", "planned"
    APPLIED = "APPLIED", "applied"


class LayoutPlan(models.Model):
    """A planned change of the layout (quotas.layout.plan): the layout it is to become, the diff from
    the layout it started from (whose hash it keeps: apply refuses if the layout changed since), its
    effects now, its temporary changes, and the what-if run that replays last week with it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_by_name = models.CharField(max_length=150, blank=True)
    base_hash = models.CharField(max_length=64)
    base_version = models.PositiveIntegerField(null=True, blank=True)  # the latest version when planned
    rollback_to = models.PositiveIntegerField(null=True, blank=True)  # plan --rollback N
    document = models.JSONField()  # the layout it is to become (quotas.layoutdoc, normalised)
    diff = models.JSONField(default=list)
    effects = models.JSONField(default=dict)  # now: borrowed, never runnable, over-commit; warnings
    temporary = models.JSONField(default=list)  # [{share, until, fields: {path: [before, after]}}]
    whatif_run = models.CharField(max_length=32, blank=True)
    state = models.CharField(max_length=16, choices=PlanState.choices, default=PlanState.PLANNED)
    applied_at = models.DateTimeField(null=True, blank=True)
    version = models.OneToOneField(
        "LayoutVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="plan"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=PlanState.values), name="layoutplan_state_valid")
        ]

    def __str__(self) -> str:
        return f"plan {self.pk} ({self.state})"


class VersionKind(models.TextChoices):
    APPLY = "apply", "applied"
    ROLLBACK = "rollback", "rollback"
    REVERT = "revert", "temporary change ended"


class LayoutVersion(models.Model):
    """Every applied layout: who, when, the diff from the one before, and the whole layout after it."""

    number = models.PositiveIntegerField(unique=True)
    applied_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    actor_name = models.CharField(max_length=150, blank=True)  # empty: the system (a revert)
    kind = models.CharField(max_length=16, choices=VersionKind.choices, default=VersionKind.APPLY)
    diff = models.JSONField(default=list)
    document = models.JSONField()
    # Version 1's only: the layout before it (as the seed, the admin or an older gpuquota left it), so that
    # there is a rollback to it (`rollback 0`); null where version 1 was applied before it was kept.
    before = models.JSONField(null=True, blank=True)
    hash = models.CharField(max_length=64)
    note = models.CharField(max_length=400, blank=True)

    class Meta:
        ordering = ["-number"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=VersionKind.values), name="layoutversion_kind_valid")
        ]

    def __str__(self) -> str:
        return f"layout version {self.number}"


class TemporaryState(models.TextChoices):
    PENDING = "PENDING", "pending"
    REVERTED = "REVERTED", "reverted"
    PARTLY = "PARTLY", "partly reverted"
    SKIPPED = "SKIPPED", "skipped"


class TemporaryChange(models.Model):
    """Fields of one share that an applied plan changed `until` a time: then the control side sets
    them back (quotas.layout.revert_due), once, each field only if it still holds the value this change
    gave it (a later change is never undone)."""

    version = models.ForeignKey(LayoutVersion, on_delete=models.CASCADE, related_name="temporary_changes")
    share = models.ForeignKey(
        Share, null=True, blank=True, on_delete=models.SET_NULL, related_name="temporary_changes"
    )
    share_name = models.CharField(max_length=63)  # as applied
    until = models.DateTimeField()
    fields = models.JSONField()  # {"capacity.a100": [before, after], "state": [before, after]}
    state = models.CharField(max_length=16, choices=TemporaryState.choices, default=TemporaryState.PENDING)
    done_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=400, blank=True)
    revert_version = models.ForeignKey(
        LayoutVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["until", "id"]
        indexes = [models.Index(fields=["state", "until"], name="temporarychange_due")]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=TemporaryState.values), name="temporarychange_state_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.share_name} until {self.until:%Y-%m-%d %H:%M} ({self.state})"
