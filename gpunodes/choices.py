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
