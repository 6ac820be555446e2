"""Whether the control side hears the cluster: the witness behind declaring a node LOST.

A node is declared LOST when its heartbeats were missing for NODE_LOST_AFTER_S *while the control side
was hearing heartbeats from other nodes*. When no heartbeat arrives from anyone (the broker, the
database or the control worker down, or every agent gone at once), the silence says nothing about any
one node: nothing is declared LOST, and once heartbeats arrive again every node has a fresh
NODE_LOST_AFTER_S to check in. An outage of the control side is therefore an alert (a metric, a banner
on the overview), never a mass node failure that re-queues work the agents still run.

"Hearing since" is kept by the scheduling pass (`SchedulerPass.hearing_since`, one pass at a time): a
pass that sees a heartbeat from some node within `gap_s()` and follows the previous pass within
`gap_s()` carries the previous pass's value on; otherwise the hearing starts again (now), or stops
(null). A gap between passes counts as a gap in hearing because passes and heartbeats are handled by
the same control worker: when it comes back, heartbeats from its backlog may be applied after the
first pass.

With a single node there is no other witness: its silence cannot be told from the control side's own,
so it is never declared LOST; its jobs stay on record as running until its agent heartbeats again
(a restarted agent's first heartbeat ends what it no longer runs, and those jobs are re-queued). There
is no other node to run them on meanwhile (README, "Failures and timing").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db.models import Max

from gpunodes.models import Node
from quotas.models import SchedulerPass


def gap_s() -> float:
    """A silence this long (no heartbeat from any node, or no scheduling pass) is an outage of the
    control side's hearing: a few heartbeat and pass intervals, and at most half of NODE_LOST_AFTER_S
    (an outage that it does not notice must stay well short of one that would lose nodes)."""
    return min(
        max(3.0 * settings.HEARTBEAT_INTERVAL_S, 3.0 * settings.SCHEDULER_INTERVAL_S),
        settings.NODE_LOST_AFTER_S / 2,
    )


def latest_heartbeat() -> datetime | None:
    """The latest heartbeat the control side heard from any node (one query)."""
    return Node.objects.aggregate(latest=Max("last_heartbeat"))["latest"]


def hearing_since(now: datetime, previous: tuple[datetime, datetime | None] | None) -> datetime | None:
    """The pass's view: since when heartbeats have been heard without a gap (None: none heard now).
    `previous` is the previous pass's (started_at, hearing_since)."""
    gap = timedelta(seconds=gap_s())
    latest = latest_heartbeat()
    if latest is None or now - latest > gap:
        return None
    if previous is None or previous[1] is None or now - previous[0] > gap:
        return now  # heard again (or for the first time): every node gets a fresh NODE_LOST_AFTER_S
    return previous[1]


def lost_cutoff(now: datetime, since: datetime | None) -> datetime | None:
    """Nodes whose last heartbeat is older than this are LOST; None while no node may be declared LOST
    (not hearing, or hearing for less than NODE_LOST_AFTER_S)."""
    cutoff = now - timedelta(seconds=settings.NODE_LOST_AFTER_S)
    if since is None or since > cutoff:
        return None
    return cutoff


def agent_started_at(boot_id: str) -> datetime | None:
    """When the agent process behind a boot id started, by its host's clock: boot ids begin with it in
    milliseconds (gpunodes.agent.main.new_boot_id); None for ids without it (older agents)."""
    head = boot_id.split("-", 1)[0]
    if len(head) != 14 or not head.isdigit():
        return None
    return datetime.fromtimestamp(int(head) / 1000, tz=UTC)


def silence_before(since: datetime) -> float | None:
    """How long no node was heard before the hearing that began at `since`, or None when it began with
    the cluster's start: no pass had ever heard a node, or every agent heard since then started after
    the last pass that heard one (a first start, `make run` again after Ctrl-C, every host rebooted).
    Then nothing ran unheard, so there is nothing to warn about; a silence that agents ran through (the
    broker, the database or the control worker away) is one."""
    last_heard = (
        SchedulerPass.objects.filter(started_at__lt=since, hearing_since__isnull=False)
        .order_by("-started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    if last_heard is None:
        return None
    boots = Node.objects.filter(last_heartbeat__gte=since - timedelta(seconds=gap_s())).values_list(
        "boot_id", flat=True
    )
    started = [agent_started_at(b) for b in boots]
    if started and all(s is not None and s > last_heard for s in started):
        return None
    return max(0.0, (since - last_heard).total_seconds())


@dataclass(frozen=True)
class Hearing:
    """What the dashboard and the metrics say about it (read side, two queries, one with `latest`; two
    more while heartbeats have been heard again for less than NODE_LOST_AFTER_S)."""

    nodes: bool  # some node has ever heartbeated
    silence_s: float  # since the latest heartbeat from any node (0 without nodes)
    outage: bool  # no heartbeat from any node, or no pass, within gap_s()
    suspended: bool  # a silent node would not be declared LOST now
    resumed_s: float | None  # how long heartbeats have been heard again (while suspended after a gap)
    # While resumed: how long no node was heard before (None: the hearing began with the cluster's start).
    silence_before_s: float | None = None
    # While resumed: how long until a silent node may be declared LOST again.
    checks_resume_in_s: float | None = None


def hearing(now: datetime, latest: datetime | None | bool = False) -> Hearing:
    """`latest`: the latest heartbeat of any node where the caller has read it already."""
    if latest is False:
        latest = latest_heartbeat()
    if latest is None:
        return Hearing(nodes=False, silence_s=0.0, outage=False, suspended=False, resumed_s=None)
    gap = timedelta(seconds=gap_s())
    last_pass = (
        SchedulerPass.objects.order_by("-started_at").values_list("started_at", "hearing_since").first()
    )
    silence = max(0.0, (now - latest).total_seconds())
    passes_stopped = last_pass is None or now - last_pass[0] > gap
    outage = now - latest > gap or passes_stopped
    since = None if passes_stopped else last_pass[1]
    suspended = outage or lost_cutoff(now, since) is None
    resumed = None if outage or since is None else max(0.0, (now - since).total_seconds())
    before = resume_in = None
    if suspended and resumed is not None:
        before = silence_before(since)
        resume_in = float(max(0, math.ceil(settings.NODE_LOST_AFTER_S - resumed)))
    return Hearing(
        nodes=True,
        silence_s=silence,
        outage=outage,
        suspended=suspended,
        resumed_s=resumed,
        silence_before_s=before,
        checks_resume_in_s=resume_in,
    )
