"""The cover of rule 3 and the share accounting of one pass: held, being freed (grace) and earmarked GPUs
per share, borrowed GPUs in all against idle lendable ones (the deficit), reclaim's budget per share,
and who a borrowed admission draws from. A part of rules.TypePass."""

from __future__ import annotations

from quotas.engine.views import (
    UNASSIGNED,
)


class CoverAccounting:
    """Per-share numbers and the cover (rule 3), kept incrementally as the pass decides."""

    def _contrib(self, s: int, sign: int) -> None:
        u = self.held[s] + self.pend[s]
        c = self.capacity[s]
        own = u if u < c else c
        self.own_total += sign * own
        self.borrowed_total += sign * (u - own)
        if self.lender[s]:
            self.lendable_idle += sign * (c - own)
        elif self.reserve[s]:
            self.reserve_idle += sign * (c - own)

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
        lendable = self.lendable_idle + self.pool
        hw = self.schedulable_gpus - self.own_total - self.reserve_idle
        if hw < lendable:
            lendable = hw if hw > 0 else 0
        return self.borrowed_total - lendable

    def _deficit_if(self, s: int, more: int) -> int:
        """_deficit() if share s held `more` GPUs more, without changing anything."""
        u = self.held[s] + self.pend[s]
        c = self.capacity[s]
        own0 = u if u < c else c
        u1 = u + more
        own1 = u1 if u1 < c else c
        d_own = own1 - own0
        lidle, ridle = self.lendable_idle, self.reserve_idle
        if self.lender[s]:
            lidle -= d_own
        elif self.reserve[s]:
            ridle -= d_own
        lendable = lidle + self.pool
        hw = self.schedulable_gpus - self.own_total - d_own - ridle
        if hw < lendable:
            lendable = hw if hw > 0 else 0
        return self.borrowed_total + (u1 - own1) - (u - own0) - lendable

    def _borrowed(self, s: int) -> int:
        b = self.held[s] + self.pend[s] - self.capacity[s]
        return b if b > 0 else 0

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

    def _lenders(self) -> tuple[str, ...]:
        """Who a borrowed admission draws from: every lender with idle lendable GPUs (proportional
        accounting), the largest first."""
        names = self.sh.names
        items = []
        for s in self.lender_shares:
            u = self.held[s] + self.pend[s]
            idle = self.capacity[s] - u
            if idle > 0:
                items.append((-idle, names[s]))
        if self.pool:
            items.append((-self.pool, UNASSIGNED))
        items.sort()
        return tuple(n for _, n in items)
