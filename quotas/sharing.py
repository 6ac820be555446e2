"""What sharing gained and what it cost, per share and team over time (issue 26): the numbers behind the
usage page, its API (GET /api/v1/usage/) and its CSV download.

- GPU-hours used (own capacity), borrowed and lent: the minute samples of `UsageSample` (quotas/usage.py)
  integrated over each bucket (a sample stands for its `resolution_s`). Borrowed GPU-hours are what
  sharing gained the borrower: work run on GPUs its own capacity did not have.
- GPU-hours lost, by cause (reclaim, in-share priority, node lost, fenced, GPU failed): the work thrown
  away by the attempts that ended in each bucket (Attempt.gpu_seconds_lost, written at each end:
  GPUs x (end - safe point)).
- What it cost the owners: their wait for reclaimed GPUs, per share and by the job's priority, p50 and
  p95: over the attempts admitted on own capacity whose admission needed GPUs back (a reclaim, or a wait
  for protection), from the first pass that needed them (Attempt.reclaim_needed_at) to the start. It
  is the victims' grace, and with protection windows the wait for them too (bench/bench_itp.py, the
  same definition in virtual time).

A constant number of queries whatever the window: one aggregate of the samples, one of the lost work,
one read of the owners' waits (few rows: one per reclaim), one of the shares.
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import F, Sum
from django.db.models.functions import TruncDay, TruncHour
from django.utils import timezone

from quotas.models import Share, UsageSample

MAX_DAYS = 90  # what the samples keep (usage.KEEP_FOR)
HOURLY_UP_TO_DAYS = 2  # a window of up to 2 days in hours, a longer one in days
# The causes in the order pages and files give them (jobs.choices.LostCause's values: the jobs app is
# below this one, but its choices are read here as plain strings).
CAUSES = (
    "reclaim",
    "priority",
    "fair_share",
    "node_lost",
    "fenced",
    "gpu_failed",
    "agent_stopped",
    "host_fault",
)
CAUSE_LABELS = {
    "reclaim": "reclaim",
    "priority": "in-share priority",
    "fair_share": "fair reclaim",
    "node_lost": "node lost",
    "fenced": "fenced",
    "gpu_failed": "GPU failed",
    "agent_stopped": "agent stopped",
    "host_fault": "host fault",
}
CSV_COLUMNS = (
    "bucket_start",
    "share",
    "team",
    "gpu_hours_own",
    "gpu_hours_borrowed",
    "gpu_hours_lent",
    *(f"lost_gpu_hours_{c}" for c in CAUSES),
    "lost_gpu_hours",
    "owner_waits",
    "owner_wait_p50_s",
    "owner_wait_p95_s",
)


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest rank, as the simulator's report and bench 10 take it; None for no values."""
    if not sorted_values:
        return None
    return sorted_values[max(1, math.ceil(pct / 100 * len(sorted_values))) - 1]


@dataclass
class Waits:
    """Owners' waits for reclaimed GPUs, seconds."""

    values: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        self.values.append(max(0.0, seconds))

    def summary(self) -> dict[str, Any]:
        ordered = sorted(self.values)
        p50, p95 = percentile(ordered, 50), percentile(ordered, 95)
        return {
            "n": len(ordered),
            "p50_s": None if p50 is None else round(p50, 1),
            "p95_s": None if p95 is None else round(p95, 1),
        }


