"""Usage history and the dashboard's read-outs of the cluster right now.

This module owns `UsageSample`: a beat task writes one row per share and GPU type every minute
(`sample`), rows older than a day are thinned to 15-minute buckets (`downsample`) and rows older
than 90 days are deleted (`prune`), so the 24-hour chart reads at most a few thousand rows.

The "right now" read-outs (`cluster_picture`) take one snapshot (quotas.scheduler.load_snapshot) and
ask the policy's accounting (policy.usage / policy.lending): the numbers the pass decides by, never a
second copy of the rules. Everything here runs a constant number of queries, whatever the number of jobs.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Count, F, Sum
from django.utils import timezone

from quotas.engine import policy
from quotas.models import Share, UsageSample

FRESH_RESOLUTION_S = 60
DOWNSAMPLE_AFTER = timedelta(days=1)
DOWNSAMPLE_RESOLUTION_S = 15 * 60
KEEP_FOR = timedelta(days=90)
DOWNSAMPLE_BATCH = 50_000  # rows thinned per call: a long-stopped beat catches up over a few runs

_NUMBERS = ("capacity", "own", "borrowed", "lent", "queued_gpus", "running_jobs", "queued_jobs")


# --- history -------------------------------------------------------------------------------------


def sample(now: datetime | None = None) -> int:
    """Write the usage of every share and GPU type at `now`. Returns the number of rows written."""
    from quotas.scheduler import load_snapshot
    from quotas.services import share_usage

    now = now or timezone.now()
    loaded = load_snapshot(now, queued=False)
    snapshot = loaded.snapshot
    capacity = {s.name: dict(s.capacity) for s in snapshot.shares}
    share_ids = dict(Share.objects.values_list("name", "pk"))
    rows = []
    for share, by_type in share_usage(snapshot, loaded.queued_totals).items():
        if share not in share_ids:
            continue
        for gpu_type, u in by_type.items():
            rows.append(
                UsageSample(
                    at=now,
                    share_id=share_ids[share],
                    gpu_type=gpu_type,
                    capacity=capacity.get(share, {}).get(gpu_type, 0),
                    own=u["own"],
                    borrowed=u["borrowed"],
                    lent=u["lent"],
                    queued_gpus=u["queued_gpus"],
                    running_jobs=u["running_jobs"],
                    queued_jobs=u["queued_jobs"],
                    resolution_s=FRESH_RESOLUTION_S,
                )
            )
    UsageSample.objects.bulk_create(rows)
    return len(rows)


def _bucket(at: datetime, size_s: int) -> datetime:
    epoch = int(at.timestamp())
    return datetime.fromtimestamp(epoch - epoch % size_s, tz=at.tzinfo)


def downsample(now: datetime | None = None) -> int:
    """Replace fresh samples older than a day by one averaged row per share, type and 15-minute bucket.
    Only whole buckets before the cut-off are touched, so running it again changes nothing. Returns the
    number of rows removed."""
    now = now or timezone.now()
    cutoff = _bucket(now - DOWNSAMPLE_AFTER, DOWNSAMPLE_RESOLUTION_S)
    rows = list(
        UsageSample.objects.filter(at__lt=cutoff, resolution_s__lt=DOWNSAMPLE_RESOLUTION_S)
        .order_by("at", "id")
        .values("id", "at", "share_id", "gpu_type", "resolution_s", *_NUMBERS)[:DOWNSAMPLE_BATCH]
    )
    if not rows:
        return 0
    if len(rows) == DOWNSAMPLE_BATCH:
        # Keep the last (maybe partial) bucket of the batch for the next call.
        last = _bucket(rows[-1]["at"], DOWNSAMPLE_RESOLUTION_S)
        rows = [r for r in rows if _bucket(r["at"], DOWNSAMPLE_RESOLUTION_S) < last] or rows
    buckets: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        buckets[(_bucket(r["at"], DOWNSAMPLE_RESOLUTION_S), r["share_id"], r["gpu_type"])].append(r)
    merged = []
    for (at, share_id, gpu_type), group in buckets.items():
        n = len(group)
        values: dict[str, Any] = {}
        for name in _NUMBERS:
            mean = sum(r[name] for r in group) / n
            values[name] = mean if name in ("own", "borrowed", "lent") else round(mean)
        merged.append(
            UsageSample(
                at=at,
                share_id=share_id,
                gpu_type=gpu_type,
                resolution_s=DOWNSAMPLE_RESOLUTION_S,
                **values,
            )
        )
    with transaction.atomic():
        ids = [r["id"] for r in rows]
        for i in range(0, len(ids), 900):  # SQLite's limit on query parameters
            UsageSample.objects.filter(pk__in=ids[i : i + 900]).delete()
        UsageSample.objects.bulk_create(merged)
    return len(rows)


def prune(now: datetime | None = None) -> int:
    """Delete samples older than 90 days. Returns the number of rows deleted."""
    now = now or timezone.now()
    deleted, _ = UsageSample.objects.filter(at__lt=now - KEEP_FOR).delete()
    return deleted


def borrowed_by_type(since: datetime, until: datetime) -> dict[str, dict[str, float]]:
    """GPU-hours borrowed per type and share over [since, until) (type -> share -> GPU-hours, only those
    that borrowed), as /usage/'s figures count them (a sample stands for its resolution_s), but kept
    apart by type: borrowing of different types is not comparable. One aggregating query."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    rows = (
        UsageSample.objects.filter(at__gte=since, at__lt=until, borrowed__gt=0)
        .values("gpu_type", "share__name")
        .annotate(seconds=Sum(F("borrowed") * F("resolution_s")))
        .order_by()
    )
    for r in rows:
        out[r["gpu_type"]][r["share__name"]] = (r["seconds"] or 0.0) / 3600
    return dict(out)


