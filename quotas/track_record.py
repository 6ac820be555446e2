"""The forecast's track record (SEMANTICS "Track record"): what each job was told when it was first
forecast, beside when it actually started, and per share how often recent jobs started within their
likely range and how far off the ETA was.

Owns ForecastRecord's rows. The control worker writes them after each stored forecast
(`record_first_forecasts`, then `mark_started`), each in a constant number of statements whatever the
length of the queue; pages, API and CLI read `summary`. A record keeps the stored forecast's ETA and
range as they were stored; every reading widens the range to hold the ETA through
quotas.models.likely_range, as the pages did when the job was shown it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Exists, OuterRef, Q, Subquery
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Attempt, Job
from quotas.engine.runtimes import TOO_LITTLE_HISTORY
from quotas.models import ForecastKind, ForecastRecord, QueueForecast, Share, likely_range

# A start this close outside its range still counts as within it: the stored forecast is up to a pass
# old when it is read, and a process starts a few seconds after the admission that the ETA forecasts.
TOLERANCE_S = 60
# The chart's points: the latest starts, at most this many (the numbers are over all of them).
POINTS_SHOWN = 500
MAX_DAYS = 90


def record_first_forecasts(computed_at: datetime) -> int:
    """Keep the forecast stored at `computed_at` as the first forecast of each job in it that has no
    record yet: its ETA, range and kind, beside its share and submit time. One statement (INSERT ...
    SELECT): a job with a record already is skipped by ON CONFLICT, a probe of the primary key's index
    per row, whatever the length of the queue (a NOT EXISTS beside it was planned against the table as
    it was, an empty one at first, and scanned it whole for every row it added: 52 s for 98,000 jobs in
    bench 5, 1 s without it). Only jobs still QUEUED that never ran: a job
    admitted while the forecast was written was never shown it, and a job back in the queue after an
    attempt is no longer at its first wait. Nor a forecast from too little history (its basis says so,
    runtimes.TOO_LITTLE_HISTORY): it measures the default runtime, not the forecast (a young cluster's
    first forecasts were all the one-hour default: "median error 59 min"); such a job's record is the
    first forecast of it that rests on what the system has seen, if one comes before it starts.
    Returns how many records were written."""
    records = ForecastRecord._meta.db_table
    forecasts = QueueForecast._meta.db_table
    jobs = Job._meta.db_table
    sql = (
        f"INSERT INTO {records} "
        "(job_id, share_id, submitted_at, forecast_at, eta, eta_low, eta_high, kind, started_at) "
        "SELECT f.job_id, j.share_id, j.submitted_at, f.computed_at, f.eta, f.eta_low, f.eta_high, f.kind, NULL "
        f"FROM {forecasts} f JOIN {jobs} j ON j.id = f.job_id "
        "WHERE f.computed_at = %s AND j.state = %s AND j.attempt_count = 0 AND f.basis NOT LIKE %s "
        "ON CONFLICT (job_id) DO NOTHING"
    )
    params = [
        connection.ops.adapt_datetimefield_value(computed_at),
        JobState.QUEUED.value,
        f"%{TOO_LITTLE_HISTORY}%",
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return max(cursor.rowcount, 0)


def mark_started() -> int:
    """Fill in the start of each record still without one whose job has started: its first attempt's
    start (the earliest Attempt.started_at). One UPDATE; the records still waiting are found by the
    started_at index and each looks up its job's attempts by theirs. Returns how many were filled."""
    first_start = (
        Attempt.objects.filter(job_id=OuterRef("job_id"), started_at__isnull=False)
        .order_by("started_at")
        .values("started_at")[:1]
    )
    return (
        ForecastRecord.objects.filter(started_at__isnull=True)
        .filter(Exists(first_start))
        .update(started_at=Subquery(first_start))
    )


def summary(share: Share, *, now: datetime | None = None, days: int = 7) -> dict:
    """A share's track record over the jobs that started in the last `days` days (1 to 90): `summaries`
    of that one share."""
    return summaries([share], now=now, days=days)[share.pk]


