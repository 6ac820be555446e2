"""The organisation tree (SEMANTICS.md "Groups: the organisation tree"): groups of shares, their weights,
borrow and lend limits, the net of each node, what a subtree takes from and lends outside itself,
fair-share values with their decayed history, the tree's validation, and the organisation view that the
org page, the API, the CLI and Prometheus read.

Pure, like the rest of quotas/engine: production (quotas/scheduler.py) and the simulator feed it the same
frozen inputs (`GroupSpec`, `views.ShareView` with `group` and `weight`, `views.Snapshot` with `groups`,
`fair_share_half_life_s`, `fair_reclaim` and `history`).

A node of the tree is named by its group or share name (they are unique together); the cluster is the
root and has no name (`None`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quotas.engine.views import (  # GroupSpec lives beside ShareView (views imports nothing of this module)
    LEND,
    LEND_AND_BORROW,
    UNASSIGNED,
    UNLIMITED,
    GroupSpec,
    ShareView,
    Snapshot,
    usage,
)

MAX_DEPTH = 4  # levels of groups (shares not counted)
NAME_RE = re.compile(r"[a-z0-9-]{1,63}")
MAX_LIMIT = 2_147_483_647  # a percentage, as the database stores it
NO_LIMIT = 1 << 62  # a limit of -1, as a number of GPUs

# A node's state in words (organisation_view): what the org page, the API and the CLI say.
WITHIN = "within its guarantee"
BORROWING = "borrowing"
LENDING = "lending"
STARVED = "starved"


def limit_gpus(limit: int, capacity: int) -> int:
    """A limit in percent of `capacity` as GPUs (rounded down, as a share's borrow limit); NO_LIMIT for -1."""
    if limit == UNLIMITED:
        return NO_LIMIT
    return max(0, capacity) * max(0, limit) // 100


# ---------------------------------------------------------------------------------------------------
# Validation


def validate_tree(groups: Sequence[GroupSpec], shares: Iterable[Any]) -> list[tuple[str, str]]:
    """Every problem of a tree as (path, message), paths as the layout document names them
    (`groups[2].parent`, `shares[0].group`); empty when the tree is valid. `shares` are objects with
    `name` and, optionally, `group` and `weight` (ShareView, scenario shares, layout rows)."""
    errors: list[tuple[str, str]] = []
    share_list = list(shares)
    share_names = {getattr(s, "name", None) for s in share_list}
    by_name: dict[str, int] = {}
    for i, g in enumerate(groups):
        path = f"groups[{i}]"
        if not isinstance(g.name, str) or not NAME_RE.fullmatch(g.name):
            errors.append((f"{path}.name", f"must match {NAME_RE.pattern}, got {g.name!r}"))
        elif g.name in by_name:
            errors.append((f"{path}.name", f'duplicate group name "{g.name}"'))
        elif g.name in share_names:
            errors.append((f"{path}.name", f'"{g.name}" is already the name of a share'))
        else:
            by_name[g.name] = i
        if not _positive_number(g.weight):
            errors.append((f"{path}.weight", f"must be a positive number, got {g.weight!r}"))
        for field_name, hi in (("borrow_limit", MAX_LIMIT), ("lend_limit", 100)):
            value = getattr(g, field_name)
            if not _whole(value) or not (value == UNLIMITED or 0 <= value <= hi):
                errors.append((f"{path}.{field_name}", f"must be -1 (no limit) or 0..{hi}, got {value!r}"))
    for i, g in enumerate(groups):
        if g.parent is not None and g.parent not in by_name:
            errors.append((f"groups[{i}].parent", f'unknown group "{g.parent}"'))
    # Cycles and depth: follow each group's parents.
    parent = {g.name: g.parent for i, g in enumerate(groups) if by_name.get(g.name) == i}
    reported: set[str] = set()
    for i, g in enumerate(groups):
        if g.name not in parent or by_name.get(g.name) != i:
            continue
        seen = [g.name]
        node = parent[g.name]
        while node is not None and node in parent and node not in seen:
            seen.append(node)
            node = parent[node]
        if node is not None and node in seen:
            cycle = seen[seen.index(node) :]
            if not reported.intersection(cycle):
                reported.update(cycle)
                errors.append((f"groups[{i}].parent", "a cycle: " + " -> ".join([*cycle, node])))
        elif node is None and len(seen) > MAX_DEPTH:
            errors.append(
                (
                    f"groups[{i}].parent",
                    f"at most {MAX_DEPTH} levels of groups: {' < '.join(seen)} is {len(seen)}",
                )
            )
    for i, s in enumerate(share_list):
        group = getattr(s, "group", None)
        if group is not None and group not in by_name:
            errors.append((f"shares[{i}].group", f'unknown group "{group}"'))
        weight = getattr(s, "weight", 1)
        if not _positive_number(weight):
            errors.append((f"shares[{i}].weight", f"must be a positive number, got {weight!r}"))
    return errors


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_number(value: Any) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


# ---------------------------------------------------------------------------------------------------
# The tree as the engine indexes it


class Tree:
    """A valid tree indexed for the rules and the accounting: each node's parent and children, its depth,
    its weight, and per type its capacity and its limits in GPUs. Build it with `Tree.build`; a tree
    that `validate_tree` rejects raises ValueError."""

    __slots__ = ("groups", "shares", "parent", "children", "depth", "weight", "top", "_caps")

    def __init__(self, groups: Sequence[GroupSpec], shares: Sequence[ShareView]) -> None:
        problems = validate_tree(groups, shares)
        if problems:
            raise ValueError("; ".join(f"{p}: {m}" for p, m in problems))
        self.groups = {g.name: g for g in groups}
        self.shares = {s.name: s for s in shares}
        self.parent: dict[str, str | None] = {g.name: g.parent for g in groups}
        self.parent.update({s.name: s.group for s in shares})
        self.children: dict[str | None, list[str]] = {None: []}
        for g in groups:
            self.children.setdefault(g.name, [])
        for name in sorted(self.parent):
            self.children[self.parent[name]].append(name)
        self.top = self.children[None]
        self.depth: dict[str, int] = {}
        for name in self.parent:
            d, node = 0, self.parent[name]
            while node is not None:
                d += 1
                node = self.parent[node]
            self.depth[name] = d
        self.weight = {g.name: float(g.weight) for g in groups}
        self.weight.update({s.name: float(s.weight) for s in shares})
        self._caps: dict[str, dict[str, int]] = {}

    @classmethod
    def build(cls, groups: Sequence[GroupSpec], shares: Sequence[ShareView]) -> Tree:
        return cls(tuple(groups), tuple(shares))

    def path(self, name: str) -> list[str]:
        """The node's ancestors from the top down, then the node."""
        out = [name]
        node = self.parent[name]
        while node is not None:
            out.append(node)
            node = self.parent[node]
        return out[::-1]

    def capacity(self, gpu_type: str) -> dict[str, int]:
        """Per node, the capacity of the type: a share's own, a group's its subtree's sum."""
        caps = self._caps.get(gpu_type)
        if caps is None:
            caps = {name: 0 for name in self.parent}
            for s in self.shares.values():
                c = max(0, s.capacity.get(gpu_type, 0))
                node: str | None = s.name
                while node is not None:
                    caps[node] += c
                    node = self.parent[node]
            self._caps[gpu_type] = caps
        return caps

    def lend_cap(self, name: str, gpu_type: str) -> int:
        g = self.groups.get(name)
        return NO_LIMIT if g is None else limit_gpus(g.lend_limit, self.capacity(gpu_type)[name])

    def borrow_cap(self, name: str, gpu_type: str) -> int:
        g = self.groups.get(name)
        return NO_LIMIT if g is None else limit_gpus(g.borrow_limit, self.capacity(gpu_type)[name])

    def sides(self, a: str, b: str) -> tuple[str, str, str | None]:
        """The two children of the lowest common group of shares (or groups) a and b that hold them, and
        that group (None: the cluster). Rule 3's distance and rule 11's sides."""
        pa, pb = self.path(a), self.path(b)
        i = 0
        while i < len(pa) and i < len(pb) and pa[i] == pb[i]:
            i += 1
        common = pa[i - 1] if i else None
        return (pa[i] if i < len(pa) else a), (pb[i] if i < len(pb) else b), common


@dataclass(frozen=True, slots=True)
class Nets:
    """The tree's accounting for one type at one instant: per node its net (positive: it offers, negative:
    it needs), what it takes from outside itself, what it offers to its parent's level (its positive
    net after its lend limit) and what of that is used beyond its own subtree (lent outside: by its
    siblings and by whatever its ancestors lend outside them); `top` is the sum at the top with the
    unassigned pool's idle GPUs, and `shortfall` per group (over its borrow limit) and at the top
    (None). `lent` is a figure to show and to count (the page, the API, the metrics, the simulator's
    per-group GPU-seconds); no rule decides by it."""

    net: Mapping[str, int]
    taken: Mapping[str, int]
    offer: Mapping[str, int]
    lent: Mapping[str, float]
    top: int
    shortfall: Mapping[str | None, int]


def share_net(share: ShareView, gpu_type: str, used: int) -> int:
    """A share's net of one type: its idle lendable GPUs (capacity - own use, for LEND and LEND_AND_BORROW)
    minus its borrowed GPUs (one of the two is 0)."""
    cap = max(0, share.capacity.get(gpu_type, 0))
    if used > cap:
        return cap - used
    return cap - used if share.strategy in (LEND, LEND_AND_BORROW) else 0


def nets(tree: Tree, gpu_type: str, used: Mapping[str, int], pool: int) -> Nets:
    """The nets of every node for one type, from the GPUs each share uses and the unassigned pool's idle
    GPUs (SEMANTICS: a group's net sums what its children offer, each capped by its lend limit, and
    need)."""
    net: dict[str, int] = {}
    offer: dict[str, int] = {}
    for name, share in tree.shares.items():
        net[name] = share_net(share, gpu_type, used.get(name, 0))
        offer[name] = max(0, net[name])  # a share has no lend limit of its own

    def visit(name: str) -> int:
        if name in net:
            return net[name]
        total = 0
        for child in tree.children[name]:
            n = visit(child)
            total += offer[child] if n > 0 else n
        net[name] = total
        offer[name] = min(total, tree.lend_cap(name, gpu_type)) if total > 0 else 0
        return total

    top = pool
    for child in tree.top:
        n = visit(child)
        top += offer[child] if n > 0 else n
    for name in tree.groups:
        visit(name)  # a group with no shares below it
    taken = {name: max(0, -n) for name, n in net.items()}
    # What of each node's offer is used beyond its own subtree, top-down: at the top, the other top-level
    # nodes' needs, served by the offers and the pool in proportion; inside a group, its children's
    # offers serve their siblings' needs and what the group lends outside, each in proportion to its
    # offer (counting the siblings' needs alone, a share whose department lends outside lent nothing).
    lent: dict[str, float] = {}
    stack: list[str | None] = [None]
    while stack:
        parent = stack.pop()
        kids = tree.children.get(parent, ())
        offers = sum(offer[c] for c in kids) + (pool if parent is None else 0)
        demand = sum(taken[c] for c in kids) + (lent[parent] if parent is not None else 0)
        factor = min(1.0, demand / offers) if offers else 0.0
        for c in kids:
            lent[c] = offer[c] * factor
            if c in tree.groups:
                stack.append(c)
    shortfall: dict[str | None, int] = {None: max(0, -top)}
    for name in tree.groups:
        shortfall[name] = max(0, taken[name] - tree.borrow_cap(name, gpu_type))
    return Nets(net=net, taken=taken, offer=offer, lent=lent, top=top, shortfall=shortfall)


def fair_share_value(taken: float, history: float, weight: float, capacity: int) -> float:
    """SEMANTICS: (what it takes from outside now + its history) / (weight x max(1, capacity))."""
    return (taken + history) / fair_weight(weight, capacity)


# ---------------------------------------------------------------------------------------------------
# History


class FairShareHistory:
    """Each share's and group's decayed borrowing history per type (SEMANTICS: the GPUs it took from outside
    over time, each second weighted by 2^(-age/H), divided by H / ln 2, so a steady n gives n).

    `advance(now, taken)` accounts the interval since the previous call, during which each (name, type)
    in `taken` took that many GPUs from outside (constant over it; what is absent took none), and
    returns the history now. Between calls the value of a constant x moves as
    h' = h * 2^(-dt/H) + x * (1 - 2^(-dt/H)), which is the integral exactly. A half-life of 0 keeps no
    history (every value 0). Values below 1e-6 GPU are dropped. `to_dict`/`from_dict` are plain JSON
    for production to store between passes."""

    __slots__ = ("half_life_s", "at", "values")

    def __init__(self, half_life_s: float, at: float | None = None, values: Mapping | None = None) -> None:
        self.half_life_s = half_life_s
        self.at = at
        self.values: dict[tuple[str, str], float] = dict(values or {})

    def advance(self, now: float, taken: Mapping[tuple[str, str], float]) -> dict[tuple[str, str], float]:
        h = self.half_life_s
        if h <= 0:
            self.at, self.values = now, {}
            return self.values
        dt = 0.0 if self.at is None else max(0.0, now - self.at)
        self.at = now if self.at is None else max(self.at, now)
        if dt:
            keep = 2.0 ** (-dt / h)
            out: dict[tuple[str, str], float] = {}
            for key in self.values.keys() | taken.keys():
                v = self.values.get(key, 0.0) * keep + taken.get(key, 0) * (1.0 - keep)
                if v >= 1e-6:
                    out[key] = v
            self.values = out
        return self.values

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, dict[str, float]] = {}
        for (name, gpu_type), v in sorted(self.values.items()):
            values.setdefault(name, {})[gpu_type] = v
        return {"half_life_s": self.half_life_s, "at": self.at, "values": values}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FairShareHistory:
        values = {
            (name, gpu_type): float(v)
            for name, by_type in (data.get("values") or {}).items()
            for gpu_type, v in by_type.items()
        }
        return cls(data.get("half_life_s", 0), data.get("at"), values)