HISTORY_MIN_SPAN = timedelta(minutes=10)


def history(*, hours: int = 24, now: datetime | None = None) -> dict[str, Any]:
    """GPUs used (own + borrowed, all types) per share over the last `hours`, for a stacked area chart:
    {"times": [...iso], "series": {share: [gpus, ...]}, "start", "end" (the x range), "since" (the first
    sample, where it falls inside the window)}. One aggregating query."""
    now = now or timezone.now()
    rows = (
        UsageSample.objects.filter(at__gte=now - timedelta(hours=hours), at__lte=now)
        .values("at", "share__name")
        .annotate(used=Sum(F("own") + F("borrowed")))
        .order_by("at", "share__name")
    )
    times: list[datetime] = []
    index: dict[datetime, int] = {}
    points: dict[str, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["at"] not in index:
            index[r["at"]] = len(times)
            times.append(r["at"])
        points[r["share__name"]][index[r["at"]]] = round(r["used"] or 0, 2)
    series = {name: [p.get(i, 0) for i in range(len(times))] for name, p in sorted(points.items())}
    start = now - timedelta(hours=hours)
    # A young cluster (its first sample inside the window) is drawn from that sample, with a little room
    # before it, not squeezed into the last pixels of a day; at least HISTORY_MIN_SPAN wide.
    since = times[0] if times and times[0] > start + HISTORY_MIN_SPAN else None
    if since is not None:
        span = max(now - since, HISTORY_MIN_SPAN)
        start = max(start, now - span * 1.05)
    return {
        "times": [t.isoformat() for t in times],
        "series": series,
        "start": start.isoformat(),
        "end": now.isoformat(),
        "since": since,
    }


# --- right now -------------------------------------------------------------------------------------


@dataclass
class Bar:
    """One share's capacity bar for one GPU type: segments in GPUs and in percent of the bar."""

    gpu_type: str
    capacity: int
    own: int
    borrowed: int
    lent: float
    idle: float
    queued: int  # queued demand beyond what the share has free
    queued_jobs: int
    running_jobs: int

    @property
    def scale(self) -> float:
        return max(1, self.capacity + self.borrowed + self.queued)

    def pct(self, value: float) -> float:
        return round(100 * value / self.scale, 2)

    @property
    def segments(self) -> list[tuple[str, str, float, float]]:
        """(css class, label, GPUs, percent) in the order drawn."""
        return [
            (cls, label, value, self.pct(value))
            for cls, label, value in (
                ("own", "own used", self.own),
                ("borrowed", "borrowed", self.borrowed),
                ("lent", "lent out", gpu_count(self.lent)),
                ("idle", "idle", gpu_count(self.idle)),
                ("queued", "queued beyond capacity", self.queued),
            )
            if value
        ]

    @property
    def capacity_pct(self) -> float:
        return self.pct(self.capacity)


def gpu_count(value: float) -> int | float:
    """A GPU count for people: an integer prints as one (idle 3, not idle 3.0); lent GPUs are shared
    in proportion (SEMANTICS) and may be fractional, to one decimal."""
    rounded = round(value, 1)
    return int(rounded) if rounded == int(rounded) else rounded


@dataclass
class ShareCard:
    name: str
    team: str
    team_slug: str
    strategy: str
    borrow_limit: int
    in_share_preemption: bool
    state: str
    description: str
    colour: int
    bars: list[Bar] = field(default_factory=list)
    team_id: int | None = None


@dataclass
class ClusterPicture:
    now: datetime
    cards: list[ShareCard]
    totals: list[dict[str, Any]]  # per GPU type
    sankey: dict[str, Any]  # plotly-ready: labels, source, target, value, and "flows" for the table
    overcommitted: list[str]  # GPU types whose shares' capacity exceeds the cluster's
    queued_jobs: int
    running_jobs: int


PALETTE_SIZE = 10


def colour_of(share_id: int) -> int:
    """A share's colour index (0..PALETTE_SIZE-1), from its id: it keeps its colour on every chart, the
    nodes page and the Sankey when shares are added or removed (the first PALETTE_SIZE differ)."""
    return (share_id - 1) % PALETTE_SIZE


def share_colours(names) -> dict[str, int]:
    """The colour index of each named share (colour_of its id); one query."""
    from quotas.models import Share

    return {
        name: colour_of(pk)
        for name, pk in Share.objects.filter(name__in=list(names)).values_list("name", "pk")
    }


class RunningRow(NamedTuple):
    """A running attempt as the pages list it (a plain tuple: thousands unpickle in a few ms)."""

    attempt_id: int
    job_id: int
    share: str
    placement: tuple
    started_at: float
    preempting: bool


@dataclass
class LivePicture:
    """The cluster right now as the pages show it, from one snapshot: the picture (every share's card,
    totals, lending), the running attempts by share, which of them are borrowed, and the queue's totals."""

    picture: ClusterPicture
    running: dict[str, list[RunningRow]]
    borrowed: frozenset
    queued_totals: dict[tuple[str, str], tuple[int, int]]
    hatched: dict[int, int]  # borrowed attempt id -> how many of its GPUs the node grid hatches


LIVE_KEY = "gpuquota:live-picture:2"  # :2 since `hatched`: a cached older picture is not read


def _version() -> tuple:
    """What the live picture depends on, in one cheap query: the newest job event (every submit, start,
    end, pre-emption and cancel writes one) and audit entry (share changes), the nodes' states and the
    GPUs they have. Equal versions mean an equal picture. (A pass that decides nothing changes none of
    them, so the beat's passes do not throw the picture away.)"""
    from django.db import connection

    from gpunodes.models import Gpu, Node
    from jobs.models import JobEvent
    from quotas.models import AuditEntry

    def newest(model, column: str = "id") -> str:
        return f"(SELECT max({column}) FROM {model._meta.db_table})"

    sql = ", ".join(
        [
            newest(JobEvent),
            newest(AuditEntry),
            newest(Node, "state_changed_at"),
            f"(SELECT count(*) FROM {Node._meta.db_table})",
            f"(SELECT count(*) FROM {Gpu._meta.db_table})",
        ]
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {sql}")
        return tuple(str(v) for v in cursor.fetchone())


def hatched_gpus(snapshot, borrowed: frozenset, acct) -> dict[int, int]:
    """How many GPUs of each borrowed attempt the grid hatches: per share and type exactly the share's
    borrowed count (usage - own, as its card says), the latest-started borrowed attempts first. An
    attempt only partly over its share's capacity is borrowed as a whole (it is reclaimable), but only
    its GPUs over the capacity are hatched, so hatched GPUs add up to the cards' borrowed numbers.
    `acct` is policy.usage(snapshot)."""
    left = {
        (share, gpu_type): u.borrowed for share, per_type in acct.items() for gpu_type, u in per_type.items()
    }
    out: dict[int, int] = {}
    runs = sorted(
        (r for r in snapshot.running if r.attempt_id in borrowed),
        key=lambda r: (-r.started_at, -r.attempt_id),
    )
    for run in runs:
        key = (run.share, run.gpu_type)
        out[run.attempt_id] = n = max(0, min(run.gpus, left.get(key, 0)))
        left[key] = left.get(key, 0) - n
    return out


def live_picture() -> LivePicture:
    """The live picture, shared by every page through the cache while nothing it depends on changed
    (see _version): a page view costs one small query instead of loading thousands of attempts and
    GPUs. Never stale: a change gives a new version and the next view computes it afresh."""
    from django.core.cache import cache

    from quotas.scheduler import load_snapshot

    version = _version()
    try:
        hit = cache.get(LIVE_KEY)
    except Exception:  # a broken cache only costs the load below
        hit = None
    if hit is not None and hit[0] == version:
        return hit[1]
    loaded = load_snapshot(queued=False)
    running: dict[str, list[RunningRow]] = {}
    for r in loaded.snapshot.running:
        placement = loaded.real_placement(r.placement)  # the nodes' GPU indexes, not the engine's
        row = RunningRow(r.attempt_id, r.job_id, r.share, placement, r.started_at, r.preempting)
        running.setdefault(r.share, []).append(row)
    borrowed = policy.borrowed_attempts(loaded.snapshot)
    acct = policy.usage(loaded.snapshot)  # the cards' numbers and the grid's hatching, computed once
    live = LivePicture(
        picture=cluster_picture(loaded=loaded, acct=acct),
        running=running,
        borrowed=borrowed,
        queued_totals=dict(loaded.queued_totals),
        hatched=hatched_gpus(loaded.snapshot, borrowed, acct),
    )
    try:
        cache.set(LIVE_KEY, (version, live), 3600)
    except Exception:
        pass
    return live


def cluster_picture(
    *, team_id: int | None = None, now: datetime | None = None, loaded=None, acct=None
) -> ClusterPicture:
    """Share cards, cluster totals per type, lending flows and over-commit, from one snapshot (the
    shared live picture unless a snapshot is given). With `team_id`, only that team's cards. `acct`:
    policy.usage of the loaded snapshot, when the caller has it already."""
    if loaded is None and now is None:
        picture = live_picture().picture
        if team_id is not None:
            picture = dataclasses.replace(picture, cards=[c for c in picture.cards if c.team_id == team_id])
        return picture
    from quotas.scheduler import load_snapshot

    now = now or timezone.now()
    loaded = loaded or load_snapshot(now, queued=False)
    snapshot = loaded.snapshot
    if acct is None:
        acct = policy.usage(snapshot)
    queued_gpus: dict[tuple[str, str], int] = defaultdict(int)
    queued_jobs: dict[tuple[str, str], int] = defaultdict(int)
    running_jobs: dict[tuple[str, str], int] = defaultdict(int)
    for key, (jobs, gpus) in loaded.queued_totals.items():
        queued_gpus[key] += gpus
        queued_jobs[key] += jobs
    for r in snapshot.running:
        running_jobs[(r.share, r.gpu_type)] += 1

    shares = list(Share.objects.select_related("team").order_by("name"))
    colours = {s.name: colour_of(s.pk) for s in shares}
    capacity = {s.name: dict(s.capacity) for s in snapshot.shares}
    cards = []
    for share in shares:
        if team_id is not None and share.team_id != team_id:
            continue
        card = ShareCard(
            name=share.name,
            team=share.team.name,
            team_slug=share.team.slug,
            strategy=share.strategy,
            borrow_limit=share.borrow_limit,
            in_share_preemption=share.in_share_preemption,
            state=share.state,
            description=share.description,
            colour=colours[share.name],
            team_id=share.team_id,
        )
        types = sorted(set(capacity.get(share.name, {})) | set(acct.get(share.name, {})))
        for gpu_type in types:
            u = acct.get(share.name, {}).get(gpu_type)
            cap = capacity.get(share.name, {}).get(gpu_type, 0)
            own = u.own if u else 0
            borrowed = u.borrowed if u else 0
            lent = u.lent if u else 0.0
            free = max(0, cap - own)
            waiting = queued_gpus[(share.name, gpu_type)]
            card.bars.append(
                Bar(
                    gpu_type=gpu_type,
                    capacity=cap,
                    own=own,
                    borrowed=borrowed,
                    lent=lent,
                    idle=max(0.0, cap - own - lent),
                    queued=max(0, waiting - free),
                    queued_jobs=queued_jobs[(share.name, gpu_type)],
                    running_jobs=running_jobs[(share.name, gpu_type)],
                )
            )
        cards.append(card)

    # Cluster totals per type: READY GPUs, held, borrowed, queued demand, nodes by state.
    totals: dict[str, dict[str, Any]] = {}

    def total(gpu_type: str) -> dict[str, Any]:
        return totals.setdefault(
            gpu_type,
            {
                "gpu_type": gpu_type,
                "ready": 0,
                "nodes": 0,
                "nodes_ready": 0,
                "used": 0,
                "borrowed": 0,
                "queued_gpus": 0,
                "queued_jobs": 0,
                "assigned": 0,
            },
        )

    for node in snapshot.nodes:
        t = total(node.gpu_type)
        t["nodes"] += 1
        if node.schedulable:
            t["nodes_ready"] += 1
            t["ready"] += node.gpus
    for r in snapshot.running:
        total(r.gpu_type)["used"] += r.gpus
    for (_share, gpu_type), n in queued_gpus.items():
        total(gpu_type)["queued_gpus"] += n
    for (_share, gpu_type), n in queued_jobs.items():
        total(gpu_type)["queued_jobs"] += n
    for name, by_type in acct.items():
        if name == policy.UNASSIGNED:
            continue
        for gpu_type, u in by_type.items():
            total(gpu_type)["borrowed"] += u.borrowed
    for caps in capacity.values():
        for gpu_type, n in caps.items():
            total(gpu_type)["assigned"] += n
    overcommitted = []
    for gpu_type, t in sorted(totals.items()):
        t["idle"] = max(0, t["ready"] - t["used"])
        t["unassigned"] = max(0, t["ready"] - t["assigned"])
        t["used_pct"] = round(100 * t["used"] / t["ready"]) if t["ready"] else 0
        if t["assigned"] > t["ready"]:
            overcommitted.append(gpu_type)

    return ClusterPicture(
        now=now,
        cards=cards,
        totals=[totals[t] for t in sorted(totals)],
        sankey=sankey_data(snapshot, colours),
        overcommitted=overcommitted,
        queued_jobs=sum(jobs for jobs, _ in loaded.queued_totals.values()),
        running_jobs=len(snapshot.running),
    )


def sankey_data(snapshot, colours: dict[str, int]) -> dict[str, Any]:
    """Lending right now as plotly Sankey arrays (lender nodes on the left, borrowers on the right),
    plus the same flows as rows for a table beside it."""
    flows = []
    for gpu_type, pairs in policy.lending(snapshot).items():
        for (lender, borrower), gpus in sorted(pairs.items()):
            if gpus > 0:
                flows.append({"gpu_type": gpu_type, "lender": lender, "borrower": borrower, "gpus": gpus})
    labels: list[str] = []
    colour_of: list[int] = []
    ids: dict[tuple[str, str], int] = {}

    def node(name: str, side: str) -> int:
        key = (name, side)
        if key not in ids:
            ids[key] = len(labels)
            labels.append(f"{name} ({'lends' if side == 'L' else 'borrows'})")
            colour_of.append(colours.get(name, -1))
        return ids[key]

    source, target, value, link_labels = [], [], [], []
    for f in flows:
        source.append(node(f["lender"], "L"))
        target.append(node(f["borrower"], "B"))
        value.append(round(f["gpus"], 2))
        link_labels.append(f"{f['gpu_type']}: {gpu_count(f['gpus'])} GPUs")
    for f in flows:
        f["gpus"] = gpu_count(f["gpus"])
    return {
        "labels": labels,
        "colours": colour_of,
        "source": source,
        "target": target,
        "value": value,
        "link_labels": link_labels,
        "flows": flows,
    }


def capacity_warnings(
    *, capacity: dict[str, int], share_id: int | None = None, enabled: bool = True
) -> list[str]:
    """What saving this capacity would do that an admin should know first (it is allowed): a GPU type
    no node has, and capacity beyond the READY GPUs of a type (over-commit: guarantees then hold only
    as far as the hardware exists). `share_id`: the share being edited, whose current capacity the new
    one replaces."""
    from gpunodes.choices import NodeState
    from gpunodes.models import Gpu, Node
    from quotas.choices import ShareState
    from quotas.models import ShareCapacity

    wanted = {t: n for t, n in capacity.items() if n}
    if not wanted:
        return []
    known = set(Node.objects.values_list("gpu_type", flat=True).distinct())
    ready: dict[str, int] = defaultdict(int)
    for gpu_type, n in (
        Gpu.objects.filter(node__state=NodeState.READY, node__gpu_type__in=list(wanted))
        .values_list("node__gpu_type")
        .annotate(n=Count("id"))
    ):
        ready[gpu_type] = n
    others: dict[str, int] = defaultdict(int)
    for gpu_type, n in (
        ShareCapacity.objects.filter(gpu_type__in=list(wanted), share__state=ShareState.ENABLED)
        .exclude(share_id=share_id)
        .values_list("gpu_type")
        .annotate(n=Sum("max_gpus"))
    ):
        others[gpu_type] = n
    warnings = []
    for gpu_type, n in sorted(wanted.items()):
        if gpu_type not in known:
            warnings.append(
                f"No node has GPU type {gpu_type}: its {n} GPUs guarantee nothing until such a node registers."
            )
        elif enabled and others[gpu_type] + n > ready[gpu_type]:
            warnings.append(
                f"Over-committed: the shares would hold {others[gpu_type] + n} {gpu_type} GPUs, "
                f"{ready[gpu_type]} are READY. Guarantees hold only as far as the hardware exists."
            )
    return warnings
