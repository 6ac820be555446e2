"""GPU hosts and their GPUs, as registered and kept alive by the agent's heartbeats."""

from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from gpunodes.choices import NodeState
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

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index"),
            models.UniqueConstraint(fields=["uuid"], name="gpu_unique_uuid"),
        ]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"
