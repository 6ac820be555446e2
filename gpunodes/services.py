"""Node verbs: register an inventory, cordon, uncordon, drain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str = ""
    memory_mb: int = 0


def fake_inventory(
    node_name: str, count: int, model: str = "NVIDIA A10G", memory_mb: int = 23028
) -> list[GpuInfo]:
    """An explicit fake inventory for hosts without GPUs (tests, the demo)."""
    return [GpuInfo(i, f"GPU-fake-{node_name}-{i}", model, memory_mb) for i in range(count)]


@transaction.atomic
def node_register(
    *,
    name: str,
    gpu_type: str,
    gpus: Sequence[GpuInfo],
    hostname: str = "",
    agent_version: str = "",
    labels: dict | None = None,
    state: str | None = None,
) -> tuple[Node, bool]:
    """Create or update a node and make its GPU rows match the inventory. Returns (node, created).
    GPUs the host no longer reports are removed unless an attempt still holds them."""
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "gpu_type": gpu_type,
            "state": state or NodeState.READY,
            "hostname": hostname,
            "agent_version": agent_version,
            "labels": labels or {},
        },
    )
    if not created:
        changed = []
        for field, value in (
            ("gpu_type", gpu_type),
            ("hostname", hostname),
            ("agent_version", agent_version),
        ):
            if value and getattr(node, field) != value:
                setattr(node, field, value)
                changed.append(field)
        if labels is not None and node.labels != labels:
            node.labels = labels
            changed.append("labels")
        if state and node.state != state:
            node.state = state
            node.state_changed_at = timezone.now()
            changed += ["state", "state_changed_at"]
        if changed:
            node.save(update_fields=changed)
    existing = {g.index: g for g in node.gpus.all()}
    reported = {g.index: g for g in gpus}
    for index, info in reported.items():
        row = existing.get(index)
        if row is None:
            Gpu.objects.create(
                node=node, index=index, uuid=info.uuid, model=info.model, memory_mb=info.memory_mb
            )
        elif (row.uuid, row.model, row.memory_mb) != (info.uuid, info.model, info.memory_mb):
            row.uuid, row.model, row.memory_mb = info.uuid, info.model, info.memory_mb
            row.save(update_fields=["uuid", "model", "memory_mb"])
    gone = [i for i in existing if i not in reported]
    if gone:
        node.gpus.filter(index__in=gone, claim__isnull=True).delete()
    return node, created
