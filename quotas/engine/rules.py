"""One pass over one GPU type's state: rules 1-10 of SEMANTICS.md (phases A, B and C of policy.plan),
with rule 9's minimal victim sets (_Fit). Reads the state of quotas/engine/state.py; decides into an
_Out that becomes the Plan."""

from __future__ import annotations

import heapq
import weakref
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Hashable, Iterator, Mapping
from itertools import compress

from quotas.engine.state import (
    _ADMITTED,
    _BLOCKED,
    _DEFER,
    _EARMARKED,
    _KEY_MAX,
    _NO_LIMIT,
    _RESERVED,
    _TODO,
    _Att,
    _Open,
    _Out,
    _Status,
    _TypeBase,
    _Waiting,
)
from quotas.engine.views import (
    ADMITTED_BORROWED,
    ADMITTED_OWN,
    PRIORITY,
    RECLAIM,
    UNASSIGNED,
    Admission,
    Plan,
    Preemption,
    ProtectionWait,
    QueuedView,
    _plural,
    at_time,
)

# Reasons the pass can leave for when they are read (Plan.waiting); off only in the test that checks
# that reading them later gives the same sentences.
LAZY_REASONS = True
_REASON_MEMO = 4096  # sentences kept per GPU type between passes


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
        # The reasons left for later hold the passes (bound methods, closures), which hold `out`: it lets
        # go of the list, so no cycle is left and a plan nobody reads is freed at once, not by the cyclic
        # collector (a pass's garbage is thousands of lists and cells; collecting it was ~15 % of a run).
        out.later = []
        for base in readers:
            base._readers.append(weakref.ref(waiting))
            base._fresh.clear()
    return Plan(
        admissions=tuple(out.admissions),
        preemptions=tuple(out.preemptions),
        waiting=waiting,
        reserved=out.reserved,
        protected=out.protected,
        recheck_at=out.recheck_at,
    )


class _Fit:
    """Rule 9's node test for one job of g GPUs, kept as victims are taken and given back: does some
    fitting node (or do the needed whole nodes) have the job's GPUs free or being freed?

    Nodes that fit without any victim are counted once (`base`); a node touched by victims is looked
    at again only when its victims change (`extra`: GPUs this job's victims free there)."""

    __slots__ = ("tp", "g", "gang", "k", "base", "hits", "extra")

    def __init__(self, tp: _TypePass, g: int, fits: bool | None = None) -> None:
        """`fits`: whether a single-node job fits a node without victims, when the caller knows."""
        self.tp = tp
        self.g = g
        self.gang = g > tp.M
        self.extra: dict[int, int] = {}
        self.hits = 0  # touched nodes that fit only thanks to the victims
        if self.gang:
            self.k = g // tp.M
            # Nodes of size M with all GPUs free or being freed: the wholly free ones (counted per pass)
            # and those with GPUs being freed (few) that are otherwise free.
            fu, pu, M, size = tp.free_u, tp.pend_u, tp.M, tp.size
            self.base = tp._whole_free() + sum(
                1 for i in tp.pend_nodes if pu[i] and size[i] == M and fu[i] + pu[i] == M
            )
        else:
            self.k = 1
            if fits is None:
                fits = tp._place(g, None, True) is not None
            self.base = 1 if fits else 0

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


