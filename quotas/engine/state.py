"""The pass state of one GPU type, kept between passes by policy.Engine (or built at once by
policy.plan): node buckets, per-share held/grace/pending counts, running attempts in victim order, queues
in rule 1's order with their suffix minima and per-size keys, and the lazily written waiting reasons."""

from __future__ import annotations

import heapq
import math
import weakref
from bisect import bisect_left
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from quotas.engine.pyclasses import (  # noqa: F401 (read from here by the rest of the engine)
    ADMITTED,
    BLOCKED,
    DEFERRED,
    EARMARKED,
    RESERVED,
    TODO,
    LazyWaiting,
    PassStatus,
)
from quotas.engine.tree import GroupSpec, TreeIndex, limit_gpus
from quotas.engine.views import (
    LEND_AND_BORROW,
    RESERVE,
    Admission,
    NodeView,
    Preemption,
    ProtectionWait,
    QueuedView,
    RunningView,
    ShareView,
    borrow_cap_gpus,
    borrowed_order_key,
    lends,
    neg_priority,
    never_fits,
    take_over,
    victim_key,
)


class OpenIndexes:
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

    def part(self, start: int, stop: int | None = None) -> OpenIndexes:
        return OpenIndexes(start, self.stop if stop is None else stop, self.decided)


NO_LIMIT = 1 << 62


MASKS: dict[tuple[int, ...], int] = {}  # GPU index tuple -> bit mask; a memo of _mask()


def _mask(idxs: Sequence[int]) -> int:  # a tuple, or a list (decoded JSON: not memoised)
    m = 0
    for x in idxs:
        if x >= 0:
            m |= 1 << x
    if idxs.__class__ is tuple:
        if len(MASKS) > 65536:
            MASKS.clear()
        MASKS[idxs] = m
    return m


@dataclass(frozen=True, slots=True)
class NodeTable:
    """One type's nodes as the pass indexes them: by name, each name once (the first in input order)."""

    names: list[str]
    size: list[int]
    sched: list[bool]
    full: list[int]  # bit mask of the node's GPU indexes
    index: dict[str, int]
    schedulable_gpus: int
    largest_node: int
    largest_schedulable: int
    largest_nodes: list[int]


NODE_TABLES: dict[str, tuple[tuple[NodeView, ...], NodeTable]] = {}  # gpu type -> (nodes, table)


def node_table(gpu_type: str, nodes: list[NodeView] | tuple[NodeView, ...]) -> NodeTable:
    """Read-only node structures for one type, memoised on the (immutable) node views: the simulator
    and successive passes mostly see the same nodes. The pass never changes a table."""
    key = tuple(nodes)
    hit = NODE_TABLES.get(gpu_type)
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
    table = NodeTable(
        names=names,
        size=size,
        sched=sched,
        full=[(1 << sz) - 1 for sz in size],
        index={name: i for i, name in enumerate(names)},
        schedulable_gpus=sum(sz for sz, ok in zip(size, sched, strict=True) if ok),
        largest_node=M,
        largest_schedulable=max((sz for sz, ok in zip(size, sched, strict=True) if ok), default=0),
        largest_nodes=[i for i in range(len(kept)) if sched[i] and size[i] == M],
    )
    if len(NODE_TABLES) >= 64:
        NODE_TABLES.clear()
    NODE_TABLES[gpu_type] = (key, table)
    return table


class PassAttempt:
    """A running attempt as the pass sees it (mutable: it may become a victim)."""

    __slots__ = ("view", "s", "gpus", "prio", "on", "victim", "bnow", "masks", "vkey", "bkey", "until")

    def __init__(self, view: RunningView, s: int, on: list[tuple[int, int]], gpus: int, until: float) -> None:
        self.view = view
        self.s = s
        self.until = until  # rule 10: protected (never a candidate) while the pass's now is before this
        self.gpus = gpus
        self.prio = view.priority
        self.on = on  # [(node index, GPUs on it)] for the nodes of this type that it holds
        self.victim = False
        self.bnow = False  # in borrowed_attempts()
        self.masks: list[tuple[int, int]] = []  # [(node index, bit mask of the GPUs it holds there)]
        self.vkey = victim_key(view)  # rules 3 and 4's victim order (descending)
        self.bkey = borrowed_order_key(view)  # rule 8's order (descending)


