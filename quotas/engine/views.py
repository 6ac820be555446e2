"""What the policy sees and decides (plain data: nodes, shares, running attempts, queued jobs, a
snapshot of them, a plan), and the accounting everyone reads from a snapshot: usage per share, lending,
which attempts are borrowed, whether a job can ever fit a share. Pure, like the rest of quotas/engine."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

RESERVE = "RESERVE"
LEND = "LEND"
LEND_AND_BORROW = "LEND_AND_BORROW"
STRATEGIES = (RESERVE, LEND, LEND_AND_BORROW)

RECLAIM = "RECLAIM"
PRIORITY = "PRIORITY"
FAIR_SHARE = "FAIR_SHARE"  # rule 11: fair reclaim

ADMITTED_OWN = "ADMITTED_OWN"
ADMITTED_BORROWED = "ADMITTED_BORROWED"

UNASSIGNED = "(unassigned)"
UNLIMITED = -1
_T = TypeVar("_T")

# placement: ((node name, (gpu index, ...)), ...); one entry for a single-node job, several for a gang.
Placement = tuple[tuple[str, tuple[int, ...]], ...]
# A running attempt's, as it is read: the same, or as lists (decoded JSON); never checked for tuples (a
# compiled engine checks declared types: quotas/engine/native.py).
PlacementIn = Sequence[Any]

# Views made often: those made at every pass, admission, queueing and checkpoint (RunningView, QueuedView,
# Admission, Preemption, Plan) write their __init__ out and are not `frozen`. A dataclass's generated
# __init__ is Python that `dataclasses` makes at import, even in a compiled engine (quotas/engine/native.py),
# and a frozen one sets each field through object.__setattr__: 10 % of a compiled replay. Written out,
# mypyc compiles it (3-4x faster to make one). Nothing assigns to a view after it is made (a change is a
# new view, dataclasses.replace); eq and hash are those `frozen` gave (unsafe_hash). The __init__ says the
# fields again, in order, with their defaults (a field's default_factory is None there):
# tests/quotas/test_native.py holds them to the fields.


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    gpu_type: str
    gpus: int  # GPU indexes are 0..gpus-1
    # READY nodes count as capacity and take new work. A cordoned/draining node is passed with
    # schedulable=False so that the attempts still running on it are known, but it adds no capacity.
    schedulable: bool = True


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group of the organisation tree: its parent group (None: directly under the cluster), how strongly
    its subtree competes for idle capacity with its siblings, and its limits in percent of its subtree's
    capacity per type (-1: no limit)."""

    # As given: a layout document's groups are made into GroupSpecs before validate_tree says what is
    # wrong with them (a weight as text, a limit out of range), so no type is checked on the way in.
    name: Any
    parent: Any = None  # str | None
    weight: Any = 1  # a number > 0
    borrow_limit: Any = UNLIMITED  # int
    lend_limit: Any = UNLIMITED  # int


