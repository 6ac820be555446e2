"""Team and share verbs, and the live read-outs of the queue: share usage, queue positions and ETAs.

Writes validate through the models' own validators and ask for a scheduling pass after commit. The
queue's forecast is computed here for the control worker (`forecast_refresh`: one snapshot, the policy
replayed by quotas.engine.forecast, stored as QueueForecast) and read back by pages, API and CLI
(`forecast_fields`); nothing here re-decides what the policy decides.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import ProtectedError
from django.utils import timezone

from quotas import audit
from quotas.choices import Role, ShareState, Strategy
from quotas.engine import collector
from quotas.engine import forecast as fc
from quotas.engine import runtimes as rt
from quotas.models import GPU_TYPE_RE, Membership, Share, Team, likely_range

log = logging.getLogger(__name__)

# ETA of a job with no max_runtime_s in a share that has never finished a job.
DEFAULT_RUNTIME_S = 3600
# The runtime estimates learn from the successful attempts of the last RUNTIME_HISTORY_DAYS: at most
# rt.RECENT_SAMPLE of each share and of each user's job name, the most recent, out of at most RUNTIME_ROWS
# read (one query).
RUNTIME_HISTORY_DAYS = 30
RUNTIME_ROWS = 20_000
# The work expected to arrive, for the estimates (fc.ARRIVALS_WINDOW_S): at most this many jobs.
ARRIVALS_MAX = 20_000
MAX_INT = 2**31 - 1


def _conflict(message: str) -> Exception:
    from jobs.services import Conflict

    return Conflict(message)


# --- teams ---------------------------------------------------------------------------------------


def _resolve_members(members: Iterable[Mapping[str, str]]) -> list[tuple[Any, str]]:
    User = get_user_model()
    wanted = [(str(m.get("username", "")), m.get("role") or Role.MEMBER) for m in members]
    users = {u.get_username(): u for u in User.objects.filter(username__in=[w[0] for w in wanted])}
    problems = []
    for username, role in wanted:
        if username not in users:
            problems.append(f'No user named "{username}".')
        if role not in Role.values:
            problems.append(f'"{role}" is not a role; use one of {", ".join(Role.values)}.')
    if len({w[0] for w in wanted}) != len(wanted):
        problems.append("A user may be listed once.")
    if problems:
        raise ValidationError({"members": problems})
    return [(users[username], role) for username, role in wanted]


def _set_members(team: Team, members: Iterable[Mapping[str, str]]) -> None:
    resolved = _resolve_members(members)
    keep = {u.pk: role for u, role in resolved}
    team.memberships.exclude(user_id__in=list(keep)).delete()
    existing = {m.user_id: m for m in team.memberships.all()}
    for user_id, role in keep.items():
        m = existing.get(user_id)
        if m is None:
            Membership.objects.create(team=team, user_id=user_id, role=role)
        elif m.role != role:
            Membership.objects.filter(pk=m.pk).update(role=role)


def _lock_layout() -> None:
    # A team edit changes the layout (its hash): under the same lock as plans applied.
    from quotas import layout

    layout.lock()


@transaction.atomic
def team_create(
    *, name: str, slug: str, members: Sequence[Mapping[str, str]] | None = None, actor=None
) -> Team:
    _lock_layout()
    team = Team(name=name, slug=slug)
    team.full_clean()
    team.save()
    if members:
        _set_members(team, members)
    audit.record_audit(actor, "create", team, {}, audit.snapshot(team))
    return team


@transaction.atomic
def team_update(
    *,
    team: Team,
    name: str | None = None,
    slug: str | None = None,
    members: Sequence | None = None,
    actor=None,
) -> Team:
    _lock_layout()
    before = audit.snapshot(team)
    if name is not None:
        team.name = name
    if slug is not None:
        team.slug = slug
    team.full_clean()
    team.save()
    if members is not None:
        _set_members(team, members)
    audit.record_audit(actor, "update", team, before, audit.snapshot(team))
    return team


def team_delete(*, team: Team, actor=None) -> None:
    try:
        with transaction.atomic():
            _lock_layout()
            audit.record_audit(actor, "delete", team, audit.snapshot(team), {})
            team.delete()
    except ProtectedError as e:
        raise _conflict(f'Team "{team.slug}" still owns shares; delete or move them first.') from e


# --- shares --------------------------------------------------------------------------------------


def _validate_capacity(capacity: Mapping[str, int]) -> dict[str, int]:
    import re

    problems = []
    for gpu_type, n in capacity.items():
        if not isinstance(gpu_type, str) or not re.match(GPU_TYPE_RE, gpu_type):
            problems.append(f'"{gpu_type}" is not a GPU type: use a lower-case name such as a10g or h100.')
        elif not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_INT:
            problems.append(f"The capacity of {gpu_type} must be a whole number of GPUs, 0 or more.")
    if problems:
        raise ValidationError({"capacity": problems})
    return dict(capacity)


def _check_share(share: Share) -> None:
    errors: dict[str, list[str]] = {}
    try:
        share.full_clean(validate_unique=False)
    except ValidationError as e:
        errors = e.message_dict
    if "name" not in errors and Share.objects.filter(name=share.name).exclude(pk=share.pk).exists():
        # Django's own words would be "Share with this Name already exists."
        errors["name"] = [f'A share named "{share.name}" already exists.']
    if (
        share.borrow_limit != -1
        and share.strategy != Strategy.LEND_AND_BORROW
        and "borrow_limit" not in errors
    ):
        errors["borrow_limit"] = [
            f"Only a LEND_AND_BORROW share borrows: leave borrow_limit at -1 for {share.strategy}."
        ]
    if share.borrow_limit > MAX_INT:
        errors["borrow_limit"] = ["borrow_limit is a percentage: -1 (no limit) or 0 or more."]
    from jobs.limits import MIN_RUNTIME

    if problem := MIN_RUNTIME.problem(share.min_runtime_s):
        errors["min_runtime_s"] = [problem]  # in place of the model's own words: one sentence everywhere
    if errors:
        raise ValidationError(errors)


SHARE_FIELDS = (
    "name",
    "team",
    "description",
    "strategy",
    "borrow_limit",
    "in_share_preemption",
    "min_runtime_s",
    "state",
)


def _share_entry(share: Share, capacity: Mapping[str, int]) -> dict[str, Any]:
    """A share as a layout document's entry (quotas.layoutdoc)."""
    from quotas import layoutdoc

    return {
        "name": share.name,
        "team": share.team.slug,
        "capacity": dict(capacity),
        **{f: getattr(share, f) for f in layoutdoc.VALUE_FIELDS},
    }