def taken_from_outside(snapshot: Snapshot) -> dict[tuple[str, str], int]:
    """(share or group name, type) -> GPUs its subtree takes from outside itself now (positive only): what
    `FairShareHistory.advance` is fed after a pass. Usage counts GPUs in grace (SEMANTICS' usage)."""
    out: dict[tuple[str, str], int] = {}
    tree, per_type = _accounting(snapshot)
    for gpu_type, (n, _, _) in per_type.items():
        for name, t in n.taken.items():
            if t:
                out[(name, gpu_type)] = t
    return out


def _accounting(snapshot: Snapshot) -> tuple[Tree, dict[str, tuple[Nets, dict[str, int], int]]]:
    """The tree and, per type, its nets, the GPUs each share uses (grace not counted) and the pool."""
    u = usage(snapshot)
    shares = [s for s in snapshot.shares]
    known = {s.name for s in shares}
    # A share named only by work owns nothing and borrows what it holds (views._all_shares).
    for name in sorted(u.keys() - known - {UNASSIGNED}):
        shares.append(ShareView(name=name, capacity={}, borrow_limit=0))
    tree = Tree.build(snapshot.groups, shares)
    types: set[str] = set()
    for by_type in u.values():
        types.update(by_type)
    per_type = {}
    for gpu_type in sorted(types):
        used = {name: by_type[gpu_type].used for name, by_type in u.items() if gpu_type in by_type}
        pool_row = u.get(UNASSIGNED, {}).get(gpu_type)
        pool = pool_row.capacity if pool_row is not None else 0
        per_type[gpu_type] = (nets(tree, gpu_type, used, pool), used, pool)
    return tree, per_type