@dataclass(frozen=True, slots=True)
class ShareView:
    name: str
    capacity: Mapping[str, int]  # gpu_type -> own (guaranteed) GPUs
    strategy: str = LEND_AND_BORROW
    borrow_limit: int = UNLIMITED  # percent of own capacity per type; -1 = no limit
    in_share_preemption: bool = False
    # An attempt of this share is protected (rule 10) until it has run this long since it started: no
    # reclaim or in-share pre-emption takes it before then.
    min_runtime_s: float = 0
    # Its place in the organisation tree (tree.py): its group (None: directly under the cluster) and how
    # strongly it competes for idle capacity with its siblings.
    group: str | None = None
    weight: Any = 1  # a number > 0 as given (validate_tree says what is wrong with any other value)


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: "Views made often", above)
class RunningView:
    """An admitted or running attempt; it holds its GPUs until it is gone from the snapshot.

    Ids (attempt, job) are orderable among themselves (all ints, or all strings): they break ties, so
    that the same snapshot always gives the same plan."""

    attempt_id: Hashable
    job_id: Hashable
    share: str
    gpu_type: str
    priority: int
    submitted_at: float
    started_at: float
    placement: PlacementIn
    borrowed: bool  # as admitted (or as last classified); see borrowed_attempts()
    # In its pre-emption grace period: its GPUs count as being freed and it is never chosen again.
    preempting: bool = False
    # The job the pre-emption made room for (rule 7), when preempting.
    beneficiary_job_id: Hashable | None = None
    # When the attempt last reported a checkpoint (SEMANTICS "Checkpoints and safe points"); None:
    # never. One before the attempt started (a stale report) counts as none.
    last_checkpoint_at: float | None = None
    # How many earlier attempts of its job a fair reclaim (rule 11) pre-empted: fair reclaim leaves a job
    # alone after fairshare.FAIR_RECLAIM_MAX_PER_JOB of them. No other rule reads it.
    fair_reclaims: int = 0

    def __init__(
        self,
        attempt_id: Hashable,
        job_id: Hashable,
        share: str,
        gpu_type: str,
        priority: int,
        submitted_at: float,
        started_at: float,
        placement: PlacementIn,
        borrowed: bool,
        preempting: bool = False,
        beneficiary_job_id: Hashable | None = None,
        last_checkpoint_at: float | None = None,
        fair_reclaims: int = 0,
    ) -> None:
        self.attempt_id = attempt_id
        self.job_id = job_id
        self.share = share
        self.gpu_type = gpu_type
        self.priority = priority
        self.submitted_at = submitted_at
        self.started_at = started_at
        self.placement = placement
        self.borrowed = borrowed
        self.preempting = preempting
        self.beneficiary_job_id = beneficiary_job_id
        self.last_checkpoint_at = last_checkpoint_at
        self.fair_reclaims = fair_reclaims

    @property
    def gpus(self) -> int:
        return sum(len(idx) for _, idx in self.placement)

    @property
    def safe_point(self) -> float:
        """The later of its start and its last reported checkpoint: what a stop now loses is the work
        since then."""
        at = self.last_checkpoint_at
        return self.started_at if at is None or at < self.started_at else at


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: "Views made often", above)
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
    # How many earlier attempts of the job a fair reclaim (rule 11) pre-empted: carried to the attempt
    # it gets next (RunningView.fair_reclaims) by whoever admits it (the forecast's replay). No rule reads
    # it here.
    fair_reclaims: int = 0

    def __init__(
        self,
        job_id: Hashable,
        share: str,
        gpu_type: str,
        gpus: int,
        priority: int,
        submitted_at: float,
        beneficiary: bool = False,
        fair_reclaims: int = 0,
    ) -> None:
        self.job_id = job_id
        self.share = share
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.priority = priority
        self.submitted_at = submitted_at
        self.beneficiary = beneficiary
        self.fair_reclaims = fair_reclaims


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: float
    nodes: tuple[NodeView, ...]
    shares: tuple[ShareView, ...]
    running: tuple[RunningView, ...] = ()
    queued: tuple[QueuedView, ...] = ()
    starvation_s: float = 3600
    # The organisation tree and fair sharing (SEMANTICS "Groups: the organisation tree", rules 5 and 11):
    # the groups (tree.GroupSpec), the history's half-life (0: no history), whether fair reclaim is on,
    # and the decayed borrowing history per (share or group name, gpu type) (tree.FairShareHistory).
    groups: tuple[GroupSpec, ...] = ()
    fair_share_half_life_s: float = 0
    fair_reclaim: bool = False
    history: Mapping[tuple[str, str], float] = field(default_factory=dict)


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: "Views made often", above)
class Admission:
    job_id: Hashable
    share: str
    placement: Placement
    borrowed: bool
    reason: str  # ADMITTED_OWN or ADMITTED_BORROWED
    lenders: tuple[str, ...] = ()  # for a borrowed admission: who it draws from (UNASSIGNED included)

    def __init__(
        self,
        job_id: Hashable,
        share: str,
        placement: Placement,
        borrowed: bool,
        reason: str,
        lenders: tuple[str, ...] = (),
    ) -> None:
        self.job_id = job_id
        self.share = share
        self.placement = placement
        self.borrowed = borrowed
        self.reason = reason
        self.lenders = lenders


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: "Views made often", above)
class Preemption:
    attempt_id: Hashable
    job_id: Hashable
    share: str
    reason: str  # RECLAIM, PRIORITY or FAIR_SHARE
    beneficiary_job_id: Hashable
    beneficiary_share: str

    def __init__(
        self,
        attempt_id: Hashable,
        job_id: Hashable,
        share: str,
        reason: str,
        beneficiary_job_id: Hashable,
        beneficiary_share: str,
    ) -> None:
        self.attempt_id = attempt_id
        self.job_id = job_id
        self.share = share
        self.reason = reason
        self.beneficiary_job_id = beneficiary_job_id
        self.beneficiary_share = beneficiary_share