def summaries(shares: Sequence[Share], *, now: datetime | None = None, days: int = 7) -> dict[int, dict]:
    """Each share's track record (by share id) over the jobs that started in the last `days` days (1 to
    90), in two queries whatever the number of shares (a team page shows all of its shares'):

    - `started`: how many did (their first attempt's start in the window); `by_kind`: of those, how
      many were first forecast `bound`, `estimate` or `none` (no ETA), with how many of each had a
      range and started within it.
    - `n`: those with an ETA; `median_error_s`: the median of |start - ETA| over them, in seconds.
    - `with_range`: those whose first forecast gave a range (low..high, widened to hold the ETA);
      `within_range`: how many started inside it, TOLERANCE_S either side allowed (the ETA is the
      admission, the start follows by seconds); `within_fraction`: their share (a calibrated range
      holds about 0.8); `early` / `late`: started before / after it.
    - `waiting_past_range`: jobs of the share still queued whose first range (or ETA, without one) has
      ended more than TOLERANCE_S ago: not in the numbers above until they start (late, then).
    - `points`: for a picture, the latest POINTS_SHOWN starts with an ETA, each as waits from its
      submit in seconds: `forecast_s` (ETA), `low_s`/`high_s` (its range, or null), `actual_s` (start),
      with `kind` and `within` (null without a range).

    Jobs that never waited for a forecast (admitted at their first pass) have no record: the numbers
    are about the jobs that waited, which are the ones an ETA is for."""
    now = now or timezone.now()
    since = now - timedelta(days=days)
    cut = now - timedelta(seconds=TOLERANCE_S)
    ids = [share.pk for share in shares]
    rows: dict[int, list[tuple]] = {pk: [] for pk in ids}
    for share_id, *row in (
        ForecastRecord.objects.filter(share_id__in=ids, started_at__gt=since, started_at__lte=now)
        .order_by("started_at", "job_id")
        .values_list("share_id", "job_id", "kind", "submitted_at", "eta", "eta_low", "eta_high", "started_at")
    ):
        rows[share_id].append(row)
    waiting = dict(
        ForecastRecord.objects.filter(
            share_id__in=ids, started_at__isnull=True, job__state=JobState.QUEUED, eta__lt=cut
        )
        .filter(Q(eta_low__isnull=True) | Q(eta_high__isnull=True) | Q(eta_high__lt=cut))
        .values("share_id")
        .annotate(n=Count("job_id"))
        .values_list("share_id", "n")
    )
    return {
        share.pk: {
            "share": share.name,
            "days": days,
            "since": since,
            "until": now,
            **_figures(rows[share.pk]),
            "waiting_past_range": waiting.get(share.pk, 0),
        }
        for share in shares
    }


def sees_jobs(user, team_id: int) -> bool:
    """Whether `user` may see a team's track-record points (its jobs and their waits): its members and
    admins, as jobs.services.can_see_job (other teams' jobs do not exist for anyone else)."""
    # A membership row is read here, not jobs.services.role_in_team: jobs.services imports this app.
    from quotas.models import Membership

    if not user.is_authenticated:
        return False
    return user.is_superuser or Membership.objects.filter(user=user, team_id=team_id).exists()


def shown(summary: dict, *, jobs_visible: bool) -> dict:
    """`summary` for a reader: whole for one who sees_jobs, else the aggregates alone (no points)."""
    return summary if jobs_visible else {**summary, "points": []}


def _figures(rows: Sequence[tuple]) -> dict:
    """The numbers and points of one share's started records, earliest start first."""
    tolerance = timedelta(seconds=TOLERANCE_S)
    by_kind = {kind: {"started": 0, "with_range": 0, "within_range": 0} for kind in ForecastKind.values}
    errors: list[float] = []
    points: list[dict] = []
    with_range = within = early = late = 0
    for job_id, kind, submitted_at, eta, eta_low, eta_high, started_at in rows:
        counts = by_kind.setdefault(kind, {"started": 0, "with_range": 0, "within_range": 0})
        counts["started"] += 1
        if eta is None:
            continue
        errors.append(abs((started_at - eta).total_seconds()))
        low, high = likely_range(eta, eta_low, eta_high)
        if kind != ForecastKind.BOUND and low is not None and low == high:
            # An estimate's range of no width (stored before issue 42: "between 02:02 and 02:02") was within
            # range only through the tolerance: it counts as no range, as such an estimate now gets.
            low = high = None
        inside = None
        if low is not None:
            with_range += 1
            counts["with_range"] += 1
            inside = low - tolerance <= started_at <= high + tolerance
            if inside:
                within += 1
                counts["within_range"] += 1
            elif started_at < low:
                early += 1
            else:
                late += 1
        points.append(
            {
                "job": job_id,
                "kind": kind,
                "forecast_s": _wait_s(submitted_at, eta),
                "low_s": _wait_s(submitted_at, low),
                "high_s": _wait_s(submitted_at, high),
                "actual_s": _wait_s(submitted_at, started_at),
                "within": inside,
            }
        )
    return {
        "started": len(rows),
        "n": len(errors),
        "median_error_s": round(statistics.median(errors), 1) if errors else None,
        "with_range": with_range,
        "within_range": within,
        "within_fraction": round(within / with_range, 3) if with_range else None,
        "early": early,
        "late": late,
        "tolerance_s": TOLERANCE_S,
        "by_kind": by_kind,
        "points": points[-POINTS_SHOWN:],
    }


def _wait_s(submitted_at: datetime, at: datetime | None) -> float | None:
    return None if at is None else round((at - submitted_at).total_seconds(), 1)