# ---------------------------------------------------------------------------------------------------
# The organisation view


@dataclass(frozen=True, slots=True)
class OrgRow:
    """One group or share of one type, as the org page, the API, the CLI and Prometheus show it."""

    kind: str  # "group" or "share"
    name: str
    parent: str | None
    depth: int  # 0: directly under the cluster
    gpu_type: str
    capacity: int
    in_use: int
    taken_from_outside: int
    lent_outside: float
    weight: float
    history: float
    fair_share_value: float
    state: str  # WITHIN, BORROWING, LENDING or STARVED
    waiting_to_borrow: bool  # a job of its subtree waits to borrow this type
    # Its fair part of the capacity borrowers may use now (what is lent plus what is still idle and
    # lendable), split top-down among the siblings that wait to borrow or borrow as rule 5 splits it:
    # by weight x max(1, capacity of the type) (a group: its subtree's capacity), the divisor of the
    # fair-share value; None when it neither waits to borrow nor borrows.
    fair_part: float | None
    # The plain weights' total of those siblings, itself included (kept as the API has always said it).
    competing_total_weight: float | None
    # weight x max(1, capacity of the type): what its part is in proportion to ("weight 2 x 8 a10g of
    # capacity = 16"), and the siblings' total of it, itself included ("16 of 40"; None as fair_part).
    fair_weight: float
    competing_total_fair_weight: float | None


