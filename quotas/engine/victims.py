"""Victims (rules 3, 4, 9 and 10): rule 3's reclaim order and rule 4's in-share order, rule 9's minimal-set
walk (forward until the job can run, then backwards giving back what it does not need), and rule 10's
wait for protected attempts. A part of rules.TypePass."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import compress

from quotas.engine.cover import CoverAccounting
from quotas.engine.placement import NodeFit
from quotas.engine.state import (
    PassAttempt,
)
from quotas.engine.views import (
    RECLAIM,
    Preemption,
    ProtectionWait,
    QueuedView,
)


class ProtectionClaim:
    """Rule 10: the victims (some protected) a job waiting for protection would take: marked for the
    rest of the pass, never pre-empted."""

    __slots__ = ("victims",)

    def __init__(self, victims: list[tuple[PassAttempt, str]]) -> None:
        self.victims = victims


class VictimWalk(CoverAccounting):
    """The candidate orders and the minimal-set walk over them."""

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

    def _mark(self, a: PassAttempt, reclaim: bool) -> None:
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

    def _unmark(self, a: PassAttempt) -> None:
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

    def _reclaim_candidates(self, s_job: int) -> Iterator[PassAttempt]:
        """Rule 3's order: borrowed attempts of the other shares, the shares furthest from s_job in the
        organisation tree first (the fewest groups in common), then the share with the most borrowed
        GPUs ÷ its weight (counted now, when the reclaim starts, without history; ties: share name),
        inside a share lowest priority first, then the most recent safe point, then later in queue
        order (rule 8). Flat, with every weight 1: the most borrowed first."""
        tree = self.sh.tree
        if tree is None:
            order = sorted(
                (s for s in self.vshares if s != s_job and self._borrowed(s) > 0),
                key=lambda s: (-self._borrowed(s), s),  # share indexes follow name order
            )
        else:
            common, weight = tree.common_depth, tree.weight
            order = sorted(
                (s for s in self.vshares if s != s_job and self._borrowed(s) > 0),
                key=lambda s: (common(s_job, s), -self._borrowed(s) / weight[s], s),
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

    def _in_share_candidates(self, s: int, n: int) -> Iterator[PassAttempt]:
        """Rule 4's order: the share's first n attempts of its in-share victim order (those of strictly
        lower priority: lowest first, then the most recent safe point, then later in queue order), which is
        `vatts` from the end. Protected ones included: _try_in_share leaves them out."""
        lst = self.vatts[s]
        last = len(lst) - 1
        for idx in range(self.iptr[s], n):
            a = lst[last - idx]
            if not a.victim:
                yield a

    def _reachable(self, g: int, fit: NodeFit, ins: dict[int, int]) -> set[int] | None:
        """The nodes that some set of candidates could make fit a job of g GPUs (free + being freed +
        borrowed GPUs there + `ins`, what rule 4's candidates add there), when none fits without
        victims; None when one does. An empty set (or too few whole nodes) means no victim can help."""
        if fit.ok():
            return None
        fu, pu, rec, size, sched = self.free_u, self.pend_u, self.rec, self.size, self.sched
        if self._rec_nodes is None:  # then kept by _mark and _unmark for the rest of the pass
            self._rec_nodes = set(compress(range(len(rec)), rec))
        nodes = self._rec_nodes | ins.keys()
        if g > self.largest_node:
            return {
                i
                for i in nodes
                if sched[i]
                and size[i] == self.largest_node
                and fu[i] + pu[i] + rec[i] + ins.get(i, 0) == self.largest_node
            }
        return {i for i in nodes if sched[i] and fu[i] + pu[i] + rec[i] + ins.get(i, 0) >= g}

    def _walk(
        self,
        s: int,
        g: int,
        tol: int | tuple[int, ...],
        walk_inputs: Callable[[], tuple[Iterator[tuple[PassAttempt, str]], dict[int, int] | None]],
        own_limit: bool,
        fits: bool | None = None,
        protected: bool = False,
    ) -> tuple[list[tuple[PassAttempt, str]], NodeFit] | str | ProtectionClaim:
        """Rule 9's walk (_minimal_victims) over the candidates that `walk_inputs` gives (with what they
        add per node, for rule 4), protected attempts left out; then rule 10: if it fails where a
        protected candidate was left out (`protected`: the caller left some out already), the walk is
        made again with them. If that one succeeds, the job waits for protection: its victims (some
        protected) are returned as a ProtectionClaim, marked but not pre-empted."""
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
        return ProtectionClaim(again[0])

    def _protect_wait(self, s: int, k: int, claim: ProtectionClaim) -> int:
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
        tol: int | tuple[int, ...],
        cands: Iterator[tuple[PassAttempt, str]],
        own_limit: bool,
        ins: dict[int, int] | None = None,
        fits: bool | None = None,
    ) -> tuple[list[tuple[PassAttempt, str]], NodeFit] | str:
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
        fit = NodeFit(self, g, fits)
        reach = self._reachable(g, fit, ins or {})
        if reach is not None and (len(reach) + fit.base < fit.k if fit.gang else not reach):
            return "place"

        def can_run() -> bool:
            return (
                (not own_limit or self.held[s] + self.pend[s] <= self.capacity[s])
                and self._covered(s, tol)
                and fit.ok()
            )

        taken: list[tuple[PassAttempt, str]] = []
        ok = can_run()
        if not ok:
            for a, reason in cands:
                if reason == RECLAIM:
                    if own_limit and self.held[s] + self.pend[s] > self.capacity[s]:
                        break  # only the share's own jobs bring it within its capacity
                    if not self._fits_budget(a.s, [a.gpus]):
                        continue  # reclaim never takes a share's own capacity (beyond one indivisible job)
                if (
                    reach is not None
                    and self._covered(s, tol)
                    and (not own_limit or self.held[s] + self.pend[s] <= self.capacity[s])
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
                if own_limit and self.held[s] + self.pend[s] > self.capacity[s]
                else "cover"
                if not self._covered(s, tol)
                else "place"
            )
            for a, _ in reversed(taken):
                fit.add(a, -1)
                self._unmark(a)
            return why
        kept: list[tuple[PassAttempt, str]] = []
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

    def _commit_victims(self, victims: list[tuple[PassAttempt, str]], job: QueuedView) -> int:
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
