"""Why a job waits (SEMANTICS "Forecast"): the sentences, keyed by blocker so that equal blockers share one,
written at once or left for when Plan.waiting is read. A part of rules.TypePass."""

from __future__ import annotations

from quotas.engine.passfields import PassFields
from quotas.engine.state import (
    BLOCKED,
)
from quotas.engine.views import (
    at_time,
    plural,
)

# Reasons the pass can leave for when they are read (Plan.waiting); off only in the tests that check
# that reading them later gives the same sentences.
LAZY_REASONS = True
REASON_MEMO = 4096  # sentences kept per GPU type between passes


class WaitingReasons(PassFields):
    """The waiting reasons of one pass."""

    def _reason(self, key: tuple) -> str:
        """Why a job waits, naming the blocker with its numbers (SEMANTICS "Forecast"). `key` is the
        blocker's kind and numbers, so equal blockers share one sentence."""
        why = self._reasons.get(key)
        if why is None:
            kind, t = key[0], self.t
            if kind == "place":
                g, free = key[1], key[2]
                if g > self.largest_node:
                    free_now = (
                        "none is free" if not free else "1 is free" if free == 1 else f"{free} are free"
                    )
                    why = (
                        f"needs {g // self.largest_node} whole {self.largest_node}-GPU {t} nodes; {free_now}"
                    )
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
                why = f"behind {plural(key[1], 'job')} ahead of it in its share's queue"
            elif kind == "held":
                why = "behind a job of its share that waits for GPUs being freed for it"
            elif kind == "protected":
                n, shares, until = key[1], key[2], key[3]
                why = (
                    f"waits for {plural(n, 'protected job')} of share{'s' if len(shares) > 1 else ''} "
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
                elif kind == "group_limit":
                    name, bcap, taken = key[4], key[5], key[6]
                    why = f"{own}; group {name} may take {bcap} {t} from outside: {taken} taken"
                elif kind == "slack":
                    spare = key[4]
                    why = (
                        f"{own}; nothing idle to borrow"
                        if spare <= 0
                        else f"{own}; only {spare} idle lendable {t} to borrow"
                    )
                else:  # pragma: no cover - every key kind is listed above
                    why = "waiting"
            if len(self._reasons) > REASON_MEMO:
                self._reasons.clear()
            self._reasons[key] = why
        return why

    def _own_numbers(self, s: int, g: int) -> tuple[int, int, int]:
        """(gpus asked, own capacity in use, own capacity) for a reason."""
        use = self.held[s] + max(self.grace[s], self.pend[s])
        return g, min(use, self.capacity[s]), self.capacity[s]

    def _place_key(self, g: int) -> tuple:
        if g > self.largest_node:
            return ("place", g, self._whole_free())
        return ("place", g, self._max_free())

    def _wait(self, s: int, k: int, key: tuple) -> int:
        self.out.waiting[self.q[s][k].job_id] = self._reason(key)
        self.status[s][k] = BLOCKED
        return BLOCKED
