"""Choices of the gpunodes app, in one place."""

from django.db import models


class NodeState(models.TextChoices):
    # A node heard of for the first time, not yet accepted by an admin (or a join token): no work.
    PENDING = "PENDING", "Pending acceptance"
    READY = "READY", "Ready"
    CORDONED = "CORDONED", "Cordoned"
    DRAINING = "DRAINING", "Draining"
    LOST = "LOST", "Lost"


# Only READY nodes count as capacity and take new work (SEMANTICS.md, "Capacity").
SCHEDULABLE_STATES = frozenset({NodeState.READY})
# Nodes whose running attempts still hold GPUs (a LOST node's attempts are ended by the pass).
HOLDING_STATES = frozenset({NodeState.READY, NodeState.CORDONED, NodeState.DRAINING})


class GpuHealth(models.TextChoices):
    HEALTHY = "HEALTHY", "Healthy"
    # Found broken by its agent (gpunodes/agent/health.py): out of capacity until an admin marks it
    # healthy and its agent's re-check agrees.
    UNHEALTHY = "UNHEALTHY", "Unhealthy"
    # Marked healthy by an admin, waiting for its agent's re-check: still out of capacity.
    CHECKING = "CHECKING", "Re-checking"


class GpuFailureReason(models.TextChoices):
    """Why an agent found a GPU broken (the heartbeat's `unhealthy[].reason`)."""

    XID = "xid", "Critical Xid error"
    ECC = "ecc", "Uncorrectable ECC error"
    RETIRED_PAGES = "retired_pages", "Pages pending retirement"
    ROW_REMAP = "row_remap", "Row remapping pending or failed"
    OFF_BUS = "off_bus", "Fallen off the bus"
    STUCK_PROCESS = "stuck_process", "A process that cannot be reaped"