def share_create(
    *, name: str, team: Team, capacity: Mapping[str, int] | None = None, actor=None, **fields: Any
) -> Share:
    """Create a share with its capacity ({gpu_type: gpus}): a plan of the layout with it added, applied
    at once (quotas.layout, the one path that changes shares). Raises ValidationError({field: [msg]})."""
    from quotas import layout

    unknown = set(fields) - set(SHARE_FIELDS)
    if unknown:
        raise TypeError(f"unknown share fields: {sorted(unknown)}")
    capacity = _validate_capacity(capacity or {})
    share = Share(name=name, team=team, **fields)
    _check_share(share)
    layout.change_share(name=None, share=_share_entry(share, capacity), actor=actor)
    return Share.objects.select_related("team").get(name=name)


def share_update(
    *, share: Share, capacity: Mapping[str, int] | None = None, actor=None, **fields: Any
) -> Share:
    """Change a share's settings and/or capacity (a plan of that change, applied at once). Queued and
    running jobs go on; the next pass uses the new values (a lowered capacity can turn running jobs into
    borrowed, reclaimable ones)."""
    from quotas import layout

    unknown = set(fields) - set(SHARE_FIELDS)
    if unknown:
        raise TypeError(f"unknown share fields: {sorted(unknown)}")
    name_now = Share.objects.filter(pk=share.pk).values_list("name", flat=True).first() or share.name
    for field, value in fields.items():
        setattr(share, field, value)
    capacity = share.capacity_map() if capacity is None else _validate_capacity(capacity)
    _check_share(share)
    layout.change_share(name=name_now, share=_share_entry(share, capacity), actor=actor)
    share.refresh_from_db()
    return share


def share_delete(*, share: Share, actor=None) -> None:
    """Delete a DISABLED share without jobs (the one rule for the dashboard and the API): a plan of the
    layout without it, applied at once."""
    from quotas import layout

    if share.state != ShareState.DISABLED:
        raise _conflict(f'Disable share "{share.name}" before deleting it.')
    layout.change_share(name=share.name, share=None, actor=actor)


