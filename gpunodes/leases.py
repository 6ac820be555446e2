"""Leases: what the control side can trust of a host's word on time. A host's jobs may outlive its last
heartbeat by its lease (FENCE_AFTER_S and the fence's grace); past it they are gone, and may run
elsewhere. Apart from gpunodes.services so that jobs.lifecycle can ask without an import circle."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from gpunodes.choices import NodeState
from gpunodes.models import Node


def lease_s() -> float:
    """How long a host's jobs may outlive its last heartbeat the broker took: its lease and the grace of
    the fence that ends it (gpunodes/agent/fence.py); without a lease (FENCE_AFTER_S=0), until the node is
    declared LOST."""
    if settings.FENCE_AFTER_S > 0:
        return float(settings.FENCE_AFTER_S + settings.FENCE_GRACE_S)
    return float(settings.NODE_LOST_AFTER_S)


def lease_cutoff(now: datetime) -> datetime:
    """Nodes last heard before this have let their lease lapse: whatever ran there is gone (fenced), and
    may run again elsewhere."""
    return now - timedelta(seconds=lease_s() + settings.HEARTBEAT_INTERVAL_S)


def lease_end(node_name: str) -> datetime | None:
    """The latest moment a process of this node's attempts can have run, as far as the control side
    knows now: its last heartbeat and its lease. None: no lease, or never heard."""
    if settings.FENCE_AFTER_S <= 0:
        return None
    last = Node.objects.filter(name=node_name).values_list("last_heartbeat", flat=True).first()
    return None if last is None else last + timedelta(seconds=lease_s() + settings.HEARTBEAT_INTERVAL_S)


def shared_lapse(node_name: str, now: datetime, *, attempt_id: int | None = None) -> list[str]:
    """The other hosts that lost their lease at about the time this one did (its last heartbeat, give
    or take a lease and two heartbeats): still silent now, or whose attempts were fenced or lost since.
    Several hosts lapsing at once is the control plane's outage (the broker full or down), not one
    job's doing: no strike (jobs.lifecycle). [] when this host did not lapse (an agent that restarted
    at once) or it lapsed alone."""
    from jobs.choices import LostCause
    from jobs.models import Attempt

    lapse = max(float(settings.FENCE_AFTER_S), 2.0 * settings.HEARTBEAT_INTERVAL_S)
    if settings.FENCE_AFTER_S <= 0:
        lapse = float(settings.NODE_LOST_AFTER_S)
    last = Node.objects.filter(name=node_name).values_list("last_heartbeat", flat=True).first()
    if last is None or (now - last).total_seconds() < lapse:
        return []
    window = timedelta(seconds=lease_s() + 2 * settings.HEARTBEAT_INTERVAL_S)
    silent = set(
        Node.objects.exclude(name=node_name)
        .exclude(state=NodeState.PENDING)
        .filter(
            last_heartbeat__gte=last - window,
            last_heartbeat__lte=min(last + window, now - timedelta(seconds=lapse)),
        )
        .values_list("name", flat=True)
    )
    for placement in (
        Attempt.objects.filter(
            lost_cause__in=[LostCause.FENCED, LostCause.NODE_LOST], ended_at__gte=last - window
        )
        .exclude(pk=attempt_id)
        .values_list("placement", flat=True)[:1000]
    ):
        silent.update(p.get("node") for p in placement or () if p.get("node") != node_name)
    return sorted(n for n in silent if n)
