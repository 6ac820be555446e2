"""Fair reclaim (rule 11, the cluster setting `fair_reclaim`): after rules 2-5, a job left waiting to
borrow may pre-empt borrowed work of other shares, but only where the two sides' fair-share values
would not cross, so that the same two sides never take GPUs back from each other while nothing else
changes. A part of rules.TypePass.

The sides of job J (share S) and a borrowed attempt c (share V) are the two children of the lowest
common group of S and V (the cluster's, without groups: the shares themselves) that hold them; their
values are SEMANTICS' fair-share values at that level (cover.py `_node_value`), counted with J admitted
and the victims taken so far gone. Candidates: the borrowed, unprotected attempts of other shares
(none admitted in this pass: those are no attempts yet), by their side's value now, highest first
(ties: the side's name), then the share's own value, then inside a share rule 3's order; only sides
whose value is above J's side's now are in the list (see `_fair_try`: the contract's test alone let two
sides that both take nothing from outside swap GPUs forever), and no attempt with more GPUs than J (what
it frees beyond J's need is lost work that makes no side fairer) or more than
`FAIR_RECLAIM_MAX_UNSAVED_S` of work since its safe point, nor of a job fair reclaim already took
`FAIR_RECLAIM_MAX_PER_JOB` times. The walk
takes c only if J's side's value is not above c's side's value with c gone; it stops as soon as J can
run (rule 9's "can run" for a borrower: its share's limit, the cover with J borrowing, a node), then
gives back walking backwards, keeping the test true for the victims left. Nothing is pre-empted when
the list cannot make J run. Protected attempts are passed over (a fair reclaim held up by them waits,
and pauses no one's borrowing); while an owner waits for protection (rule 10) no fair reclaim starts,
since J would start borrowing.
"""

from __future__ import annotations

from quotas.engine.placement import NodeFit
from quotas.engine.state import ADMITTED, EARMARKED, RESERVED, PassAttempt
from quotas.engine.victims import VictimWalk
from quotas.engine.views import FAIR_SHARE

# The most unsaved work (seconds since its safe point) an attempt may lose to a fair reclaim: a deviation
# from rule 11's list, which has every borrowed unprotected attempt. Rule 11 only re-divides borrowed
# capacity, which jobs ending would re-divide anyway; an attempt that has run longer than this since its
# last checkpoint is left to end (or to an owner's reclaim). On the ITP fortnight the costliest tenth of
# the moves lost 91 % of the work lost to fair_share; this bound cut that work by a factor of 6 and kept
# owners' p95 wait as without fair reclaim (bench/bench_fair_reclaim.py, bench/RESULTS.md).
FAIR_RECLAIM_MAX_UNSAVED_S = 1800

# How many times fair reclaim may pre-empt one job: a deviation from rule 11's list, which has every
# borrowed unprotected attempt. Rule 11 bounds how soon the same two sides trade GPUs back, not how often
# one job is taken (on the ITP fortnight one job was taken 57 times, each time by a share that moved above
# it again); Slurm's and Kueue's users expect a job not to be pre-empted over and over for fairness. A job
# whose earlier attempts fair reclaim took this many times (RunningView.fair_reclaims) is left to end or
# to an owner's reclaim, which is not bounded. On the ITP fortnight 5 cut the work lost to fair_share from
# 889 to 672 GPU-h with owners' p95 wait still 30 s; 3 and 4 made owners wait longer (31 and 33 s), as
# jobs left borrowing were reclaimed by owners instead (bench/bench_fair_reclaim.py, bench/RESULTS.md).
FAIR_RECLAIM_MAX_PER_JOB = 5