@dataclass
class Figures:
    """GPU-hours of one share (or team, or the cluster) over one bucket or the whole window."""

    own: float = 0.0
    borrowed: float = 0.0
    lent: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    waits: Waits = field(default_factory=Waits)
    waits_by_priority: dict[int, Waits] = field(default_factory=lambda: defaultdict(Waits))

    def add(self, other: Figures) -> None:
        self.own += other.own
        self.borrowed += other.borrowed
        self.lent += other.lent
        for cause, hours in other.lost.items():
            self.lost[cause] += hours
        self.waits.values += other.waits.values
        for prio, waits in other.waits_by_priority.items():
            self.waits_by_priority[prio].values += waits.values

    @property
    def used(self) -> float:
        return self.own + self.borrowed

    @property
    def lost_total(self) -> float:
        return sum(self.lost.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_hours_used": round(self.used, 3),
            "gpu_hours_own": round(self.own, 3),
            "gpu_hours_borrowed": round(self.borrowed, 3),
            "gpu_hours_lent": round(self.lent, 3),
            "lost_gpu_hours": {c: round(h, 3) for c, h in self.lost.items()},
            "lost_gpu_hours_total": round(self.lost_total, 3),
            "owner_wait": {
                **self.waits.summary(),
                "by_priority": {
                    str(p): w.summary() for p, w in sorted(self.waits_by_priority.items(), reverse=True)
                },
            },
        }