@dataclass(slots=True, unsafe_hash=True)  # (not frozen: "Views made often", above)
class Plan:
    admissions: tuple[Admission, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    # job_id -> a sentence saying why a queued job still waits ("share at capacity, nothing idle to
    # borrow", "waiting for reclaim from share X", "needs 8 free GPUs on one node").
    waiting: Mapping[Hashable, str] = field(default_factory=dict)
    # job_id -> ((node, GPUs), ...) held back for a waiting job during this pass: the GPUs being freed
    # for a beneficiary (rule 7) and the node(s) a starving head job reserves (rule 6). Informational:
    # the next pass recomputes it from the snapshot.
    reserved: Mapping[Hashable, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    # job_id -> what a job that waits for protection (rule 10) waits for.
    protected: Mapping[Hashable, ProtectionWait] = field(default_factory=dict)
    # The earliest instant at which a protection window that matters to a waiting job ends: the walk
    # is to be made again then (a pass at that instant), even if nothing else changes. None: none.
    recheck_at: float | None = None
    # The pass reached a fixpoint (rules._settled says when): a pass over the state with exactly these
    # admissions started (and nothing else changed), at the same instant, decides nothing: no
    # admission, no pre-emption, no job waiting for protection. Callers that pass again until nothing
    # new is decided may skip that pass (SEMANTICS is silent on how often passes run). Without
    # admissions it also says nothing was earmarked (Engine.quiet builds on it). Not compared: it says
    # what the decisions lead to, not what they are.
    settled: bool = field(default=False, compare=False)

    def __init__(
        self,
        admissions: tuple[Admission, ...] = (),
        preemptions: tuple[Preemption, ...] = (),
        waiting: Mapping[Hashable, str] | None = None,
        reserved: Mapping[Hashable, tuple[tuple[str, int], ...]] | None = None,
        protected: Mapping[Hashable, ProtectionWait] | None = None,
        recheck_at: float | None = None,
        settled: bool = False,
    ) -> None:
        self.admissions = admissions
        self.preemptions = preemptions
        self.waiting = {} if waiting is None else waiting
        self.reserved = {} if reserved is None else reserved
        self.protected = {} if protected is None else protected
        self.recheck_at = recheck_at
        self.settled = settled


@dataclass(frozen=True, slots=True)
class ProtectionWait:
    """Rule 10: a job that could run with protected candidates among its victims but cannot without
    them. Nothing is pre-empted for it yet; until it runs, no new borrowing of its GPU type starts."""

    attempts: tuple[Hashable, ...]  # the protected attempts its walk needs
    shares: tuple[str, ...]  # their shares, by name
    until: float  # when the last of their windows ends: a bound on this wait
    next_at: float  # when the first of them ends: the walk is made again then


def at_time(t: float) -> str:
    """An instant as a waiting reason says it: local HH:MM for epoch seconds (production), t=N s for
    the small virtual times of the simulator and the forecast's replay of it."""
    if t >= 1e9:
        return time.strftime("%H:%M", time.localtime(t))
    return f"t={t:,.0f} s"


@dataclass(frozen=True, slots=True)
class ShareUsage:
    """One share's (or the unassigned pool's) accounting for one GPU type at one instant."""

    capacity: int  # own (guaranteed) GPUs; for UNASSIGNED the pool size
    used: int  # GPUs held by its attempts
    own: int  # min(used, capacity)
    borrowed: int  # used - own
    idle: int  # capacity - own (a RESERVE share's idle GPUs are idle but not lendable)
    lent: float  # proportional share of all borrowed GPUs (SEMANTICS "Lent"); 0 for RESERVE


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------------------------------
# Accounting shared by plan() and the helpers


def lends(strategy: str) -> bool:
    return strategy in (LEND, LEND_AND_BORROW)


def neg_priority(job: QueuedView) -> int:
    return -job.priority


def queue_key(job: QueuedView) -> tuple:
    """A share's queue order as plan() considers it: beneficiaries of pre-emptions first (rule 7), then
    priority desc, submit time asc, job id asc (rule 1). For callers that list a queue (forecast, pages)."""
    return (not job.beneficiary, -job.priority, job.submitted_at, job.job_id)


def borrowed_order_key(run: RunningView) -> tuple:
    # Sorted descending: attempts admitted as borrowed first, then the most recently started, then
    # later in queue order (rule 8). So a lowered capacity makes the newest work borrowed and an own
    # job ending turns the oldest borrowed attempt back into own.
    return (run.borrowed, run.started_at, run.submitted_at, run.job_id, run.attempt_id)


def victim_key(run: RunningView) -> tuple:
    # Sorted descending (rules 3 and 4): lowest priority first, then the most recent safe point (the
    # least work lost; with no checkpoints, the most recently started), then later in queue order.
    return (-run.priority, run.safe_point, run.submitted_at, run.job_id, run.attempt_id)


def _borrowed_part(runs: list[RunningView], capacity: int) -> list[RunningView]:
    """The attempts of one share and type that lie (wholly or partly) in its over-capacity part.

    An attempt counts as borrowed if any of its GPUs is over capacity: a 4-GPU attempt in a share that
    borrows 2 is borrowed as a whole, because jobs are indivisible.
    """
    return _over_capacity(runs, sum(r.gpus for r in runs) - max(0, capacity), borrowed_order_key)


def _over_capacity(items: Iterable[_T], over: int, key: Callable[[_T], tuple]) -> list[_T]:
    """The items (each with `.gpus`) that make up `over` GPUs over capacity, the last in rule 8's
    order (`key`, descending) first. The pass state keeps its attempts in that order and takes them
    with take_over, as this does."""
    if over <= 0:
        return []
    return take_over(sorted(items, key=key, reverse=True), over)


def take_over(ordered: Iterable[_T], over: int) -> list[_T]:
    """The first items of `ordered` (rule 8's order, descending) that make up `over` GPUs."""
    out: list[_T] = []
    for item in ordered:
        if over <= 0:
            break
        out.append(item)
        over -= item.gpus
    return out


def _all_shares(snapshot: Snapshot) -> dict[str, ShareView]:
    """Shares by name; a share referenced by work but missing from the snapshot owns nothing and may
    borrow nothing, so its attempts are all borrowed (reclaimable) and its jobs wait."""
    shares = {s.name: s for s in snapshot.shares}
    named = {r.share for r in snapshot.running} | {q.share for q in snapshot.queued}
    for name in sorted(named - shares.keys()):
        shares[name] = ShareView(name=name, capacity={}, strategy=LEND_AND_BORROW, borrow_limit=0)
    return shares


def borrow_cap_gpus(share: ShareView, capacity: int) -> int | None:
    """GPUs of one type the share may borrow on top of its capacity; None = no limit."""
    if share.strategy != LEND_AND_BORROW:
        return 0
    if share.borrow_limit == UNLIMITED:
        return None
    return max(0, capacity) * max(0, share.borrow_limit) // 100


def borrowed_attempts(snapshot: Snapshot) -> frozenset:
    """Attempt ids that count as borrowed now (SEMANTICS: borrowed = usage - min(usage, capacity)).

    Usage includes attempts in their grace period, as SEMANTICS defines it. plan() chooses reclaim
    victims only among the attempts that are in this set and not already pre-empting.
    """
    shares = _all_shares(snapshot)
    groups: dict[tuple[str, str], list[RunningView]] = {}
    for run in snapshot.running:
        groups.setdefault((run.share, run.gpu_type), []).append(run)
    out: set = set()
    for (name, gpu_type), runs in groups.items():
        cap = shares[name].capacity.get(gpu_type, 0)
        out.update(r.attempt_id for r in _borrowed_part(runs, cap))
    return frozenset(out)


def never_fits(share: ShareView, gpu_type: str, gpus: int) -> str | None:
    """Why a job of `gpus` GPUs of `gpu_type` can never start in this share as it is configured (its
    own capacity plus what it may borrow), or None. Submit refuses such a job; plan() gives a queued
    one this reason (a capacity lowered after it was submitted)."""
    cap = max(0, share.capacity.get(gpu_type, 0))
    extra = borrow_cap_gpus(share, cap)
    if extra is None or gpus <= cap + extra:
        return None
    if share.strategy != LEND_AND_BORROW:
        return (
            f"{share.name} is {share.strategy} with {cap} {gpu_type}: a {gpus}-GPU job can never start there"
        )
    return (
        f"{share.name} may hold at most {cap + extra} {gpu_type} ({cap} own, borrow limit "
        f"{share.borrow_limit}%): a {gpus}-GPU job can never start there"
    )


_CAPACITY_MEMO: tuple[tuple[NodeView, ...], dict[str, int]] = ((), {})  # the last nodes seen -> capacity


def _schedulable_capacity(snapshot: Snapshot) -> dict[str, int]:
    global _CAPACITY_MEMO
    nodes, cluster = _CAPACITY_MEMO
    # Equal tuples of the same node objects compare by identity, element by element: cheap.
    if nodes is snapshot.nodes or (len(nodes) == len(snapshot.nodes) and nodes == snapshot.nodes):
        return dict(cluster)
    cluster = {}
    for node in snapshot.nodes:
        if node.schedulable:
            cluster[node.gpu_type] = cluster.get(node.gpu_type, 0) + max(0, node.gpus)
    _CAPACITY_MEMO = (tuple(snapshot.nodes), cluster)
    return dict(cluster)


def usage(snapshot: Snapshot, *, count_preempting: bool = True) -> dict[str, dict[str, ShareUsage]]:
    """share -> gpu_type -> ShareUsage, plus UNASSIGNED -> gpu_type for the unassigned pool.

    `count_preempting=False` counts GPUs in a grace period as already freed (the view the cover of
    rule 3 takes); the default follows SEMANTICS' definition of usage. Lent follows SEMANTICS: with B
    borrowed and L idle-lendable GPUs of a type, a lender with `idle` lendable GPUs lends
    idle * B / L. If the cover is broken (B > L) each lender lends all its idle GPUs and the rest of
    the borrowed GPUs are attributed to nobody.
    """
    used: dict[tuple[str, str], int] = {}
    for run in snapshot.running:
        if run.preempting and not count_preempting:
            continue
        key = (run.share, run.gpu_type)
        g = 0
        for _, idx in run.placement:
            g += len(idx)
        used[key] = used.get(key, 0) + g
    return usage_from(_all_shares(snapshot), used, _schedulable_capacity(snapshot))


def usage_from(
    shares: Mapping[str, ShareView], used: Mapping[tuple[str, str], int], cluster: Mapping[str, int]
) -> dict[str, dict[str, ShareUsage]]:
    """usage() from GPUs used per (share, type) and schedulable GPUs per type."""
    out: dict[str, dict[str, ShareUsage]] = {name: {} for name in sorted(shares)}
    for name, gpu_type, cap, use, own, lent in usage_rows(shares, used, cluster):
        out.setdefault(name, {})[gpu_type] = ShareUsage(cap, use, own, use - own, cap - own, lent)
    return out


def usage_rows(
    shares: Mapping[str, ShareView], used: Mapping[tuple[str, str], int], cluster: Mapping[str, int]
) -> Iterator[tuple[str, str, int, int, int, float]]:
    """(share, type, capacity, used, own, lent) per share and type that has capacity or use, and the
    unassigned pool as share UNASSIGNED, by type then name: usage()'s numbers without its objects (the
    simulator's accounting reads them after every instant)."""
    gpu_types = set(cluster) | {t for _, t in used}
    for share in shares.values():
        gpu_types.update(share.capacity)
    names = sorted(shares)
    for gpu_type in sorted(gpu_types):
        rows, factor, pool = type_usage(
            gpu_type, type_specs(shares, gpu_type, names), used, cluster.get(gpu_type, 0)
        )
        for name, cap, use, own, lend in rows:
            yield name, gpu_type, cap, use, own, lend * factor
        if pool:
            yield UNASSIGNED, gpu_type, pool, 0, 0, pool * factor


def type_specs(
    shares: Mapping[str, ShareView], gpu_type: str, names: Iterable[str]
) -> list[tuple[str, int, bool]]:
    """The shares `names` (in that order: by name) as type_usage reads them for one type: (name, capacity
    of the type, not below 0, lends)."""
    return [(n, max(0, shares[n].capacity.get(gpu_type, 0)), lends(shares[n].strategy)) for n in names]


def type_usage(
    gpu_type: str,
    specs: Iterable[tuple[str, int, bool]],
    used: Mapping[tuple[str, str], int],
    gpus: int,
) -> tuple[list[tuple[str, int, int, int, int]], float, int]:
    """One GPU type's part of usage_rows, from its shares as (name, capacity of the type (not below 0),
    lends), in name order, the GPUs used per (share, type) and the type's schedulable GPUs:
    (name, capacity, used, own, lendable idle) per share with capacity or use, the factor that makes
    lendable idle GPUs lent (SEMANTICS "Lent": borrowed / lendable, at most 1), and the unassigned
    pool (which lends `pool * factor`). The simulator's accounting calls it per type after each
    instant with its specs kept between calls."""
    rows = []
    assigned = borrowed = lendable = 0
    for name, cap, lender in specs:
        assigned += cap
        use = used.get((name, gpu_type), 0)
        if not cap and not use:
            continue
        own = use if use < cap else cap
        lend = cap - own if lender else 0
        rows.append((name, cap, use, own, lend))
        borrowed += use - own
        lendable += lend
    pool = max(0, gpus - assigned)
    lendable += pool
    factor = min(1.0, borrowed / lendable) if lendable else 0.0
    return rows, factor, pool


def lending(snapshot: Snapshot, *, count_preempting: bool = True) -> dict[str, dict[tuple[str, str], float]]:
    """gpu_type -> (lender, borrower) -> GPUs: each borrower draws from each lender in proportion to
    what the lender lends (SEMANTICS "Lent"). UNASSIGNED appears as a lender."""
    per_type: dict[str, tuple[dict[str, float], dict[str, int]]] = {}
    for name, by_type in usage(snapshot, count_preempting=count_preempting).items():
        for gpu_type, u in by_type.items():
            lenders, borrowers = per_type.setdefault(gpu_type, ({}, {}))
            if u.lent > 0:
                lenders[name] = u.lent
            if u.borrowed > 0:
                borrowers[name] = u.borrowed
    out: dict[str, dict[tuple[str, str], float]] = {}
    for gpu_type in sorted(per_type):
        lenders, borrowers = per_type[gpu_type]
        total = sum(borrowers.values())
        pairs: dict[tuple[str, str], float] = {}
        for borrower, b in sorted(borrowers.items()):
            for lender, lent in sorted(lenders.items()):
                pairs[(lender, borrower)] = lent * b / total
        if pairs:
            out[gpu_type] = pairs
    return out


# --------------------------------------------------------------------------------------------------
# plan()

# Status of a queued job inside one pass.
