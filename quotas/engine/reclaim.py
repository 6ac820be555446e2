"""Own capacity first (rules 2-4, with rule 6's starvation guard): a job that fits its share's own room is
admitted own, waits for GPUs being freed, or reclaims borrowed work of other shares; one that does not
may pre-empt lower-priority work of its own share. A part of rules.TypePass."""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Iterator
from functools import partial
from itertools import repeat
from operator import add

from quotas.engine import reasons
from quotas.engine.borrowing import BorrowingRules
from quotas.engine.state import (
    ADMITTED,
    BLOCKED,
    DEFERRED,
    EARMARKED,
    KEY_MAX,
    NO_LIMIT,
    RESERVED,
    TODO,
    PassAttempt,
)
from quotas.engine.victims import ProtectionClaim
from quotas.engine.views import (
    PRIORITY,
    RECLAIM,
    QueuedView,
)


def _write_held_reason(numbers: tuple, s: int, k: int) -> None:
    """_reserve_starving's writer: a starving head's reason, with the numbers of the moment it was held
    for."""
    out, reason, job_id, key, placement, names, starvation_s = numbers
    nodes = names[placement[0][0]] if len(placement) == 1 else ", ".join(names[i] for i, _ in placement)
    out[job_id] = f"{reason(key)}; holding {nodes} for it (waited over {starvation_s:g}s)"