def organisation_view(
    snapshot: Snapshot, history: Mapping[tuple[str, str], float] | None = None
) -> list[OrgRow]:
    """Per group and share, per type: capacity, in use, taken from outside, lent outside, weight, history,
    fair-share value, its state in words, and for each one that waits to borrow (or borrows) its fair
    part of the capacity borrowers may use now (`fair_parts`: rule 5's split, by weight x capacity).
    `history` defaults to the snapshot's. Rows in tree order (depth first, children by name), types by
    name."""
    history = snapshot.history if history is None else history
    tree, per_type = _accounting(snapshot)
    shares = tree.shares
    wait_types: dict[str, set[str]] = {}  # type -> shares with a job waiting to borrow it
    used_all: dict[str, dict[str, int]] = {t: used for t, (_, used, _) in per_type.items()}
    for job in snapshot.queued:
        share = shares.get(job.share)
        if share is None or share.strategy != LEND_AND_BORROW:
            continue
        cap = max(0, share.capacity.get(job.gpu_type, 0))
        if used_all.get(job.gpu_type, {}).get(job.share, 0) + job.gpus > cap:
            wait_types.setdefault(job.gpu_type, set()).add(job.share)
    rows: list[OrgRow] = []
    order = _tree_order(tree)
    for gpu_type, (n, used, pool) in per_type.items():
        caps = tree.capacity(gpu_type)
        waiting: set[str] = set()
        for name in wait_types.get(gpu_type, ()):
            waiting.update(tree.path(name))
        in_use: dict[str, int] = {}
        for name in shares:
            u = used.get(name, 0)
            for node in tree.path(name):
                in_use[node] = in_use.get(node, 0) + u
        # What borrowers may hold now: the offers at the top (what is lent and what is still idle) and
        # the unassigned pool.
        borrowable = sum(n.offer[c] for c in tree.top) + pool
        part, competing = fair_parts(tree, n, waiting, float(borrowable), gpu_type)
        for name in order:
            if caps.get(name, 0) == 0 and in_use.get(name, 0) == 0 and name not in waiting:
                continue
            h = float(history.get((name, gpu_type), 0.0))
            taken = n.taken[name]
            value = fair_share_value(taken, h, tree.weight[name], caps[name])
            fair = part.get(name)
            if name in waiting and fair is not None and taken < fair:
                state = STARVED
            elif taken > 0:
                state = BORROWING
            elif n.lent.get(name, 0) > 0:
                state = LENDING
            else:
                state = WITHIN
            totals = competing.get(name)
            rows.append(
                OrgRow(
                    kind="group" if name in tree.groups else "share",
                    name=name,
                    parent=tree.parent[name],
                    depth=tree.depth[name],
                    gpu_type=gpu_type,
                    capacity=caps[name],
                    in_use=in_use.get(name, 0),
                    taken_from_outside=taken,
                    lent_outside=n.lent.get(name, 0.0),
                    weight=tree.weight[name],
                    history=h,
                    fair_share_value=value,
                    state=state,
                    waiting_to_borrow=name in waiting,
                    fair_part=fair,
                    competing_total_weight=None if totals is None else totals[0],
                    fair_weight=fair_weight(tree.weight[name], caps[name]),
                    competing_total_fair_weight=None if totals is None else totals[1],
                )
            )
    return rows


