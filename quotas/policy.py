"""The scheduling policy: one pure function from a snapshot to a plan.

This module owns the semantics of ../shared/spec/SEMANTICS.md. It imports nothing from Django and does
no I/O: production passes (quotas/scheduler.py), the simulator (quotas/simulate.py), queue positions,
ETAs and the what-if preview all call `plan()` and the accounting helpers here. Never a second copy.

Identifiers (job ids, attempt ids) are opaque hashable, orderable values: ints in production, strings
in the simulator. Times are seconds (epoch in production, virtual in the simulator).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

RESERVE = "RESERVE"
LEND = "LEND"
LEND_AND_BORROW = "LEND_AND_BORROW"
STRATEGIES = (RESERVE, LEND, LEND_AND_BORROW)

RECLAIM = "RECLAIM"
PRIORITY = "PRIORITY"

ADMITTED_OWN = "ADMITTED_OWN"
ADMITTED_BORROWED = "ADMITTED_BORROWED"

UNASSIGNED = "(unassigned)"
UNLIMITED = -1

# placement: ((node name, (gpu index, ...)), ...); one entry for a single-node job, several for a gang.
Placement = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    gpu_type: str
    gpus: int  # GPU indexes are 0..gpus-1
    # READY nodes count as capacity and take new work. A cordoned/draining node is passed with
    # schedulable=False so that the attempts still running on it are known, but it adds no capacity.
    schedulable: bool = True


@dataclass(frozen=True, slots=True)
class ShareView:
    name: str
    capacity: Mapping[str, int]  # gpu_type -> own (guaranteed) GPUs
    strategy: str = LEND_AND_BORROW
    borrow_limit: int = UNLIMITED  # percent of own capacity per type; -1 = no limit
    in_share_preemption: bool = False


@dataclass(frozen=True, slots=True)
class RunningView:
    """An admitted or running attempt; it holds its GPUs until it is gone from the snapshot."""

    attempt_id: Hashable
    job_id: Hashable
    share: str
    gpu_type: str
    priority: int
    submitted_at: float
    started_at: float
    placement: Placement
    borrowed: bool  # as admitted (or as last classified); see borrowed_attempts()
    # In its pre-emption grace period: its GPUs count as being freed and it is never chosen again.
    preempting: bool = False
    # The job the pre-emption made room for (rule 7), when preempting.
    beneficiary_job_id: Hashable | None = None

    @property
    def gpus(self) -> int:
        return sum(len(idx) for _, idx in self.placement)


@dataclass(frozen=True, slots=True)
class QueuedView:
    job_id: Hashable
    share: str
    gpu_type: str
    gpus: int
    priority: int
    submitted_at: float
    # Pre-emptions were decided for this job and it has not been admitted since: it goes ahead of
    # everything else that arrived (rule 7).
    beneficiary: bool = False


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeView, ...]
    shares: tuple[ShareView, ...]
    running: tuple[RunningView, ...] = ()
    queued: tuple[QueuedView, ...] = ()
    starvation_s: float = 3600


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: Hashable
    share: str
    placement: Placement
    borrowed: bool
    reason: str  # ADMITTED_OWN or ADMITTED_BORROWED
    lenders: tuple[str, ...] = ()  # for a borrowed admission: who it draws from (UNASSIGNED included)


@dataclass(frozen=True, slots=True)
class Preemption:
    attempt_id: Hashable
    job_id: Hashable
    share: str
    reason: str  # RECLAIM or PRIORITY
    beneficiary_job_id: Hashable
    beneficiary_share: str


@dataclass(frozen=True, slots=True)
class Plan:
    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    # job_id -> a sentence saying why a queued job still waits ("share at capacity, nothing idle to
    # borrow", "waiting for reclaim from share X", "needs 8 free GPUs on one node").
    waiting: Mapping[Hashable, str] = field(default_factory=dict)


def plan(snapshot: Snapshot) -> Plan:
    raise NotImplementedError
