"""The cover of rule 3 and the share accounting of one pass: held, being freed (grace) and earmarked GPUs
per share, borrowed GPUs in all against idle lendable ones (the deficit), reclaim's budget per share,
and who a borrowed admission draws from. A part of rules.TypePass."""

from __future__ import annotations

from collections.abc import Mapping

from quotas.engine.placement import NodePlacement
from quotas.engine.views import (
    UNASSIGNED,
)


def cover_parts(used: int, capacity: int, lends: bool, reserves: bool) -> tuple[int, int, int, int]:
    """A share's parts of the cover's totals when it uses `used` GPUs (held + earmarked): its own
    capacity in use, what it borrows, and its idle capacity as lendable (a lender) or reserved."""
    own = used if used < capacity else capacity
    idle = capacity - own
    if lends:
        return own, used - own, idle, 0
    return own, used - own, 0, idle if reserves else 0


def share_net(used: int, capacity: int, lends: bool) -> int:
    """A share's net in the tree when it uses `used` GPUs: its idle lendable GPUs, or minus what it
    borrows."""
    if used > capacity:
        return capacity - used
    return capacity - used if lends else 0


def carry_net_up(
    net: list[int], offer: list[int], parent: list[int], lend_cap: list[int], s: int, n: int
) -> int:
    """Share s's net is now n: its net and offer, and every ancestor's as far as the change reaches (a
    group's net is the sum of its children's offers, its offer that net capped by its lend limit).
    Returns the change of the top's sum of offers."""
    d = n - offer[s]
    net[s] = offer[s] = n
    p = parent[s]
    while d and p >= 0:
        n = net[p] + d
        net[p] = n
        cap = lend_cap[p]
        o = cap if n > cap else n
        d = o - offer[p]
        offer[p] = o
        p = parent[p]
    return d


class CoverAtStart:
    """The cover's numbers as a pass starts, nothing earmarked yet: `_contrib` summed over the shares,
    each share's own room (capacity - held - grace) and, with groups, each tree node's net and offer
    and the top's sum. They depend only on the base's held and grace GPUs and its fixed capacities,
    strategies and tree, so the base keeps them (TypeState.cover_at_start) and brings them up to date
    for the few shares whose attempts started, ended or started pre-empting since (a pass used to add
    up every share and build the tree's nets afresh: 8-11% of the passes' time). `held` and
    `grace`: the base's numbers they were made from. Never changed once made: a pass copies the lists
    it changes."""

    __slots__ = (
        "held",
        "grace",
        "own_total",
        "borrowed_total",
        "lendable_idle",
        "reserve_idle",
        "own_room",
        "node_net",
        "node_offer",
        "top_sum",
    )

    held: list[int]
    grace: list[int]
    own_total: int
    borrowed_total: int
    lendable_idle: int
    reserve_idle: int
    own_room: list[int]
    node_net: list[int] | None
    node_offer: list[int] | None
    top_sum: int