class _Claim:
    """Rule 10: the victims (some protected) a job waiting for protection would take: marked for the
    rest of the pass, never pre-empted."""

    __slots__ = ("victims",)

    def __init__(self, victims: list[tuple[_Att, str]]) -> None:
        self.victims = victims


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
        # Rule 10: protected attempts are left out of the walks' candidates (`_exclude`) wherever some
        # share has a protection window; `_skipped`: the current walk left one out; `no_borrow`: a job
        # waits for protection, so no new borrowing of this type starts in this pass.
        self.protects = self._exclude = base.protects
        self._skipped = False
        self.no_borrow = False
        self.pool, self.overcommitted, self.lender_shares = base.pool, base.overcommitted, base.lender_shares
        self.ben_nodes = base.ben_nodes
        n_shares = len(self.cap)

        # -- what this pass changes: copies
        self.held = held = base.held.copy()
        self.grace = grace = base.grace.copy()
        self.pend = [0] * n_shares
        self._used = base.used  # read-only: admissions take GPUs from the free-index lists
        self._free_idx: dict[int, list[int]] = {}  # free GPU indexes, built when a node is first used
        # The base's node arrays until this pass first changes them (_set_free, _own_pend): many passes
        # change none, and at 256 nodes the copies were a pass's largest fixed cost.
        self.free_u = base.free
        self.pend_u = base.pend_u
        self.pend_nodes = base.pend_nodes
        self._free_mine = self._pend_mine = False
        self.bk = base.bk.copy()  # the base's heaps until this pass changes one (_bucket)
        self._bk_mine = 0  # bit v: bucket v is this pass's own copy
        self._mf = -1  # cached largest free count; -1 = stale
        self._whole = base.whole  # nodes with all M GPUs free, kept by _set_free
        self.free_total = base.free_total  # free GPUs not reserved for anyone, kept by _set_free
        self._taken: dict[int, list] = {}  # reclaim victims of the current decision: share -> [b0, atts]
        # Bumped by every change of the shares' numbers or of free GPUs (_chg, _set_free): what was
        # learnt at one version holds while it stays the same.
        self.version = 0
        # share -> (GPUs, version): at that version a job of that many GPUs of the share could borrow
        # right now (_can_borrow_now), so any job of as many or fewer could too (_borrows_now).
        self.borrows_now: dict[int, tuple[int, int]] = {}

        # -- victim orders: from the base, when first needed (_victims)
        self._vready = False
        self._rec_nodes: set[int] | None = None  # nodes where rec > 0, once _reachable asks
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
        self._reasons = base.reasons  # blocker key -> sentence: the same for every pass of this base

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
        self.vlist, self.vshares = base.vlist, base.vshares
        # Rule 4's order is each share's attempts read from the end (lowest priority first).
        self.vatts, self.vnprio, self.pgpus = base.vatts, base.vnprio, base.pgpus
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
        self.version += 1
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
            rec, nodes = self.rec, self._rec_nodes
            for i, c in a.on:
                rec[i] -= c
                if nodes is not None and not rec[i]:
                    nodes.discard(i)

    def _unmark(self, a: _Att) -> None:
        a.victim = False
        self._chg(a.s, dh=a.gpus, dg=-a.gpus)
        if a.bnow:
            rec, nodes = self.rec, self._rec_nodes
            for i, c in a.on:
                rec[i] += c
                if nodes is not None and rec[i]:
                    nodes.add(i)
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
        if not self._free_mine:
            self.free_u = self.free_u.copy()
            self._free_mine = True
        if self.M:
            M = self.M
            self._whole += (v == M) - (self.free_u[i] == M)
        self.free_total += v - self.free_u[i]
        self.free_u[i] = v
        if v:
            heapq.heappush(self._bucket(v), i)
        self._mf = -1
        self.version += 1

    def _bucket(self, v: int) -> list[int]:
        """Heap v of the free-count buckets, to change: this pass's own copy, made on first change
        (most passes change none, and the base's heaps outlive the pass)."""
        h = self.bk[v]
        if not self._bk_mine >> v & 1:
            h = self.bk[v] = h.copy()
            self._bk_mine |= 1 << v
        return h

    def _valid(self, v: int) -> list[int]:
        """Heap v once its head is stale: with a head that has v GPUs free now, or empty. Entries that
        went stale before the pass are dropped from the base's heap for every later pass (the base
        replaces it); those this pass made stale, from its own copy."""
        fu = self.free_u
        h = self.bk[v]
        if not self._bk_mine >> v & 1:
            h = self.bk[v] = self.base.fresh_bucket(v)
            if not h or fu[h[0]] == v:
                return h
        h = self._bucket(v)
        while h and fu[h[0]] != v:
            heapq.heappop(h)
        return h

    def _best_free(self, g: int) -> int | None:
        """Best fit on free GPUs: the node left with the fewest free GPUs, ties by name."""
        fu = self.free_u
        bk = self.bk
        for v in range(g, self.maxk + 1):
            h = bk[v]
            if h and fu[h[0]] != v:
                h = self._valid(v)
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

    def _whole_free(self) -> int:
        """How many nodes have all their GPUs free (only nodes of the largest size M can): kept by the
        base between passes and by _set_free within one (a blocked gang's reason asks, at 256 nodes)."""
        return self._whole

    def _max_free(self) -> int:
        if self._mf < 0:
            fu = self.free_u
            self._mf = 0
            for v in range(self.maxk, 0, -1):
                h = self.bk[v]
                if h and fu[h[0]] != v:
                    h = self._valid(v)
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
        wait: bool = False,
    ) -> list[tuple[int, int]] | None:
        """Where g GPUs would go (rule 9's last sentence): on free GPUs, and if asked on GPUs being
        freed (`pend_u`, and `extra` from victims chosen for this job). A node where the job can start
        now (its GPUs free, not being freed) comes first, unless the job is to `wait` for GPUs being
        freed; then, for a beneficiary of an earlier pass, the nodes its victims free (`prefer`); then
        best fit (fewest GPUs left free on the node); ties: node name. Single node, or whole nodes for a
        gang."""
        if g > self.M:
            return self._place_gang(g // self.M, extra, use_pend, wait)
        fu = self.free_u
        best = None
        i = None if wait else self._best_free(g)
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
        self, k: int, extra: dict[int, int] | None, use_pend: bool, wait: bool = False
    ) -> list[tuple[int, int]] | None:
        """k whole nodes of the type's largest size: wholly free ones first (none if the gang is to
        `wait` for GPUs being freed), then those whose GPUs are all free or being freed; each group by
        node name."""
        M = self.M
        fu = self.free_u
        chosen: list[int] = []
        if self.maxk >= M and not wait:
            h = self._bucket(M)
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
        first, then the most recent safe point, then later in queue order (rule 8)."""
        order = sorted(
            (s for s in self.vshares if s != s_job and self._borrowed(s) > 0),
            key=lambda s: (-self._borrowed(s), s),  # share indexes follow name order
        )
        now = self.now if self._exclude else None  # rule 10: protected attempts are no candidates
        for s in order:
            lst = self.vlist[s]
            for idx in range(self.vptr[s], len(lst)):
                a = lst[idx]
                if not a.victim:
                    if now is not None and a.until > now:
                        self._skipped = True
                        continue
                    yield a

    def _in_share_candidates(self, s: int, n: int) -> Iterator[_Att]:
        """Rule 4's order: the share's first n attempts of its in-share victim order (those of strictly
        lower priority: lowest first, then the most recent safe point, then later in queue order), which is
        `vatts` from the end. Protected ones included: _try_in_share leaves them out."""
        lst = self.vatts[s]
        last = len(lst) - 1
        for idx in range(self.iptr[s], n):
            a = lst[last - idx]
            if not a.victim:
                yield a

    def _reachable(self, g: int, fit: _Fit, ins: dict[int, int]) -> set[int] | None:
        """The nodes that some set of candidates could make fit a job of g GPUs (free + being freed +
        borrowed GPUs there + `ins`, what rule 4's candidates add there), when none fits without
        victims; None when one does. An empty set (or too few whole nodes) means no victim can help."""
        if fit.ok():
            return None
        fu, pu, rec, size, sched = self.free_u, self.pend_u, self.rec, self.size, self.sched
        if self._rec_nodes is None:  # then kept by _mark and _unmark for the rest of the pass
            self._rec_nodes = set(compress(range(len(rec)), rec))
        nodes = self._rec_nodes | ins.keys()
        if g > self.M:
            return {
                i
                for i in nodes
                if sched[i] and size[i] == self.M and fu[i] + pu[i] + rec[i] + ins.get(i, 0) == self.M
            }
        return {i for i in nodes if sched[i] and fu[i] + pu[i] + rec[i] + ins.get(i, 0) >= g}

    def _walk(
        self,
        s: int,
        g: int,
        tol: int,
        walk_inputs: Callable[[], tuple[Iterator[tuple[_Att, str]], dict[int, int] | None]],
        own_limit: bool,
        fits: bool | None = None,
        protected: bool = False,
    ) -> tuple[list[tuple[_Att, str]], _Fit] | str | _Claim:
        """Rule 9's walk (_minimal_victims) over the candidates that `walk_inputs` gives (with what they
        add per node, for rule 4), protected attempts left out; then rule 10: if it fails where a
        protected candidate was left out (`protected`: the caller left some out already), the walk is
        made again with them. If that one succeeds, the job waits for protection: its victims (some
        protected) are returned as a _Claim, marked but not pre-empted."""
        self._skipped = protected
        cands, ins = walk_inputs()
        found = self._minimal_victims(s, g, tol, cands, own_limit, ins, fits)
        if not isinstance(found, str) or not self._skipped:
            return found
        self._exclude = False
        try:
            cands, ins = walk_inputs()
            again = self._minimal_victims(s, g, tol, cands, own_limit, ins, fits)
        finally:
            self._exclude = True
        if isinstance(again, str):
            return found
        return _Claim(again[0])

    def _protect_wait(self, s: int, k: int, claim: _Claim) -> int:
        """Rule 10: q[s][k] (in `pend[s]`) waits for protection. Nothing is pre-empted for it, and no
        GPUs are held for it on any node; but for the rest of the pass it counts as a reclaim under way:
        its GPUs stay in its share's accounting and its victims stay marked (claimed), so that the jobs
        after it walk for victims of their own instead of waiting for the same ones. No new borrowing
        of the type starts in this pass; the walk is to be made again when the first of the protected
        victims' windows ends (Plan.recheck_at), and the last one's end bounds the wait."""
        job = self.q[s][k]
        now = self.now
        protected = [a for a, _ in claim.victims if a.until > now]
        ends = [a.until for a in protected]
        shares = tuple(sorted({a.view.share for a in protected}))
        wait = ProtectionWait(tuple(a.view.attempt_id for a in protected), shares, max(ends), min(ends))
        out = self.out
        out.protected[job.job_id] = wait
        if out.recheck_at is None or wait.next_at < out.recheck_at:
            out.recheck_at = wait.next_at
        if not self.no_borrow:
            self.no_borrow = True
            self.version += 1  # "could borrow right now", learnt at an earlier version, no longer holds
        self.held_for[s] = min(self.held_for[s], self.qkey[s][k])
        return self._wait(s, k, ("protected", len(protected), shares, wait.until))

    def _minimal_victims(
        self,
        s: int,
        g: int,
        tol: int,
        cands: Iterator[tuple[_Att, str]],
        own_limit: bool,
        ins: dict[int, int] | None = None,
        fits: bool | None = None,
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
        fit = _Fit(self, g, fits)
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

    def _own_pend(self) -> None:
        """pend_u and pend_nodes, this pass's own copies from here on (see __init__)."""
        if not self._pend_mine:
            self.pend_u = self.pend_u.copy()
            self.pend_nodes = set(self.pend_nodes)
            self._pend_mine = True

    def _commit_victims(self, victims: list[tuple[_Att, str]], job: QueuedView) -> int:
        """Record the pre-emptions; their GPUs join the pool being freed. Returns GPUs added there."""
        self._own_pend()
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
            lst, p = self.vlist[s], self.vptr[s]
            while p < len(lst) and lst[p].victim:
                p += 1
            self.vptr[s] = p
            lst, p = self.vatts[s], self.iptr[s]  # rule 4's order: from the end
            while p < len(lst) and lst[-1 - p].victim:
                p += 1
            self.iptr[s] = p
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

    def _hold(
        self, placement: list[tuple[int, int]], free_too: bool = True
    ) -> tuple[tuple[tuple[str, int], ...], int]:
        """Reserve GPUs on these nodes for one waiting job: GPUs being freed first, then free ones (not
        `free_too`: none). Returns what was held and how many of those GPUs were being freed."""
        self._own_pend()
        held = []
        from_pend = 0
        for i, c in placement:
            take = min(c, self.pend_u[i])
            from_pend += take
            self.pend_u[i] -= take
            if not self.pend_u[i]:
                self.pend_nodes.discard(i)
            if not free_too:
                c = take
            elif c > take:
                self._set_free(i, self.free_u[i] - (c - take))
            if c:
                held.append((self.node_names[i], c))
        return tuple(held), from_pend

    def _earmark(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        victims: list[tuple[_Att, str]],
        hold_free: bool = True,
    ) -> int:
        """q[s][k] (already in `pend[s]`) waits for the GPUs being freed on `placement` (and holds the
        free ones there too, unless not `hold_free`)."""
        job = self.q[s][k]
        added = self._commit_victims(victims, job) if victims else 0
        held, from_pend = self._hold(placement, hold_free)
        if held:
            self.out.reserved[job.job_id] = held
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
            elif kind == "protected":
                n, shares, until = key[1], key[2], key[3]
                why = (
                    f"waits for {_plural(n, 'protected job')} of share{'s' if len(shares) > 1 else ''} "
                    f"{', '.join(shares)}, until {at_time(until)}"
                )
            elif kind == "paused":
                why = f"no new borrowing of {t} while a job waits for protected jobs"
            else:
                g, used, cap = key[1], key[2], key[3]
                own = f"needs {g} {t}: share at its own capacity ({used} of {cap})"
                if used < cap:
                    own = f"needs {g} {t}: its share has {cap - used} of {cap} own left"
                if kind == "strategy":
                    why = f"{own}; a {key[4]} share does not borrow"
                elif kind == "limit":
                    borrowed, bcap = key[4], key[5]
                    # Below its limit, the share would pass it with this job: what it would borrow then
                    # (a 4-GPU job of a share borrowing 1 of 3 would take it to 5), not "reached".
                    would = borrowed + g - (cap - used)
                    already = f" ({borrowed} already borrowed)" if borrowed else ""
                    why = (
                        f"{own}; its borrow limit allows no borrowing"
                        if bcap == 0
                        else f"{own}, borrow limit reached ({borrowed} of {bcap})"
                        if borrowed >= bcap
                        else f"{own}, would borrow {would}{already}, limit {bcap}"
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
            if len(self._reasons) > _REASON_MEMO:
                self._reasons.clear()
            self._reasons[key] = why
        return why

    def _own_numbers(self, s: int, g: int) -> tuple[int, int, int]:
        """(gpus asked, own capacity in use, own capacity) for a reason."""
        use = self.held[s] + max(self.grace[s], self.pend[s])
        return g, min(use, self.cap[s]), self.cap[s]

    def _place_key(self, g: int) -> tuple:
        if g > self.M:
            return ("place", g, self._whole_free())
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
            placement = [(i, self.M) for i in sorted(self._most_available(g // self.M))]
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

    def _most_available(self, k: int) -> list[int]:
        """The k nodes of the largest size with the most GPUs free or being freed (ties: name), read
        level by level from the free-count buckets and the few nodes with GPUs being freed, instead of
        ranking every node; when fewer than k have any, the first of the others by name."""
        M, fu, pu, size, bk = self.M, self.free_u, self.pend_u, self.size, self.bk
        pend = [i for i in self.pend_nodes if size[i] == M]
        chosen: list[int] = []
        for v in range(min(M, len(bk) - 1), 0, -1):
            level = {i for i in bk[v] if fu[i] == v and size[i] == M and not pu[i]}
            level.update(i for i in pend if fu[i] + pu[i] == v)
            if level:
                chosen.extend(sorted(level)[: k - len(chosen)])
                if len(chosen) == k:
                    return chosen
        taken = set(chosen)  # every other node has nothing free or being freed
        for i in self.m_nodes:
            if len(chosen) == k:
                break
            if i not in taken:
                chosen.append(i)
        return chosen

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
        # (Rule 4's failed-try memo first: when it already knows the try fails, whether it may is moot.)
        if (
            self.in_share[s]
            and g <= c
            and g < self._in_share_floor(s, job.priority)
            and not self._borrows_now(s, k)
        ):
            outcome = self._in_share(s, k)
            if outcome != _DEFER:
                return outcome  # earmarked for its victims, or waiting for protection
        self.status[s][k] = _DEFER
        return _DEFER

    def _borrows_upto(self, s: int) -> int:
        """The most GPUs a job of share s was found able to borrow right now at this version (0: none
        found since the last change)."""
        memo = self.borrows_now.get(s)
        return memo[0] if memo is not None and memo[1] == self.version else 0

    def _borrows_now(self, s: int, k: int) -> bool:
        """_can_borrow_now, answered at once for a job no bigger than one that could at this version:
        each of its tests (the borrow limit, the cover, the largest free block, a node) passes for
        fewer GPUs if it passed for more, and the share's held job key is checked here."""
        g = self.q[s][k].gpus
        upto = self._borrows_upto(s)
        if g <= upto:
            return self.qkey[s][k] <= self.held_for[s]
        if self._can_borrow_now(s, k):
            self.borrows_now[s] = (g, self.version)
            return True
        return False

    def _can_borrow_now(self, s: int, k: int) -> bool:
        g = self.q[s][k].gpus
        return (
            self.lab[s]
            and not self.no_borrow
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
        fits = None
        if self._deficit() <= tol:
            # Rule 9 with nothing to take: where the cover holds and a node fits (free or being-freed
            # GPUs), the minimal set is empty; _minimal_victims would say so after building its walk.
            placement = self._place(g, None, True, self.ben_nodes.get(job.job_id))
            if placement is not None:
                return self._start_or_wait(s, k, placement, [], can_now, None)
            fits = False if g <= self.M else None  # (a gang's node test counts its nodes itself)
        found = self._walk(
            s, g, tol, lambda: (((a, RECLAIM) for a in self._reclaim_candidates(s)), None), False, fits
        )
        if isinstance(found, _Claim):
            return self._protect_wait(s, k, found)
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
        return self._start_or_wait(s, k, placement, victims, can_now, fit.extra)

    def _start_or_wait(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        victims: list[tuple[_Att, str]],
        can_now: bool,
        extra: dict[int, int] | None,
    ) -> int:
        """Rule 9's last paragraph, for a job of rules 2-3 with its placement (its victims, if any, are
        marked). GPUs in grace count as freed: with its share's limit holding now, it starts at once on
        free GPUs while its victims stop; but a beneficiary (victims now, or earlier ones still in
        grace) does so only where the free GPUs left after it still cover every RESERVE share's idle
        capacity of the type, so that a RESERVE share's next job starts at once. Otherwise it waits for
        its victims' GPUs, holding none of the free ones."""
        if not can_now or not all(self.free_u[i] >= c for i, c in placement):
            return self._earmark(s, k, placement, victims)
        job = self.q[s][k]
        if (
            self.ridle > 0
            and self.free_total - job.gpus < self.ridle
            and (victims or job.job_id in self.base.ben_count)
        ):
            ben = self.ben_nodes.get(job.job_id)
            waits = self._place(job.gpus, extra, True, ben, wait=True)
            return self._earmark(s, k, waits or placement, victims, hold_free=False)
        return self._admit(s, k, placement, False, victims)

    def _in_share(self, s: int, k: int) -> int:
        """Rule 4: pre-empt strictly lower-priority work of the share, only if that makes the job fit
        (own capacity, cover, and a node): _EARMARKED; _BLOCKED if it waits for protection (rule 10);
        else _DEFER. The caller has asked _in_share_floor already."""
        job = self.q[s][k]
        g, p = job.gpus, job.priority
        self._victims()
        n = len(self.vnprio[s]) - bisect_right(self.vnprio[s], -p)  # attempts of lower priority
        if not n:
            # Nothing of lower priority runs in the share: no job of priority p or lower, of any size,
            # can pre-empt in it this pass (candidates only shrink), so the walk stops deferring them
            # one by one.
            self.in_fail[s] = (1, p, self.epoch)
            return _DEFER
        outcome = self._try_in_share(s, k, n)
        if outcome == _DEFER:
            self.in_fail[s] = (g, p, self.epoch)
        return outcome

    def _in_share_floor(self, s: int, p: int) -> int:
        """Rule 4 cannot make room in share s for a job of priority p and this many GPUs or more: this
        epoch's failed try was for no more GPUs and no lower priority (free GPUs and candidates only
        shrink within an epoch). _NO_LIMIT when no such try is known."""
        memo = self.in_fail.get(s)
        if memo is not None and memo[2] == self.epoch and p <= memo[1]:
            return memo[0]
        return _NO_LIMIT

    def _try_in_share(self, s: int, k: int, n: int) -> int:
        """Rule 4 with rule 9: one candidate list, the share's strictly-lower-priority attempts in rule
        4's order, then other shares' borrowed attempts in rule 3's order; a minimal set of them so
        that the job runs as own: _EARMARKED. Protected attempts are no candidates (rule 10): _BLOCKED
        when the job waits for them; _DEFER when no set makes it run."""
        if not n:
            return _DEFER
        job = self.q[s][k]
        g = job.gpus
        over = self.held[s] + self.pend[s] + g - self.cap[s]
        p = job.priority
        if sum(gpus for prio, gpus in self.pgpus[s].items() if prio < p) < over:
            return _DEFER  # even all of them (victims taken this pass included) leave it over capacity
        d = self._deficit()
        tol = d if d > 0 else 0
        self._taken = {}
        self._chg(s, dp=g)

        mine = list(self._in_share_candidates(s, n))
        if sum(a.gpus for a in mine) < over:
            self._chg(s, dp=-g)
            return _DEFER  # even all of them would not bring it within its capacity
        now = self.now
        protected = self.protects and any(a.until > now for a in mine)
        unprotected = [a for a in mine if a.until <= now] if protected else mine

        def walk_inputs() -> tuple[Iterator[tuple[_Att, str]], dict[int, int]]:
            own = unprotected if self._exclude else mine
            # What the candidates add to `rec` per node: the share's own candidates, less all of its
            # borrowed attempts, which `rec` counts but which are candidates only when of lower priority
            # (and then in `own`). Counting them twice made a whole node look over-full to a gang's test
            # (no node reachable: a possible pre-emption missed), and looser tests walked every candidate
            # for none.
            ins: dict[int, int] = {}
            for a in own:
                for i, c in a.on:
                    ins[i] = ins.get(i, 0) + c
            for a in self.vlist[s]:
                if not a.victim:
                    for i, c in a.on:
                        ins[i] = ins.get(i, 0) - c

            def cands() -> Iterator[tuple[_Att, str]]:
                for a in own:
                    yield a, PRIORITY
                for a in self._reclaim_candidates(s):
                    yield a, RECLAIM

            return cands(), ins

        found = self._walk(s, g, tol, walk_inputs, True, protected=protected)
        if isinstance(found, _Claim):
            return self._protect_wait(s, k, found)
        if isinstance(found, str):
            self._chg(s, dp=-g)
            return _DEFER
        victims, fit = found
        placement = self._place(g, fit.extra, True)
        return self._earmark(s, k, placement, victims)

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
        if self.no_borrow:
            return self._wait(s, k, ("paused",))  # rule 10: a job waits for protection
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
            if status[s][k] == _TODO and self._own_phase(s, k) == _DEFER:
                self._borrow(s, k)
        for key, s, k in sorted(heads):
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
            if self.lab[s] and not self.no_borrow:
                heap.append((self._borrow_ratio(s), s))
            elif lazy is None:
                for k in ks:
                    self._borrow(s, k)
            else:
                # Only says why they wait, from numbers of this share that phase C does not change
                # (it admits only LEND_AND_BORROW jobs, without victims, and none while a job waits for
                # protection): left for when it is asked.
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
        job might. When k waits behind a held job, at its borrow limit, for lendable GPUs or for a
        node, every later job as big or bigger waits too, and nothing changes while they are told so:
        their reasons, from the numbers as they are now, are left for when they are read."""
        g = self.q[s][k].gpus
        use = self.held[s] + max(self.grace[s], self.pend[s])
        limit = self.cap[s] + self.bcap[s]
        unplaced = False
        if self.qkey[s][k] > self.held_for[s]:
            below = 0  # every later job is held too
        elif use + g > limit:
            below = limit - use + 1
        elif self._deficit_if(s, g) > 0:
            below = g  # a bigger job would break the cover at least as much
        else:
            # No node for it (or it is the starving head and now holds one): a bigger job fits no node
            # either (a single-node job finds no node with as many GPUs free, so no node is wholly
            # free for a gang), and none after k is the share's head, so none of them reserves.
            unplaced = True
            below = g
        nxt = self._next_below(s, k, below)
        if nxt > k + 1:
            why = self._skipped_why(s, g, unplaced, use, limit)
            self.out.later.append((why, s, ks.part(k + 1, nxt)))
        return nxt

    def _skipped_why(
        self, s: int, g0: int, unplaced: bool, use: int, limit: int
    ) -> Callable[[int, int], None]:
        """The reason writer for the jobs _skip_blocked skipped (`use` and `limit` as it computed them):
        _borrow's checks in its order, with the numbers of this moment. (A function of its own: the
        closure's cells would otherwise be made on every call of _skip_blocked, most of which skip
        nothing.)"""
        q, keys, out, reason = self.q[s], self.qkey[s], self.out.waiting, self._reason
        cap, held_for, bcap = self.cap[s], self.held_for[s], self.bcap[s]
        used, borrowed = min(use, cap), max(0, use - cap)
        spare = -self._deficit() - (max(0, cap - use) if self.lender[s] else 0)
        # After an unplaced job, a bigger one that passes the cover check (it grows with the size)
        # waits for a node: its sentence, per size, with the nodes as they are now.
        place: dict[int, tuple] = {}
        if unplaced:
            deficit_if, place_key = self._deficit_if, self._place_key
            place = {x: place_key(x) for x in self.by_size[s] if x >= g0 and deficit_if(s, x) <= 0}

        def why(s: int, k: int) -> None:
            g = q[k].gpus
            if keys[k] > held_for:
                key: tuple = ("held",)
            elif use + g > limit:
                key = ("limit", g, used, cap, borrowed, bcap)
            else:
                key = place.get(g) or ("slack", g, used, cap, spare)
            out[q[k].job_id] = reason(key)

        return why

    def _next_below(self, s: int, k: int, below: int) -> int:
        """The first queue index after k whose job needs fewer than `below` GPUs (the queue's length
        if none)."""
        return self._next_sized(s, k, below - 1, 0, 0)

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
            # A failed try was for a job within capacity, so its floor is at most cap + 1.
            below = max(below, min(self._in_share_floor(s, self.q[s][k].priority), self.cap[s] + 1))
            # Jobs of more than `room` and at most `upto` GPUs can borrow right now (_borrows_now), so
            # rule 4 is not tried for them: deferred too, while nothing changes and no job of the share
            # waits for held GPUs (a later job's key would then be past it).
            upto = self._borrows_upto(s)
            if upto and self.held_for[s] == _KEY_MAX:
                if upto + 1 < below:
                    return self._next_sized(s, k, room, upto, below)
                below = room + 1
        return self._next_below(s, k, below)

    def _next_sized(self, s: int, k: int, room: int, lo: int, hi: int) -> int:
        """The first queue index after k whose job needs at most `room` GPUs, or more than `lo` and
        fewer than `hi` (the queue's length if none)."""
        suf = self.sufmin[s]
        n = len(suf)
        if k + 1 >= n or (suf[k + 1] > room and suf[k + 1] >= hi):
            return n
        # Most often it is a few jobs on: look there first, then bisect each size's keys.
        q = self.q[s]
        for j in range(k + 1, min(n, k + 9)):
            x = q[j].gpus
            if x <= room or lo < x < hi:
                return j
        key = self.qkey[s][k]
        first = None
        for g, keys in self.by_size[s].items():
            if g <= room or lo < g < hi:
                i = bisect_right(keys, key)
                if i < len(keys) and (first is None or keys[i] < first):
                    first = keys[i]
        return n if first is None else bisect_left(self.qkey[s], first, k + 1)

    def _skip_unplaced(self, s: int, k: int) -> int:
        """Rules 2-4, after a job of share s before index k was blocked (or reserved for): from k on,
        the jobs that fit the share's own room but are of a size this epoch's failed placement covers
        (_place_failed) each wait for a node, and none of them is the share's head, so none reserves.
        They are marked so, at once, and their reasons left for later with the free counts of now;
        returns the first index _own_phase might decide otherwise. (At 100k jobs on 2,560 GPUs, 1.2 M
        such jobs went through _own one by one, four per pass.)"""
        room = self.cap[s] - self.held[s] - self.pend[s]
        q, st = self.q[s], self.status[s]
        n = len(q)
        skipped: list[int] = []
        place: dict[int, tuple] = {}  # size -> its reason's key now
        while k < n:
            if st[k] == _TODO:
                g = q[k].gpus
                if g > room or not self._place_failed(g):
                    break
                st[k] = _BLOCKED
                skipped.append(k)
                if g not in place:
                    place[g] = self._place_key(g)
            k += 1
        if skipped:
            out, reason = self.out.waiting, self._reason

            def why(s: int, k: int) -> None:
                out[q[k].job_id] = reason(place[q[k].gpus])

            if LAZY_REASONS:
                self.out.later.append((why, s, skipped))
            else:
                for j in skipped:
                    why(s, j)
        return k

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
            # Nothing left in this queue fits its own capacity: all of it is for rule 5, unless rule 4
            # could still make room. It cannot when the last failed try (this epoch) was for no more
            # GPUs and no lower priority than any job left (priorities only fall along the queue).
            if self.cap[s] - self.held[s] - self.pend[s] < suf[k] and (
                not self.in_share[s] or suf[k] >= self._in_share_floor(s, qs[k].priority)
            ):
                break
            before = self.held[s] + self.pend[s]  # the own-use ratio's numerator, min(.., cap)
            outcome = self._own_phase(s, k)
            if outcome == _DEFER:
                k = self._next_not_deferred(s, k)
                continue
            k += 1
            if outcome in (_BLOCKED, _RESERVED):
                k = self._skip_unplaced(s, k)
                continue
            if outcome in (_ADMITTED, _EARMARKED) and heap:
                cap = self.cap[s]
                if min(self.held[s] + self.pend[s], cap) != min(before, cap):
                    key = (self._own_ratio(s), s)
                    if key > heap[0]:
                        heapq.heappush(heap, key)
                        break
        self.bptr[s] = k