class PassOutput:
    __slots__ = (
        "admissions",
        "preemptions",
        "waiting",
        "reserved",
        "later",
        "protected",
        "recheck_at",
        "unsettled",
        "admitted_at_hold",
    )

    def __init__(self) -> None:
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[Hashable, str] = {}
        self.reserved: dict[Hashable, tuple[tuple[str, int], ...]] = {}
        self.protected: dict[Hashable, ProtectionWait] = {}
        self.recheck_at: float | None = None
        # Reasons not written during the pass: (function, share, queue indexes) run on first read.
        self.later: list[tuple[Callable[[int, int], object], int, Iterable[int]]] = []
        # Something this pass did keeps a pass made right after its admissions from being known to
        # decide nothing (Plan.settled, rules._settled): a job earmarked GPUs, a beneficiary started,
        # rule 4 may find candidates it did not, or the pass ranked by fair-share values.
        self.unsettled = False
        # How many admissions the pass had made when it first held a node for a starving head (rule 6):
        # -1 until it does (Plan.settled).
        self.admitted_at_hold = -1


class ShareIndex:
    """The shares as a pass indexes them, by name order. A share referenced by work but missing from
    the declared ones owns nothing and may borrow nothing (see _all_shares)."""

    __slots__ = ("known", "names", "views", "sidx", "tree")

    def __init__(
        self,
        declared: Iterable[ShareView],
        running: Iterable[RunningView],
        queued: Iterable[QueuedView],
        groups: Sequence[GroupSpec] = (),
    ):
        shares = {s.name: s for s in declared}
        self.known = set(shares)
        named = {r.share for r in running} | {q.share for q in queued}
        for name in sorted(named - shares.keys()):
            shares[name] = ShareView(name=name, capacity={}, strategy=LEND_AND_BORROW, borrow_limit=0)
        self.names = sorted(shares)
        self.views = [shares[n] for n in self.names]
        self.sidx = {n: i for i, n in enumerate(self.names)}
        # The organisation tree (tree.TreeIndex), or None for a flat layout with every weight 1: then
        # every rule runs exactly as it did before the tree existed.
        self.tree: TreeIndex | None = None
        if groups or any(v.weight != 1 for v in self.views):
            self.tree = TreeIndex(self.views, tuple(groups))


def _job_key(job: QueuedView) -> tuple:
    # Rule 1's order in a pass: priority desc, submit time asc, job id asc (rule 8: the earlier wins).
    return (-job.priority, job.submitted_at, job.job_id)


KEY_MAX = (math.inf,)  # after every _job_key


def _still_read(reader: weakref.ref) -> bool:
    """A plan that may still read a type state's queue lists: alive, with reasons left to write."""
    w = reader()
    return w is not None and bool(w._later)