class CoverAccounting(NodePlacement):
    """Per-share numbers and the cover (rule 3), kept incrementally as the pass decides.

    Flat (no groups): the cover is one number, `_deficit()`: borrowed in all minus idle lendable in all
    (clamped to the hardware). With groups (SEMANTICS "Groups: the organisation tree") it holds per
    level: each node's net (a share's idle lendable minus its borrowed GPUs; a group's sum of what its
    children offer, capped by their lend limits, and need) is kept up the tree as shares change, and
    the shortfalls are the hardware's (borrowed beyond what the hardware can hold, as flat), the top's
    (the top-level offers and the unassigned pool short of the needs) and each group's (taken from
    outside beyond its borrow limit). A decision may make none of those on its share's path larger
    (`_cover_tol`, `_covered`); a borrowing may leave none of them above 0 (`_borrow_breaks`)."""

    # -- the tree -----------------------------------------------------------------------------------------

    def _cover_setup(self, history: Mapping[tuple[str, str], float], fair_reclaim: bool) -> None:
        """The cover's numbers as the pass starts, and the organisation tree's (None for a flat layout
        with every weight 1 and no history, where every rule runs as before the tree existed)."""
        sh_tree = self.sh.tree
        self.history = history
        self.fair_reclaim = fair_reclaim
        self._node_history: dict[int, float] = {}  # node -> its history, read once per pass
        # Rule 5 and rule 3's order by fair-share value (weights or history); the cover per level (groups).
        self.fair = sh_tree is not None or bool(history)
        self.tree = sh_tree if sh_tree is not None and sh_tree.has_groups else None
        self.node_scale = self.base.node_scale
        if sh_tree is not None:
            self.node_capacity = self.base.node_capacity
        if self.tree is not None:
            self.node_lend_cap = self.base.node_lend_cap
            self.node_borrow_cap = self.base.node_borrow_cap
        start = self._cover_at_start()
        self.own_total, self.borrowed_total = start.own_total, start.borrowed_total
        self.lendable_idle, self.reserve_idle = start.lendable_idle, start.reserve_idle
        # Per share, its own capacity left as the pass started (never changed: a reason written after
        # the pass, when the base has moved on, reads it as it was).
        self.own_room_at_start = start.own_room
        if self.tree is not None:
            self.node_net, self.node_offer = start.node_net.copy(), start.node_offer.copy()  # changed here
            self.top_sum = start.top_sum

    def _cover_at_start(self) -> CoverAtStart:
        """The base's CoverAtStart: brought up to date for the shares whose held or grace GPUs changed
        since it was made (TypeState.cover_changed), made from scratch only for a base's first pass."""
        base = self.base
        kept: CoverAtStart | None = base.cover_at_start
        changed = base.cover_changed
        if kept is not None and not changed:
            return kept
        kept = self._cover_from_scratch() if kept is None else self._cover_updated(kept, changed)
        base.cover_at_start = kept
        changed.clear()
        return kept

    def _cover_from_scratch(self) -> CoverAtStart:
        base = self.base
        held, grace, capacity, lender, reserve = (
            base.held,
            base.grace,
            self.capacity,
            self.lender,
            self.reserve,
        )
        kept = CoverAtStart()
        kept.held, kept.grace = held.copy(), grace.copy()
        own = [u if u < c else c for u, c in zip(held, capacity, strict=True)]
        kept.own_total = sum(own)
        kept.borrowed_total = sum(held) - kept.own_total
        lendable_idle = reserve_idle = 0
        for c, o, lends, reserves in zip(capacity, own, lender, reserve, strict=True):  # as cover_parts
            if lends:
                lendable_idle += c - o
            elif reserves:
                reserve_idle += c - o
        kept.lendable_idle, kept.reserve_idle = lendable_idle, reserve_idle
        kept.own_room = [c - u - g for c, u, g in zip(capacity, held, grace, strict=True)]
        kept.node_net = kept.node_offer = None
        kept.top_sum = 0
        tree = self.tree
        if tree is None:
            return kept
        # A share's net is its idle lendable GPUs, or minus what it borrows (_share_net, pend 0).
        net = [c - u if u > c or lends else 0 for u, c, lends in zip(held, capacity, lender, strict=True)]
        net += [0] * (len(tree.names) - len(net))
        offer = net.copy()  # what a node contributes to its parent's net: its net, capped (a share: none)
        lend_cap, children = self.node_lend_cap, tree.children
        for g in tree.depth_order:  # deepest first: children before parents
            n = 0
            for c in children[g]:
                n += offer[c]
            net[g] = n
            cap = lend_cap[g]
            offer[g] = cap if n > cap else n
        kept.node_net, kept.node_offer = net, offer
        kept.top_sum = self.pool + sum(offer[x] for x in tree.top)
        return kept

    def _cover_updated(self, old: CoverAtStart, changed: set[int]) -> CoverAtStart:
        """`old` with the base's numbers of the `changed` shares: a new object (a pass or a plan's
        reasons may still read the old one), its totals, own room and nets moved by their changes."""
        base = self.base
        kept = CoverAtStart()
        kept.held, kept.grace, kept.own_room = old.held.copy(), old.grace.copy(), old.own_room.copy()
        own_total, borrowed_total = old.own_total, old.borrowed_total
        lendable_idle, reserve_idle = old.lendable_idle, old.reserve_idle
        tree = self.tree
        net = offer = None
        top_sum = old.top_sum
        if tree is not None:
            net, offer = old.node_net.copy(), old.node_offer.copy()
        for s in changed:
            c, lends, reserves = self.capacity[s], self.lender[s], self.reserve[s]
            u0, u1 = kept.held[s], base.held[s]
            own, borrowed, lendable, reserved = cover_parts(u0, c, lends, reserves)
            own_total -= own
            borrowed_total -= borrowed
            lendable_idle -= lendable
            reserve_idle -= reserved
            own, borrowed, lendable, reserved = cover_parts(u1, c, lends, reserves)
            own_total += own
            borrowed_total += borrowed
            lendable_idle += lendable
            reserve_idle += reserved
            kept.held[s] = u1
            kept.grace[s] = g = base.grace[s]
            kept.own_room[s] = c - u1 - g
            if tree is not None:
                top_sum += carry_net_up(
                    net, offer, tree.parent, self.node_lend_cap, s, share_net(u1, c, lends)
                )
        kept.own_total, kept.borrowed_total = own_total, borrowed_total
        kept.lendable_idle, kept.reserve_idle = lendable_idle, reserve_idle
        kept.node_net, kept.node_offer, kept.top_sum = net, offer, top_sum
        return kept

    def _share_net(self, s: int, more: int = 0) -> int:
        return share_net(self.held[s] + self.pend[s] + more, self.capacity[s], self.lender[s])

    def _tree_update(self, s: int) -> None:
        """Share s's numbers changed: its net and every ancestor's, as far as the change reaches."""
        d = carry_net_up(
            self.node_net, self.node_offer, self.tree.parent, self.node_lend_cap, s, self._share_net(s)
        )
        if d:
            self.top_sum += d

    def _hw_short(self, d_own: int = 0, d_borrowed: int = 0, d_reserve: int = 0) -> int:
        """Borrowed GPUs beyond what the hardware can hold (flat's clamp, as a shortfall of its own)."""
        hw = self.schedulable_gpus - self.own_total - d_own - self.reserve_idle - d_reserve
        over = self.borrowed_total + d_borrowed - (hw if hw > 0 else 0)
        return over if over > 0 else 0

    def _shortfalls(self, s: int) -> tuple[int, ...]:
        """The shortfalls on share s's path: the hardware's, the top's, then each group's, top down."""
        net, bcap = self.node_net, self.node_borrow_cap
        top = -self.top_sum
        out = [self._hw_short(), top if top > 0 else 0]
        for g in self.tree.path[s]:
            over = -net[g] - bcap[g]
            out.append(over if over > 0 else 0)
        return tuple(out)

    def _shortfalls_if(self, s: int, more: int) -> tuple[int, ...]:
        """_shortfalls(s) if share s held `more` GPUs more, without changing anything. Kept while the
        pass's version stays the same: a borrower that cannot borrow asks it three or four times in a
        row (rule 5's test, its reason, the skip of the jobs behind it)."""
        memo = self._shortfalls_memo
        hit = memo.get((s, more))
        if hit is not None and hit[0] == self.version:
            return hit[1]
        tree = self.tree
        u = self.held[s] + self.pend[s]
        c = self.capacity[s]
        own0 = u if u < c else c
        own1 = u + more if u + more < c else c
        d_own = own1 - own0
        d_borrowed = (u + more - own1) - (u - own0)
        hw = self._hw_short(d_own, d_borrowed, -d_own if self.reserve[s] else 0)
        net, offer, lend_cap, bcap = self.node_net, self.node_offer, self.node_lend_cap, self.node_borrow_cap
        d = self._share_net(s, more) - offer[s]
        groups = []
        for g in reversed(tree.path[s]):  # bottom up
            n = net[g] + d
            over = -n - bcap[g]
            groups.append(over if over > 0 else 0)
            cap = lend_cap[g]
            o = cap if n > cap else n
            d = o - offer[g]
        top = -(self.top_sum + d)
        out = (hw, top if top > 0 else 0, *reversed(groups))
        memo[(s, more)] = (self.version, out)
        return out

    def _cover_tol(self, s: int) -> int | tuple[int, ...]:
        """What a decision for share s may not make larger: the shortfall(s) now (0 where the cover holds)."""
        if self.tree is None:
            d = self._deficit()
            return d if d > 0 else 0
        return self._shortfalls(s)

    def _covered(self, s: int, tol: int | tuple[int, ...]) -> bool:
        """No shortfall on share s's path is larger than `tol` (one number for all, or one per level)."""
        if self.tree is None:
            return self._deficit() <= tol
        if tol.__class__ is int:
            return max(self._shortfalls(s)) <= tol
        # _shortfalls(s) level by level against `tol` (its own shortfalls earlier, so none negative),
        # stopping at the first that is worse: rule 9's walk asks this once per candidate.
        if self._hw_short() > tol[0] or -self.top_sum > tol[1]:
            return False
        net, bcap = self.node_net, self.node_borrow_cap
        i = 2
        for g in self.tree.path[s]:
            if -net[g] - bcap[g] > tol[i]:
                return False
            i += 1
        return True

    def _covered_if(self, s: int, more: int, tol: int | tuple[int, ...]) -> bool:
        """_covered(s, tol) if share s held `more` GPUs more, without changing anything."""
        if self.tree is None:
            return self._deficit_if(s, more) <= tol
        short = self._shortfalls_if(s, more)
        if tol.__class__ is int:
            return max(short) <= tol
        return all(a <= b for a, b in zip(short, tol, strict=True))

    def _borrow_breaks(self, s: int, g: int) -> bool:
        """Would share s borrowing g more GPUs leave a shortfall (rule 5: the cover, per level)?"""
        if self.tree is None:
            return self._deficit_if(s, g) > 0
        return max(self._shortfalls_if(s, g)) > 0

    def _borrow_block(self, s: int, g: int) -> tuple[str, int] | None:
        """With groups: which level stops share s borrowing g GPUs: ("group", node) for a group's borrow
        limit (the lowest such group), ("top", spare) for the top (what is offered there and unused), or
        None. (The hardware's clamp reads as the top's.)"""
        if self.tree is None:
            return None
        short = self._shortfalls_if(s, g)
        path = self.tree.path[s]
        for i in range(len(path) - 1, -1, -1):
            if short[2 + i] > 0:
                return ("group", path[i])
        if short[0] > 0 or short[1] > 0:
            return ("top", max(0, self.top_sum))
        return None

    # -- fair-share values (rules 3, 5 and 11) --------------------------------------------------------------

    def _node_value(self, x: int) -> float:
        """SEMANTICS' fair-share value of node x of this type: (taken from outside + history) / (weight x
        max(1, capacity)). (Computed each time: a cache per version cost as much as the sum.)"""
        if self.tree is not None:
            taken = -self.node_net[x]
            if taken < 0:
                taken = 0
        else:
            taken = self._borrowed(x)
        history = self._node_history.get(x)
        if history is None:
            history = self._node_history[x] = self._history_of(x)
        return (taken + history) / self.node_scale[x]

    def _history_of(self, x: int) -> float:
        """Node x's borrowing history of this type (the same for the whole pass)."""
        if not self.history:
            return 0.0
        tree = self.sh.tree
        name = self.sh.names[x] if tree is None else tree.names[x]
        return self.history.get((name, self.t), 0.0)

    def _fair_key(self, s: int) -> tuple:
        """Rule 5's order for share s: its path's values and names from the top down (the lowest value
        at the top goes first, then the same inside it, down to the share; ties: name)."""
        tree = self.sh.tree
        if tree is None:  # history alone, no weights or groups
            return (self._history_value(s), self.sh.names[s])
        names, value = tree.names, self._node_value
        if self.tree is None:  # weights without groups: the share alone
            return (value(s), names[s])
        key: list = []
        for x in tree.lineage[s]:
            key.append(value(x))
            key.append(names[x])
        return tuple(key)

    def _history_value(self, s: int) -> float:
        taken = self.held[s] + self.pend[s] - self.capacity[s]
        h = self.history.get((self.sh.names[s], self.t), 0.0)
        return ((taken if taken > 0 else 0) + h) / max(1, self.capacity[s])

    def _contrib(self, s: int, sign: int) -> None:
        own, borrowed, lendable, reserved = cover_parts(
            self.held[s] + self.pend[s], self.capacity[s], self.lender[s], self.reserve[s]
        )
        self.own_total += sign * own
        self.borrowed_total += sign * borrowed
        self.lendable_idle += sign * lendable
        self.reserve_idle += sign * reserved

    def _chg(self, s: int, dh: int = 0, dp: int = 0, dg: int = 0) -> None:
        self.version += 1
        self._contrib(s, -1)
        self.held[s] += dh
        self.pend[s] += dp
        self.grace[s] += dg
        self._contrib(s, 1)
        if self.tree is not None:
            self._tree_update(s)

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
