"""The scheduling policy: one pure function from a snapshot to a plan.

This module owns the semantics of ../shared/spec/SEMANTICS.md. It imports nothing from Django and does
no I/O: production passes (quotas/scheduler.py), the simulator (quotas/engine/simulate.py), queue positions,
ETAs and the what-if preview all call `plan()` and the accounting helpers here. Never a second copy.

Identifiers (job ids, attempt ids) are opaque hashable, orderable values: ints in production, strings
in the simulator. Times are seconds (epoch in production, virtual in the simulator).

Where SEMANTICS leaves room, this module decides:
- Borrowed attempts (`borrowed_attempts`): per share and type the over-capacity part is filled by
  attempts admitted as borrowed first, then the most recently started (ties: later in queue order).
  An attempt with any GPU in that part is borrowed as a whole.
- Victims follow rules 3, 4 and 9 exactly (`_reclaim_candidates`, `_in_share_candidates`,
  `_minimal_victims`): the order first, then the backward walk; no victim is chosen for being smaller
  or cheaper. What is left to this module: "borrowed" is per attempt (above), so a share's victims
  may leave it below its own capacity only by less than its largest victim (a 4-GPU attempt of a
  share borrowing 2 may go; nothing of that share after it): a candidate that would break this is
  skipped in the walk. Among the nodes of one tier (can start now / must wait) a beneficiary of an
  earlier pass goes back to the nodes its victims free before best fit, so that two beneficiaries
  do not swap nodes and pre-empt again. "Best fit" on a node where the job starts now counts the
  GPUs free now; on a node where it waits, those free or being freed.
- Over-commit: idle-lendable GPUs are clamped to what the hardware can hold (schedulable capacity -
  own use - RESERVE idle), so a guarantee that exceeds the hardware is never lent out twice.
- Gangs: whole nodes of the largest node size of the type: wholly free ones first, then those whose
  GPUs are all free or being freed; each group by node name.
- In-share pre-emption is skipped when the job can borrow right now (rule 4 says so; its victim
  would only borrow the same GPUs back).
- Beneficiaries of earlier pre-emptions go first, and may borrow ahead of everyone; while a job
  waits for GPUs held for it, jobs behind it in its share do not borrow in that pass.
"""

from __future__ import annotations