@dataclass
class Report:
    since: datetime
    until: datetime
    bucket_s: int
    buckets: list[datetime]
    teams: dict[str, str]  # share -> team slug
    by_bucket: dict[tuple[str, datetime], Figures]  # (share, bucket start)
    shares: dict[str, Figures]  # the whole window
    team_totals: dict[str, Figures]
    cluster: Figures

    def as_dict(self) -> dict[str, Any]:
        return {
            "since": self.since.isoformat(),
            "until": self.until.isoformat(),
            "bucket_s": self.bucket_s,
            "causes": list(CAUSES),
            "cluster": self.cluster.as_dict(),
            "shares": [
                {"share": name, "team": self.teams[name], **f.as_dict()}
                for name, f in sorted(self.shares.items())
            ],
            "teams": [{"team": team, **f.as_dict()} for team, f in sorted(self.team_totals.items())],
            "series": [
                {
                    "bucket_start": b.isoformat(),
                    "share": name,
                    "team": self.teams[name],
                    **{k: v for k, v in f.as_dict().items() if k != "owner_wait"},
                    "owner_wait": f.waits.summary(),
                }
                for (name, b), f in sorted(self.by_bucket.items(), key=lambda kv: (kv[0][1], kv[0][0]))
            ],
        }

    def csv(self) -> str:
        """One line per bucket and share: the same numbers as the page and the API."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for (name, bucket), f in sorted(self.by_bucket.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            waits = f.waits.summary()
            writer.writerow(
                [
                    bucket.isoformat(),
                    name,
                    self.teams[name],
                    f"{f.own:.3f}",
                    f"{f.borrowed:.3f}",
                    f"{f.lent:.3f}",
                    *(f"{f.lost[c]:.3f}" for c in CAUSES),
                    f"{f.lost_total:.3f}",
                    waits["n"],
                    "" if waits["p50_s"] is None else waits["p50_s"],
                    "" if waits["p95_s"] is None else waits["p95_s"],
                ]
            )
        return out.getvalue()

    def chart(self, share: str | None = None) -> dict[str, Any]:
        """Plotly-ready series over the buckets for one share, or all of them: GPU-hours own, borrowed
        (what sharing gained), lent, and lost by cause."""
        names = [share] if share else sorted(self.shares)
        series: dict[str, list[float]] = {k: [] for k in ("own", "borrowed", "lent", *CAUSES)}
        for bucket in self.buckets:
            total = Figures()
            for name in names:
                if (name, bucket) in self.by_bucket:
                    total.add(self.by_bucket[(name, bucket)])
            series["own"].append(round(total.own, 3))
            series["borrowed"].append(round(total.borrowed, 3))
            series["lent"].append(round(total.lent, 3))
            for cause in CAUSES:
                series[cause].append(round(total.lost[cause], 3))
        return {
            "x": [b.isoformat() for b in self.buckets],
            "series": series,
            "labels": {
                "own": "used, own capacity",
                "borrowed": "run on borrowed GPUs",
                "lent": "lent",
                **{c: f"lost: {label}" for c, label in CAUSE_LABELS.items()},
            },
            "causes": list(CAUSES),
            "what": share or "all shares",
        }


def window(days: int, now: datetime | None = None) -> tuple[datetime, datetime, int]:
    """(since, until, bucket seconds) of the last `days` days: hours up to HOURLY_UP_TO_DAYS, else days."""
    until = now or timezone.now()
    bucket_s = 3600 if days <= HOURLY_UP_TO_DAYS else 86400
    return until - timedelta(days=days), until, bucket_s


def _bucket_starts(since: datetime, until: datetime, bucket_s: int) -> list[datetime]:
    start = since.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if bucket_s == 86400:
        start = start.replace(hour=0)
    out = []
    while start < until:
        out.append(start)
        start += timedelta(seconds=bucket_s)
    return out


def report(*, days: int = 7, shares: Iterable[str] | None = None, now: datetime | None = None) -> Report:
    """The figures of the last `days` days (1 to MAX_DAYS), per share (all, or those named) and bucket."""
    from jobs.models import Attempt

    since, until, bucket_s = window(days, now)
    trunc = TruncHour if bucket_s == 3600 else TruncDay
    wanted = None if shares is None else set(shares)
    teams = {
        name: team
        for name, team in Share.objects.values_list("name", "team__slug")
        if wanted is None or name in wanted
    }
    by_bucket: dict[tuple[str, datetime], Figures] = defaultdict(Figures)

    samples = (
        UsageSample.objects.filter(at__gte=since, at__lt=until, share__name__in=list(teams))
        .annotate(bucket=trunc("at", tzinfo=UTC))
        .values("share__name", "bucket")
        .annotate(
            own=Sum(F("own") * F("resolution_s")),
            borrowed=Sum(F("borrowed") * F("resolution_s")),
            lent=Sum(F("lent") * F("resolution_s")),
        )
        .order_by()
    )
    for row in samples:
        f = by_bucket[(row["share__name"], row["bucket"])]
        f.own, f.borrowed, f.lent = ((row[k] or 0.0) / 3600 for k in ("own", "borrowed", "lent"))

    lost = (
        Attempt.objects.filter(ended_at__gte=since, ended_at__lt=until, job__share__name__in=list(teams))
        .exclude(lost_cause="")
        .annotate(bucket=trunc("ended_at", tzinfo=UTC))
        .values("job__share__name", "bucket", "lost_cause")
        .annotate(seconds=Sum("gpu_seconds_lost"))
        .order_by()
    )
    for row in lost:
        cause = row["lost_cause"] if row["lost_cause"] in CAUSES else "node_lost"
        by_bucket[(row["job__share__name"], row["bucket"])].lost[cause] += (row["seconds"] or 0.0) / 3600

    waits = Attempt.objects.filter(
        reclaim_needed_at__isnull=False,
        started_at__isnull=False,
        started_at__gte=since,
        started_at__lt=until,
        borrowed=False,
        job__share__name__in=list(teams),
    ).values_list("job__share__name", "job__priority", "reclaim_needed_at", "started_at")
    step = timedelta(seconds=bucket_s)
    starts = _bucket_starts(since, until, bucket_s)
    first = starts[0] if starts else since
    for name, priority, needed, started in waits:
        bucket = first + step * int((started - first) // step)
        f = by_bucket[(name, bucket)]
        wait = (started - needed).total_seconds()
        f.waits.add(wait)
        f.waits_by_priority[priority].add(wait)

    totals: dict[str, Figures] = {name: Figures() for name in teams}
    for (name, _), f in by_bucket.items():
        totals[name].add(f)
    team_totals: dict[str, Figures] = defaultdict(Figures)
    cluster = Figures()
    for name, f in totals.items():
        team_totals[teams[name]].add(f)
        cluster.add(f)
    return Report(
        since=since,
        until=until,
        bucket_s=bucket_s,
        buckets=starts,
        teams=teams,
        by_bucket=dict(by_bucket),
        shares=totals,
        team_totals=dict(team_totals),
        cluster=cluster,
    )