def fair_weight(weight: float, capacity: int) -> float:
    """What a node's fair part is in proportion to: weight x max(1, capacity of the type), the divisor of
    its fair-share value, so that the part is what rule 5 gives it (it evens the values out)."""
    return weight * max(1, capacity)


def fair_parts(
    tree: Tree, n: Nets, waiting: set[str], borrowable: float, gpu_type: str
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Top-down, each node that waits to borrow or borrows gets of its parent's part (at the top: all
    that borrowers may hold) its fraction of weight x max(1, capacity) among such siblings: rule 5
    evens (taken + history) / (weight x max(1, capacity)) out, so what each takes tends to that part.
    Also, per such node, the siblings' total of the plain weights and of weight x max(1, capacity)."""
    caps = tree.capacity(gpu_type)
    part: dict[str, float] = {}
    competing: dict[str, tuple[float, float]] = {}
    stack: list[tuple[str | None, float]] = [(None, borrowable)]
    while stack:
        parent, amount = stack.pop()
        kids = [c for c in tree.children.get(parent, ()) if c in waiting or n.taken[c] > 0]
        fair = {c: fair_weight(tree.weight[c], caps[c]) for c in kids}
        weights = sum(tree.weight[c] for c in kids)
        total = sum(fair.values())
        for c in kids:
            part[c] = amount * fair[c] / total
            competing[c] = (weights, total)
            if c in tree.groups:
                stack.append((c, part[c]))
    return part, competing


