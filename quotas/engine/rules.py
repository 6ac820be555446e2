"""One pass over one GPU type's state: rules 1-10 of SEMANTICS.md (phases A, B and C of policy.plan).

A reader finds each concern in its own module, all parts of `TypePass`:
- cover.py      the cover of rule 3 and the per-share accounting (CoverAccounting);
- placement.py  nodes, best fit, gangs, and rule 9's node test (NodePlacement, NodeFit);
- victims.py    rule 3's and rule 4's victim orders, rule 9's minimal-set walk, rule 10 (VictimWalk);
- reclaim.py    own capacity first: rules 2-4 and rule 6's starvation guard (OwnCapacityRules);
- borrowing.py  rule 5 (BorrowingRules);
- reasons.py    why a job waits (WaitingReasons);
and here: the pass over all types (`run_pass`), the order of the phases (`TypePass.run`), and the two
decisions every phase ends in (`_admit`, `_earmark`). It reads the state of state.py and decides into a
PassOutput that becomes the Plan."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Hashable, Mapping
from typing import Any

from quotas.engine import reasons
from quotas.engine.placement import NodeFit
from quotas.engine.reclaim import OwnCapacityRules
from quotas.engine.state import (
    ADMITTED,
    DEFERRED,
    EARMARKED,
    KEY_MAX,
    NO_LIMIT,
    TODO,
    LazyWaiting,
    OpenIndexes,
    PassAttempt,
    PassOutput,
    PassStatus,
    TypeState,
)
from quotas.engine.victims import ProtectionClaim
from quotas.engine.views import (
    ADMITTED_BORROWED,
    ADMITTED_OWN,
    FAIR_SHARE,
    PRIORITY,
    RECLAIM,
    Admission,
    Plan,
)

__all__ = ["NodeFit", "ProtectionClaim", "TypePass", "named_beneficiaries", "run_pass"]


def named_beneficiaries(bases: Mapping[str, TypeState]) -> set[Hashable]:
    """The jobs pre-empting attempts of any type name: beneficiaries (rule 7) as much as the jobs flagged
    so in their queues (TypeState.bens)."""
    named: set[Hashable] = set()
    for base in bases.values():
        if base.ben_count:
            named.update(base.ben_count)
    return named


def run_pass(
    bases: Mapping[str, TypeState],
    now: float,
    starvation_s: float,
    history: Mapping[tuple[str, str], float] | None = None,
    fair_reclaim: bool = False,
) -> Plan:
    out = PassOutput()
    beneficiaries = named_beneficiaries(bases)
    readers = []
    for gpu_type in sorted(bases):
        base = bases[gpu_type]
        if base.waiting:
            out.waiting.update(base.waiting)
        if not base.qinfo:
            continue  # nothing queued of this type: nothing to admit, nothing to pre-empt for
        lazy = len(out.later)
        tp = TypePass(base, now, starvation_s, beneficiaries, out, history, fair_reclaim)
        tp.run()
        for a in tp.marked:
            a.victim = False  # the attempts outlive the pass; its decisions are in `out`
        if len(out.later) > lazy:
            readers.append(base)
    waiting: Mapping[Hashable, str] = out.waiting
    if out.later:
        waiting = LazyWaiting(out.waiting, out.later)
        # The reasons left for later hold the passes (bound methods, closures), which hold `out`: it lets
        # go of the list, so no cycle is left and a plan nobody reads is freed at once, not by the cyclic
        # collector (a pass's garbage is thousands of lists and cells; collecting it was ~15 % of a run).
        out.later = []
        for base in readers:
            base.add_reader(waiting)
    return Plan(
        admissions=tuple(out.admissions),
        preemptions=tuple(out.preemptions),
        waiting=waiting,
        reserved=out.reserved,
        protected=out.protected,
        recheck_at=out.recheck_at,
        settled=_settled(out),
    )


def _settled(out: PassOutput) -> bool:
    """Plan.settled: the pass reached a fixpoint. With admissions, a pass right after they start
    decides nothing: this one admitted and did nothing else, no pre-emption, nothing earmarked for a
    job (rules 7, 9), no job waiting for protection (rule 10), no beneficiary started (rule 7 puts it
    ahead of the owners, so it may be reclaimed next, and the GPUs its victims free are then held for
    nobody), no share with in-share pre-emption left with a waiting job of higher priority than one of
    its attempts (rule 4's candidates grow with what starts, and a job that skipped rule 4 because it
    could borrow then may have lost those GPUs since), and no order by fair-share values (rule 5 with
    groups, weights or history; rule 11). Then the next pass starts from this one's numbers at its end,
    and every job it looks at was looked at here, in the same order or later, with as many free GPUs
    or more, as much own room or more and a cover as slack or slacker; what this pass started adds
    victims only as GPUs it took from the same nodes. A starving head that the next pass finds is held
    for (rule 6), not started: it was looked at here after the head before it started. A node held
    for a starving head (rule 6) is allowed when every admission came before the first hold
    (`admitted_at_hold`: a job started after it took GPUs beside the node chosen, so the next pass may
    choose another and free this one) and no share that started a job has a starving head left
    (`_new_starving_head`: that head goes first in the next pass, ahead of where it was looked at
    here, and may take a node held here for another). Without admissions: it decided nothing and
    earmarked nothing (so each share's head, for rule 6, is its first job, or its first that is no
    beneficiary), waits for no protection, and was not ranked by fair-share values; a node held for a
    starving head is allowed. What holds the claims: the next pass at every settled plan of random
    states and histories decides nothing (tests/quotas/test_policy_settled.py, where each condition
    above has the case that needs it), and replays with `simulate(check_skipped=True)`."""
    if out.unsettled or out.preemptions or out.protected or out.recheck_at is not None:
        return False
    return not (out.admissions and out.reserved) or out.admitted_at_hold == len(out.admissions)


class TypePass(OwnCapacityRules):
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
        self,
        base: TypeState,
        now: float,
        starvation_s: float,
        beneficiaries: set[Hashable],
        out: PassOutput,
        history: Mapping[tuple[str, str], float] | None = None,
        fair_reclaim: bool = False,
    ) -> None:
        self.base = base
        self.sh = base.sh
        self.t = base.t
        self.out = out
        self.now = now
        self.starvation_s = starvation_s

        # -- nodes and shares: read-only here
        self.node_names, self.size, self.sched = base.node_names, base.size, base.sched
        self.schedulable_gpus, self.largest_node, self.largest_schedulable, self.largest_nodes = (
            base.schedulable_gpus,
            base.largest_node,
            base.largest_schedulable,
            base.largest_nodes,
        )
        self.capacity, self.lender, self.reserve, self.may_borrow = (
            base.capacity,
            base.lender,
            base.reserve,
            base.may_borrow,
        )
        self.in_share, self.borrow_cap = base.in_share, base.borrow_cap
        # Rule 10: protected attempts are left out of the walks' candidates (`_exclude`) wherever some
        # share has a protection window; `_skipped`: the current walk left one out; `no_borrow`: a job
        # waits for protection, so no new borrowing of this type starts in this pass.
        self.protects = self._exclude = base.protects
        self._skipped = False
        self.no_borrow = False
        self.pool, self.overcommitted, self.lender_shares = base.pool, base.overcommitted, base.lender_shares
        self.ben_nodes = base.ben_nodes
        n_shares = len(self.capacity)

        # -- what this pass changes: copies
        self.held = base.held.copy()
        self.grace = base.grace.copy()
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
        # (share, GPUs more) -> (version, its shortfalls) (cover._shortfalls_if)
        self._shortfalls_memo: dict[tuple[int, int], tuple[int, tuple[int, ...]]] = {}

        # -- victim orders: from the base, when first needed (_victims)
        self._vready = False
        self._rec_nodes: set[int] | None = None  # nodes where rec > 0, once _reachable asks
        self.vptr = [0] * n_shares
        self.iptr = [0] * n_shares
        self.marked: list[PassAttempt] = []  # attempts marked as victims at some point (reset after the pass)

        # -- cover aggregates (rule 3), kept incrementally from here; the organisation tree (cover.py)
        self._cover_setup(history or {}, fair_reclaim)

        # -- memos: a shape that could not be placed even with reclaim stays so until GPUs being freed
        # are added to the unreserved pool (epoch), since free GPUs and candidates only shrink.
        self.epoch = 0
        self.fail_single = (NO_LIMIT, 0)
        self.fail_gang = (NO_LIMIT, 0)
        self.in_fail: dict[int, tuple[int, int, int]] = {}  # share -> (gpus, priority, epoch)
        self._reasons = base.reasons  # blocker key -> sentence: the same for every pass of this base

        # -- queues: the base's lists (replaced, never changed, by later events), in rule 1's order;
        # a job's key (priority, submit time, id) is its place in the global queue order.
        self.q = base.q.copy()
        self.qkey = base.keys.copy()
        self.sufmin = base.suf
        self.by_size = base.by_size
        self.status = [PassStatus() for _ in self.q]  # share -> queue index -> status, TODO unless set
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
        self.held_for = [KEY_MAX] * n_shares
        self.hptr = [0] * n_shares
        self.bptr = [0] * n_shares

    def run(self) -> None:
        q, status, qkey = self.q, self.status, self.qkey
        shares = [s for s in range(len(q)) if q[s]]
        if not shares:
            return
        is_ben = self.is_ben
        later: list[tuple[tuple, int, int]] = []  # (queue key, share, index): first in line to borrow
        if self.fair or self.fair_reclaim:
            self.out.unsettled = True  # (the values move as jobs start: no claim made for the next pass)

        # A. Rule 7: beneficiaries of earlier pre-emptions, ahead of everything else.
        # Rule 6: a starving head goes next, before backfill and other shares can take its node.
        heads = []
        now, starvation_s = self.now, self.starvation_s
        for s in shares:
            for k, job in enumerate(q[s]):
                if job.job_id in is_ben:
                    continue
                if now - job.submitted_at > starvation_s:  # (_starving, inline: the same formula)
                    heads.append((qkey[s][k], s, k))
                break
        # Ahead of everything else, borrowing included: their victims have made room for them. Own
        # capacity first among them too (rule 2): a beneficiary that borrowed the GPUs another one needs
        # for its own capacity would be reclaimed by it in the next pass, and borrow them back in the
        # one after while it stays a beneficiary (a loop at one instant, with zero grace).
        for _, s, k in self.bens:
            if status[s].get(k, TODO) == TODO:
                self._own_phase(s, k)
        for _, s, k in self.bens:
            if status[s].get(k, TODO) == DEFERRED:
                self._borrow(s, k)
        for hkey, s, k in sorted(heads):
            if status[s].get(k, TODO) == TODO and self._own_phase(s, k) == DEFERRED:
                later.append((hkey, s, k))

        # B. Rules 2-4, shares by lowest own-use ratio (ties: name), recomputed as they admit.
        held, pend, capacity = self.held, self.pend, self.capacity
        heap: list[tuple[Any, int]] = []  # (a share's key, the share): a ratio here, rule 5's order in C
        for s in shares:
            c = capacity[s]
            if c:  # (_own_ratio, inline)
                u = held[s] + pend[s]
                heap.append(((u if u < c else c) / c, s))
        heapq.heapify(heap)
        while heap:
            _, s = heapq.heappop(heap)
            self._own_share(s, heap)

        # C. Rule 5: borrowers by fewest borrowed GPUs relative to capacity (ties: name); with groups,
        # weights or history, top-down by fair-share value.
        # Rule 6's starving heads that wait to borrow try first, in queue order (one per share at most),
        # as before the tree. With groups, weights or history they wait for their share's turn in rule
        # 5's order like every borrower, and hold their node(s) then if they cannot start: first in line
        # by submit time, a head of a share that borrowed all week took the node that freed ahead of
        # an idle share whose fair-share value was lower, against rule 5 (and the memory it gives).
        # (The head of a share that may not borrow only waits: with lazy reasons its sentence is left for
        # later with the rest of its queue, below.)
        eager = not reasons.LAZY_REASONS
        may_borrow = self.may_borrow
        for _, s, k in () if self.fair else sorted(later):
            if status[s][k] == DEFERRED and (may_borrow[s] or eager):
                self._borrow(s, k)
        # Still to place: every job of the queue that phases A and B did not decide (looked at and
        # deferred, or never reached).
        pending: dict[int, OpenIndexes] = {}
        open_ = (TODO, DEFERRED)
        for s in shares:
            decided = {k for k, v in status[s].items() if v not in open_}
            if len(decided) < len(q[s]):
                pending[s] = OpenIndexes(0, len(q[s]), decided)
        heap = []
        lazy = self.out.later if reasons.LAZY_REASONS else None
        keys_version = self.version
        fair, no_borrow, pend = self.fair, self.no_borrow, self.pend
        for s, ks in pending.items():
            if may_borrow[s] and not no_borrow:
                if fair:
                    heap.append((self._borrow_order(s), s))
                else:  # (_borrow_ratio, inline: the same formula)
                    c = capacity[s]
                    b = held[s] + pend[s] - c
                    heap.append(((b if b > 0 else 0) / (c if c > 1 else 1), s))
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
        # share -> the version its key in the heap was computed at (or before): a key is a function of
        # the shares' numbers, which change only with the version (_chg), so a key of this version is
        # not stale.
        keyed_at = dict.fromkeys(pending, keys_version) if fair else {}
        while heap:
            bkey, s = heapq.heappop(heap)
            if fair and heap and keyed_at[s] != self.version:
                # A sibling's borrowing raised the values of their common groups: this share's key in
                # the heap may be stale (values only grow in phase C), so it goes back if it is now
                # behind the next one.
                now_key = self._borrow_order(s)
                keyed_at[s] = self.version
                if now_key != bkey and (now_key, s) > heap[0]:
                    heapq.heappush(heap, (now_key, s))
                    continue
            ks = pending[s]
            k, n, decided = ptr[s], ks.stop, ks.decided
            limit = self.capacity[s] + self.borrow_cap[s]
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
                if lazy is not None and self._borrow_breaks(s, suf[k]):
                    # Not even the smallest job left keeps the cover (a bigger one breaks it at least as
                    # much), and nothing changes while each is told why it waits: their reasons, with
                    # the numbers of now, are left for later (_borrow's checks in its order).
                    use = self.held[s] + max(self.grace[s], self.pend[s])
                    lazy.append((self._skipped_why(s, suf[k], False, use, limit), s, ks.part(k)))
                    k = n
                    break
                if self._borrow(s, k) == ADMITTED:
                    k += 1
                    if heap:
                        entry = (self._borrow_order(s), s)
                        if entry > heap[0]:
                            heapq.heappush(heap, entry)
                            if fair:
                                keyed_at[s] = self.version
                            break
                    continue
                k = k + 1 if lazy is None else self._skip_blocked(s, k, ks)
            ptr[s] = k

        # D. Rule 11: fair reclaim, when the cluster turns it on.
        if self.fair_reclaim:
            self._fair_reclaim_phase()
        elif not self.out.unsettled and self.out.admissions and self._rule_4_open(shares):
            self.out.unsettled = True
        # With admissions all made before the first hold, _settled needs to know of a new starving head.
        out = self.out
        held_after_all = out.admissions and out.admitted_at_hold == len(out.admissions)
        if held_after_all and not out.unsettled and self._new_starving_head(shares):
            out.unsettled = True

    def _new_starving_head(self, shares: list[int]) -> bool:
        """With a node held for a starving head (Plan.settled): does a share that started a job here
        have a starving head in a pass made right after it? That head goes first there (rule 6,
        phase A), ahead of where this pass looked at it, and may take the node held here for another."""
        q, status, is_ben = self.q, self.status, self.is_ben
        for s in shares:
            st = status[s]
            if ADMITTED not in st.values():
                continue
            for k, job in enumerate(q[s]):
                if st.get(k) == ADMITTED or job.job_id in is_ben:
                    continue
                if self._starving(job):
                    return True
                break
        return False

    def _rule_4_open(self, shares: list[int]) -> bool:
        """Could rule 4 pre-empt in a pass made right after this one (Plan.settled)? Its candidates are
        not monotone in what this pass starts: a job it started may be of lower priority than one left
        waiting in its share (a beneficiary goes first, rule 7), and a job that skipped rule 4 because
        it could borrow then may have lost those GPUs to later borrowers. So: yes where a share with
        in-share pre-emption keeps waiting a job of higher priority than some attempt it will run."""
        q, status, pgpus, in_share = self.q, self.status, self.base.pgpus, self.in_share
        for s in shares:
            if not in_share[s]:
                continue
            st, qs = status[s], q[s]
            low = min(pgpus[s]) if pgpus[s] else None
            for k, v in st.items():
                if v == ADMITTED and (low is None or qs[k].priority < low):
                    low = qs[k].priority
            if low is None:
                continue
            for k, job in enumerate(qs):  # by priority: the first left waiting has the highest of the
                if st.get(k) == ADMITTED:  # rest (a beneficiary, which goes first, and those after it)
                    continue
                if job.priority > low:
                    return True
                if not job.beneficiary:
                    break
        return False

    def _admit(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        borrowed: bool,
        victims: list[tuple[PassAttempt, str]],
    ) -> int:
        """Admit q[s][k], whose GPUs are already in `pend[s]` (moved to `held` here)."""
        job = self.q[s][k]
        if job.job_id in self.is_ben:
            # A beneficiary goes ahead of everything (rule 7), borrowing included, so jobs looked at
            # after it may reclaim it in the next pass; and the GPUs its victims are freeing are held
            # for nobody once it runs (Plan.settled).
            self.out.unsettled = True
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
        self.status[s][k] = ADMITTED
        return ADMITTED

    def _earmark(
        self,
        s: int,
        k: int,
        placement: list[tuple[int, int]],
        victims: list[tuple[PassAttempt, str]],
        hold_free: bool = True,
    ) -> int:
        """q[s][k] (already in `pend[s]`) waits for the GPUs being freed on `placement` (and holds the
        free ones there too, unless not `hold_free`)."""
        job = self.q[s][k]
        self.out.unsettled = True
        added = self._commit_victims(victims, job) if victims else 0
        held, from_pend = self._hold(placement, hold_free)
        if held:
            self.out.reserved[job.job_id] = held
        if added > from_pend:
            self.epoch += 1  # more GPUs being freed than this job takes: others may now fit
        reclaim = sorted({a.view.share for a, r in victims if r == RECLAIM})
        fair = sorted({a.view.share for a, r in victims if r == FAIR_SHARE})
        if fair:
            why = "waiting for fair reclaim from share " + ", ".join(fair)
        elif any(r == PRIORITY for _, r in victims):
            why = "waiting for lower-priority jobs of its share to stop"
            if reclaim:
                why += " and for reclaim from share " + ", ".join(reclaim)
        elif reclaim:
            why = "waiting for reclaim from share " + ", ".join(reclaim)
        else:
            why = "waiting for pre-empted jobs to stop"
        self.out.waiting[job.job_id] = why
        self.status[s][k] = EARMARKED
        self.held_for[s] = min(self.held_for[s], self.qkey[s][k])
        return EARMARKED