# --- read-outs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueView:
    """One consistent look at the queue: the snapshot, the policy's accounting and the forecast."""

    loaded: Any  # quotas.scheduler.Loaded
    forecast: fc.Forecast
    guesses: Any = None  # _Guesses
    options: Mapping[str, Any] | None = None  # the replay's budget

    @property
    def snapshot(self):
        return self.loaded.snapshot


def share_usage(snapshot, queued_totals=None) -> dict[str, dict[str, dict[str, float | int]]]:
    """{share name: {gpu_type: own, borrowed, lent, queued_gpus, running_jobs, queued_jobs}} from one
    snapshot. own/borrowed/lent are the policy's accounting (lent is fractional: SEMANTICS "Lent").
    `queued_totals` ({(share, type): (jobs, gpus)}, see scheduler.Loaded) stands in for a snapshot
    loaded without its queue."""
    from quotas.engine import policy

    out: dict[str, dict[str, dict[str, float | int]]] = {}

    def row(share: str, gpu_type: str) -> dict[str, float | int]:
        return out.setdefault(share, {}).setdefault(
            gpu_type,
            {"own": 0, "borrowed": 0, "lent": 0.0, "queued_gpus": 0, "running_jobs": 0, "queued_jobs": 0},
        )

    for share in snapshot.shares:
        for gpu_type in share.capacity:
            row(share.name, gpu_type)
    for share, by_type in policy.usage(snapshot).items():
        if share == policy.UNASSIGNED:
            continue
        for gpu_type, u in by_type.items():
            r = row(share, gpu_type)
            r["own"], r["borrowed"], r["lent"] = u.own, u.borrowed, round(u.lent, 2)
    for run in snapshot.running:
        row(run.share, run.gpu_type)["running_jobs"] += 1
    if queued_totals is None:
        queued_totals = {}
        for q in snapshot.queued:
            jobs, gpus = queued_totals.get((q.share, q.gpu_type), (0, 0))
            queued_totals[(q.share, q.gpu_type)] = (jobs + 1, gpus + q.gpus)
    for (share, gpu_type), (jobs, gpus) in queued_totals.items():
        r = row(share, gpu_type)
        r["queued_jobs"] += jobs
        r["queued_gpus"] += gpus
    return out


def runtime_history(now: datetime) -> rt.Runtimes:
    """What the system has seen (SEMANTICS "Runtime estimates"): the runtimes of successful attempts that
    ended in the last RUNTIME_HISTORY_DAYS, the most recent first, up to rt.RECENT_SAMPLE per share and
    per (share, user, job name). One query, at most RUNTIME_ROWS rows."""
    from jobs.choices import AttemptState, Outcome
    from jobs.models import Attempt

    rows = (
        Attempt.objects.filter(
            state=AttemptState.ENDED,
            outcome=Outcome.SUCCEEDED,
            started_at__isnull=False,
            ended_at__gte=now - timedelta(days=RUNTIME_HISTORY_DAYS),
        )
        .order_by("-ended_at")
        .values_list(
            "job__share__name", "job__submitted_by__username", "job__name", "started_at", "ended_at"
        )[:RUNTIME_ROWS]
    )
    by_share: dict[str, list[float]] = {}
    by_group: dict[tuple[str, str, str], list[float]] = {}
    for share, user, name, started, ended in rows:
        seconds = max(1.0, (ended - started).total_seconds())
        seen = by_share.setdefault(share, [])
        if len(seen) < rt.RECENT_SAMPLE:
            seen.append(seconds)
        if name:
            group = by_group.setdefault((share, user, name), [])
            if len(group) < rt.RECENT_SAMPLE:
                group.append(seconds)
    return rt.Runtimes(by_share, by_group, default_s=DEFAULT_RUNTIME_S)


@dataclass
class _Guesses:
    """Per open job: the runtime the forecast replays with, where a guess comes from, its spread."""

    runtime: dict[int, float]
    estimates: dict[int, rt.Guess]
    spread: dict[int, tuple[float, float]]
    grace: dict[int, float]
    # The work expected to come in (QueuedViews; their runtimes join the maps above), read when asked for.
    arrivals: Any = list


