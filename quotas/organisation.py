"""Why each team gets what it gets (issue 37, item 3): the organisation tree as the org page, the share's
fair part, /api/v1/groups/, `gpuquota groups` and Prometheus show it, from one snapshot and the engine's
organisation view (quotas.engine.tree.organisation_view). It shows groups and shares by name with their
numbers, as the overview does, and never a job: everyone logged in may read it.

What a page reads here costs a constant number of queries: the snapshot without the queue (its totals)
and one aggregate of the largest queued job per share and type, which is all that "waits to borrow"
needs (a share waits to borrow a type when one of its queued jobs does not fit its own capacity)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from quotas.engine import policy
from quotas.engine.tree import (
    BORROWING,
    LENDING,
    STARVED,
    WITHIN,
    OrgRow,
    limit_gpus,
    organisation_view,
)

STATES = (WITHIN, BORROWING, LENDING, STARVED)
STATE_CLASS = {WITHIN: "within", BORROWING: "borrowing", LENDING: "lending", STARVED: "starved"}


@dataclass
class Node:
    """One group or share of one GPU type, with what the pages say of it."""

    row: OrgRow
    team: str = ""  # a share's team name ("" for a group)
    team_slug: str = ""
    borrow_limit: int = -1  # a group's limit in percent (-1: none)
    lend_limit: int = -1
    may_take: int | None = None  # a group's borrow limit in GPUs of this type (None: no limit)
    may_lend: int | None = None

    def __getattr__(self, name):  # the row's fields read as the node's (templates, serializers)
        if name == "row":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.row, name)

    @property
    def state_class(self) -> str:
        return STATE_CLASS.get(self.row.state, "within")

    @property
    def fair_weight_words(self) -> str:
        """ "weight 2 × 8 a10g of capacity = 16" (the organisation page's fair part)."""
        return fair_weight_words(self.row)

    @property
    def parts(self) -> str:
        """The fair-share value with its parts: "(3 taken + 1.4 history) ÷ (weight 2 × 8 capacity) = 0.27"."""
        r = self.row
        return (
            f"({r.taken_from_outside} taken + {r.history:.1f} history) ÷ "
            f"(weight {r.weight:g} × {max(1, r.capacity)} capacity) = {r.fair_share_value:.2f}"
        )


@dataclass
class Organisation:
    at: datetime
    nodes: list[Node]
    gpu_types: list[str]
    groups: dict[str, policy.GroupSpec] = field(default_factory=dict)
    half_life_s: float = 0
    fair_reclaim: bool = False

    def of_type(self, gpu_type: str) -> list[Node]:
        return [n for n in self.nodes if n.row.gpu_type == gpu_type]

    def find(self, name: str, gpu_type: str) -> Node | None:
        return next((n for n in self.nodes if n.row.name == name and n.row.gpu_type == gpu_type), None)

    def of(self, name: str) -> list[Node]:
        return [n for n in self.nodes if n.row.name == name]

    @property
    def has_groups(self) -> bool:
        return bool(self.groups)

    def sunburst(self, gpu_type: str) -> dict:
        """plotly's sunburst of one type: ids, labels, parents, values (capacity), colours (state)."""
        rows = self.of_type(gpu_type)
        return {
            "ids": [n.row.name for n in rows],
            "labels": [n.row.name for n in rows],
            "parents": [n.row.parent or "" for n in rows],
            "values": [max(n.row.capacity, n.row.in_use, 0) for n in rows],
            "states": [n.row.state for n in rows],
            "text": [f"{n.row.state}; value {n.row.fair_share_value:.2f}" for n in rows],
        }


# The rows the page, the API, the CLI and Prometheus read: the engine's organisation view, whose lent
# outside counts, at every level, what a node's capacity lends beyond its own subtree (tree.nets).
view = organisation_view


def _queued_heads(loaded) -> tuple[policy.QueuedView, ...]:
    """One stand-in queued job per share and type: its largest queued job (one aggregate)."""
    from jobs.choices import JobState
    from jobs.models import Job

    now = loaded.snapshot.now
    rows = (
        Job.objects.filter(state=JobState.QUEUED)
        .values_list("share__name", "gpu_type")
        .annotate(largest=Max("gpus"))
        .order_by()
    )
    return tuple(
        policy.QueuedView(job_id=i, share=share, gpu_type=gpu_type, gpus=gpus, priority=0, submitted_at=now)
        for i, (share, gpu_type, gpus) in enumerate(sorted(rows))
    )


def load(*, loaded=None, now: datetime | None = None, words: bool = True, teams: bool = True) -> Organisation:
    """The organisation now: a row per group and share per type (in tree order), with its team, its
    limits and their GPUs. words=False (Prometheus: values, taken and lent only) reads nothing more
    than the snapshot: no queue (states and fair parts then ignore waiting jobs), no team names;
    teams=False: no team names (the API names a share's team itself)."""
    from quotas.models import Share
    from quotas.scheduler import load_snapshot

    loaded = loaded or load_snapshot(now, queued=False)
    snapshot = loaded.snapshot
    if not snapshot.queued and words:
        snapshot = replace(snapshot, queued=_queued_heads(loaded))
    rows = view(snapshot)
    team_of = {}
    if words and teams:
        team_of = {
            name: (team, slug)
            for name, team, slug in Share.objects.values_list("name", "team__name", "team__slug")
        }
    groups = {g.name: g for g in snapshot.groups}
    nodes = []
    for r in rows:
        node = Node(row=r)
        if r.kind == "share":
            node.team, node.team_slug = team_of.get(r.name, ("", ""))
        else:
            g = groups[r.name]
            node.borrow_limit, node.lend_limit = g.borrow_limit, g.lend_limit
            if g.borrow_limit != -1:
                node.may_take = limit_gpus(g.borrow_limit, r.capacity)
            if g.lend_limit != -1:
                node.may_lend = limit_gpus(g.lend_limit, r.capacity)
        nodes.append(node)
    return Organisation(
        at=datetime.fromtimestamp(snapshot.now, tz=timezone.get_current_timezone()),
        nodes=nodes,
        gpu_types=sorted({r.gpu_type for r in rows}),
        groups=groups,
        half_life_s=snapshot.fair_share_half_life_s,
        fair_reclaim=snapshot.fair_reclaim,
    )


_recent: dict[bool, tuple[float, int | None, Organisation]] = {}
_recent_lock = threading.Lock()


def load_recent(*, teams: bool = True) -> Organisation:
    """load(teams=...) as this process read it at most ORGANISATION_RECENT_S ago, unless a pass ran
    since: what a job's "why it waits", the organisation page and /api/v1/groups/ show, polled by many
    (`gpuquota status` in a loop, the page's refresh), costs one small query per poll, not a snapshot of
    every running attempt. The numbers it shows move at passes; a change between passes shows within
    ORGANISATION_RECENT_S (0: read every time)."""
    from quotas.models import SchedulerPass

    max_age = settings.ORGANISATION_RECENT_S
    if max_age <= 0:
        return load(teams=teams)
    last_pass = SchedulerPass.objects.order_by("-pk").values_list("pk", flat=True).first()
    now = time.monotonic()
    hit = _recent.get(teams)
    if hit is not None and hit[1] == last_pass and now - hit[0] < max_age:
        return hit[2]  # shared between threads: nothing after load() changes an Organisation
    org = load(teams=teams)
    with _recent_lock:
        _recent[teams] = (now, last_pass, org)
    return org


def forget_recent() -> None:
    with _recent_lock:
        _recent.clear()


# --- a share's fair part, in words ------------------------------------------------------------------


def borrowed_last_day(
    share_names: Sequence[str], *, now: datetime | None = None
) -> dict[tuple[str, str], float]:
    """(share, type) -> the GPUs it borrowed on average over the last day (its usage samples)."""
    from django.db.models import F, FloatField, Sum
    from django.db.models.functions import Cast

    from quotas.models import UsageSample

    now = now or timezone.now()
    day = 86400.0
    rows = (
        UsageSample.objects.filter(share__name__in=list(share_names), at__gt=now - timedelta(days=1))
        .values_list("share__name", "gpu_type")
        .annotate(gpu_s=Sum(F("borrowed") * Cast("resolution_s", FloatField())))
        .order_by()
    )
    return {(name, t): (gpu_s or 0.0) / day for name, t, gpu_s in rows}


def why_it_waits(org: Organisation, share: str, gpu_type: str, gpus: int | None = None) -> list[str]:
    """Why a share that waits to borrow a type gets no more of it now, in the words the organisation
    page, the share page, the API (a share's `fair_share`, a queued job's `why_it_waits`) and the CLI
    (`gpuquota groups`, `gpuquota status`) all show: each group above it whose borrow limit is reached
    ("group research may take 12 a10g from outside: 12 taken"), and the borrowers that go before it
    ("behind 2 shares with a lower fair-share value"). Groups and shares are counted or named as the
    overview does, never a job. Empty when the share does not wait to borrow the type; with `gpus` (a
    queued job's size), also when that job fits what is left of its share's own capacity (it does not
    wait to borrow, whatever its share's bigger jobs do)."""
    node = org.find(share, gpu_type)
    if node is None or node.row.kind != "share" or not node.row.waiting_to_borrow:
        return []
    r = node.row
    if gpus is not None and r.in_use + gpus <= r.capacity:
        return []
    out = []
    parent = r.parent
    while parent is not None:
        g = org.find(parent, gpu_type)
        if g is not None and g.may_take is not None and g.row.taken_from_outside >= g.may_take:
            out.append(
                f"group {parent} may take {g.may_take} {gpu_type} from outside: {g.row.taken_from_outside} taken"
            )
        parent = org.groups[parent].parent if parent in org.groups else None
    ahead = [
        n
        for n in org.of_type(gpu_type)
        if n.row.kind == "share"
        and n.row.name != r.name
        and n.row.waiting_to_borrow
        and n.row.parent == r.parent
        and n.row.fair_share_value < r.fair_share_value
    ]
    if ahead:
        out.append(f"behind {len(ahead)} share{'s' if len(ahead) != 1 else ''} with a lower fair-share value")
    return out


def fair_part_words(org: Organisation, node: Node, borrowed_day: float | None = None) -> str:
    """ "your fair part of idle a10g now is 6 GPUs: weight 2 × 8 a10g of capacity = 16 of 40 among the
    borrowers that wait; borrowed 3 a10g over the last day (history 1.4)". The part is rule 5's split:
    siblings that wait to borrow share what borrowers may hold by weight × capacity (a group's: its
    shares' capacity), the divisor of the fair-share value that rule 5 evens out."""
    r = node.row
    if r.fair_part is None:
        head = f"{r.name} neither waits to borrow {r.gpu_type} nor borrows it now"
    else:
        head = (
            f"your fair part of idle {r.gpu_type} now is {r.fair_part:.0f} GPUs: "
            f"{fair_weight_words(r)} of {r.competing_total_fair_weight:g} among the borrowers that wait"
        )
    if borrowed_day is not None:
        # an average over the day: one decimal where it is small ("0.1 a10g"), else whole GPUs
        amount = f"{borrowed_day:.1f}".removesuffix(".0") if borrowed_day < 10 else f"{borrowed_day:.0f}"
        head += f"; borrowed {amount} {r.gpu_type} over the last day"
        if org.half_life_s:
            head += f" (history {r.history:.1f})"
    elif org.half_life_s:
        head += f"; history {r.history:.1f}"
    return head


def fair_weight_words(r: OrgRow) -> str:
    """What a node's fair part is in proportion to: "weight 2 × 8 a10g of capacity = 16" (a node without
    capacity of the type counts as 1: "weight 1 × 1 (no a10g of its own) = 1")."""
    of = f"{r.capacity} {r.gpu_type} of capacity" if r.capacity >= 1 else f"1 (no {r.gpu_type} of its own)"
    return f"weight {r.weight:g} × {of} = {r.fair_weight:g}"


def share_lines(org: Organisation, share_names: Sequence[str], *, now: datetime | None = None) -> list[dict]:
    """For each of these shares and each type it has a row of: its state, its fair part in words and
    why it waits (the share page, the team page, the org page's "your shares")."""
    day = borrowed_last_day(share_names, now=now)
    out = []
    for name in share_names:
        for node in org.of(name):
            r = node.row
            out.append(
                {
                    "node": node,
                    "words": fair_part_words(org, node, day.get((name, r.gpu_type))),
                    "why": why_it_waits(org, name, r.gpu_type),
                }
            )
    return out


# --- /usage/: borrowed GPU-hours per group and share against their fair part ------------------------


def borrowing_by_tree(borrowed: dict[str, dict[str, float]]) -> list[dict]:
    """The borrowed GPU-hours of a window (type -> share -> GPU-hours, quotas.usage.borrowed_by_type)
    per type that was borrowed (by name; borrowing of different types is not comparable) and per group
    and share of today's tree, in tree order, each beside its fair part: at each level, what the
    siblings that borrowed borrowed together, split by weight x max(1, capacity of the type) (the
    engine's fair_weight, a group's capacity its subtree's): rule 5 lends to the lowest fair-share value
    first, so over time borrowing follows that split. A group's figure is what its shares borrowed.
    Nodes that borrowed nothing are listed with 0 and no part (they did not compete).
    Returns [{"gpu_type", "rows": [...]}]."""
    from types import SimpleNamespace

    from quotas import fairshare
    from quotas.engine.tree import fair_weight
    from quotas.models import Share, ShareCapacity

    groups = {g.name: g for g in fairshare.groups()}
    parent: dict[str, str | None] = {g.name: g.parent for g in groups.values()}
    weight: dict[str, float] = {g.name: float(g.weight) for g in groups.values()}
    for name, group, w in Share.objects.values_list("name", "group__name", "weight"):
        parent[name], weight[name] = group, float(w)
    own_capacity: dict[tuple[str, str], int] = {
        (share, gpu_type): gpus
        for share, gpu_type, gpus in ShareCapacity.objects.values_list("share__name", "gpu_type", "max_gpus")
    }
    children: dict[str | None, list[str]] = {}
    for name in sorted(parent):
        children.setdefault(parent[name], []).append(name)

    def up_the_tree(per_share: dict[str, float]) -> dict[str, float]:
        """Each node's figure: its own (a share) plus its subtree's (a group)."""
        total = dict.fromkeys(parent, 0.0)
        for name, amount in per_share.items():
            node = name if name in parent else None
            while node is not None:
                total[node] += amount
                node = parent[node]
        return total

    order: list[tuple[str, int]] = []  # (name, depth), depth first, children by name

    def walk(at: str | None, depth: int) -> None:
        for k in children.get(at, []):
            order.append((k, depth))
            walk(k, depth + 1)

    walk(None, 0)
    sections: list[dict] = []
    for gpu_type in sorted(t for t, by_share in borrowed.items() if any(h > 0 for h in by_share.values())):
        total = up_the_tree(borrowed[gpu_type])
        capacity = up_the_tree({s: float(g) for (s, t), g in own_capacity.items() if t == gpu_type})
        fair = {name: fair_weight(weight[name], int(capacity[name])) for name in parent}
        # Per parent, what its children that borrowed borrowed together and their total fair weight.
        level: dict[str | None, tuple[float, float]] = {}
        for at, kids in children.items():
            competing = [k for k in kids if total[k] > 0]
            level[at] = (sum(total[k] for k in competing), sum(fair[k] for k in competing))
        rows: list[dict] = []
        for name, depth in order:
            hours, fair_total = level[parent[name]]
            competes = total[name] > 0
            part = hours * fair[name] / fair_total if competes else None
            # The organisation page's words (fair_weight_words reads these four attributes).
            words = fair_weight_words(
                SimpleNamespace(
                    weight=weight[name],
                    capacity=int(capacity[name]),
                    gpu_type=gpu_type,
                    fair_weight=fair[name],
                )
            )
            rows.append(
                {
                    "name": name,
                    "kind": "group" if name in groups else "share",
                    "depth": depth,
                    "borrowed": total[name],
                    "weight": weight[name],
                    "capacity": int(capacity[name]),
                    "fair_weight": fair[name],
                    "competing_fair_weight": fair_total if competes else None,
                    "fair_part": part,
                    "ratio": None if not part else total[name] / part,
                    "words": words + (f" of {fair_total:g} among those that borrowed" if competes else ""),
                }
            )
        sections.append({"gpu_type": gpu_type, "rows": rows})
    return sections
