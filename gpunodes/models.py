"""GPU hosts and their GPUs, as registered and kept alive by the agent's heartbeats; the GPUs' health and
the record of their failures."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from gpunodes.choices import GpuFailureReason, GpuHealth, NodeState
from quotas.models import gpu_type_validator

NODE_NAME_RE = r"^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$"
node_name_validator = RegexValidator(
    NODE_NAME_RE, "Use 1 to 63 letters, digits, dots, underscores or hyphens."
)


class Node(models.Model):
    name = models.CharField(max_length=63, unique=True, validators=[node_name_validator])
    gpu_type = models.CharField(max_length=32, validators=[gpu_type_validator])
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.READY)
    hostname = models.CharField(max_length=255, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    agent_version = models.CharField(max_length=32, blank=True)
    # Changes every time the agent process starts: a new boot means the host forgot what it ran.
    boot_id = models.CharField(max_length=64, blank=True)
    # When its agent sent the last heartbeat applied (the host's clock, at most MESSAGE_CLOCK_SKEW_S
    # ahead of ours): one sent before it is late, and dropped (gpunodes.services.node_heartbeat).
    last_sent_at = models.FloatField(null=True, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    # Where its peers reach it (its agent's --advertise-address): a multi-node job's MASTER_ADDR when
    # this node is rank 0, and its entry in GPUQUOTA_HOSTS.
    address = models.CharField(max_length=253, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=NodeState.values), name="node_state_valid"),
        ]
        indexes = [models.Index(fields=["state", "gpu_type"], name="node_state_type_idx")]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64)
    model = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(default=0)
    # Only HEALTHY GPUs count as capacity (quotas.scheduler.load_snapshot). Why not, and since when.
    health = models.CharField(max_length=16, choices=GpuHealth.choices, default=GpuHealth.HEALTHY)
    health_reason = models.CharField(max_length=16, choices=GpuFailureReason.choices, blank=True)
    health_detail = models.CharField(max_length=300, blank=True)
    health_changed_at = models.DateTimeField(null=True, blank=True)
    # The token of the latest re-check asked for (an admin's mark-healthy): the agent's answer names it.
    recheck = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index"),
            models.UniqueConstraint(fields=["uuid"], name="gpu_unique_uuid"),
            models.CheckConstraint(condition=Q(health__in=GpuHealth.values), name="gpu_health_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"


class GpuFailure(models.Model):
    """A GPU found broken: what its agent said, when, and who brought it back (kept as history; the
    counter of GPU failures by reason, quotas.metrics, counts these rows)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpu_failures")
    gpu = models.ForeignKey(Gpu, on_delete=models.SET_NULL, null=True, blank=True, related_name="failures")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64)
    reason = models.CharField(max_length=16, choices=GpuFailureReason.choices)
    detail = models.CharField(max_length=300, blank=True)
    found_at = models.DateTimeField()  # when the agent found it (its clock, bounded by ours)
    recorded_at = models.DateTimeField(auto_now_add=True)
    cleared_at = models.DateTimeField(null=True, blank=True)
    cleared_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-found_at", "-id"]
        indexes = [models.Index(fields=["reason"], name="gpufailure_reason_idx")]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index} {self.reason} at {self.found_at:%Y-%m-%d %H:%M:%S}"