import heapq
import math
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter

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
    # job_id -> ((node, GPUs), ...) held back for a waiting job during this pass: the GPUs being freed
    # for a beneficiary (rule 7) and the node(s) a starving head job reserves (rule 6). Informational:
    # the next pass recomputes it from the snapshot.
    reserved: Mapping[Hashable, tuple[tuple[str, int], ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ShareUsage:
    """One share's (or the unassigned pool's) accounting for one GPU type at one instant."""

    capacity: int  # own (guaranteed) GPUs; for UNASSIGNED the pool size
    used: int  # GPUs held by its attempts
    own: int  # min(used, capacity)
    borrowed: int  # used - own
    idle: int  # capacity - own (a RESERVE share's idle GPUs are idle but not lendable)
    lent: float  # proportional share of all borrowed GPUs (SEMANTICS "Lent"); 0 for RESERVE


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------------------------------
# Accounting shared by plan() and the helpers


def _lends(strategy: str) -> bool:
    return strategy in (LEND, LEND_AND_BORROW)


def _neg_priority(job: QueuedView) -> int:
    return -job.priority


def queue_key(job: QueuedView) -> tuple:
    """A share's queue order as plan() considers it: beneficiaries of pre-emptions first (rule 7), then
    priority desc, submit time asc, job id asc (rule 1). For callers that list a queue (forecast, pages)."""
    return (not job.beneficiary, -job.priority, job.submitted_at, job.job_id)


def _borrowed_order_key(run: RunningView) -> tuple:
    # Sorted descending: attempts admitted as borrowed first, then the most recently started, then
    # later in queue order (rule 8). So a lowered capacity makes the newest work borrowed and an own
    # job ending turns the oldest borrowed attempt back into own.
    return (run.borrowed, run.started_at, run.submitted_at, run.job_id, run.attempt_id)


def _victim_key(run: RunningView) -> tuple:
    # Sorted descending: lowest priority first, then most recently started, then later in queue order.
    return (-run.priority, run.started_at, run.submitted_at, run.job_id, run.attempt_id)


def _borrowed_part(runs: list[RunningView], capacity: int) -> list[RunningView]:
    """The attempts of one share and type that lie (wholly or partly) in its over-capacity part.

    An attempt counts as borrowed if any of its GPUs is over capacity: a 4-GPU attempt in a share that
    borrows 2 is borrowed as a whole, because jobs are indivisible.
    """
    over = sum(r.gpus for r in runs) - max(0, capacity)
    if over <= 0:
        return []
    out: list[RunningView] = []
    for run in sorted(runs, key=_borrowed_order_key, reverse=True):
        if over <= 0:
            break
        out.append(run)
        over -= run.gpus
    return out


def _all_shares(snapshot: Snapshot) -> dict[str, ShareView]:
    """Shares by name; a share referenced by work but missing from the snapshot owns nothing and may
    borrow nothing, so its attempts are all borrowed (reclaimable) and its jobs wait."""
    shares = {s.name: s for s in snapshot.shares}
    named = {r.share for r in snapshot.running} | {q.share for q in snapshot.queued}
    for name in sorted(named - shares.keys()):
        shares[name] = ShareView(name=name, capacity={}, strategy=LEND_AND_BORROW, borrow_limit=0)
    return shares


def _borrow_cap(share: ShareView, capacity: int) -> int | None:
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
    extra = _borrow_cap(share, cap)
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
    return _usage(_all_shares(snapshot), used, _schedulable_capacity(snapshot))


def _usage(
    shares: Mapping[str, ShareView], used: Mapping[tuple[str, str], int], cluster: Mapping[str, int]
) -> dict[str, dict[str, ShareUsage]]:
    """usage() from GPUs used per (share, type) and schedulable GPUs per type."""
    gpu_types = set(cluster) | {t for _, t in used}
    for share in shares.values():
        gpu_types.update(share.capacity)
    out: dict[str, dict[str, ShareUsage]] = {name: {} for name in sorted(shares)}
    for gpu_type in sorted(gpu_types):
        rows = []
        assigned = borrowed = lendable = 0
        for name in sorted(shares):
            share = shares[name]
            cap = max(0, share.capacity.get(gpu_type, 0))
            assigned += cap
            use = used.get((name, gpu_type), 0)
            if not cap and not use:
                continue
            own = min(use, cap)
            lend = cap - own if _lends(share.strategy) else 0
            rows.append((name, cap, use, own, lend))
            borrowed += use - own
            lendable += lend
        pool = max(0, cluster.get(gpu_type, 0) - assigned)
        lendable += pool
        factor = min(1.0, borrowed / lendable) if lendable else 0.0
        for name, cap, use, own, lend in rows:
            out[name][gpu_type] = ShareUsage(cap, use, own, use - own, cap - own, lend * factor)
        if pool:
            out.setdefault(UNASSIGNED, {})[gpu_type] = ShareUsage(pool, 0, 0, 0, pool, pool * factor)
    return out


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
_TODO, _ADMITTED, _EARMARKED, _BLOCKED, _DEFER, _RESERVED = range(6)


class _Status(dict):
    """One share's statuses in a pass, by queue index: only the jobs the pass looked at are stored."""

    __slots__ = ()

    def __missing__(self, k: int) -> int:
        return _TODO


class _Open:
    """Queue indexes range(start, stop) of one share that phase C still has to place: all but the
    `decided` ones (phases A and B decide few). Never materialised unless walked: a long queue's
    tail costs nothing until its reasons are read."""

    __slots__ = ("start", "stop", "decided")

    def __init__(self, start: int, stop: int, decided: set[int]) -> None:
        self.start, self.stop, self.decided = start, stop, decided

    def __iter__(self) -> Iterator[int]:
        d = self.decided
        for k in range(self.start, self.stop):
            if k not in d:
                yield k

    def part(self, start: int, stop: int | None = None) -> _Open:
        return _Open(start, self.stop if stop is None else stop, self.decided)


_NO_LIMIT = 1 << 62
# Reasons the pass can leave for when they are read (Plan.waiting); off only in the test that checks
# that reading them later gives the same sentences.
LAZY_REASONS = True


_MASKS: dict[tuple[int, ...], int] = {}  # GPU index tuple -> bit mask; a memo of _mask()


def _mask(idxs: tuple[int, ...]) -> int:
    m = 0
    for x in idxs:
        if x >= 0:
            m |= 1 << x
    if idxs.__class__ is tuple:
        if len(_MASKS) > 65536:
            _MASKS.clear()
        _MASKS[idxs] = m
    return m


def _borrowed_atts(atts: list[_Att], over: int) -> list[_Att]:
    """_borrowed_part() on the pass's attempts: `over` GPUs over capacity, taken in rule 8's order."""
    out: list[_Att] = []
    for a in sorted(atts, key=_att_borrowed_key, reverse=True):
        if over <= 0:
            break
        out.append(a)
        over -= a.gpus
    return out


def _att_borrowed_key(a: _Att) -> tuple:
    return _borrowed_order_key(a.view)


@dataclass(frozen=True, slots=True)
class _NodeTable:
    """One type's nodes as the pass indexes them: by name, each name once (the first in input order)."""

    names: list[str]
    size: list[int]
    sched: list[bool]
    full: list[int]  # bit mask of the node's GPU indexes
    index: dict[str, int]
    C: int
    M: int
    maxk: int
    m_nodes: list[int]


_NODE_TABLES: dict[str, tuple[tuple[NodeView, ...], _NodeTable]] = {}  # gpu type -> (nodes, table)


def _node_table(gpu_type: str, nodes: list[NodeView] | tuple[NodeView, ...]) -> _NodeTable:
    """Read-only node structures for one type, memoised on the (immutable) node views: the simulator
    and successive passes mostly see the same nodes. The pass never changes a table."""
    key = tuple(nodes)
    hit = _NODE_TABLES.get(gpu_type)
    # Equal tuples of the same objects compare by identity, element by element: no hashing.
    if hit is not None and hit[0] == key:
        return hit[1]
    kept: list[NodeView] = []
    seen: set[str] = set()
    for node in sorted(key, key=attrgetter("name")):
        if node.name not in seen:
            seen.add(node.name)
            kept.append(node)
    names = [n.name for n in kept]
    size = [max(0, n.gpus) for n in kept]
    sched = [n.schedulable and n.gpus > 0 for n in kept]
    M = max(size, default=0)  # the node size that decides single node vs gang
    table = _NodeTable(
        names=names,
        size=size,
        sched=sched,
        full=[(1 << sz) - 1 for sz in size],
        index={name: i for i, name in enumerate(names)},
        C=sum(sz for sz, ok in zip(size, sched, strict=True) if ok),
        M=M,
        maxk=max((sz for sz, ok in zip(size, sched, strict=True) if ok), default=0),
        m_nodes=[i for i in range(len(kept)) if sched[i] and size[i] == M],
    )
    if len(_NODE_TABLES) >= 64:
        _NODE_TABLES.clear()
    _NODE_TABLES[gpu_type] = (key, table)
    return table


class _Att:
    """A running attempt as the pass sees it (mutable: it may become a victim)."""

    __slots__ = ("view", "s", "gpus", "prio", "on", "victim", "bnow", "masks")

    def __init__(self, view: RunningView, s: int, on: list[tuple[int, int]], gpus: int) -> None:
        self.view = view
        self.s = s
        self.gpus = gpus
        self.prio = view.priority
        self.on = on  # [(node index, GPUs on it)] for the nodes of this type that it holds
        self.victim = False
        self.bnow = False  # in borrowed_attempts()
        self.masks: list[tuple[int, int]] = []  # [(node index, bit mask of the GPUs it holds there)]


class _Out:
    __slots__ = ("admissions", "preemptions", "waiting", "reserved", "later")

    def __init__(self) -> None:
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[Hashable, str] = {}
        self.reserved: dict[Hashable, tuple[tuple[str, int], ...]] = {}
        # Reasons not written during the pass: (function, share, queue indexes) run on first read.
        self.later: list[tuple[Callable[[int, int], int], int, Iterable[int]]] = []


class _Waiting(Mapping):
    """Plan.waiting, computed lazily: most plans (the simulator's, the forecast's later passes) are
    never asked why a job waits, and writing a sentence for every queued job on every pass made the
    pass cost grow with the queue. A reason left for later is one whose inputs no longer change once
    the pass has moved past it (see _TypePass.run), so reading it after the pass gives the same
    sentence as writing it at once."""

    __slots__ = ("_done", "_later", "__weakref__")

    def __init__(self, done: dict[Hashable, str], later: list) -> None:
        self._done = done
        self._later = later

    def _all(self) -> dict[Hashable, str]:
        if self._later:
            later, self._later = self._later, []
            for fn, s, ks in later:
                for k in ks:
                    fn(s, k)
        return self._done

    def __getitem__(self, key: Hashable) -> str:
        return self._all()[key]

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, key: object) -> bool:
        return key in self._all()

    def __repr__(self) -> str:
        return repr(self._all())


class _Shares:
    """The shares as a pass indexes them, by name order. A share referenced by work but missing from
    the declared ones owns nothing and may borrow nothing (see _all_shares)."""

    __slots__ = ("known", "names", "views", "sidx")

    def __init__(
        self, declared: Iterable[ShareView], running: Iterable[RunningView], queued: Iterable[QueuedView]
    ):
        shares = {s.name: s for s in declared}
        self.known = set(shares)
        named = {r.share for r in running} | {q.share for q in queued}
        for name in sorted(named - shares.keys()):
            shares[name] = ShareView(name=name, capacity={}, strategy=LEND_AND_BORROW, borrow_limit=0)
        self.names = sorted(shares)
        self.views = [shares[n] for n in self.names]
        self.sidx = {n: i for i, n in enumerate(self.names)}


def _job_key(job: QueuedView) -> tuple:
    # Rule 1's order in a pass: priority desc, submit time asc, job id asc (rule 8: the earlier wins).
    return (-job.priority, job.submitted_at, job.job_id)


_KEY_MAX = (math.inf,)  # after every _job_key


class _TypeBase:
    """One GPU type's scheduling state as it stands between passes, kept up to date by events
    (`add_run`, `remove_run`, `add_job`, `remove_job`) instead of being rebuilt from a snapshot for
    every pass: node tables, GPUs in use per node, per share the GPUs held and in grace, the running
    attempts, the queue in rule 1's order with its suffix minima, and the victim orders (refreshed
    for the shares whose attempts changed, when a pass first needs them). A pass (_TypePass) copies
    the few small arrays it changes and reads the rest: it costs what it decides plus the shares it
    looks at, not the size of the queue.

    `plan(snapshot)` builds the same state in bulk, so production passes, the simulator, the forecast
    and the what-if run one engine."""

    def __init__(
        self,
        sh: _Shares,
        gpu_type: str,
        nodes: Iterable[NodeView],
        running: Iterable[RunningView],
        queued: Iterable[QueuedView],
    ) -> None:
        self.sh = sh
        self.t = gpu_type
        st = _node_table(gpu_type, tuple(nodes))
        self.node_names, self.size, self.sched, self.full = st.names, st.size, st.sched, st.full
        self.node_index = st.index
        self.C, self.M, self.maxk, self.m_nodes = st.C, st.M, st.maxk, st.m_nodes
        n_nodes = len(st.names)

        views = sh.views
        n = len(views)
        self.cap = cap = [max(0, v.capacity.get(gpu_type, 0)) for v in views]
        self.lender = [_lends(v.strategy) for v in views]
        self.reserve = [v.strategy == RESERVE for v in views]
        self.lab = [v.strategy == LEND_AND_BORROW for v in views]
        self.in_share = [v.in_share_preemption for v in views]
        limits = [_borrow_cap(v, c) for v, c in zip(views, cap, strict=True)]
        self.bcap = [_NO_LIMIT if b is None else b for b in limits]
        self.pool = max(0, self.C - sum(cap))
        self.overcommitted = sum(cap) > self.C
        self.lender_shares = [s for s in range(n) if self.lender[s] and cap[s] > 0]

        # -- running attempts
        self.used = [0] * n_nodes  # GPUs in use per node, a bit mask
        self.pend_u = [0] * n_nodes  # GPUs of pre-empting attempts per schedulable node
        self.pend_nodes: set[int] = set()
        self.held = [0] * n
        self.grace = [0] * n
        self.atts: list[dict[Hashable, _Att]] = [{} for _ in range(n)]  # not pre-empting
        self.pre: dict[
            Hashable, tuple
        ] = {}  # pre-empting: attempt id -> (share, masks, on, gpus, beneficiary)
        self.ben_nodes: dict[
            Hashable, dict[int, int]
        ] = {}  # beneficiary -> node -> its pre-empting attempts there
        self.ben_count: dict[Hashable, int] = {}  # beneficiary -> pre-empting attempts naming it
        # False once an attempt claimed a GPU another one holds: only a rebuild in snapshot order
        # then says who holds it, so the engine rebuilds.
        self.regular = True
        self.free: list[int] = []
        self.bk: list[list[int]] = []
        for run in running:
            self.add_run(run, bulk=True)
        self.free = [st.size[i] - self.used[i].bit_count() if st.sched[i] else 0 for i in range(n_nodes)]
        self._rebuild_buckets()

        # -- victim orders, refreshed for the shares in `dirty` when a pass first needs them
        self.dirty: set[int] = set(range(n))
        self.vlist: list[list[_Att]] = [[] for _ in range(n)]
        self.ilist: list[list[_Att]] = [[] for _ in range(n)]
        self.iprio: list[list[int]] = [[] for _ in range(n)]
        self.vshares: list[int] = []
        self.rec = [0] * n_nodes

        # -- queues (lists are replaced, never changed in place: an earlier plan's lazy reasons read them)
        self.waiting: dict[Hashable, str] = {}  # jobs that can never run as things are, and why
        self._shape: dict[int, str | None] = {}
        self._never: dict[tuple[str, int], str | None] = {}
        self.q: list[list[QueuedView]] = [[] for _ in range(n)]
        self.keys: list[list[tuple]] = [[] for _ in range(n)]
        # share -> GPUs per job -> those jobs' keys, in order: where the next job of fewer GPUs than
        # the share has room for is (a pass skips the jobs between, which cannot change anything).
        # Read by passes only while they run: changed in place.
        self.by_size: list[dict[int, list[tuple]]] = [{} for _ in range(n)]
        self.qinfo: dict[Hashable, tuple[int, tuple]] = {}
        self.bens: set[Hashable] = set()  # queued jobs flagged as beneficiaries
        # Plans whose waiting reasons are still to be written from these queue lists (weak: a plan
        # nobody keeps does not count). While one is alive, an event replaces a list instead of
        # changing it in place.
        self._readers: list[weakref.ref] = []
        self._fresh: set[int] = set()  # shares whose lists were copied after the last such plan
        sidx, q, keys, qinfo = sh.sidx, self.q, self.keys, self.qinfo
        for job in queued:  # in rule 1's order
            why = self._never_why(job)
            if why is not None:
                self.waiting[job.job_id] = why
                continue
            s = sidx[job.share]
            key = (-job.priority, job.submitted_at, job.job_id)
            q[s].append(job)
            keys[s].append(key)
            self.by_size[s].setdefault(job.gpus, []).append(key)
            qinfo[job.job_id] = (s, key)
            if job.beneficiary:
                self.bens.add(job.job_id)
        self.suf: list[list[int]] = []
        for qs in q:
            suf = [0] * len(qs)
            m = _NO_LIMIT
            for k in range(len(qs) - 1, -1, -1):
                g = qs[k].gpus
                if g < m:
                    m = g
                suf[k] = m
            self.suf.append(suf)

    # -- nodes ---------------------------------------------------------------------------------------

    def _rebuild_buckets(self) -> None:
        self.bk = [[] for _ in range(self.maxk + 1)]
        for i, f in enumerate(self.free):
            if f:
                self.bk[f].append(i)  # ascending: already a heap
        self._bk_entries = sum(map(len, self.bk))

    def _free_changed(self, i: int, d: int) -> None:
        v = self.free[i] + d
        self.free[i] = v
        if v:
            heapq.heappush(self.bk[v], i)  # the old entry goes stale; passes skip stale entries
            self._bk_entries += 1
            if self._bk_entries > 2 * len(self.free) + 64:
                self._rebuild_buckets()

    # -- running attempts ------------------------------------------------------------------------------

    def add_run(self, run: RunningView, bulk: bool = False) -> None:
        # GPUs in use per node as a bit mask; a GPU index listed twice, taken already, or outside the
        # node counts once, for the first attempt (in snapshot order) only.
        s = self.sh.sidx[run.share]
        node_index, full, used = self.node_index, self.full, self.used
        masks: list[tuple[int, int]] = []
        gpus = 0
        for name, idxs in run.placement:
            gpus += len(idxs)
            i = node_index.get(name)
            if i is None:
                continue  # a node gone from the snapshot: the GPUs still count as usage
            m = _MASKS.get(idxs) if idxs.__class__ is tuple else None
            if m is None:
                m = _mask(idxs)
            m &= full[i]
            new = m & ~used[i]
            if new != m:
                self.regular = False
            if new:
                used[i] |= new
                masks.append((i, new))
                if not bulk and self.sched[i]:
                    self._free_changed(i, -new.bit_count())
        if len(masks) == 1:
            on = [(masks[0][0], masks[0][1].bit_count())]
        else:
            per_node: dict[int, int] = {}
            for i, m in masks:
                per_node[i] = per_node.get(i, 0) + m.bit_count()
            on = sorted(per_node.items())
        if run.preempting:
            self.grace[s] += gpus
            sched, pend_u = self.sched, self.pend_u
            for i, c in on:
                if sched[i]:
                    pend_u[i] += c
                    self.pend_nodes.add(i)
            b = run.beneficiary_job_id
            if b is not None:
                self.ben_count[b] = self.ben_count.get(b, 0) + 1
                nodes = self.ben_nodes.setdefault(b, {})
                for i, _ in on:
                    nodes[i] = nodes.get(i, 0) + 1
            self.pre[run.attempt_id] = (s, masks, on, gpus, b)
            return
        att = _Att(run, s, on, gpus)
        att.masks = masks
        self.held[s] += gpus
        self.atts[s][run.attempt_id] = att
        if not bulk:
            self.dirty.add(s)

    def remove_run(self, run: RunningView) -> None:
        if run.preempting:
            s, masks, on, gpus, b = self.pre.pop(run.attempt_id)
            self.grace[s] -= gpus
            sched, pend_u = self.sched, self.pend_u
            for i, c in on:
                if sched[i]:
                    pend_u[i] -= c
                    if not pend_u[i]:
                        self.pend_nodes.discard(i)
            if b is not None:
                left = self.ben_count[b] - 1
                if left:
                    self.ben_count[b] = left
                else:
                    del self.ben_count[b]
                nodes = self.ben_nodes[b]
                for i, _ in on:
                    nodes[i] -= 1
                    if not nodes[i]:
                        del nodes[i]
                if not left:
                    del self.ben_nodes[b]
        else:
            s = self.sh.sidx[run.share]
            att = self.atts[s].pop(run.attempt_id)
            self.held[s] -= att.gpus
            masks = att.masks
            self.dirty.add(s)
        used, sched = self.used, self.sched
        for i, m in masks:
            used[i] &= ~m
            if sched[i]:
                self._free_changed(i, m.bit_count())

    def victim_orders(self) -> None:
        """Rule 8's borrowed part and the victim orders of rules 3 and 4, for the shares whose
        attempts changed since they were last ordered."""
        if not self.dirty:
            return
        rec = self.rec
        for s in self.dirty:
            for a in self.vlist[s]:
                a.bnow = False
                for i, c in a.on:
                    rec[i] -= c
            atts = list(self.atts[s].values())
            vl: list[_Att] = []
            over = self.held[s] - self.cap[s]
            if over > 0:
                vl = _borrowed_atts(atts, over)
                for a in vl:
                    a.bnow = True
                    for i, c in a.on:
                        rec[i] += c
                vl.sort(key=_att_victim_key, reverse=True)
            self.vlist[s] = vl
            if self.in_share[s]:
                il = sorted(atts, key=_att_victim_key, reverse=True)
                self.ilist[s] = il
                self.iprio[s] = [a.prio for a in il]
        self.dirty.clear()
        self.vshares = [s for s in range(len(self.vlist)) if self.vlist[s]]

    # -- queued jobs ----------------------------------------------------------------------------------

    def _never_why(self, job: QueuedView) -> str | None:
        g = job.gpus
        shape = self._shape
        why = shape[g] if g in shape else shape.setdefault(g, self._invalid(g))
        if why is None and job.share not in self.sh.known:
            why = f"unknown share {job.share}"
        if why is None:
            never_key = (job.share, g)
            if never_key not in self._never:
                self._never[never_key] = never_fits(self.sh.views[self.sh.sidx[job.share]], self.t, g)
            why = self._never[never_key]
        return why

    def _invalid(self, g: int) -> str | None:
        """Why a job of g GPUs can never be placed on this type's nodes as they are, or None."""
        if g <= 0:
            return "asks for no GPUs"
        if not self.size:
            return f"no {self.t} nodes in the cluster"
        M = self.M
        if M == 0:  # only GPU-less nodes of this type
            return f"no {self.t} node has any GPUs"
        if g > M:
            if g % M:
                return f"{g} GPUs is more than one {M}-GPU node and not a multiple of it"
            if g // M > len(self.m_nodes):
                return f"needs {g // M} whole {M}-GPU nodes; only {len(self.m_nodes)} are schedulable"
            return None
        if g > self.maxk:
            if not self.maxk:
                return f"no schedulable {self.t} nodes"
            return f"needs {g} GPUs on one node; no schedulable {self.t} node has that many"
        return None

    def _own_lists(self, s: int) -> tuple[list[tuple], list[QueuedView]]:
        """Share s's key and job lists, safe to change in place: copies while a plan may still read
        the old ones for its reasons."""
        readers = self._readers
        if s not in self._fresh:
            while readers:
                w = readers[-1]()
                if w is not None and w._later:
                    self.keys[s] = self.keys[s].copy()
                    self.q[s] = self.q[s].copy()
                    self._fresh.add(s)  # a copy no plan has seen: changed in place until the next plan
                    break
                readers.pop()
        return self.keys[s], self.q[s]

    def add_job(self, job: QueuedView) -> None:
        why = self._never_why(job)
        if why is not None:
            self.waiting[job.job_id] = why
            return
        s = self.sh.sidx[job.share]
        key = (-job.priority, job.submitted_at, job.job_id)
        pos = bisect_left(self.keys[s], key)
        keys, q = self._own_lists(s)
        keys.insert(pos, key)
        q.insert(pos, job)
        same = self.by_size[s].setdefault(job.gpus, [])
        same.insert(bisect_left(same, key), key)
        self.qinfo[job.job_id] = (s, key)
        if job.beneficiary:
            self.bens.add(job.job_id)
        g = job.gpus
        suf = self.suf[s]  # read by passes only while they run: changed in place
        suf.insert(pos, g if pos + 1 == len(q) or suf[pos] > g else suf[pos])
        k = pos - 1
        while k >= 0 and suf[k] > g:
            suf[k] = g
            k -= 1

    def remove_job(self, job: QueuedView) -> None:
        if self.waiting.pop(job.job_id, None) is not None:
            return
        s, key = self.qinfo.pop(job.job_id)
        pos = bisect_left(self.keys[s], key)
        keys, q = self._own_lists(s)
        del keys[pos]
        del q[pos]
        same = self.by_size[s][job.gpus]
        del same[bisect_left(same, key)]
        if not same:
            del self.by_size[s][job.gpus]
        self.bens.discard(job.job_id)
        suf = self.suf[s]
        del suf[pos]
        nxt = suf[pos] if pos < len(suf) else _NO_LIMIT
        for k in range(pos - 1, -1, -1):
            g = q[k].gpus
            v = g if g < nxt else nxt
            if suf[k] == v:
                break
            suf[k] = v
            nxt = v


def _att_victim_key(a: _Att) -> tuple:
    return _victim_key(a.view)


def _type_bases(
    sh: _Shares, nodes: Iterable[NodeView], running: Iterable[RunningView], queued: Iterable[QueuedView]
) -> dict[str, _TypeBase]:
    """Every GPU type's state built at once from views (plan(snapshot), and an Engine's rebuild)."""
    by_nodes: dict[str, list[NodeView]] = {}
    for node in nodes:
        by_nodes.setdefault(node.gpu_type, []).append(node)
    by_run: dict[str, list[RunningView]] = {}
    for run in running:
        by_run.setdefault(run.gpu_type, []).append(run)
    # One sort of all queued jobs gives each type's queue in rule 1's order. Three stable passes on
    # single keys equal one sort on the tuple, about three times faster.
    order = sorted(queued, key=attrgetter("job_id"))
    order.sort(key=attrgetter("submitted_at"))
    order.sort(key=_neg_priority)
    by_q: dict[str, list[QueuedView]] = {}
    for job in order:
        by_q.setdefault(job.gpu_type, []).append(job)
    types = sorted(set(by_nodes) | set(by_run) | set(by_q))
    return {t: _TypeBase(sh, t, by_nodes.get(t, ()), by_run.get(t, ()), by_q.get(t, ())) for t in types}


def _pass(bases: Mapping[str, _TypeBase], now: float, starvation_s: float) -> Plan:
    out = _Out()
    beneficiaries: set[Hashable] = set()
    for base in bases.values():
        if base.ben_count:
            beneficiaries.update(base.ben_count)
    readers = []
    for gpu_type in sorted(bases):
        base = bases[gpu_type]
        if base.waiting:
            out.waiting.update(base.waiting)
        if not base.qinfo:
            continue  # nothing queued of this type: nothing to admit, nothing to pre-empt for
        lazy = len(out.later)
        tp = _TypePass(base, now, starvation_s, beneficiaries, out)
        tp.run()
        for a in tp.marked:
            a.victim = False  # the attempts outlive the pass; its decisions are in `out`
        if len(out.later) > lazy:
            readers.append(base)
    waiting: Mapping[Hashable, str] = out.waiting
    if out.later:
        waiting = _Waiting(out.waiting, out.later)
        for base in readers:
            base._readers.append(weakref.ref(waiting))
            base._fresh.clear()
    return Plan(
        admissions=tuple(out.admissions),
        preemptions=tuple(out.preemptions),
        waiting=waiting,
        reserved=out.reserved,
    )


def plan(snapshot: Snapshot) -> Plan:
    """One scheduling pass (SEMANTICS "One scheduling pass", rules 1-9). Pure and deterministic.

    GPU types are independent (capacity, cover, limits and nodes are all per type), so the pass runs
    once per type, in type-name order. Within a type:
      A. beneficiaries of earlier pre-emptions, then starving queue heads, go first (rules 6, 7);
      B. own capacity, shares by lowest own-use ratio, each share's queue in order; a job that fits
         its remaining own capacity is admitted own, waits for GPUs being freed, or reclaims
         (rules 2, 3); one that does not may pre-empt lower-priority work of its share (rule 4);
         victims of both are a minimal set taken in order (rule 9);
      C. borrowing, shares by fewest borrowed GPUs relative to capacity (rule 5).
    Backfill (rule 6) is natural: a blocked job never stops the jobs behind it, except that a
    starving head job holds the node(s) it needs next.

    The same engine as `Engine.plan()`, built from the snapshot at once.
    """
    sh = _Shares(snapshot.shares, snapshot.running, snapshot.queued)
    bases = _type_bases(sh, snapshot.nodes, snapshot.running, snapshot.queued)
    return _pass(bases, snapshot.now, snapshot.starvation_s)


class Engine:
    """The scheduling state of one cluster kept between passes, for callers that plan again and again
    as things change a little (the simulator, the forecast's replay, the what-if): they report each
    change (a job queued or gone from the queue, an attempt started, changed or gone, the nodes or
    shares replaced) and `plan(now)` costs about what the pass decides, not the size of the queue.

    `plan(now)` equals `plan(self.snapshot(now))` (tests/quotas/test_engine_incremental.py checks it
    after every event of random histories and of the generated traces). Rare changes (nodes, shares,
    an unknown share or type, a GPU claimed twice) rebuild the state from the views at the next pass.
    """

    def __init__(
        self,
        *,
        nodes: Iterable[NodeView] = (),
        shares: Iterable[ShareView] = (),
        running: Iterable[RunningView] = (),
        queued: Iterable[QueuedView] = (),
        starvation_s: float = 3600,
    ) -> None:
        self.nodes = tuple(nodes)
        self.shares = tuple(shares)
        self.running: dict[Hashable, RunningView] = {r.attempt_id: r for r in running}
        self.queued: dict[Hashable, QueuedView] = {j.job_id: j for j in queued}
        self.starvation_s = starvation_s
        self._sh: _Shares | None = None
        self._bases: dict[str, _TypeBase] = {}
        self._cluster: dict[str, int] | None = None  # schedulable GPUs per type

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Engine:
        return cls(
            nodes=snapshot.nodes,
            shares=snapshot.shares,
            running=snapshot.running,
            queued=snapshot.queued,
            starvation_s=snapshot.starvation_s,
        )

    def snapshot(self, now: float, *, queued: bool = True) -> Snapshot:
        return Snapshot(
            now=now,
            nodes=self.nodes,
            shares=self.shares,
            running=tuple(self.running.values()),
            queued=tuple(self.queued.values()) if queued else (),
            starvation_s=self.starvation_s,
        )

    def _state(self) -> tuple[_Shares, dict[str, _TypeBase]]:
        if self._sh is None:
            self._sh = _Shares(self.shares, self.running.values(), self.queued.values())
            self._bases = _type_bases(self._sh, self.nodes, self.running.values(), self.queued.values())
            self._cluster = None
        return self._sh, self._bases

    def plan(self, now: float) -> Plan:
        return _pass(self._state()[1], now, self.starvation_s)

    def usage(self) -> dict[str, dict[str, ShareUsage]]:
        """usage(self.snapshot(now)) from the kept state, without a walk over the attempts."""
        sh, bases = self._state()
        used: dict[tuple[str, str], int] = {}
        for t, base in bases.items():
            for s, name in enumerate(sh.names):
                g = base.held[s] + base.grace[s]
                if g:
                    used[(name, t)] = g
        if self._cluster is None:
            self._cluster = {}
            for node in self.nodes:
                if node.schedulable:
                    self._cluster[node.gpu_type] = self._cluster.get(node.gpu_type, 0) + max(0, node.gpus)
        shares = dict(zip(sh.names, sh.views, strict=True))
        if len(shares) > len(sh.known):  # shares only named by work: those still named now (rare)
            named = {r.share for r in self.running.values()} | {q.share for q in self.queued.values()}
            shares = {n: v for n, v in shares.items() if n in sh.known or n in named}
        return _usage(shares, used, self._cluster)

    # -- changes ---------------------------------------------------------------------------------------

    def _base(self, gpu_type: str, share: str) -> _TypeBase | None:
        """The type's state to update in place, or None when the next pass rebuilds anyway."""
        sh = self._sh
        if sh is None:
            return None
        base = self._bases.get(gpu_type)
        if base is None or share not in sh.sidx:
            self._sh = None  # a type or share the state does not know yet
            return None
        return base

    def set_nodes(self, nodes: Iterable[NodeView]) -> None:
        self.nodes = tuple(nodes)
        self._sh = None

    def set_shares(self, shares: Iterable[ShareView]) -> None:
        self.shares = tuple(shares)
        self._sh = None

    def set_starvation(self, starvation_s: float) -> None:
        self.starvation_s = starvation_s

    def add_queued(self, job: QueuedView) -> None:
        """A job joins the queue, or a queued job's view changes (priority, beneficiary): it keeps its
        place in the order of the views."""
        old = self.queued.get(job.job_id)
        self.queued[job.job_id] = job
        if old is not None:
            base = self._base(old.gpu_type, old.share)
            if base is not None:
                base.remove_job(old)
        base = self._base(job.gpu_type, job.share)
        if base is not None:
            base.add_job(job)

    def remove_queued(self, job_id: Hashable) -> QueuedView:
        job = self.queued.pop(job_id)
        base = self._base(job.gpu_type, job.share)
        if base is not None:
            base.remove_job(job)
        return job

    def add_running(self, run: RunningView) -> None:
        """A new attempt, or a new view of one (pre-empting now): it keeps its place in the order."""
        old = self.running.get(run.attempt_id)
        self.running[run.attempt_id] = run
        if old is not None:
            base = self._base(old.gpu_type, old.share)
            if base is not None:
                base.remove_run(old)
        base = self._base(run.gpu_type, run.share)
        if base is not None:
            base.add_run(run)
            if not base.regular:
                self._sh = None

    def remove_running(self, attempt_id: Hashable) -> RunningView:
        run = self.running.pop(attempt_id)
        base = self._base(run.gpu_type, run.share)
        if base is not None:
            base.remove_run(run)
            if not base.regular:
                self._sh = None
        return run


class _Fit:
    """Rule 9's node test for one job of g GPUs, kept as victims are taken and given back: does some
    fitting node (or do the needed whole nodes) have the job's GPUs free or being freed?

    Nodes that fit without any victim are counted once (`base`); a node touched by victims is looked
    at again only when its victims change (`extra`: GPUs this job's victims free there)."""

    __slots__ = ("tp", "g", "gang", "k", "base", "hits", "extra")

    def __init__(self, tp: _TypePass, g: int) -> None:
        self.tp = tp
        self.g = g
        self.gang = g > tp.M
        self.extra: dict[int, int] = {}
        self.hits = 0  # touched nodes that fit only thanks to the victims
        if self.gang:
            self.k = g // tp.M
            fu, pu, M = tp.free_u, tp.pend_u, tp.M
            self.base = sum(1 for i in tp.m_nodes if fu[i] + pu[i] == M)
        else:
            self.k = 1
            self.base = 1 if tp._place(g, None, True) is not None else 0

    def _fits(self, i: int) -> bool:
        e = self.extra.get(i, 0)
        if not e:
            return False  # counted in `base` if it fits without victims
        tp = self.tp
        avail = tp.free_u[i] + tp.pend_u[i] + e
        if self.gang:
            return tp.size[i] == tp.M and avail == tp.M
        return avail >= self.g and tp.free_u[i] + tp.pend_u[i] < self.g

    def add(self, a: _Att, sign: int) -> None:
        sched = self.tp.sched
        for i, c in a.on:
            if not sched[i]:
                continue
            before = self._fits(i)
            e = self.extra.get(i, 0) + sign * c
            if e:
                self.extra[i] = e
            else:
                del self.extra[i]
            self.hits += self._fits(i) - before

    def ok(self) -> bool:
        if self.gang:
            return self.base + self.hits >= self.k
        return bool(self.base or self.hits)


class _TypePass:
    """The pass for one GPU type.

    Accounting per share uses three numbers: `held` (non-pre-empting attempts and admissions of this
    pass), `grace` (attempts in their grace period) and `pend` (jobs earmarked this pass: GPUs being
    freed for them). The cover of rule 3 looks at the future, held + pend, so GPUs in grace count as
    freed and the GPUs earmarked for a beneficiary count as its. Share limits must hold both now
    (held + grace) and in the future (held + pend).

    Nodes: `free_u` free GPUs not reserved for anyone, `pend_u` GPUs of pre-empting attempts not
    reserved for anyone, kept in buckets by free count so best fit is O(node size), not O(nodes).
    """

    def __init__(
        self, base: _TypeBase, now: float, starvation_s: float, beneficiaries: set[Hashable], out: _Out
    ) -> None:
        self.base = base
        self.sh = base.sh
        self.t = base.t
        self.out = out
        self.now = now
        self.starvation_s = starvation_s

        # -- nodes and shares: read-only here
        self.node_names, self.size, self.sched = base.node_names, base.size, base.sched
        self.C, self.M, self.maxk, self.m_nodes = base.C, base.M, base.maxk, base.m_nodes
        self.cap, self.lender, self.reserve, self.lab = base.cap, base.lender, base.reserve, base.lab
        self.in_share, self.bcap = base.in_share, base.bcap
        self.pool, self.overcommitted, self.lender_shares = base.pool, base.overcommitted, base.lender_shares
        self.ben_nodes = base.ben_nodes
        n_shares = len(self.cap)

        # -- what this pass changes: copies
        self.held = held = base.held.copy()
        self.grace = grace = base.grace.copy()
        self.pend = [0] * n_shares
        self._used = base.used  # read-only: admissions take GPUs from the free-index lists
        self._free_idx: dict[int, list[int]] = {}  # free GPU indexes, built when a node is first used
        self.free_u = base.free.copy()
        self.pend_u = base.pend_u.copy()
        self.pend_nodes = set(base.pend_nodes)
        self.bk = [h.copy() for h in base.bk]
        self._mf = -1  # cached largest free count; -1 = stale
        self._taken: dict[int, list] = {}  # reclaim victims of the current decision: share -> [b0, atts]

        # -- victim orders: from the base, when first needed (_victims)
        self._vready = False
        self.vptr = [0] * n_shares
        self.iptr = [0] * n_shares
        self.marked: list[_Att] = []  # attempts marked as victims at some point (reset after the pass)

        # -- cover aggregates (rule 3), kept incrementally
        self.own_total = self.B = self.lidle = self.ridle = 0
        for s in range(n_shares):
            self._contrib(s, 1)
        self.room0 = [self.cap[s] - held[s] - grace[s] for s in range(n_shares)]

        # -- memos: a shape that could not be placed even with reclaim stays so until GPUs being freed
        # are added to the unreserved pool (epoch), since free GPUs and candidates only shrink.
        self.epoch = 0
        self.fail_single = (_NO_LIMIT, 0)
        self.fail_gang = (_NO_LIMIT, 0)
        self.in_fail: dict[int, tuple[int, int, int]] = {}  # share -> (gpus, priority, epoch)
        self._reasons: dict[tuple, str] = {}

        # -- queues: the base's lists (replaced, never changed, by later events), in rule 1's order;
        # a job's key (priority, submit time, id) is its place in the global queue order.
        self.q = base.q.copy()
        self.qkey = base.keys.copy()
        self.sufmin = base.suf
        self.by_size = base.by_size
        self.status = [_Status() for _ in self.q]  # share -> queue index -> status, _TODO unless set
        self.is_ben = base.bens | beneficiaries if beneficiaries else base.bens
        self.bens: list[tuple[tuple, int, int]] = []  # (queue key, share, index), in queue order
        qinfo = base.qinfo
        for job_id in self.is_ben:
            info = qinfo.get(job_id)
            if info is not None:
                s, key = info
                self.bens.append((key, s, bisect_left(self.qkey[s], key)))
        self.bens.sort()
        # Queue key of the share's first job that waits for GPUs held for it: nothing behind it
        # may borrow in this pass, or the borrowed job would count as own in the next pass and take
        # the room it waits for (pre-emption ping-pong at one instant).
        self.held_for = [_KEY_MAX] * n_shares
        self.hptr = [0] * n_shares
        self.bptr = [0] * n_shares

    def _victims(self) -> None:
        """The victim orders (rules 3, 4, 8), from the base on first use in this pass: most passes
        choose no victim and never pay for them."""
        if self._vready:
            return
        self._vready = True
        base = self.base
        base.victim_orders()
        self.vlist, self.ilist, self.iprio, self.vshares = base.vlist, base.ilist, base.iprio, base.vshares
        # GPUs per node of borrowed attempts not (yet) victims: a bound on what reclaim could free
        # there, so that rule 9's walk can tell at once when no node could ever fit a job.
        self.rec = base.rec.copy()

    # -- accounting ----------------------------------------------------------------------------------

    def _contrib(self, s: int, sign: int) -> None:
        u = self.held[s] + self.pend[s]
        c = self.cap[s]
        own = u if u < c else c
        self.own_total += sign * own
        self.B += sign * (u - own)
        if self.lender[s]:
            self.lidle += sign * (c - own)
        elif self.reserve[s]:
            self.ridle += sign * (c - own)

    def _chg(self, s: int, dh: int = 0, dp: int = 0, dg: int = 0) -> None:
        self._contrib(s, -1)
        self.held[s] += dh
        self.pend[s] += dp
        self.grace[s] += dg
        self._contrib(s, 1)

    def _deficit(self) -> int:
        """Borrowed minus idle-lendable GPUs (> 0: the cover of rule 3 is broken).

        Idle lendable = lenders' idle capacity + the unassigned pool, clamped under over-commit (or
        usage on unschedulable nodes) to what the hardware can hold: C - own use - RESERVE idle, so
        that lent capacity is never promised twice.
        """
        lendable = self.lidle + self.pool
        hw = self.C - self.own_total - self.ridle
        if hw < lendable:
            lendable = hw if hw > 0 else 0
        return self.B - lendable

    def _deficit_if(self, s: int, more: int) -> int:
        """_deficit() if share s held `more` GPUs more, without changing anything."""
        u = self.held[s] + self.pend[s]
        c = self.cap[s]
        own0 = u if u < c else c
        u1 = u + more
        own1 = u1 if u1 < c else c
        d_own = own1 - own0
        lidle, ridle = self.lidle, self.ridle
        if self.lender[s]:
            lidle -= d_own
        elif self.reserve[s]:
            ridle -= d_own
        lendable = lidle + self.pool
        hw = self.C - self.own_total - d_own - ridle
        if hw < lendable:
            lendable = hw if hw > 0 else 0
        return self.B + (u1 - own1) - (u - own0) - lendable

    def _borrowed(self, s: int) -> int:
        b = self.held[s] + self.pend[s] - self.cap[s]
        return b if b > 0 else 0

    def _mark(self, a: _Att, reclaim: bool) -> None:
        if reclaim:
            self._taken.setdefault(a.s, [self._borrowed(a.s), []])[1].append(a)
        a.victim = True
        self.marked.append(a)
        self._chg(a.s, dh=-a.gpus, dg=a.gpus)
        if a.bnow:
            for i, c in a.on:
                self.rec[i] -= c

    def _unmark(self, a: _Att) -> None:
        a.victim = False
        self._chg(a.s, dh=a.gpus, dg=-a.gpus)
        if a.bnow:
            for i, c in a.on:
                self.rec[i] += c
        st = self._taken.get(a.s)
        if st is not None and a in st[1]:
            st[1].remove(a)

    def _fits_budget(self, s: int, more: list[int]) -> bool:
        """May reclaim take victims of these sizes from share s, on top of those this decision took?

        A set of victims of one share is allowed while the share is still borrowing before its largest
        victim goes: sum - max < borrowed (as it was before this decision). So reclaim never takes own
        capacity except the unavoidable overshoot of one indivisible job: a 4-GPU attempt of a share
        borrowing 2 may go (the share ends 2 below its capacity), a second victim after it may not.
        """
        st = self._taken.get(s)
        if st is None:
            b0, sizes = self._borrowed(s), list(more)
        else:
            b0, sizes = st[0], [a.gpus for a in st[1]] + more
        return sum(sizes) - max(sizes) < b0

    # -- nodes -----------------------------------------------------------------------------------------

    def _set_free(self, i: int, v: int) -> None:
        self.free_u[i] = v
        if v:
            heapq.heappush(self.bk[v], i)
        self._mf = -1

    def _best_free(self, g: int) -> int | None:
        """Best fit on free GPUs: the node left with the fewest free GPUs, ties by name."""
        fu = self.free_u
        bk = self.bk
        for v in range(g, self.maxk + 1):
            h = bk[v]
            while h and fu[h[0]] != v:
                heapq.heappop(h)
            if h:
                return h[0]
        return None

    def _free_list(self, i: int) -> list[int]:
        """Node i's free GPU indexes, ascending (what is left of them as admissions take them)."""
        idx = self._free_idx.get(i)
        if idx is None:
            m = self._used[i]
            idx = [x for x in range(self.size[i]) if not m >> x & 1] if self.sched[i] else []
            self._free_idx[i] = idx
        return idx

    def _max_free(self) -> int:
        if self._mf < 0:
            fu = self.free_u
            self._mf = 0
            for v in range(self.maxk, 0, -1):
                h = self.bk[v]
                while h and fu[h[0]] != v:
                    heapq.heappop(h)
                if h:
                    self._mf = v
                    break
        return self._mf

    def _extra(self, *victim_lists: list[tuple[_Att, str]]) -> dict[int, int]:
        """GPUs that the given victims will free, per schedulable node."""
        extra: dict[int, int] = {}
        for lst in victim_lists:
            for a, _ in lst:
                for i, c in a.on:
                    if self.sched[i]:
                        extra[i] = extra.get(i, 0) + c
        return extra

    def _place(
        self,
        g: int,
        extra: dict[int, int] | None = None,
        use_pend: bool = False,
        prefer: set[int] | None = None,
    ) -> list[tuple[int, int]] | None:
        """Where g GPUs would go (rule 9's last sentence): on free GPUs, and if asked on GPUs being
        freed (`pend_u`, and `extra` from victims chosen for this job). A node where the job can start
        now (its GPUs free, not being freed) comes first; then, for a beneficiary of an earlier pass,
        the nodes its victims free (`prefer`); then best fit (fewest GPUs left free on the node);
        ties: node name. Single node, or whole nodes for a gang."""
        if g > self.M:
            return self._place_gang(g // self.M, extra, use_pend)
        fu = self.free_u
        best = None
        i = self._best_free(g)
        if i is not None:
            # Every node with g free GPUs is in the first tier; among them, best fit on free GPUs.
            if prefer:
                for j in prefer:
                    if fu[j] >= g and self.sched[j]:
                        key = (0, 0, fu[j] - g, j)
                        if best is None or key < best:
                            best = key
            if best is None:
                best = (0, 0 if prefer is not None and i in prefer else 1, fu[i] - g, i)
        if (use_pend or extra) and best is None:
            cand = set(self.pend_nodes) if use_pend else set()
            if extra:
                cand.update(extra)
            for i in cand:
                nf = (self.pend_u[i] if use_pend else 0) + (extra.get(i, 0) if extra else 0)
                avail = fu[i] + nf
                if not nf or avail < g or not self.sched[i]:
                    continue
                key = (1, 0 if prefer is not None and i in prefer else 1, avail - g, i)
                if best is None or key < best:
                    best = key
        return None if best is None else [(best[3], g)]

    def _place_gang(
        self, k: int, extra: dict[int, int] | None, use_pend: bool
    ) -> list[tuple[int, int]] | None:
        """k whole nodes of the type's largest size: wholly free ones first, then those whose GPUs are
        all free or being freed; each group by node name."""
        M = self.M
        fu = self.free_u
        chosen: list[int] = []
        if self.maxk >= M:
            h = self.bk[M]
            popped: list[int] = []
            while h and len(chosen) < k:
                i = heapq.heappop(h)
                if fu[i] != M or i in popped:
                    continue
                popped.append(i)
                chosen.append(i)
            for i in popped:
                heapq.heappush(h, i)  # only a proposal: the commit changes free_u
        if len(chosen) < k and (use_pend or extra):
            cand = set(self.pend_nodes) if use_pend else set()
            if extra:
                cand.update(extra)
            waiting = []
            for i in cand:
                if self.size[i] != M or not self.sched[i]:
                    continue
                nf = (self.pend_u[i] if use_pend else 0) + (extra.get(i, 0) if extra else 0)
                if nf and fu[i] + nf == M:
                    waiting.append(i)
            waiting.sort()
            chosen.extend(waiting[: k - len(chosen)])
        if len(chosen) < k:
            return None
        return [(i, M) for i in sorted(chosen)]

    # -- victims (rules 3, 4 and 9) ----------------------------------------------------------------

    def _reclaim_candidates(self, s_job: int) -> Iterator[_Att]:
        """Rule 3's order: borrowed attempts of the other shares, the share with the most borrowed GPUs
        first (counted now, when the reclaim starts; ties: share name), inside a share lowest priority
        first, then most recently started, then later in queue order (rule 8)."""
        order = sorted(
            (s for s in self.vshares if s != s_job and self._borrowed(s) > 0),
            key=lambda s: (-self._borrowed(s), s),  # share indexes follow name order
        )
        for s in order:
            lst = self.vlist[s]
            for idx in range(self.vptr[s], len(lst)):
                a = lst[idx]
                if not a.victim:
                    yield a

    def _in_share_candidates(self, s: int, n: int) -> Iterator[_Att]:
        """Rule 4's order: the share's first n attempts of its in-share victim order (those of strictly
        lower priority: lowest first, then most recently started, then later in queue order)."""
        lst = self.ilist[s]
        for idx in range(self.iptr[s], n):
            if not lst[idx].victim:
                yield lst[idx]

    def _reachable(self, g: int, fit: _Fit, ins: dict[int, int]) -> set[int] | None:
        """The nodes that some set of candidates could make fit a job of g GPUs (free + being freed +
        borrowed GPUs there + `ins`, the in-share candidates' GPUs there), when none fits without
        victims; None when one does. An empty set (or too few whole nodes) means no victim can help."""
        if fit.ok():
            return None
        fu, pu, rec, size, sched = self.free_u, self.pend_u, self.rec, self.size, self.sched
        nodes = {i for i in range(len(rec)) if rec[i]} | ins.keys()
        if g > self.M:
            return {
                i
                for i in nodes
                if sched[i] and size[i] == self.M and fu[i] + pu[i] + rec[i] + ins.get(i, 0) == self.M
            }
        return {i for i in nodes if sched[i] and fu[i] + pu[i] + rec[i] + ins.get(i, 0) >= g}

    def _minimal_victims(
        self,
        s: int,
        g: int,
        tol: int,
        cands: Iterator[tuple[_Att, str]],
        own_limit: bool,
        ins: dict[int, int] | None = None,
    ) -> tuple[list[tuple[_Att, str]], _Fit] | str:
        """Rule 9. Take candidates in order until the job (g GPUs of share s, already in `pend[s]`)
        can run: the cover holds (deficit at most `tol`), some fitting node, or the needed whole nodes,
        has its GPUs free or being freed, and with `own_limit` (rule 4) the share stays within its own
        capacity. Then walk the victims taken backwards and give back each one without which the job
        can still run. Returns (victims, what they free) with the victims marked, or why not ("cover",
        "place", "own") with nothing marked. Reclaim victims must pass `_fits_budget`.

        Shortcuts that change no outcome: when no node is reachable (`_reachable`) the walk is not
        made; once the cover and the share's capacity hold, a candidate on no reachable node is passed
        over, since the backward walk would give it back; and in rule 4 the walk stops when the
        share's own candidates are used up without bringing it within its capacity."""
        self._victims()
        fit = _Fit(self, g)
        reach = self._reachable(g, fit, ins or {})
        if reach is not None and (len(reach) + fit.base < fit.k if fit.gang else not reach):
            return "place"

        def can_run() -> bool:
            return (
                (not own_limit or self.held[s] + self.pend[s] <= self.cap[s])
                and self._deficit() <= tol
                and fit.ok()
            )

        taken: list[tuple[_Att, str]] = []
        ok = can_run()
        if not ok:
            for a, reason in cands:
                if reason == RECLAIM:
                    if own_limit and self.held[s] + self.pend[s] > self.cap[s]:
                        break  # only the share's own jobs bring it within its capacity
                    if not self._fits_budget(a.s, [a.gpus]):
                        continue  # reclaim never takes a share's own capacity (beyond one indivisible job)
                if (
                    reach is not None
                    and self._deficit() <= tol
                    and (not own_limit or self.held[s] + self.pend[s] <= self.cap[s])
                    and not any(i in reach for i, _ in a.on)
                ):
                    continue  # it could only be given back
                self._mark(a, reason == RECLAIM)
                fit.add(a, 1)
                taken.append((a, reason))
                if can_run():
                    ok = True
                    break
        if not ok:
            why = (
                "own"
                if own_limit and self.held[s] + self.pend[s] > self.cap[s]
                else "cover"
                if self._deficit() > tol
                else "place"
            )
            for a, _ in reversed(taken):
                fit.add(a, -1)
                self._unmark(a)
            return why
        kept: list[tuple[_Att, str]] = []
        for entry in reversed(taken):
            a = entry[0]
            fit.add(a, -1)
            self._unmark(a)
            if can_run():
                continue  # not needed: it keeps running
            self._mark(a, entry[1] == RECLAIM)
            fit.add(a, 1)
            kept.append(entry)
        kept.reverse()
        return kept, fit

    # -- decisions -------------------------------------------------------------------------------------

    def _commit_victims(self, victims: list[tuple[_Att, str]], job: QueuedView) -> int:
        """Record the pre-emptions; their GPUs join the pool being freed. Returns GPUs added there."""
        added = 0
        for a, reason in victims:
            v = a.view
            self.out.preemptions.append(
                Preemption(v.attempt_id, v.job_id, v.share, reason, job.job_id, job.share)
            )
            for i, c in a.on:
                if self.sched[i]:
                    self.pend_u[i] += c
                    self.pend_nodes.add(i)
                    added += c
        for s in {a.s for a, _ in victims}:
            for lst, ptr in ((self.vlist[s], self.vptr), (self.ilist[s], self.iptr)):
                p = ptr[s]
                while p < len(lst) and lst[p].victim:
                    p += 1
                ptr[s] = p
        return added

    def _admit(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        borrowed: bool,
        victims: list[tuple[_Att, str]],
    ) -> int:
        """Admit q[s][k], whose GPUs are already in `pend[s]` (moved to `held` here)."""
        job = self.q[s][k]
        self._chg(s, dh=job.gpus, dp=-job.gpus)
        where = []
        for i, c in placement:
            idx = self._free_list(i)
            where.append((self.node_names[i], tuple(idx[:c])))
            del idx[:c]
            self._set_free(i, self.free_u[i] - c)
        lenders = self._lenders() if borrowed else ()
        self.out.admissions.append(
            Admission(
                job_id=job.job_id,
                share=job.share,
                placement=tuple(where),
                borrowed=borrowed,
                reason=ADMITTED_BORROWED if borrowed else ADMITTED_OWN,
                lenders=lenders,
            )
        )
        if victims and self._commit_victims(victims, job):
            self.epoch += 1
        self.status[s][k] = _ADMITTED
        return _ADMITTED

    def _hold(self, placement: list[tuple[int, int]]) -> tuple[tuple[tuple[str, int], ...], int]:
        """Reserve GPUs on these nodes for one waiting job: GPUs being freed first, then free ones.
        Returns what was held and how many of those GPUs were being freed."""
        held = []
        from_pend = 0
        for i, c in placement:
            take = min(c, self.pend_u[i])
            from_pend += take
            self.pend_u[i] -= take
            if not self.pend_u[i]:
                self.pend_nodes.discard(i)
            if c > take:
                self._set_free(i, self.free_u[i] - (c - take))
            held.append((self.node_names[i], c))
        return tuple(held), from_pend

    def _earmark(
        self, s: int, k: int, placement: list[tuple[int, int]], victims: list[tuple[_Att, str]]
    ) -> int:
        """q[s][k] (already in `pend[s]`) waits for the GPUs being freed on `placement`."""
        job = self.q[s][k]
        added = self._commit_victims(victims, job) if victims else 0
        self.out.reserved[job.job_id], from_pend = self._hold(placement)
        if added > from_pend:
            self.epoch += 1  # more GPUs being freed than this job takes: others may now fit
        reclaim = sorted({a.view.share for a, r in victims if r == RECLAIM})
        if any(r == PRIORITY for _, r in victims):
            why = "waiting for lower-priority jobs of its share to stop"
            if reclaim:
                why += " and for reclaim from share " + ", ".join(reclaim)
        elif reclaim:
            why = "waiting for reclaim from share " + ", ".join(reclaim)
        else:
            why = "waiting for pre-empted jobs to stop"
        self.out.waiting[job.job_id] = why
        self.status[s][k] = _EARMARKED
        self.held_for[s] = min(self.held_for[s], self.qkey[s][k])
        return _EARMARKED

    def _lenders(self) -> tuple[str, ...]:
        """Who a borrowed admission draws from: every lender with idle lendable GPUs (proportional
        accounting), the largest first."""
        names = self.sh.names
        items = []
        for s in self.lender_shares:
            u = self.held[s] + self.pend[s]
            idle = self.cap[s] - u
            if idle > 0:
                items.append((-idle, names[s]))
        if self.pool:
            items.append((-self.pool, UNASSIGNED))
        items.sort()
        return tuple(n for _, n in items)

    # -- reasons ---------------------------------------------------------------------------------------

    def _reason(self, key: tuple) -> str:
        """Why a job waits, naming the blocker with its numbers (SEMANTICS "Forecast"). `key` is the
        blocker's kind and numbers, so equal blockers share one sentence."""
        why = self._reasons.get(key)
        if why is None:
            kind, t = key[0], self.t
            if kind == "place":
                g, free = key[1], key[2]
                if g > self.M:
                    free_now = (
                        "none is free" if not free else "1 is free" if free == 1 else f"{free} are free"
                    )
                    why = f"needs {g // self.M} whole {self.M}-GPU {t} nodes; {free_now}"
                elif not free:
                    why = (
                        f"needs {g} {t}; none is free"
                        if g == 1
                        else f"needs {g} {t} on one node; none is free"
                    )
                else:
                    why = f"needs {g} {t} on one node; the largest free block is {free}"
            elif kind == "cover":
                why = (
                    "cluster over-committed: no capacity left to honour the share's guarantee"
                    if self.overcommitted
                    else "waiting for borrowed capacity to be returned"
                )
            elif kind == "behind":
                why = f"behind {_plural(key[1], 'job')} ahead of it in its share's queue"
            elif kind == "held":
                why = "behind a job of its share that waits for GPUs being freed for it"
            else:
                g, used, cap = key[1], key[2], key[3]
                own = f"needs {g} {t}: share at its own capacity ({used} of {cap})"
                if used < cap:
                    own = f"needs {g} {t}: its share has {cap - used} of {cap} own left"
                if kind == "strategy":
                    why = f"{own}; a {key[4]} share does not borrow"
                elif kind == "limit":
                    borrowed, bcap = key[4], key[5]
                    why = (
                        f"{own}; its borrow limit allows no borrowing"
                        if bcap == 0
                        else f"{own}, borrow limit reached ({borrowed} of {bcap})"
                    )
                elif kind == "slack":
                    spare = key[4]
                    why = (
                        f"{own}; nothing idle to borrow"
                        if spare <= 0
                        else f"{own}; only {spare} idle lendable {t} to borrow"
                    )
                else:  # pragma: no cover - every key kind is listed above
                    why = "waiting"
            self._reasons[key] = why
        return why

    def _own_numbers(self, s: int, g: int) -> tuple[int, int, int]:
        """(gpus asked, own capacity in use, own capacity) for a reason."""
        use = self.held[s] + max(self.grace[s], self.pend[s])
        return g, min(use, self.cap[s]), self.cap[s]

    def _place_key(self, g: int) -> tuple:
        if g > self.M:
            free = sum(1 for i in self.m_nodes if self.free_u[i] == self.M)
            return ("place", g, free)
        return ("place", g, self._max_free())

    def _wait(self, s: int, k: int, key: tuple) -> int:
        self.out.waiting[self.q[s][k].job_id] = self._reason(key)
        self.status[s][k] = _BLOCKED
        return _BLOCKED

    # -- starvation guard (rule 6) ---------------------------------------------------------------------

    def _is_head(self, s: int, k: int) -> bool:
        st = self.status[s]
        p = self.hptr[s]
        n = len(self.q[s])
        while p < n and st[p] in (_ADMITTED, _EARMARKED):
            p += 1
        self.hptr[s] = p
        return p == k

    def _starving(self, job: QueuedView) -> bool:
        return self.now - job.submitted_at > self.starvation_s

    def _reserve_starving(self, s: int, k: int, tol: int) -> int:
        """The share's head has waited too long: hold the node(s) it needs next (those closest to
        fitting it) so backfill cannot take them, and its GPUs in the share's accounting if the cover
        allows. q[s][k] is not in `pend[s]` when this is called."""
        job = self.q[s][k]
        g = job.gpus
        fu, pu = self.free_u, self.pend_u
        if g > self.M:
            ranked = sorted(self.m_nodes, key=lambda i: (-(fu[i] + pu[i]), i))[: g // self.M]
            placement = [(i, self.M) for i in sorted(ranked)]
        else:
            best = None
            for i in range(len(self.size)):
                if self.sched[i] and self.size[i] >= g:
                    key = (-(fu[i] + pu[i]), i)
                    if best is None or key < best:
                        best = key
            placement = [(best[1], g)]
        self._chg(s, dp=g)
        if self._deficit() > tol:
            self._chg(s, dp=-g)
        hold = []
        for i, c in placement:
            hold.append((i, min(c, fu[i] + pu[i])))
        self.out.reserved[job.job_id] = self._hold([(i, c) for i, c in hold if c])[0]
        nodes = ", ".join(self.node_names[i] for i, _ in placement)
        self.out.waiting[job.job_id] = (
            f"{self._reason(self._place_key(g))}; holding {nodes} for it (waited over {self.starvation_s:g}s)"
        )
        self.status[s][k] = _RESERVED
        self.held_for[s] = min(self.held_for[s], self.qkey[s][k])
        return _RESERVED

    def _blocked_on_placement(self, s: int, k: int, tol: int) -> int:
        job = self.q[s][k]
        if self._starving(job) and self._is_head(s, k):
            return self._reserve_starving(s, k, tol)
        return self._wait(s, k, self._place_key(job.gpus))

    # -- rules 2-4: own capacity ---------------------------------------------------------------------

    def _place_failed(self, g: int) -> bool:
        if g > self.M:
            v, e = self.fail_gang
            return e == self.epoch and g // self.M >= v
        v, e = self.fail_single
        return e == self.epoch and g >= v

    def _own_phase(self, s: int, k: int) -> int:
        job = self.q[s][k]
        g = job.gpus
        c = self.cap[s]
        if self.held[s] + self.pend[s] + g <= c:
            return self._own(s, k, self.held[s] + self.grace[s] + g <= c)
        # Rule 4 "may" pre-empt: not when the job can borrow right now, or its victim would only
        # borrow the same idle GPUs back in the next pass (pre-emption churn for nothing).
        if self.in_share[s] and g <= c and not self._can_borrow_now(s, k) and self._in_share(s, k):
            return _EARMARKED
        self.status[s][k] = _DEFER
        return _DEFER

    def _can_borrow_now(self, s: int, k: int) -> bool:
        g = self.q[s][k].gpus
        return (
            self.lab[s]
            and self.qkey[s][k] <= self.held_for[s]
            and self.held[s] + max(self.grace[s], self.pend[s]) + g <= self.cap[s] + self.bcap[s]
            and self._deficit_if(s, g) <= 0
            and (g > self.M or self._max_free() >= g)
            and self._place(g) is not None
        )

    def _own(self, s: int, k: int, can_now: bool) -> int:
        """Rules 2-3 for a job that fits its share's remaining own capacity: admitted own where a node
        and the cover allow it, else it reclaims a minimal set of borrowed work in rule 3's order and
        waits for those GPUs (rule 9)."""
        job = self.q[s][k]
        g = job.gpus
        d = self._deficit()
        tol = d if d > 0 else 0  # never make the cover worse; restore it if it held
        if self._place_failed(g):
            return self._blocked_on_placement(s, k, tol)
        self._taken = {}
        self._chg(s, dp=g)
        found = self._minimal_victims(
            s, g, tol, ((a, RECLAIM) for a in self._reclaim_candidates(s)), own_limit=False
        )
        if isinstance(found, str):
            self._chg(s, dp=-g)
            if found == "cover":
                return self._wait(s, k, ("cover",))
            memo = (g // self.M if g > self.M else g, self.epoch)
            if g > self.M:
                self.fail_gang = memo
            else:
                self.fail_single = memo
            return self._blocked_on_placement(s, k, tol)
        victims, fit = found
        placement = self._place(g, fit.extra, True, self.ben_nodes.get(job.job_id))
        # GPUs in grace count as freed: with its share's limit holding now, the job starts at once on
        # free GPUs while its victims (if any, for the cover) stop.
        if can_now and all(self.free_u[i] >= c for i, c in placement):
            return self._admit(s, k, placement, False, victims)
        return self._earmark(s, k, placement, victims)

    def _in_share(self, s: int, k: int) -> bool:
        """Rule 4: pre-empt strictly lower-priority work of the share, only if that makes the job fit
        (own capacity, cover, and a node)."""
        job = self.q[s][k]
        g, p = job.gpus, job.priority
        memo = self.in_fail.get(s)
        if memo is not None and memo[2] == self.epoch and g >= memo[0] and p <= memo[1]:
            return False
        self._victims()
        n = bisect_left(self.iprio[s], p)  # the victim order starts with the lowest priorities
        if self._try_in_share(s, k, n):
            return True
        self.in_fail[s] = (g, p, self.epoch)
        return False

    def _try_in_share(self, s: int, k: int, n: int) -> bool:
        """Rule 4 with rule 9: one candidate list, the share's strictly-lower-priority attempts in rule
        4's order, then other shares' borrowed attempts in rule 3's order; a minimal set of them so
        that the job runs as own."""
        if not n:
            return False
        job = self.q[s][k]
        g = job.gpus
        d = self._deficit()
        tol = d if d > 0 else 0
        self._taken = {}
        self._chg(s, dp=g)

        mine = list(self._in_share_candidates(s, n))
        if sum(a.gpus for a in mine) < self.held[s] + self.pend[s] - self.cap[s]:
            self._chg(s, dp=-g)
            return False  # even all of them would not bring it within its capacity
        ins: dict[int, int] = {}
        for a in mine:
            for i, c in a.on:
                ins[i] = ins.get(i, 0) + c

        def cands() -> Iterator[tuple[_Att, str]]:
            for a in mine:
                yield a, PRIORITY
            for a in self._reclaim_candidates(s):
                yield a, RECLAIM

        found = self._minimal_victims(s, g, tol, cands(), own_limit=True, ins=ins)
        if isinstance(found, str):
            self._chg(s, dp=-g)
            return False
        victims, fit = found
        placement = self._place(g, fit.extra, True)
        self._earmark(s, k, placement, victims)
        return True

    # -- rule 5: borrowing ---------------------------------------------------------------------------

    def _borrow(self, s: int, k: int) -> int:
        job = self.q[s][k]
        g = job.gpus
        if not self.lab[s]:
            if g <= self.room0[s]:
                return self._wait(s, k, ("behind", k))
            return self._wait(s, k, ("strategy", *self._own_numbers(s, g), self.sh.views[s].strategy))
        if self.qkey[s][k] > self.held_for[s]:
            return self._wait(s, k, ("held",))
        # A borrower that lost its own room to earlier jobs of its share hears why it cannot borrow.
        limit = self.cap[s] + self.bcap[s]
        use = self.held[s] + max(self.grace[s], self.pend[s])
        if use + g > limit:
            borrowed = max(0, use - self.cap[s])
            return self._wait(s, k, ("limit", *self._own_numbers(s, g), borrowed, self.bcap[s]))
        if self._deficit_if(s, g) > 0:
            # What others could lend: the share's own idle GPUs are part of the lendable total.
            spare = -self._deficit() - (max(0, self.cap[s] - use) if self.lender[s] else 0)
            return self._wait(s, k, ("slack", *self._own_numbers(s, g), spare))
        placement = None if g <= self.M and self._max_free() < g else self._place(g)
        if placement is None:
            return self._blocked_on_placement(s, k, 0)
        self._chg(s, dp=g)
        return self._admit(s, k, placement, True, [])

    # -- the pass ----------------------------------------------------------------------------------------

    def run(self) -> None:
        q, status, qkey = self.q, self.status, self.qkey
        shares = [s for s in range(len(q)) if q[s]]
        if not shares:
            return
        is_ben = self.is_ben
        later: list[tuple[tuple, int, int]] = []  # (queue key, share, index): first in line to borrow
        touched: dict[int, list[int]] = {}  # share -> queue indexes phase A decided on

        # A. Rule 7: beneficiaries of earlier pre-emptions, ahead of everything else.
        # Rule 6: a starving head goes next, before backfill and other shares can take its node.
        heads = []
        for s in shares:
            for k, job in enumerate(q[s]):
                if job.job_id in is_ben:
                    continue
                if self._starving(job):
                    heads.append((qkey[s][k], s, k))
                break
        for _, s, k in self.bens:
            # Ahead of everything else, borrowing included: its victims have made room for it.
            touched.setdefault(s, []).append(k)
            if status[s][k] == _TODO and self._own_phase(s, k) == _DEFER:
                self._borrow(s, k)
        for key, s, k in sorted(heads):
            touched.setdefault(s, []).append(k)
            if status[s][k] == _TODO and self._own_phase(s, k) == _DEFER:
                later.append((key, s, k))

        # B. Rules 2-4, shares by lowest own-use ratio (ties: name), recomputed as they admit.
        heap = [(self._own_ratio(s), s) for s in shares if self.cap[s]]
        heapq.heapify(heap)
        while heap:
            _, s = heapq.heappop(heap)
            self._own_share(s, heap)

        # C. Rule 5: borrowers by fewest borrowed GPUs relative to capacity (ties: name).
        for _, s, k in sorted(later):
            if status[s][k] == _DEFER:
                self._borrow(s, k)
        # Still to place: every job of the queue that phases A and B did not decide (looked at and
        # deferred, or never reached).
        pending: dict[int, _Open] = {}
        open_ = (_TODO, _DEFER)
        for s in shares:
            decided = {k for k, v in status[s].items() if v not in open_}
            if len(decided) < len(q[s]):
                pending[s] = _Open(0, len(q[s]), decided)
        heap = []
        lazy = self.out.later if LAZY_REASONS else None
        for s, ks in pending.items():
            if self.lab[s]:
                heap.append((self._borrow_ratio(s), s))
            elif lazy is None:
                for k in ks:
                    self._borrow(s, k)
            else:
                # Only says why they wait, from numbers of this share that phase C does not change
                # (it admits only LEND_AND_BORROW jobs, without victims): left for when it is asked.
                lazy.append((self._borrow, s, ks))
        heapq.heapify(heap)
        ptr = dict.fromkeys(pending, 0)
        while heap:
            _, s = heapq.heappop(heap)
            ks = pending[s]
            k, n, decided = ptr[s], ks.stop, ks.decided
            limit = self.cap[s] + self.bcap[s]
            suf = self.sufmin[s]
            while k < n:
                if k in decided:
                    k += 1
                    continue
                if lazy is not None and self.held[s] + max(self.grace[s], self.pend[s]) + suf[k] > limit:
                    # Not even the smallest job left fits the borrow limit, and this share's numbers
                    # cannot change any more: each waits at "held" or "limit" (_borrow's first checks).
                    lazy.append((self._borrow, s, ks.part(k)))
                    k = n
                    break
                if self._borrow(s, k) == _ADMITTED:
                    k += 1
                    if heap:
                        key = (self._borrow_ratio(s), s)
                        if key > heap[0]:
                            heapq.heappush(heap, key)
                            break
                    continue
                k = k + 1 if lazy is None else self._skip_blocked(s, k, ks)
            ptr[s] = k

    def _skip_blocked(self, s: int, k: int, ks: _Open) -> int:
        """Rule 5, after job k of a LEND_AND_BORROW share could not borrow: the next queue index whose
        job might. When k waits behind a held job, at its borrow limit or for lendable GPUs, every
        later job as big or bigger waits the same way, and nothing changes while they are told so:
        their reasons, from the numbers as they are now, are left for when they are read."""
        q = self.q[s]
        g = q[k].gpus
        cap, held_for, bcap = self.cap[s], self.held_for[s], self.bcap[s]
        use = self.held[s] + max(self.grace[s], self.pend[s])
        limit = cap + bcap
        if self.qkey[s][k] > held_for:
            below = 0  # every later job is held too
        elif use + g > limit:
            below = limit - use + 1
        elif self._deficit_if(s, g) > 0:
            below = g  # a bigger job would break the cover at least as much
        else:
            return k + 1  # no node for it: not skipped (a starving head may reserve)
        nxt = self._next_below(s, k, below)
        if nxt > k + 1:
            used, borrowed = min(use, cap), max(0, use - cap)
            spare = -self._deficit() - (max(0, cap - use) if self.lender[s] else 0)
            keys, out, reason = self.qkey[s], self.out.waiting, self._reason

            def why(s: int, k: int) -> None:
                # _borrow's checks in its order, with the numbers of the moment it was skipped.
                g = q[k].gpus
                if keys[k] > held_for:
                    key: tuple = ("held",)
                elif use + g > limit:
                    key = ("limit", g, used, cap, borrowed, bcap)
                else:
                    key = ("slack", g, used, cap, spare)
                out[q[k].job_id] = reason(key)

            self.out.later.append((why, s, ks.part(k + 1, nxt)))
        return nxt

    def _next_below(self, s: int, k: int, below: int) -> int:
        """The first queue index after k whose job needs fewer than `below` GPUs (the queue's length
        if none)."""
        suf = self.sufmin[s]
        n = len(suf)
        if k + 1 >= n or suf[k + 1] >= below:
            return n
        key = self.qkey[s][k]
        first = None
        for g, keys in self.by_size[s].items():
            if g < below:
                i = bisect_right(keys, key)
                if i < len(keys) and (first is None or keys[i] < first):
                    first = keys[i]
        return n if first is None else bisect_left(self.qkey[s], first, k + 1)

    def _next_not_deferred(self, s: int, k: int) -> int:
        """After job k of share s was deferred by rules 2-4: the next queue index whose job _own_phase
        might not defer as things are now; every job between would be deferred, and a deferral changes
        nothing. A job is deferred when it does not fit the share's own room and rule 4 cannot help:
        the share has no in-share pre-emption, or the job needs more than its capacity, or this
        epoch's failed try was for no more GPUs and no lower priority (priorities only fall along the
        queue)."""
        room = self.cap[s] - self.held[s] - self.pend[s]
        below = room + 1  # jobs of `below` GPUs or more are deferred
        if self.in_share[s]:
            memo = self.in_fail.get(s)
            if memo is not None and memo[2] == self.epoch and self.q[s][k].priority <= memo[1]:
                below = max(below, memo[0])
            else:
                below = max(below, self.cap[s] + 1)
        return self._next_below(s, k, below)

    def _own_ratio(self, s: int) -> float:
        u = self.held[s] + self.pend[s]
        return min(u, self.cap[s]) / self.cap[s]

    def _borrow_ratio(self, s: int) -> float:
        return self._borrowed(s) / max(1, self.cap[s])

    def _own_share(self, s: int, heap: list[tuple[float, int]]) -> None:
        """Walk share s's queue for rules 2-4 until its own-use ratio passes the next share's."""
        qs, st, suf = self.q[s], self.status[s], self.sufmin[s]
        k = self.bptr[s]
        n = len(qs)
        while k < n:
            if st[k] != _TODO:
                k += 1
                continue
            if self.cap[s] - self.held[s] - self.pend[s] < suf[k]:
                # Nothing left in this queue fits its own capacity: all of it is for rule 5, unless
                # rule 4 could still make room. It cannot when the last failed try (this epoch) was
                # for no more GPUs and no lower priority than any job left (priorities only fall
                # along the queue).
                if not self.in_share[s]:
                    break
                memo = self.in_fail.get(s)
                if (
                    memo is not None
                    and memo[2] == self.epoch
                    and suf[k] >= memo[0]
                    and qs[k].priority <= memo[1]
                ):
                    break
            before = self._own_ratio(s)
            outcome = self._own_phase(s, k)
            if outcome == _DEFER:
                k = self._next_not_deferred(s, k)
                continue
            k += 1
            if outcome in (_ADMITTED, _EARMARKED) and heap:
                key = (self._own_ratio(s), s)
                if key[0] != before and key > heap[0]:
                    heapq.heappush(heap, key)
                    break
        self.bptr[s] = k