def _guesses(loaded, now: datetime) -> _Guesses:
    """Each open job's runtime for the forecast: its enforced max_runtime_s, or a guess from what the
    system has seen (its user's job name, else its share, else the default; for a running attempt given
    how long it has run). One query for the jobs, one for the history."""
    from jobs.choices import JOB_OPEN_STATES
    from jobs.models import Job

    model = runtime_history(now)
    started = {r.job_id: r.started_at for r in loaded.snapshot.running if not r.preempting}
    at = now.timestamp()
    share_names = dict(Share.objects.values_list("pk", "name"))
    out = _Guesses({}, {}, {}, {})
    queued_guess: dict[tuple, rt.Guess] = {}
    queued_bounded: dict[tuple, tuple[float, float]] = {}
    rows = Job.objects.filter(state__in=list(JOB_OPEN_STATES)).values_list(
        "pk", "share_id", "submitted_by__username", "name", "max_runtime_s", "preemption_grace_s"
    )
    for pk, share_id, user, name, max_runtime, grace_s in rows:
        out.grace[pk] = float(grace_s)
        since = started.get(pk)
        if max_runtime:  # enforced by the agent: an ETA that rests only on these is a bound
            out.runtime[pk] = float(max_runtime)
            # It may end sooner: the range replays' low point (a bound's range has the width of that).
            key = (share_id, user, name, max_runtime)
            points = None if since is not None else queued_bounded.get(key)
            if points is None:
                elapsed = None if since is None else max(0.0, at - since)
                points = model.bounded(
                    share_names.get(share_id, ""), user, name, max_runtime_s=max_runtime, elapsed=elapsed
                )
                if since is None:
                    queued_bounded[key] = points
            out.spread[pk] = points
            continue
        if since is None:  # not running: the same guess for every job of a kind (100k queued: one each)
            guess = queued_guess.get((share_id, user, name))
            if guess is None:
                guess = queued_guess[(share_id, user, name)] = model.guess(
                    share_names.get(share_id, ""), user, name
                )
        else:
            guess = model.guess(share_names.get(share_id, ""), user, name, elapsed=max(0.0, at - since))
        out.runtime[pk], out.estimates[pk], out.spread[pk] = guess.seconds, guess, (guess.low, guess.high)
    out.arrivals = lambda: _expected_arrivals(loaded.snapshot, now, model, share_names, out)
    return out


def _expected_arrivals(snapshot, now: datetime, model: rt.Runtimes, share_names, out: _Guesses) -> list:
    """The work expected to come in (fc.ARRIVALS_WINDOW_S): each job submitted in that window before now
    comes in again that long after its submit, with the guessed runtime of its kind. At most
    ARRIVALS_MAX, the latest first (one query). Their ids are negative: no job's."""
    from jobs.models import Job
    from quotas.engine.policy import QueuedView

    window = timedelta(seconds=fc.ARRIVALS_WINDOW_S)
    types = {n.gpu_type for n in snapshot.nodes}
    rows = (
        Job.objects.filter(submitted_at__gte=now - window, submitted_at__lt=now)
        .order_by("-submitted_at")
        .values_list(
            "share_id",
            "submitted_by__username",
            "name",
            "gpu_type",
            "gpus",
            "priority",
            "submitted_at",
            "max_runtime_s",
        )[:ARRIVALS_MAX]
    )
    arrivals = []
    guesses: dict[tuple, rt.Guess] = {}
    for i, (share_id, user, name, gpu_type, gpus, priority, submitted, max_runtime) in enumerate(
        rows, start=1
    ):
        share = share_names.get(share_id)
        if share is None or gpu_type not in types:
            continue
        phantom = -i
        arrivals.append(
            QueuedView(phantom, share, gpu_type, gpus, priority, (submitted + window).timestamp())
        )
        if max_runtime:
            out.runtime[phantom] = float(max_runtime)
            continue
        guess = guesses.get((share, user, name))
        if guess is None:
            guess = guesses[(share, user, name)] = model.guess(share, user, name)
        out.runtime[phantom], out.spread[phantom] = guess.seconds, (guess.low, guess.high)
    return arrivals