class TypeState:
    """One GPU type's scheduling state as it stands between passes, kept up to date by events
    (`add_run`, `remove_run`, `add_job`, `remove_job`) instead of being rebuilt from a snapshot for
    every pass: node tables, GPUs in use per node, per share the GPUs held and in grace, the running
    attempts, the queue in rule 1's order with its suffix minima, and the victim orders (refreshed
    for the shares whose attempts changed, when a pass first needs them). A pass (TypePass) copies
    the few small arrays it changes and reads the rest: it costs what it decides plus the shares it
    looks at, not the size of the queue.

    `plan(snapshot)` builds the same state in bulk, so production passes, the simulator, the forecast
    and the what-if run one engine."""

    def __init__(
        self,
        sh: ShareIndex,
        gpu_type: str,
        nodes: Iterable[NodeView],
        running: Iterable[RunningView],
        queued: Iterable[QueuedView],
    ) -> None:
        self.sh = sh
        self.t = gpu_type
        st = node_table(gpu_type, tuple(nodes))
        self.node_names, self.size, self.sched, self.full = st.names, st.size, st.sched, st.full
        self.node_index = st.index
        self.schedulable_gpus, self.largest_node, self.largest_schedulable, self.largest_nodes = (
            st.schedulable_gpus,
            st.largest_node,
            st.largest_schedulable,
            st.largest_nodes,
        )
        n_nodes = len(st.names)

        views = sh.views
        n = len(views)
        self.capacity = cap = [max(0, v.capacity.get(gpu_type, 0)) for v in views]
        self.lender = [lends(v.strategy) for v in views]
        self.reserve = [v.strategy == RESERVE for v in views]
        self.may_borrow = [v.strategy == LEND_AND_BORROW for v in views]
        self.in_share = [v.in_share_preemption for v in views]
        # Rule 10: each share's protection window; `protects`: some share has one (else the pass never
        # looks at protection at all).
        self.min_run = [max(0, v.min_runtime_s) for v in views]
        self.protects = any(self.min_run)
        limits = [borrow_cap_gpus(v, c) for v, c in zip(views, cap, strict=True)]
        self.borrow_cap = [NO_LIMIT if b is None else b for b in limits]
        self.pool = max(0, self.schedulable_gpus - sum(cap))
        self.overcommitted = sum(cap) > self.schedulable_gpus
        # Why-it-waits sentences by blocker key (reasons.WaitingReasons._reason); they depend on the key, the
        # type, the node size and `overcommitted` only, all fixed for this base's life.
        self.reasons: dict[tuple, str] = {}
        # g -> (the schedulable nodes with at least g GPUs, by index; whether they are all the schedulable
        # nodes): rule 6's held node for a starving head is chosen among them. Fixed for this base's
        # life, like the node tables.
        self.fit_nodes: dict[int, tuple[list[int], bool]] = {}
        self.lender_shares = [s for s in range(n) if self.lender[s] and cap[s] > 0]
        # The tree's numbers of this type (see cover.py): each node's capacity and its limits in GPUs.
        tree = sh.tree
        if tree is not None and tree.has_groups:
            self.node_capacity = tree.capacities(cap)
            self.node_lend_cap = [
                limit_gpus(lim, c) for lim, c in zip(tree.lend_limit, self.node_capacity, strict=True)
            ]
            self.node_borrow_cap = [
                limit_gpus(lim, c) for lim, c in zip(tree.borrow_limit, self.node_capacity, strict=True)
            ]
        elif tree is not None:
            self.node_capacity = list(cap)
        # A fair-share value's divisor per node (cover._node_value): weight x max(1, capacity); every
        # weight 1 without a tree (fair reclaim or history alone).
        weights, capacities = (tree.weight, self.node_capacity) if tree is not None else ([1.0] * n, cap)
        self.node_scale = [w * (c if c > 1 else 1) for w, c in zip(weights, capacities, strict=True)]

        # -- running attempts
        self.used = [0] * n_nodes  # GPUs in use per node, a bit mask
        self.pend_u = [0] * n_nodes  # GPUs of pre-empting attempts per schedulable node
        self.pend_nodes: set[int] = set()
        self.held = [0] * n
        self.grace = [0] * n
        # The cover's numbers at a pass's start (a cover.CoverAtStart, made by the first pass), and the
        # shares whose `held` or `grace` changed since (add_run, remove_run: nowhere else), for the next
        # pass to bring it up to date.
        self.cover_at_start: Any = None  # cover.CoverAtStart once a pass made it (cover imports this module)
        self.cover_changed: set[int] = set()
        self.atts: list[dict[Hashable, PassAttempt]] = [{} for _ in range(n)]  # not pre-empting
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
        # Each share's attempts (not pre-empting) kept sorted, keys ascending, in the victim order
        # (with their priorities, negated: ascending too) and in rule 8's order: victim_orders and rule
        # 4 read them from the end instead of sorting every attempt of a share that changed, on every
        # pass. `pgpus`: per share, GPUs held per priority (rule 4's quick capacity test).
        self.vkeys: list[list[tuple]] = [[] for _ in range(n)]
        self.vatts: list[list[PassAttempt]] = [[] for _ in range(n)]
        self.vnprio: list[list[int]] = [[] for _ in range(n)]
        self.pgpus: list[dict[int, int]] = [{} for _ in range(n)]
        self.bkeys: list[list[tuple]] = [[] for _ in range(n)]
        self.batts: list[list[PassAttempt]] = [[] for _ in range(n)]
        for run in running:
            self.add_run(run, bulk=True)
        for s in range(n):
            if self.atts[s]:
                order = sorted(self.atts[s].values(), key=attrgetter("vkey"))
                self.vkeys[s] = [a.vkey for a in order]
                self.vatts[s] = order
                self.vnprio[s] = [-a.prio for a in order]
                order = sorted(order, key=attrgetter("bkey"))
                self.bkeys[s] = [a.bkey for a in order]
                self.batts[s] = order
        self.free = [st.size[i] - self.used[i].bit_count() if st.sched[i] else 0 for i in range(n_nodes)]
        self.free_total = sum(self.free)  # rule 9's last paragraph counts the free GPUs of the type
        self._rebuild_buckets()
        # Nodes with all their GPUs free (only nodes of the largest size M can be): a blocked gang's
        # reason and node test ask for it, so it is kept here, and by each pass from here on.
        self.whole = (
            sum(1 for i in st.largest_nodes if self.free[i] == st.largest_node) if st.largest_node else 0
        )

        # -- victim orders, refreshed for the shares in `dirty` when a pass first needs them
        self.dirty: set[int] = set(range(n))
        # Called before the victim orders are read (the Engine's checkpoints told for later): the safe
        # points they depend on are brought up to date only by a pass that needs them.
        self.before_victims: Callable[[], None] | None = None
        self.vlist: list[list[PassAttempt]] = [[] for _ in range(n)]
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
            m = NO_LIMIT
            for k in range(len(qs) - 1, -1, -1):
                g = qs[k].gpus
                if g < m:
                    m = g
                suf[k] = m
            self.suf.append(suf)

    # -- nodes ---------------------------------------------------------------------------------------

    def _rebuild_buckets(self) -> None:
        self.bk = [[] for _ in range(self.largest_schedulable + 1)]
        for i, f in enumerate(self.free):
            if f:
                self.bk[f].append(i)  # ascending: already a heap
        self._bk_entries = sum(map(len, self.bk))

    def fresh_bucket(self, v: int) -> list[int]:
        """Heap v without its stale entries (nodes whose free count moved on since they were pushed):
        a new list, so that a pass still reading the old one keeps it as it was."""
        h = self.bk[v]
        free = self.free
        if h and free[h[0]] != v:
            clean = sorted({i for i in h if free[i] == v})  # sorted: a heap
            self._bk_entries -= len(h) - len(clean)
            self.bk[v] = h = clean
        return h

    def _free_changed(self, i: int, d: int) -> None:
        v = self.free[i] + d
        self.free_total += d
        if self.largest_node:
            self.whole += (v == self.largest_node) - (self.free[i] == self.largest_node)
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
            m = MASKS.get(idxs) if idxs.__class__ is tuple else None
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
            self.cover_changed.add(s)
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
        att = PassAttempt(run, s, on, gpus, run.started_at + self.min_run[s])
        att.masks = masks
        self.held[s] += gpus
        self.cover_changed.add(s)
        self.atts[s][run.attempt_id] = att
        if gpus:  # (an attempt with no GPUs, from a hostile snapshot, has nothing to give)
            pg = self.pgpus[s]
            pg[att.prio] = pg.get(att.prio, 0) + gpus
        if not bulk:  # (in bulk, __init__ sorts the orders once)
            self.dirty.add(s)
            keys = self.vkeys[s]
            pos = bisect_left(keys, att.vkey)
            keys.insert(pos, att.vkey)
            self.vatts[s].insert(pos, att)
            self.vnprio[s].insert(pos, -att.prio)
            keys = self.bkeys[s]
            pos = bisect_left(keys, att.bkey)
            keys.insert(pos, att.bkey)
            self.batts[s].insert(pos, att)

    def remove_run(self, run: RunningView) -> None:
        if run.preempting:
            s, masks, on, gpus, b = self.pre.pop(run.attempt_id)
            self.grace[s] -= gpus
            self.cover_changed.add(s)
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
            self.cover_changed.add(s)
            masks = att.masks
            self.dirty.add(s)
            keys = self.vkeys[s]
            pos = bisect_left(keys, att.vkey)
            del keys[pos], self.vatts[s][pos], self.vnprio[s][pos]
            if att.gpus:
                pg = self.pgpus[s]
                left = pg[att.prio] - att.gpus
                if left:
                    pg[att.prio] = left
                else:
                    del pg[att.prio]
            keys = self.bkeys[s]
            pos = bisect_left(keys, att.bkey)
            del keys[pos], self.batts[s][pos]
        used, sched = self.used, self.sched
        for i, m in masks:
            used[i] &= ~m
            if sched[i]:
                self._free_changed(i, m.bit_count())

    def checkpoint(self, run: RunningView) -> None:
        """A new view of an attempt that only moved its safe point (a checkpoint was reported): it moves
        in the share's victim order, and rule 3's order of its share is refreshed if it is borrowed
        (rule 8's order, and so which attempts are borrowed, does not depend on safe points)."""
        if run.preempting:
            return  # never a candidate again: nothing to reorder
        s = self.sh.sidx[run.share]
        att = self.atts[s][run.attempt_id]
        key = victim_key(run)
        att.view = run
        if key == att.vkey:
            return
        keys = self.vkeys[s]
        pos = bisect_left(keys, att.vkey)
        del keys[pos], self.vatts[s][pos], self.vnprio[s][pos]
        att.vkey = key
        pos = bisect_left(keys, key)
        keys.insert(pos, key)
        self.vatts[s].insert(pos, att)
        self.vnprio[s].insert(pos, -att.prio)
        if att.bnow:
            self.dirty.add(s)

    def victim_orders(self) -> None:
        """Rule 8's borrowed part and rule 3's victim order, for the shares whose attempts changed
        since they were last ordered (rule 4's order is `vatts` read from the end)."""
        if self.before_victims is not None:
            self.before_victims()
        if not self.dirty:
            return
        rec = self.rec
        for s in self.dirty:
            for a in self.vlist[s]:
                a.bnow = False
                for i, c in a.on:
                    rec[i] -= c
            vl: list[PassAttempt] = []
            over = self.held[s] - self.capacity[s]
            if over > 0:
                vl = take_over(reversed(self.batts[s]), over)
                for a in vl:
                    a.bnow = True
                    for i, c in a.on:
                        rec[i] += c
                vl.sort(key=attrgetter("vkey"), reverse=True)
            self.vlist[s] = vl
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

    def _too_few_whole_nodes(self, needed: int) -> str:
        """A gang needs more whole nodes of the largest size than can take work: how many there are, and
        why the others cannot ("only 1 are schedulable" said neither)."""
        M = self.largest_node
        total = sum(1 for size in self.size if size == M)
        ready = len(self.largest_nodes)
        words = f"needs {needed} whole {M}-GPU nodes; "
        if total < needed:
            words += f"the cluster has {total}"
            return words + (f", {ready} of them schedulable" if ready < total else "")
        others = "the other is" if total - ready == 1 else "the others are"
        return (
            words
            + f"only {ready} of its {total} {'is' if ready == 1 else 'are'} schedulable ({others} cordoned, draining or lost)"
        )

    def _invalid(self, g: int) -> str | None:
        """Why a job of g GPUs can never be placed on this type's nodes as they are, or None."""
        if g <= 0:
            return "asks for no GPUs"
        if not self.size:
            return f"no {self.t} nodes in the cluster"
        M = self.largest_node
        if M == 0:  # only GPU-less nodes of this type
            return f"no {self.t} node has any GPUs"
        if g > M:
            if g % M:
                return f"{g} GPUs is more than one {M}-GPU node and not a multiple of it"
            if g // M > len(self.largest_nodes):
                return self._too_few_whole_nodes(g // M)
            return None
        if g > self.largest_schedulable:
            if not self.largest_schedulable:
                return f"no schedulable {self.t} nodes"
            return f"needs {g} GPUs on one node; no schedulable {self.t} node has that many"
        return None

    def add_reader(self, waiting: Any) -> None:
        """A plan's waiting reasons left for later (LazyWaiting) will read these queue lists: while it
        lives, an event copies a list before changing it (_own_lists). Only plans still read are kept
        (the others piled up under a live one: 250k in a 100k-job replay)."""
        self._readers = [r for r in self._readers if _still_read(r)]
        self._readers.append(weakref.ref(waiting))
        self._fresh.clear()

    def _own_lists(self, s: int) -> tuple[list[tuple], list[QueuedView]]:
        """Share s's key and job lists, safe to change in place: copies while a plan may still read
        the old ones for its reasons."""
        readers = self._readers
        if s not in self._fresh:
            while readers:
                if _still_read(readers[-1]):
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

    def cannot_start(self, job: QueuedView) -> bool:
        """A job just queued (add_job) that no pass could start, or pre-empt for, as things are, and
        whose place in the queue changes nothing for the jobs queued before it (Engine.quiet): it can
        never run here (`waiting`); or it is no beneficiary, has no own room in its share (rules 2-3:
        even with nothing else of the share queued), no attempt of its in-share-pre-empting share is
        of lower priority (rule 4), it is last in its share's queue (a job ahead of the head could
        take a starving head's node hold away, rule 6), and it may not borrow or no free GPUs of the
        type would hold it (rule 5 starts borrowers on free GPUs only)."""
        if job.job_id in self.waiting:
            return True
        if job.beneficiary:
            return False
        s, key = self.qinfo[job.job_id]
        g = job.gpus
        if self.held[s] + g <= self.capacity[s]:
            return False
        pg = self.pgpus[s]
        if self.in_share[s] and pg and job.priority > min(pg):
            return False
        if self.keys[s][-1] != key:
            return False
        return not (self.may_borrow[s] and self.could_place(g))

    def could_place(self, g: int) -> bool:
        """Whether free GPUs of the type could hold g GPUs now: a node with g free (the buckets' stale
        entries skipped), or for a gang any wholly free node."""
        if g > self.largest_node:
            return self.whole > 0
        return any(self.fresh_bucket(v) for v in range(g, len(self.bk)))

    def remove_job(self, job: QueuedView) -> None:
        if self.waiting.pop(job.job_id, None) is not None:
            return
        s, key = self.qinfo.pop(job.job_id)
        self.bens.discard(job.job_id)
        self._remove_key(s, key, job.gpus)

    def remove_jobs(self, jobs: Iterable[QueuedView]) -> None:
        """remove_job for each, at once: what a pass admitted, most often the heads of their shares'
        queues, which are sliced off together (the suffix minima of the rest do not change)."""
        gone: dict[int, list[tuple[tuple, int]]] = {}
        for job in jobs:
            if self.waiting.pop(job.job_id, None) is not None:
                continue
            s, key = self.qinfo.pop(job.job_id)
            self.bens.discard(job.job_id)
            gone.setdefault(s, []).append((key, job.gpus))
        for s, entries in gone.items():
            entries.sort()
            keys = self.keys[s]
            m, n = 0, min(len(entries), len(keys))
            while m < n and keys[m] == entries[m][0]:
                m += 1
            if m:
                keys, q = self._own_lists(s)
                del keys[:m]
                del q[:m]
                del self.suf[s][:m]
                sizes: dict[int, int] = {}
                for _, g in entries[:m]:
                    sizes[g] = sizes.get(g, 0) + 1
                by_size = self.by_size[s]
                for g, c in sizes.items():
                    same = by_size[g]
                    del same[:c]  # the smallest keys of that size: a prefix of its list too
                    if not same:
                        del by_size[g]
            for key, g in entries[m:]:
                self._remove_key(s, key, g)

    def _remove_key(self, s: int, key: tuple, g: int) -> None:
        pos = bisect_left(self.keys[s], key)
        keys, q = self._own_lists(s)
        del keys[pos]
        del q[pos]
        same = self.by_size[s][g]
        del same[bisect_left(same, key)]
        if not same:
            del self.by_size[s][g]
        suf = self.suf[s]
        del suf[pos]
        nxt = suf[pos] if pos < len(suf) else NO_LIMIT
        for k in range(pos - 1, -1, -1):
            g = q[k].gpus
            v = g if g < nxt else nxt
            if suf[k] == v:
                break
            suf[k] = v
            nxt = v


def type_states(
    sh: ShareIndex, nodes: Iterable[NodeView], running: Iterable[RunningView], queued: Iterable[QueuedView]
) -> dict[str, TypeState]:
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
    order.sort(key=neg_priority)
    by_q: dict[str, list[QueuedView]] = {}
    for job in order:
        by_q.setdefault(job.gpu_type, []).append(job)
    types = sorted(set(by_nodes) | set(by_run) | set(by_q))
    return {t: TypeState(sh, t, by_nodes.get(t, ()), by_run.get(t, ()), by_q.get(t, ())) for t in types}