class FairReclaim(VictimWalk):
    """Phase D of the pass: rule 11, when the cluster turns it on."""

    def _fair_reclaim_phase(self) -> None:
        if not self.fair_reclaim or self.no_borrow:
            return
        shares = [s for s in range(len(self.q)) if self.q[s] and self.may_borrow[s]]
        tried: set[int] = set()
        while True:
            # Rule 5's order, recomputed after each try: a fair reclaim changes the values.
            best = None
            for s in shares:
                if s not in tried:
                    key = (self._borrow_order(s), s)
                    if best is None or key < best:
                        best = key
            if best is None:
                return
            s = best[1]
            tried.add(s)
            k = self._waiting_borrower(s)
            if k is not None:
                self._fair_try(s, k)

    def _waiting_borrower(self, s: int) -> int | None:
        """Share s's first job still waiting (in queue order) if it waits to borrow: it does not fit the
        share's own room, fits its borrow limit, and no job of the share waits ahead of it for GPUs."""
        status, q = self.status[s], self.q[s]
        k = 0
        while k < len(q) and status[k] in (ADMITTED, EARMARKED, RESERVED):
            k += 1
        if k == len(q) or self.qkey[s][k] > self.held_for[s]:
            return None
        g = q[k].gpus
        own = self.held[s] + self.pend[s]
        if own + g <= self.capacity[s]:
            return None  # an owner: rule 3's business
        if self.held[s] + max(self.grace[s], self.pend[s]) + g > self.capacity[s] + self.borrow_cap[s]:
            return None
        return k

    def _sides(self, s: int, v: int) -> tuple[int, int]:
        """The children of the lowest common group of shares s and v that hold them (node indexes)."""
        if self.tree is None:
            return s, v
        ps, pv = (*self.tree.path[s], s), (*self.tree.path[v], v)
        i = 0
        while ps[i] == pv[i]:
            i += 1
        return ps[i], pv[i]

    def _fair_try(self, s: int, k: int) -> None:
        job = self.q[s][k]
        g = job.gpus
        self._victims()
        names = self.tree.names if self.tree is not None else self.sh.names
        value = self._node_value
        order = []
        for v in self.vshares:
            if v != s and self._borrowed(v) > 0:
                side_s, side_v = self._sides(s, v)
                # Only from a side whose value is above J's side's now (before J and any victim): a move
                # that leaves both values where they were (J's side takes nothing more from outside with
                # J, c's side nothing less without c: they lend to each other inside) would pass the test
                # below with equal values, and c's job could take the GPUs straight back the same way,
                # forever. Below now and not above after, no move can be answered by its reverse.
                if value(side_s) < value(side_v):
                    order.append((-value(side_v), names[side_v], -value(v), v, side_s, side_v))
        if not order:
            return
        order.sort(key=lambda entry: entry[:4])
        self._taken = {}
        self._chg(s, dp=g)
        fit = NodeFit(self, g)

        def can_run() -> bool:
            return self._covered(s, 0) and fit.ok()

        def fair(entry: tuple[PassAttempt, int, int]) -> bool:
            return value(entry[1]) <= value(entry[2])

        taken: list[tuple[PassAttempt, int, int]] = []
        ok = can_run()
        now = self.now
        protected_until: float | None = None  # the first protection window the walk passed over
        if not ok:
            for *_, v, side_s, side_v in order:
                lst = self.vlist[v]
                for idx in range(self.vptr[v], len(lst)):
                    a = lst[idx]
                    if a.victim:
                        continue
                    if a.until > now:  # protected (rule 10): passed over, and looked at again then
                        if protected_until is None or a.until < protected_until:
                            protected_until = a.until
                        continue
                    if not self._fits_budget(v, [a.gpus]):
                        continue  # reclaim never takes a share's own capacity
                    if a.view.fair_reclaims >= FAIR_RECLAIM_MAX_PER_JOB:
                        continue  # taken often enough for fairness (the bound above)
                    if now - a.view.safe_point > FAIR_RECLAIM_MAX_UNSAVED_S:
                        continue  # (later attempts of the share in rule 3's order may have saved since)
                    if a.gpus > g:
                        # Never a larger attempt than J (a deviation from rule 11's list, which has
                        # every borrowed attempt): what it frees beyond J's GPUs makes nobody's side
                        # fairer, and it is lost work for nothing (on the ITP fortnight a 1-GPU job took
                        # an 8-GPU job of four hours; the rest went back to borrowers as rule 5 chose).
                        continue
                    self._mark(a, True)
                    if not fair((a, side_s, side_v)):
                        self._unmark(a)
                        break  # more of this share would only lower its side's value further
                    fit.add(a, 1)
                    taken.append((a, side_s, side_v))
                    if can_run():
                        ok = True
                        break
                if ok:
                    break
        if not ok:
            for a, _, _ in reversed(taken):
                fit.add(a, -1)
                self._unmark(a)
            self._chg(s, dp=-g)
            out = self.out
            if protected_until is not None and (out.recheck_at is None or protected_until < out.recheck_at):
                out.recheck_at = protected_until  # the walk is made again when the first window ends
            return
        # Give back walking backwards: what J can run without, and without which every victim left
        # still passes the test.
        kept = list(taken)
        for entry in reversed(taken):
            a = entry[0]
            kept.remove(entry)
            fit.add(a, -1)
            self._unmark(a)
            if can_run() and all(fair(other) for other in kept):
                continue
            self._mark(a, True)
            fit.add(a, 1)
            kept.append(entry)
        placement = self._place(g, fit.extra, True)
        if placement is None:  # (fit.ok() says a node fits: never, but nothing half-done if so)
            for a, _, _ in kept:
                fit.add(a, -1)
                self._unmark(a)
            self._chg(s, dp=-g)
            return
        kept.sort(key=lambda entry: taken.index(entry))
        self._earmark(s, k, placement, [(a, FAIR_SHARE) for a, _, _ in kept])
        if self.out.later:
            # A reason phase C left for later would overwrite the one the earmark wrote.
            why, job_id, waiting = self.out.waiting[job.job_id], job.job_id, self.out.waiting
            self.out.later.append((lambda _s, _k: waiting.__setitem__(job_id, why), s, (k,)))