def queue_view(
    *,
    targets: Iterable[int] | None = None,
    now: datetime | None = None,
    budget_s: float | None = None,
    max_passes: int | None = None,
    ranges: bool = True,
) -> QueueView:
    """Load the snapshot and forecast the queue. `targets` (job ids) lets the forecast stop as soon as
    those jobs have an ETA; `ranges=False` leaves out the range replays (QueueView.guesses keeps what
    they need, for likely_ranges later). A constant number of queries, whatever the size of the queue."""
    from quotas.scheduler import load_snapshot

    now = now or timezone.now()
    loaded = load_snapshot(now)
    guesses = _guesses(loaded, now)
    options = {"budget_s": budget_s, "max_passes": max_passes} if budget_s else {}
    result = fc.forecast(
        loaded.snapshot,
        runtime_s=guesses.runtime,
        estimates=guesses.estimates,
        grace_s=guesses.grace,
        default_runtime_s=DEFAULT_RUNTIME_S,
        targets=targets,
        spread=guesses.spread if ranges else None,
        arrivals=guesses.arrivals() if ranges else (),
        **options,
    )
    return QueueView(loaded=loaded, forecast=result, guesses=guesses, options=options)


def age_words(at: datetime, now: datetime | None = None) -> str:
    """How long ago, in a few words: "42 s", "3 min", "2 h"."""
    return duration_words(((now or timezone.now()) - at).total_seconds())


def duration_words(seconds: float) -> str:
    """A span in a few words: "42 s", "3 min", "2 h"."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def range_words(low: datetime | None, high: datetime | None, now: datetime | None = None) -> str:
    """A likely range in words, as local clock times: "likely between 14:10 and 16:40"; a day named when
    it is not today ("Tue 09:30"), the full date beyond a week; a start already passed is "now". Empty
    without a range."""
    if low is None or high is None:
        return ""
    now = timezone.localtime(now or timezone.now())
    low = timezone.localtime(low)
    return f"likely between {clock_words(low, now)} and {clock_words(high, now, day=max(low, now).date())}"


def clock_words(t: datetime, now: datetime | None = None, *, day=None) -> str:
    """An instant as a local clock time: "14:10" on `day` (default: today), "Tue 09:30" within the week,
    the full date beyond; "now" once passed. One wording for an ETA and its range."""
    now = timezone.localtime(now or timezone.now())
    t = timezone.localtime(t)
    if t <= now:
        return "now"
    if t.date() == (day or now.date()):
        return f"{t:%H:%M}"
    return f"{t:%a %H:%M}" if (t.date() - now.date()).days < 7 else f"{t:%Y-%m-%d %H:%M}"


def stored_forecast(job):
    """A queued job's stored forecast (QueueForecast), or None (not queued, or not forecast yet)."""
    return getattr(job, "forecast", None) if job.state == "QUEUED" else None


def forecast_fields(job) -> dict:
    """A queued job's stored forecast for a page: position, ETA, its kind and basis, why it waits, and
    the forecast's age. Empty values for a job without one (not queued, or not forecast yet)."""
    f = stored_forecast(job)
    if f is None:
        return {
            "position": None,
            "eta": None,
            "eta_low": None,
            "eta_high": None,
            "range": "",
            "kind": "",
            "basis": "",
            "waiting": "",
            "computed_at": None,
            "age": "",
        }
    low, high = likely_range(f.eta, f.eta_low, f.eta_high)
    return {
        # In words for an estimate only: a bound's range ends at the bound, which its ETA says already.
        "range": range_words(low, high) if f.kind == fc.ESTIMATE else "",
        "position": {"in_share": f.position_in_share, "overall": f.position_overall},
        "eta": f.eta,
        "eta_low": low,
        "eta_high": high,
        "kind": f.kind,
        "basis": f.basis,
        "waiting": f.reason,
        "computed_at": f.computed_at,
        "age": age_words(f.computed_at),
    }


def _track_record(now: datetime) -> None:
    """Keep each newly forecast job's first forecast and fill in the starts since (quotas.track_record).
    The stored forecast is what users wait on: a failure here is logged, never raised."""
    from quotas import track_record

    try:
        with transaction.atomic():  # a savepoint: a failed statement leaves no broken transaction
            track_record.record_first_forecasts(now)
            track_record.mark_started()
    except Exception:
        log.exception("the forecast's track record was not updated after the forecast at %s", now)


# A container job's start waits for its image where its host lacks it (README "Container images"): the
# forecast adds the image's typical pull, the median of its last PULL_SAMPLES pulls, unless every host
# that could run the job is known to have it: an attempt of the image started there within
# PULL_CACHED_TRUST_S (the host's cache drops the least recently used images, so older news is not
# trusted). An image never seen pulled adds nothing: there is no typical pull to add.
PULL_SAMPLES = 20
PULL_CACHED_TRUST_S = 24 * 3600


@dataclass(frozen=True)
class PullAllowance:
    seconds: float
    words: str  # what the ETA's basis says of it