class OwnCapacityRules(BorrowingRules):
    """Phases A and B of the pass: own capacity, reclaim and in-share pre-emption."""

    def _own_phase(self, s: int, k: int) -> int:
        job = self.q[s][k]
        g = job.gpus
        c = self.capacity[s]
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
            if outcome != DEFERRED:
                return outcome  # earmarked for its victims, or waiting for protection
        self.status[s][k] = DEFERRED
        return DEFERRED

    def _own(self, s: int, k: int, can_now: bool) -> int:
        """Rules 2-3 for a job that fits its share's remaining own capacity: admitted own where a node
        and the cover allow it, else it reclaims a minimal set of borrowed work in rule 3's order and
        waits for those GPUs (rule 9)."""
        job = self.q[s][k]
        g = job.gpus
        tol = self._cover_tol(s)  # never make the cover worse; restore it if it held
        if self._place_failed(g):
            return self._blocked_on_placement(s, k, tol)
        self._taken = {}
        self._chg(s, dp=g)
        fits = None
        if self._covered(s, tol):
            # Rule 9 with nothing to take: where the cover holds and a node fits (free or being-freed
            # GPUs), the minimal set is empty; _minimal_victims would say so after building its walk.
            placement = self._place(g, None, True, self.ben_nodes.get(job.job_id))
            if placement is not None:
                return self._start_or_wait(s, k, placement, [], can_now, None)
            fits = False if g <= self.largest_node else None  # (a gang's node test counts its nodes itself)
        # (zip, not a generator expression: compiled, that one is made a list at once, before the walk has
        # readied the victim orders that _reclaim_candidates reads)
        found = self._walk(
            s, g, tol, lambda: (zip(self._reclaim_candidates(s), repeat(RECLAIM)), None), False, fits
        )
        if isinstance(found, ProtectionClaim):
            return self._protect_wait(s, k, found)
        if isinstance(found, str):
            self._chg(s, dp=-g)
            if found == "cover":
                return self._wait(s, k, ("cover",))
            memo = (g // self.largest_node if g > self.largest_node else g, self.epoch)
            if g > self.largest_node:
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
        placement: list[tuple[int, int]] | None,
        victims: list[tuple[PassAttempt, str]],
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
            self.reserve_idle > 0
            and self.free_total - job.gpus < self.reserve_idle
            and (victims or job.job_id in self.base.ben_count)
        ):
            ben = self.ben_nodes.get(job.job_id)
            waits = self._place(job.gpus, extra, True, ben, wait=True)
            return self._earmark(s, k, waits or placement, victims, hold_free=False)
        return self._admit(s, k, placement, False, victims)

    def _in_share(self, s: int, k: int) -> int:
        """Rule 4: pre-empt strictly lower-priority work of the share, only if that makes the job fit
        (own capacity, cover, and a node): EARMARKED; BLOCKED if it waits for protection (rule 10);
        else DEFERRED. The caller has asked _in_share_floor already."""
        job = self.q[s][k]
        g, p = job.gpus, job.priority
        self._victims()
        n = len(self.vnprio[s]) - bisect_right(self.vnprio[s], -p)  # attempts of lower priority
        if not n:
            # Nothing of lower priority runs in the share: no job of priority p or lower, of any size,
            # can pre-empt in it this pass (candidates only shrink), so the walk stops deferring them
            # one by one.
            self.in_fail[s] = (1, p, self.epoch)
            return DEFERRED
        outcome = self._try_in_share(s, k, n)
        if outcome == DEFERRED:
            self.in_fail[s] = (g, p, self.epoch)
        return outcome

    def _in_share_floor(self, s: int, p: int) -> int:
        """Rule 4 cannot make room in share s for a job of priority p and this many GPUs or more: this
        epoch's failed try was for no more GPUs and no lower priority (free GPUs and candidates only
        shrink within an epoch). NO_LIMIT when no such try is known."""
        memo = self.in_fail.get(s)
        if memo is not None and memo[2] == self.epoch and p <= memo[1]:
            return memo[0]
        return NO_LIMIT

    def _try_in_share(self, s: int, k: int, n: int) -> int:
        """Rule 4 with rule 9: one candidate list, the share's strictly-lower-priority attempts in rule
        4's order, then other shares' borrowed attempts in rule 3's order; a minimal set of them so
        that the job runs as own: EARMARKED. Protected attempts are no candidates (rule 10): BLOCKED
        when the job waits for them; DEFERRED when no set makes it run."""
        if not n:
            return DEFERRED
        job = self.q[s][k]
        g = job.gpus
        over = self.held[s] + self.pend[s] + g - self.capacity[s]
        p = job.priority
        if sum(gpus for prio, gpus in self.pgpus[s].items() if prio < p) < over:
            return DEFERRED  # even all of them (victims taken this pass included) leave it over capacity
        tol = self._cover_tol(s)
        self._taken = {}
        self._chg(s, dp=g)

        mine = list(self._in_share_candidates(s, n))
        if sum(a.gpus for a in mine) < over:
            self._chg(s, dp=-g)
            return DEFERRED  # even all of them would not bring it within its capacity
        now = self.now
        protected = self.protects and any(a.until > now for a in mine)
        unprotected = [a for a in mine if a.until <= now] if protected else mine

        def walk_inputs() -> tuple[Iterator[tuple[PassAttempt, str]], dict[int, int]]:
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

            def cands() -> Iterator[tuple[PassAttempt, str]]:
                for a in own:
                    yield a, PRIORITY
                for a in self._reclaim_candidates(s):
                    yield a, RECLAIM

            return cands(), ins

        found = self._walk(s, g, tol, walk_inputs, True, protected=protected)
        if isinstance(found, ProtectionClaim):
            return self._protect_wait(s, k, found)
        if isinstance(found, str):
            self._chg(s, dp=-g)
            return DEFERRED
        victims, fit = found
        placement = self._place(g, fit.extra, True)
        return self._earmark(s, k, placement, victims)

    def _own_share(self, s: int, heap: list[tuple[float, int]]) -> None:
        """Walk share s's queue for rules 2-4 until its own-use ratio passes the next share's."""
        qs, st, suf = self.q[s], self.status[s], self.sufmin[s]
        k = self.bptr[s]
        n = len(qs)
        while k < n:
            if st.get(k, TODO) != TODO:  # (get: no __missing__ call for the untouched)
                k += 1
                continue
            # Nothing left in this queue fits its own capacity: all of it is for rule 5, unless rule 4
            # could still make room. It cannot when the last failed try (this epoch) was for no more
            # GPUs and no lower priority than any job left (priorities only fall along the queue).
            if self.capacity[s] - self.held[s] - self.pend[s] < suf[k] and (
                not self.in_share[s] or suf[k] >= self._in_share_floor(s, qs[k].priority)
            ):
                break
            before = self.held[s] + self.pend[s]  # the own-use ratio's numerator, min(.., cap)
            outcome = self._own_phase(s, k)
            if outcome == DEFERRED:
                k = self._next_not_deferred(s, k)
                continue
            k += 1
            if outcome in (BLOCKED, RESERVED):
                k = self._skip_unplaced(s, k)
                continue
            if outcome in (ADMITTED, EARMARKED) and heap:
                cap = self.capacity[s]
                if min(self.held[s] + self.pend[s], cap) != min(before, cap):
                    key = (self._own_ratio(s), s)
                    if key > heap[0]:
                        heapq.heappush(heap, key)
                        break
        self.bptr[s] = k

    def _own_ratio(self, s: int) -> float:
        u = self.held[s] + self.pend[s]
        return min(u, self.capacity[s]) / self.capacity[s]

    def _next_not_deferred(self, s: int, k: int) -> int:
        """After job k of share s was deferred by rules 2-4: the next queue index whose job _own_phase
        might not defer as things are now; every job between would be deferred, and a deferral changes
        nothing. A job is deferred when it does not fit the share's own room and rule 4 cannot help:
        the share has no in-share pre-emption, or the job needs more than its capacity, or this
        epoch's failed try was for no more GPUs and no lower priority (priorities only fall along the
        queue)."""
        room = self.capacity[s] - self.held[s] - self.pend[s]
        below = room + 1  # jobs of `below` GPUs or more are deferred
        if self.in_share[s]:
            # A failed try was for a job within capacity, so its floor is at most cap + 1.
            below = max(below, min(self._in_share_floor(s, self.q[s][k].priority), self.capacity[s] + 1))
            # Jobs of more than `room` and at most `upto` GPUs can borrow right now (_borrows_now), so
            # rule 4 is not tried for them: deferred too, while nothing changes and no job of the share
            # waits for held GPUs (a later job's key would then be past it).
            upto = self._borrows_upto(s)
            if upto and self.held_for[s] == KEY_MAX:
                if upto + 1 < below:
                    return self._next_sized(s, k, room, upto, below)
                below = room + 1
        return self._next_below(s, k, below)

    def _skip_unplaced(self, s: int, k: int) -> int:
        """Rules 2-4, after a job of share s before index k was blocked (or reserved for): from k on,
        the jobs that fit the share's own room but are of a size this epoch's failed placement covers
        (_place_failed) each wait for a node, and none of them is the share's head, so none reserves.
        They are marked so, at once, and their reasons left for later with the free counts of now;
        returns the first index _own_phase might decide otherwise. (At 100k jobs on 2,560 GPUs, 1.2 M
        such jobs went through _own one by one, four per pass.)"""
        room = self.capacity[s] - self.held[s] - self.pend[s]
        q, st = self.q[s], self.status[s]
        n = len(q)
        skipped: list[int] = []
        place: dict[int, tuple] = {}  # size -> its reason's key now
        while k < n:
            if st.get(k, TODO) == TODO:
                g = q[k].gpus
                if g > room or not self._place_failed(g):
                    break
                st[k] = BLOCKED
                skipped.append(k)
                if g not in place:
                    place[g] = self._place_key(g)
            k += 1
        if skipped:
            out, reason = self.out.waiting, self._reason

            def why(s: int, k: int) -> None:
                out[q[k].job_id] = reason(place[q[k].gpus])

            if reasons.LAZY_REASONS:
                self.out.later.append((why, s, skipped))
            else:
                for j in skipped:
                    why(s, j)
        return k

    def _place_failed(self, g: int) -> bool:
        if g > self.largest_node:
            v, e = self.fail_gang
            return e == self.epoch and g // self.largest_node >= v
        v, e = self.fail_single
        return e == self.epoch and g >= v

    def _is_head(self, s: int, k: int) -> bool:
        st = self.status[s]
        p = self.hptr[s]
        n = len(self.q[s])
        while p < n and st[p] in (ADMITTED, EARMARKED):
            p += 1
        self.hptr[s] = p
        return p == k

    def _starving(self, job: QueuedView) -> bool:
        return self.now - job.submitted_at > self.starvation_s

    def _reserve_starving(self, s: int, k: int, tol: int | tuple[int, ...]) -> int:
        """The share's head has waited too long: hold the node(s) it needs next (those closest to
        fitting it) so backfill cannot take them, and its GPUs in the share's accounting if the cover
        allows. q[s][k] is not in `pend[s]` when this is called."""
        job = self.q[s][k]
        g = job.gpus
        fu, pu = self.free_u, self.pend_u
        if g > self.largest_node:
            placement = [(i, self.largest_node) for i in sorted(self._most_available(g // self.largest_node))]
        else:
            # The node with the most GPUs free or being freed, ties by name (index): the first of the
            # largest sums, computed over the fitting nodes at C speed (this runs at nearly every pass
            # of a busy cluster, over every node).
            cached = self.base.fit_nodes.get(g)
            if cached is None:
                fit = [i for i in range(len(self.size)) if self.sched[i] and self.size[i] >= g]
                cached = self.base.fit_nodes[g] = (fit, len(fit) == sum(map(bool, self.sched)))
            fit, every = cached
            if every and not self.pend_nodes:
                # Every schedulable node fits and none has GPUs being freed: the sums are the free
                # counts, whose largest and its first node the free-count buckets know already.
                v = self._max_free()
                placement = [(self.bk[v][0] if v else fit[0], g)]
            else:
                avail = list(map(add, fu, pu)) if len(fit) == len(fu) else [fu[i] + pu[i] for i in fit]
                placement = [(fit[avail.index(max(avail))], g)]
        if self._covered_if(s, g, tol):  # (asked before the change: no change and its undoing)
            self._chg(s, dp=g)
        # (a: the GPUs free or being freed on node i; the condition runs before the pair is made)
        if self.out.admitted_at_hold < 0:
            self.out.admitted_at_hold = len(self.out.admissions)
        self.out.reserved[job.job_id] = self._hold(
            [(i, c if c < a else a) for i, c in placement if (a := fu[i] + pu[i])]
        )[0]
        # Its reason, with the free counts of now: written when read (no later decision of this pass
        # writes one for a job held for).
        numbers = (
            self.out.waiting,
            self._reason,
            job.job_id,
            self._place_key(g),
            placement,
            self.node_names,
            self.starvation_s,
        )
        if reasons.LAZY_REASONS:
            self.out.later.append((partial(_write_held_reason, numbers), s, (k,)))
        else:
            _write_held_reason(numbers, s, k)
        self.status[s][k] = RESERVED
        self.held_for[s] = min(self.held_for[s], self.qkey[s][k])
        return RESERVED

    def _blocked_on_placement(self, s: int, k: int, tol: int | tuple[int, ...]) -> int:
        job = self.q[s][k]
        if self._starving(job) and self._is_head(s, k):
            return self._reserve_starving(s, k, tol)
        return self._wait(s, k, self._place_key(job.gpus))
