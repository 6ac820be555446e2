"""Borrowing (rule 5): jobs still waiting in LEND_AND_BORROW shares borrow idle lendable capacity within
their borrow limits and the cover, shares by fewest borrowed GPUs relative to capacity; the queue
skips that leave the reasons of jobs that cannot borrow for when they are read. A part of
rules.TypePass."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from functools import partial
from typing import Any

from quotas.engine.fairshare import FairReclaim
from quotas.engine.state import (
    OpenIndexes,
)


def _write_skipped_reason(numbers: tuple, s: int, k: int) -> None:
    """BorrowingRules._skipped_why's writer: job k's reason, from the numbers of the moment it was
    skipped."""
    q, keys, out, reason, held_for, use, limit, used, cap, borrowed, bcap, place, spare = numbers
    g = q[k].gpus
    if keys[k] > held_for:
        key: tuple = ("held",)
    elif use + g > limit:
        key = ("limit", g, used, cap, borrowed, bcap)
    else:
        key = place.get(g) or ("slack", g, used, cap, spare)
    out[q[k].job_id] = reason(key)


# Why _borrow's job could not borrow (TypePass.borrow_blocked), in the order it asks: behind a job that
# waits for GPUs held for it, at the share's borrow limit, no new borrowing (rule 10), the cover, no node.
HELD, LIMIT, PAUSED, COVER, UNPLACED = range(5)


class BorrowingRules(FairReclaim):
    """Phase C of the pass: rule 5."""

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
            self.may_borrow[s]
            and not self.no_borrow
            and self.qkey[s][k] <= self.held_for[s]
            and self.held[s] + max(self.grace[s], self.pend[s]) + g <= self.capacity[s] + self.borrow_cap[s]
            and not self._borrow_breaks(s, g)
            and (g > self.largest_node or self._max_free() >= g)
            and self._place(g) is not None
        )

    def _borrow(self, s: int, k: int) -> int:
        job = self.q[s][k]
        g = job.gpus
        if not self.may_borrow[s]:
            if g <= self.own_room_at_start[s]:
                return self._wait(s, k, ("behind", k))
            return self._wait(s, k, ("strategy", *self._own_numbers(s, g), self.sh.views[s].strategy))
        if self.qkey[s][k] > self.held_for[s]:
            self.borrow_blocked = HELD
            return self._wait(s, k, ("held",))
        # A borrower that lost its own room to earlier jobs of its share hears why it cannot borrow.
        limit = self.capacity[s] + self.borrow_cap[s]
        use = self.held[s] + max(self.grace[s], self.pend[s])
        if use + g > limit:
            self.borrow_blocked = LIMIT
            borrowed = max(0, use - self.capacity[s])
            return self._wait(s, k, ("limit", *self._own_numbers(s, g), borrowed, self.borrow_cap[s]))
        if self.no_borrow:
            self.borrow_blocked = PAUSED
            return self._wait(s, k, ("paused",))  # rule 10: a job waits for protection
        if self._borrow_breaks(s, g):
            self.borrow_blocked = COVER
            return self._wait(s, k, self._cover_key(s, g, use))
        placement = None if g <= self.largest_node and self._max_free() < g else self._place(g)
        if placement is None:
            self.borrow_blocked = UNPLACED
            return self._blocked_on_placement(s, k, 0)
        self._chg(s, dp=g)
        return self._admit(s, k, placement, True, [])

    def _skip_blocked(self, s: int, k: int, ks: OpenIndexes) -> int:
        """Rule 5, after job k of a LEND_AND_BORROW share could not borrow (_borrow, which said why in
        `borrow_blocked`, nothing changed since): the next queue index whose job might. When k waits
        behind a held job, at its borrow limit, for lendable GPUs or for a node, every later job as big
        or bigger waits too, and nothing changes while they are told so: their reasons, from the numbers
        as they are now, are left for when they are read."""
        g = self.q[s][k].gpus
        use = self.held[s] + max(self.grace[s], self.pend[s])
        limit = self.capacity[s] + self.borrow_cap[s]
        unplaced = False
        why = self.borrow_blocked
        if why == HELD:
            below = 0  # every later job is held too
        elif why == LIMIT:
            below = limit - use + 1
        elif why == COVER or (why == PAUSED and self._borrow_breaks(s, g)):
            below = g  # a bigger job would break the cover at least as much
        else:
            # No node for it (or it is the starving head and now holds one): a bigger job fits no node
            # either (a single-node job finds no node with as many GPUs free, so no node is wholly
            # free for a gang), and none after k is the share's head, so none of them reserves.
            unplaced = True
            below = g
        nxt = self._next_below(s, k, below)
        if nxt > k + 1:
            write = self._skipped_why(s, g, unplaced, use, limit)
            self.out.later.append((write, s, ks.part(k + 1, nxt)))
        return nxt

    def _skipped_why(
        self, s: int, g0: int, unplaced: bool, use: int, limit: int
    ) -> Callable[[int, int], None]:
        """The reason writer for the jobs _skip_blocked skipped (`use` and `limit` as it computed them):
        _borrow's checks in its order, with the numbers of this moment. (A partial of a module function,
        not a closure: its numbers are one tuple, where a closure made a cell for each of them on every
        call, and this runs at most passes of a busy cluster.)"""
        cap = self.capacity[s]
        # After an unplaced job, a bigger one that passes the cover check (it grows with the size)
        # waits for a node: its sentence, per size, with the nodes as they are now.
        place: dict[int, tuple] = {}
        if unplaced:
            breaks, place_key = self._borrow_breaks, self._place_key
            place = {x: place_key(x) for x in self.by_size[s] if x >= g0 and not breaks(s, x)}
        if self.tree is None:
            spare = self._flat_spare(s, use)
        else:  # the limit that binds depends on the size: each size's sentence, with the numbers of now
            spare = max(0, self.top_sum)
            cover_key = self._cover_key
            place.update((x, cover_key(s, x, use)) for x in self.by_size[s] if x >= g0 and x not in place)
        numbers = (
            self.q[s],
            self.qkey[s],
            self.out.waiting,
            self._reason,
            self.held_for[s],
            use,
            limit,
            use if use < cap else cap,
            cap,
            use - cap if use > cap else 0,
            self.borrow_cap[s],
            place,
            spare,
        )
        return partial(_write_skipped_reason, numbers)

    def _next_below(self, s: int, k: int, below: int) -> int:
        """The first queue index after k whose job needs fewer than `below` GPUs (the queue's length
        if none)."""
        return self._next_sized(s, k, below - 1, 0, 0)

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

    def _borrow_ratio(self, s: int) -> float:
        return self._borrowed(s) / max(1, self.capacity[s])

    def _borrow_order(self, s: int) -> tuple[Any, ...] | float:
        """Rule 5's heap key for share s: flat, fewest borrowed GPUs relative to capacity (ties: name);
        with groups, weights or history, its path's fair-share values from the top down."""
        return self._fair_key(s) if self.fair else self._borrow_ratio(s)

    def _flat_spare(self, s: int, use: int) -> int:
        """The idle lendable GPUs a borrower of share s (using `use`) still finds, flat: the share's own
        idle ones are part of the lendable total, not for it."""
        return -self._deficit() - (max(0, self.capacity[s] - use) if self.lender[s] else 0)

    def _cover_key(self, s: int, g: int, use: int) -> tuple:
        """The reason key of a job of g GPUs of share s that the cover stops borrowing: flat, the idle
        lendable GPUs left (the share's own idle ones are part of the lendable total, not for it);
        with groups, the limit that binds: a group's borrow limit, or what the top still offers."""
        block = None if self.tree is None else self._borrow_block(s, g)
        if block is None:  # flat, or no level of the tree binds
            cap = self.capacity[s]
            return ("slack", g, use if use < cap else cap, cap, self._flat_spare(s, use))
        if block[0] == "group":
            x = block[1]
            taken = -self.node_net[x]
            return (
                "group_limit",
                *self._own_numbers(s, g),
                self.tree.names[x],
                self.node_borrow_cap[x],
                taken if taken > 0 else 0,
            )
        return ("slack", *self._own_numbers(s, g), block[1])