def pull_allowances(now: datetime) -> dict[int, PullAllowance]:
    """Queued container jobs whose start waits for a pull: job id -> the typical pull of its image.
    A few queries, whatever the queue's length: the queued jobs with an image, the recent pulls of
    those images, which hosts ran them lately, the schedulable hosts."""
    from statistics import median

    from gpunodes.choices import SCHEDULABLE_STATES
    from gpunodes.models import Node
    from jobs.choices import JobState
    from jobs.models import Attempt, Job

    jobs = list(
        Job.objects.filter(state=JobState.QUEUED).exclude(image="").values_list("pk", "image", "gpu_type")
    )
    if not jobs:
        return {}
    images = {image for _, image, _ in jobs}
    typical: dict[str, tuple[float, int]] = {}
    for image in images:
        pulls = list(
            # pull_s not null: the attempts the partial index attempt_pulled_idx holds.
            Attempt.objects.filter(job__image=image, pull_s__isnull=False, pull_s__gt=0)
            .order_by("-started_at", "-pk")
            .values_list("pull_s", flat=True)[:PULL_SAMPLES]
        )
        if pulls:
            typical[image] = (median(pulls), len(pulls))
    if not typical:
        return {}
    cached: dict[str, set[str]] = {}
    for image, node in Attempt.objects.filter(
        job__image__in=list(typical),
        pull_s__isnull=False,
        started_at__gte=now - timedelta(seconds=PULL_CACHED_TRUST_S),
    ).values_list("job__image", "nodes__name"):
        if node:
            cached.setdefault(image, set()).add(node)
    hosts: dict[str, set[str]] = {}
    for name, gpu_type in Node.objects.filter(state__in=list(SCHEDULABLE_STATES)).values_list(
        "name", "gpu_type"
    ):
        hosts.setdefault(gpu_type, set()).add(name)
    out: dict[int, PullAllowance] = {}
    for pk, image, gpu_type in jobs:
        if image not in typical:
            continue
        able = hosts.get(gpu_type, set())
        if able and able <= cached.get(image, set()):
            continue  # wherever it runs, the image is there
        seconds, n = typical[image]
        said = f"median of {n} pulls" if n > 1 else "its one pull seen"
        out[pk] = PullAllowance(
            seconds, f"includes pulling image {image}: {duration_words(seconds)} ({said})"
        )
    return out


def _forecast_rows(
    queue: QueueView, now: datetime, carried: Mapping[int, tuple] | None = None
) -> list[tuple]:
    """QueueForecast's rows for every queued job of the forecast made at `now`, as the database takes
    them. A container job's ETA is its start: the policy's admission plus its image's typical pull where
    its host may lack the image (pull_allowances), which its basis says."""
    f = queue.forecast
    pulls = pull_allowances(now)
    tz = timezone.get_current_timezone()
    adapt = connection.ops.adapt_datetimefield_value
    stamp = adapt(now)
    etas: dict[float, object] = {}  # the replay admits in waves: a few dozen distinct instants
    rows = []
    for q in queue.snapshot.queued:
        pos = f.positions.get(q.job_id)
        if pos is None:
            continue

        def stamp_of(t: float | None):
            if t is None:
                return None
            if t not in etas:
                etas[t] = adapt(datetime.fromtimestamp(t, tz=tz))
            return etas[t]

        t = f.eta.get(q.job_id)
        pull = pulls.get(q.job_id)
        basis = f.basis.get(q.job_id) or ""
        if t is not None and pull is not None:
            t += pull.seconds
            # Whole, however long the rest: the ETA says it counts the pull.
            basis = f"{basis[: 400 - len(pull.words) - 2]}; {pull.words}" if basis else pull.words
        if t is None:
            low = high = None
        elif q.job_id in f.ranges:
            low, high = f.ranges[q.job_id]
            if pull is not None:
                low, high = low + pull.seconds, high + pull.seconds
            low, high = stamp_of(low), stamp_of(high)
        else:  # the last ranges found, until the next range replays (the reader widens them to hold t)
            low, high = (carried or {}).get(q.job_id, (None, None))
        rows.append(
            (
                q.job_id,
                pos["in_share"],
                pos["overall"],
                stamp_of(t),
                low,
                high,
                f.kind.get(q.job_id, fc.NONE),
                basis[:400],
                (f.waiting.get(q.job_id) or "")[:400],
                stamp,
            )
        )
    return rows