def _tree_order(tree: Tree) -> list[str]:
    out: list[str] = []

    def walk(parent: str | None) -> None:
        for c in tree.children.get(parent, ()):
            out.append(c)
            walk(c)

    walk(None)
    return out


__all__ = [
    "BORROWING",
    "GroupSpec",
    "FairShareHistory",
    "LENDING",
    "MAX_DEPTH",
    "Nets",
    "OrgRow",
    "STARVED",
    "Tree",
    "WITHIN",
    "fair_parts",
    "fair_share_value",
    "fair_weight",
    "limit_gpus",
    "nets",
    "organisation_view",
    "share_net",
    "taken_from_outside",
    "validate_tree",
]


# ---------------------------------------------------------------------------------------------------
# The tree over a pass's share indexes (state.ShareIndex), for the rules


class TreeIndex:
    """The organisation tree as the pass indexes it: nodes 0..n-1 are the shares in ShareIndex order,
    n.. the groups by name. `parent[x]` (-1: under the cluster), `children[x]`, `path[s]` (a share's
    groups from the top down), `lineage[s]` (its path, then the share: rule 5's key), `depth_order`
    (groups deepest first, for sums bottom-up), `weight[x]`, `names[x]`, and the groups' limits in
    percent (-1 for shares: a share's borrow limit is its own rule). A tree that `validate_tree`
    rejects never reaches a pass (the layout and the scenario refuse it); should one come in a hostile
    snapshot, its groups are ignored (a flat layout)."""

    __slots__ = (
        "n_shares",
        "names",
        "parent",
        "children",
        "top",
        "path",
        "lineage",
        "depth_order",
        "weight",
        "borrow_limit",
        "lend_limit",
        "has_groups",
    )

    def __init__(self, shares: Sequence[ShareView], groups: Sequence[GroupSpec]) -> None:
        if groups and validate_tree(groups, shares):
            groups = ()
        n = len(shares)
        ordered = sorted(groups, key=lambda g: g.name)
        self.n_shares = n
        self.has_groups = bool(ordered)
        self.names = [s.name for s in shares] + [g.name for g in ordered]
        gidx = {g.name: n + i for i, g in enumerate(ordered)}
        self.parent = [gidx.get(s.group, -1) if s.group is not None else -1 for s in shares]
        self.parent += [gidx[g.parent] if g.parent is not None else -1 for g in ordered]
        total = len(self.names)
        self.children: list[list[int]] = [[] for _ in range(total)]
        self.top: list[int] = []
        for x in range(total):
            p = self.parent[x]
            (self.children[p] if p >= 0 else self.top).append(x)
        self.path: list[tuple[int, ...]] = []
        depth = [0] * total
        for x in range(total):
            up, p = [], self.parent[x]
            while p >= 0:
                up.append(p)
                p = self.parent[p]
            depth[x] = len(up)
            if x < n:
                self.path.append(tuple(reversed(up)))
        self.lineage = [(*path, s) for s, path in enumerate(self.path)]  # a share's path, then itself
        self.depth_order = sorted(range(n, total), key=lambda x: -depth[x])
        self.weight = [float(s.weight) for s in shares] + [float(g.weight) for g in ordered]
        self.borrow_limit = [UNLIMITED] * n + [g.borrow_limit for g in ordered]
        self.lend_limit = [UNLIMITED] * n + [g.lend_limit for g in ordered]

    def capacities(self, share_capacity: Sequence[int]) -> list[int]:
        """Per node, the capacity of one type: a share's own, a group's its subtree's sum."""
        caps = list(share_capacity) + [0] * (len(self.names) - self.n_shares)
        for s, c in enumerate(share_capacity):
            for g in self.path[s]:
                caps[g] += c
        return caps

    def common_depth(self, a: int, b: int) -> int:
        """How many groups shares a and b have in common (0: only the cluster): rule 3's distance, the
        fewer the further."""
        pa, pb = self.path[a], self.path[b]
        i = 0
        while i < len(pa) and i < len(pb) and pa[i] == pb[i]:
            i += 1
        return i