def forecast_refresh(*, now: datetime | None = None, ranges: bool | None = None) -> dict:
    """Forecast the whole queue and store it (QueueForecast): what the control worker runs after a
    pass. Positions for every queued job; ETAs as far as the replay gets within FORECAST_BUDGET_S;
    likely ranges (two more replays, fc.likely_ranges) in the same refresh where the queue is small
    enough for them to cost little (the point replay took under FORECAST_RANGES_INLINE_S), else in a
    second write after the first, at most every FORECAST_RANGES_INTERVAL_S (the rows in between keep the
    ranges last found). `ranges` forces them (True) or leaves them out (False)."""
    import time as _time

    from django.conf import settings
    from django.core.cache import cache

    started = _time.monotonic()
    now = now or timezone.now()
    # Loading, replaying and writing 100k rows make no reference cycles: the collector's walks over
    # the growing heap are pure overhead here (engine.collector).
    with collector.paused():
        queue = queue_view(now=now, budget_s=settings.FORECAST_BUDGET_S, max_passes=10**9, ranges=False)
        inline = _time.monotonic() - started < settings.FORECAST_RANGES_INLINE_S
        if ranges is None:
            last = float(cache.get(RANGES_AT) or 0)
            due = inline or _time.time() - last >= settings.FORECAST_RANGES_INTERVAL_S
        else:
            due = ranges
        if due and inline:
            queue = _with_ranges(queue)
            rows = _forecast_rows(queue, now)
        else:
            rows = _forecast_rows(queue, now, _stored_ranges())
    _write_forecast(rows)
    point_s = _time.monotonic() - started
    if due and not inline:  # a long queue: its ETAs are stored first, their ranges a few seconds later
        with collector.paused():
            queue = _with_ranges(queue, arrivals=False)
            rows = _forecast_rows(queue, now)
        _write_forecast(rows)
    if due:
        cache.set(RANGES_AT, _time.time(), None)
    _track_record(now)
    return {
        "jobs": len(rows),
        "etas": len(queue.forecast.eta),
        "ranges": len(queue.forecast.ranges),
        "passes": queue.forecast.passes,
        "seconds": round(point_s, 3),
        "with_ranges_s": round(_time.monotonic() - started, 3),
    }


RANGES_AT = "gpuquota:forecast-ranges-at"


def _with_ranges(queue: QueueView, *, arrivals: bool = True) -> QueueView:
    """The ranges, and with `arrivals` the estimates that allow for the work expected to arrive. A long
    queue (its point replay took FORECAST_RANGES_INLINE_S or more) goes without arrivals: its own queue
    decides its starts, and a replay of up to ARRIVALS_MAX more jobs would hold the forecast lock for
    long (bench 5)."""
    from django.conf import settings

    g = queue.guesses
    refined = fc.likely_ranges(
        queue.snapshot,
        queue.forecast,
        runtime_s=g.runtime,
        spread=g.spread,
        arrivals=g.arrivals() if arrivals else (),
        grace_s=g.grace,
        default_runtime_s=DEFAULT_RUNTIME_S,
        **{**(queue.options or {}), "budget_s": settings.FORECAST_RANGES_BUDGET_S},
    )
    return replace(queue, forecast=refined)


def _stored_ranges() -> dict[int, tuple]:
    """The ranges of the stored forecast, as the database gives them back (to write again as they are)."""
    from quotas.models import QueueForecast

    table = QueueForecast._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT job_id, eta_low, eta_high FROM {table} WHERE eta_low IS NOT NULL")
        return {job_id: (low, high) for job_id, low, high in cursor.fetchall()}


def _write_forecast(rows: list[tuple]) -> None:
    """Replace the stored forecast whole, in one transaction (readers see the old one until it commits).
    100k rows through the ORM took ~10 s; COPY (PostgreSQL) or one executemany (SQLite) a fraction.
    A job that ends meanwhile keeps a row until the next forecast; every reader shows a forecast only
    for a job still QUEUED."""
    from quotas.models import QueueForecast

    table = QueueForecast._meta.db_table
    cols = "job_id, position_in_share, position_overall, eta, eta_low, eta_high, kind, basis, reason, computed_at"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        elif rows:
            cursor.executemany(f"INSERT INTO {table} ({cols}) VALUES ({', '.join(['%s'] * 10)})", rows)
