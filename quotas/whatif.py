"""What-if preview of a share change: the last 7 days of real submissions, replayed through the simulator
(quotas.engine.simulate with the production policy: one engine, no copy of a rule), with the shares as they are
and with a proposed change, side by side; and the sweep: one setting of one share over several values.

The scenario is built in memory from the database (quotas.engine.scenario dataclasses; nothing is written):
the registered nodes, every share as configured, and the jobs submitted in the window (up to MAX_JOBS,
the most recent), each needing the run time its latest attempt actually took (a job that never ran
needs its max_runtime_s, or an hour). A cut at the end of the window plus a day.

A run is a handful of replays ("parts": as is / with the change, or one per swept value), each its own
Celery task (quotas.tasks.whatif_replay, on the `whatif` queue) so that they run side by side. A task on
a worker runs its replay in a process of its own (real parallelism beside the control worker's threads;
a replay never holds the GIL a scheduling pass needs). Everything a run knows lives in the cache under
its id: the spec (written once, by the request) and one entry per part (written only by its task:
state, jobs replayed of total, the summary), so the page can poll it. The same request while a run for
it is going shows that run.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import json
import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from quotas.engine import measures, policy, simulate
from quotas.engine import scenario as sc

log = logging.getLogger(__name__)

WINDOW = timedelta(days=7)
MAX_JOBS = 100_000  # the most recent submissions of the window; older ones are left out (and said so)
BUDGET_S = 600.0  # one replay's wall-clock budget; past it the part fails and the page says so
DEFAULT_RUNTIME_S = 3600
TAIL_S = 24 * 3600  # simulated time after the last submission before the replay is cut
REPLAY_TASK = "quotas.tasks.whatif_replay"  # by name: quotas.tasks imports this module
RUN_TTL_S = 3600  # how long a run's spec, progress and result stay in the cache
PROGRESS_EVERY_S = 0.25  # at most this often a replay reports how far it is
PREFIX = "gpuquota:whatif:"
WINDOW_REUSE_S = 300  # runs asked within this of the last one replay its window (figures that compare)
SUMMARY_METRICS = measures.SHARE_METRICS
# The simulator's share settings besides name, team and capacity (strategy, borrow_limit, state, ...).
SCENARIO_SHARE_FIELDS = tuple(f for f in sc.Share.__slots__ if f not in ("name", "team", "capacity"))
EARLY_S = measures.EARLY_S

# Parts' states
QUEUED, READING, REPLAYING, DONE, FAILED = "queued", "reading", "replaying", "done", "failed"


class ReplayTooLong(Exception):
    """A replay ran past BUDGET_S."""


@dataclass
class Preview:
    window_start: datetime
    window_end: datetime
    jobs: int  # replayed
    left_out: int  # submissions in the window beyond MAX_JOBS (oldest first) or fitting no node
    rows: list[dict[str, Any]]  # per share: SUMMARY_METRICS before, after, change
    cluster: list[dict[str, Any]]  # utilisation over the window, waits, pre-emptions, lost, never started
    chart: dict[str, Any]  # plotly-ready grouped bars per share (GPU-hours run, p95 wait)
    never_started: dict[str, list[str]]  # before / after: the jobs that never started, in words
    seconds: float
    groups: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # per group of the tree


# --- the scenario ------------------------------------------------------------------------------------


def build_scenario(
    *, now: datetime | None = None, window: timedelta = WINDOW
) -> tuple[sc.Scenario, int, datetime]:
    """The last 7 days (`window`: the advisor reads 1-4 weeks; from the first submission replayed, if
    later) as a Scenario. Returns (scenario, jobs left out, window start). A constant number of queries,
    whatever the number of jobs."""
    from gpunodes.models import Node
    from jobs.models import Attempt, Job
    from quotas.models import Share

    now = now or timezone.now()
    start = now - window
    days = window.days  # `window` names the submissions' queryset below
    nodes = tuple(
        sc.Node(name=name, gpu_type=gpu_type, gpus=n)
        for name, gpu_type, n in Node.objects.annotate(n=Count("gpus"))
        .filter(n__gt=0)
        .order_by("name")
        .values_list("name", "gpu_type", "n")
    )
    columns = [f for f in SCENARIO_SHARE_FIELDS if f in {c.name for c in Share._meta.concrete_fields}]

    def value(share, f):  # a share's group by name, as the scenario names it (the organisation tree)
        if f == "group":
            return share.group.name if share.group_id else None
        return getattr(share, f)

    shares = tuple(
        scenario_share(
            s.name, s.team.slug, {"capacity": s.capacity_map(), **{f: value(s, f) for f in columns}}
        )
        for s in Share.objects.select_related("team", "group").prefetch_related("capacities").order_by("name")
    )
    window = Job.objects.filter(submitted_at__gte=start, submitted_at__lte=now)
    total = window.count()
    rows = list(
        window.order_by("-submitted_at", "-id").values_list(
            "pk",
            "share__name",
            "submitted_at",
            "gpu_type",
            "gpus",
            "priority",
            "max_preemptions",
            "preemption_grace_s",
            "max_runtime_s",
        )[:MAX_JOBS]
    )
    rows.reverse()
    if rows:
        # A young cluster: the window starts at its first submission, not days before it had any work
        # (idle days it never lived would dilute the utilisation).
        start = max(start, rows[0][2])
    ran: dict[int, int] = {}
    saves: dict[int, tuple[int, bool]] = {}  # job -> (checkpoint every s, saves when told to stop)
    # The window's attempts by a join, not an IN list of up to 100k ids; the latest attempt wins.
    for job_id, started, ended, last_checkpoint, checkpoints, stop_asked in (
        Attempt.objects.filter(
            job__submitted_at__gte=start, job__submitted_at__lte=now, started_at__isnull=False
        )
        .order_by("job_id", "number")
        .values_list(
            "job_id", "started_at", "ended_at", "last_checkpoint_at", "checkpoints", "stop_requested_at"
        )
    ):
        ran[job_id] = max(1, int(((ended or now) - started).total_seconds()))
        if checkpoints and last_checkpoint is not None and last_checkpoint > started:
            # The job checkpoints as its hosts saw it: on average every (last - start) / count, and, if
            # its last one came after it was told to stop, on stop too (the scenario's own terms).
            every = max(1, int((last_checkpoint - started).total_seconds() / checkpoints))
            saves[job_id] = (every, stop_asked is not None and last_checkpoint >= stop_asked)
    sizes: dict[str, int] = {}
    for n in nodes:
        sizes[n.gpu_type] = max(sizes.get(n.gpu_type, 0), n.gpus)
    count = {t: sum(1 for n in nodes if n.gpu_type == t and n.gpus == sizes[t]) for t in sizes}
    jobs = []
    for pk, share, submitted, gpu_type, gpus, prio, max_pre, grace, max_rt in rows:
        largest = sizes.get(gpu_type)
        if not largest or (gpus > largest and (gpus % largest or gpus // largest > count[gpu_type])):
            continue  # no node of the cluster as it is now could hold it
        duration = ran.get(pk) or max_rt or DEFAULT_RUNTIME_S
        jobs.append(
            sc.Job(
                id=str(pk),
                share=share,
                submit_at=max(0, int((submitted - start).total_seconds())),
                duration_s=duration,
                gpus=gpus,
                gpu_type=gpu_type,
                priority=prio,
                max_preemptions=max_pre,
                preemption_grace_s=grace,
                max_runtime_s=max_rt if max_rt and max_rt >= duration else None,
                checkpoint_every_s=saves[pk][0] if pk in saves else None,
                checkpoint_on_stop=saves[pk][1] if pk in saves else False,
            )
        )
    last = max((j.submit_at for j in jobs), default=0)
    tree = tree_of()
    scenario = sc.Scenario(
        settings=sc.Settings(tick_s=1, until_s=last + TAIL_S, **tree["settings"]),
        nodes=nodes,
        groups=tree["groups"],
        shares=shares,
        jobs=tuple(jobs),
        description=f"last {days} days of submissions",
    )
    return scenario, total - len(jobs), start


def tree_of(groups=None, settings=None) -> dict[str, Any]:
    """The organisation tree as the simulator takes it (scenario groups, fair-sharing settings): the
    live one, or a planned layout's (its document's `groups` and `settings` entries)."""
    from quotas import fairshare
    from quotas.models import FairSharing

    if groups is None:
        groups = [
            {
                "name": g.name,
                "parent": g.parent,
                "weight": g.weight,
                "borrow_limit": g.borrow_limit,
                "lend_limit": g.lend_limit,
            }
            for g in fairshare.groups()
        ]
    if settings is None:
        fair = FairSharing.current()
        settings = {"fair_share_half_life_s": fair.fair_share_half_life_s, "fair_reclaim": fair.fair_reclaim}
    return {
        "groups": tuple(sc.Group(**g) for g in groups),
        "settings": {k: settings[k] for k in ("fair_share_half_life_s", "fair_reclaim") if k in settings},
    }


def with_change(scenario: sc.Scenario, share: str, changes: Mapping[str, Any]) -> sc.Scenario:
    """The scenario with one share's settings replaced (strategy, borrow_limit, in_share_preemption,
    capacity); a new share (not in the scenario) is added."""
    allowed = {"strategy", "borrow_limit", "in_share_preemption", "min_runtime_s", "capacity", "team"}
    changes = {k: v for k, v in changes.items() if k in allowed and v is not None}
    if "capacity" in changes:
        changes["capacity"] = dict(changes["capacity"])
    shares = []
    found = False
    for s in scenario.shares:
        if s.name == share:
            s = dataclasses.replace(s, **changes)
            found = True
        shares.append(s)
    if not found:
        shares.append(sc.Share(name=share, team=str(changes.pop("team", "new")), **changes))
    return dataclasses.replace(scenario, shares=tuple(shares))


def scenario_share(name: str, team: str, values: Mapping[str, Any]) -> sc.Share:
    """A share as the simulator takes it, from a layout's values (those the simulator knows)."""
    capacity = {t: n for t, n in (values.get("capacity") or {}).items() if n}
    return sc.Share(
        name=name,
        team=team,
        capacity=dict(sorted(capacity.items())),
        **{f: values[f] for f in SCENARIO_SHARE_FIELDS if f in values},
    )


def with_layout(scenario: sc.Scenario, variant: Mapping[str, Any]) -> tuple[sc.Scenario, int]:
    """The scenario with a planned layout (quotas.layout.whatif_variant): every share as planned, the
    jobs of a renamed share under its new name, those of a share left out dropped (returned: how
    many), and each temporary change going back `after_s` into the replay (an update_share event, the
    simulator's own format for a change of a share)."""
    shares = tuple(scenario_share(s["name"], s["team"], s) for s in variant["shares"])
    names = {s.name for s in shares}
    renames = variant.get("renames") or {}
    jobs, dropped = [], 0
    for job in scenario.jobs:
        share = renames.get(job.share, job.share)
        if share not in names:
            dropped += 1
            continue
        jobs.append(job if share == job.share else dataclasses.replace(job, share=share))
    events = list(scenario.events)
    until = scenario.settings.until_s
    for revert in variant.get("reverts") or ():
        if until is not None and revert["after_s"] >= until:
            continue  # it outlasts the replay: the whole replay has the change
        values = revert["set"]
        update = {f: values[f] for f in SCENARIO_SHARE_FIELDS if f in values}
        update["capacity"] = {t: n for t, n in sorted((values.get("capacity") or {}).items()) if n}
        events.append(
            sc.Event(at=int(revert["after_s"]), kind=sc.UPDATE_SHARE, share=revert["share"], set=update)
        )
    events.sort(key=lambda e: e.at)
    extra: dict[str, Any] = {}
    if "groups" in variant:  # the planned tree and fair-sharing settings (quotas.layout.whatif_variant)
        tree = tree_of(variant["groups"], variant.get("settings") or {})
        extra["groups"] = tree["groups"]
        extra["settings"] = dataclasses.replace(scenario.settings, **tree["settings"])
    replayed = dataclasses.replace(scenario, shares=shares, jobs=tuple(jobs), events=tuple(events), **extra)
    return replayed, dropped


def pending_reverts(now: datetime) -> list[dict[str, Any]]:
    """The temporary changes applied and still to go back (TemporaryChange PENDING), as the replays take
    them: {"share" (its name now), "after_s" (as long into the replay as it lasts from now), "fields"
    ({path: [before, after]})}. Every variant, "as is" included, has them: the layout as it is now
    goes back by itself (the "as is" replay kept the change for the whole week)."""
    from quotas.models import TemporaryChange, TemporaryState

    out = []
    for change in (
        TemporaryChange.objects.filter(state=TemporaryState.PENDING, until__gt=now)
        .select_related("share")
        .order_by("until", "pk")
    ):
        name = change.share.name if change.share is not None else change.share_name
        seconds = math.ceil((change.until - now).total_seconds())
        out.append({"share": name, "after_s": max(1, seconds), "fields": dict(change.fields)})
    return out


def with_pending_reverts(scenario: sc.Scenario, pending: Sequence[Mapping[str, Any]]) -> sc.Scenario:
    """The scenario with each pending temporary change going back at its time: an update_share event
    that sets back each field still holding the value the change gave it, as the revert itself does
    (quotas.layout), in whatever the variant made of the share."""
    shares = {s.name: s for s in scenario.shares}
    until = scenario.settings.until_s
    events = list(scenario.events)
    for revert in pending:
        share = shares.get(revert["share"])
        if share is None or (until is not None and revert["after_s"] >= until):
            continue  # a share the variant removes, or a change that outlasts the replay
        capacity = dict(share.capacity)
        update: dict[str, Any] = {}
        for path, (before, after) in revert["fields"].items():
            if path.startswith("capacity."):
                gpu_type = path.split(".", 1)[1]
                if capacity.get(gpu_type, 0) == (after or 0):
                    capacity[gpu_type] = before or 0
                    update["capacity"] = {t: n for t, n in sorted(capacity.items()) if n}
            elif path in SCENARIO_SHARE_FIELDS and getattr(share, path) == after:
                update[path] = before
        if update:
            events.append(
                sc.Event(at=int(revert["after_s"]), kind=sc.UPDATE_SHARE, share=share.name, set=update)
            )
    events.sort(key=lambda e: e.at)
    return dataclasses.replace(scenario, events=tuple(events))


def window_seconds(scenario: sc.Scenario, start: datetime, now: datetime) -> float:
    """How much of the replay the figures cover: from the first submission to now, or, if later, to
    when the last job could have ended had it started at once (a young cluster's jobs outlive its short
    history). Never the replay's cut: a job that never starts does not stretch it. The same for every
    variant of a run (it is read from the scenario as it is)."""
    ends = (j.submit_at + j.duration_s for j in scenario.jobs)
    return max((now - start).total_seconds(), max(ends, default=0))


def scenario_digest(scenario: sc.Scenario, window_s: float) -> str:
    """A digest of everything a replay's summary depends on (the scenario, the window), stable across
    processes; equal scenarios built by different paths (a plan, a sweep value) digest alike."""

    def share(s: sc.Share) -> tuple:
        return (
            s.name,
            s.team,
            tuple(sorted(s.capacity.items())),
            *(getattr(s, f) for f in SCENARIO_SHARE_FIELDS),
        )

    def event(e: sc.Event) -> tuple:
        values = {
            k: tuple(sorted(v.items())) if isinstance(v, Mapping) else v for k, v in dict(e.set).items()
        }
        return (e.at, e.kind, e.job, e.share, tuple(sorted(values.items())))

    text = repr(
        (
            scenario.settings,
            scenario.nodes,
            tuple(share(s) for s in sorted(scenario.shares, key=lambda s: s.name)),
            scenario.jobs,
            tuple(event(e) for e in scenario.events),
            round(window_s, 3),
        )
    )
    if scenario.groups:  # the tree decides too; a flat scenario digests as before
        text += repr(tuple(sorted(scenario.groups, key=lambda g: g.name)))
    return hashlib.sha256(text.encode()).hexdigest()


def window_end(now: datetime | None = None) -> datetime:
    """The end of the window a run replays: now, or the last run's end when that was less than
    WINDOW_REUSE_S ago (so that runs asked together replay the same week and their figures compare)."""
    from django.core.cache import cache

    now = now or timezone.now()
    key = f"{PREFIX}window"
    held = cache.get(key)
    if held:
        end = datetime.fromisoformat(held)
        if 0 <= (now - end).total_seconds() < WINDOW_REUSE_S:
            return end
    cache.set(key, now.isoformat(), WINDOW_REUSE_S)
    return now


# --- one replay --------------------------------------------------------------------------------------


def replay(
    scenario: sc.Scenario,
    *,
    window_s: float,
    on_progress: Callable[[int], None] | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """Simulate the scenario with the production policy; the summary the pages compare, over the first
    `window_s` seconds (the real week it stands for). `on_progress` hears how many of the scenario's
    jobs have been submitted in the replay (at most every PROGRESS_EVERY_S); past `budget_s` (default
    BUDGET_S) it raises ReplayTooLong."""
    budget = BUDGET_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    submits = sorted(j.submit_at for j in scenario.jobs)
    last = [0.0]

    # Before each pass the simulator says its virtual time: how many submissions the replay has reached.
    def on_pass(now: float) -> None:
        wall = time.monotonic()
        if wall > deadline:
            raise ReplayTooLong(f"the replay took longer than {budget:.0f} s")
        if on_progress is not None and wall - last[0] >= PROGRESS_EVERY_S:
            last[0] = wall
            on_progress(bisect.bisect_right(submits, now))

    if time.monotonic() > deadline:
        raise ReplayTooLong(f"the replay took longer than {budget:.0f} s")
    result = simulate.simulate(scenario, on_pass=on_pass)
    summary = measures.summary(scenario, result, window_s)
    if result.groups:  # per group of the tree: GPU-hours taken from and lent outside it (issue 37)
        summary["groups"] = {
            name: {
                "gpu_hours_from_outside": round(g.get("gpu_seconds_from_outside", 0) / 3600, 1),
                "gpu_hours_lent_outside": round(g.get("gpu_seconds_lent_outside", 0) / 3600, 1),
            }
            for name, g in sorted(result.groups.items())
        }
    return summary


def _replay_child(conn, scenario: sc.Scenario, window_s: float, budget_s: float) -> None:
    """In the replay's own process: progress and the summary go back through the pipe."""
    try:
        summary = replay(
            scenario, window_s=window_s, on_progress=lambda n: conn.send(("progress", n)), budget_s=budget_s
        )
        conn.send(("done", summary))
    except ReplayTooLong as e:
        conn.send(("too_long", str(e)))
    except Exception as e:  # said to the parent, which records the part as failed
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


def _replay_context():
    """Where replay processes come from: a fork server that imported this module once (started at the
    first replay, single-threaded, kept while the worker lives), so that a replay starts in
    milliseconds; a fresh interpreter per replay ("spawn": 1.5-2 s to the first pass on the shared
    2-core VM, a third of a 5 s what-if) where a platform has no fork server."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def replay_isolated(
    scenario: sc.Scenario,
    *,
    window_s: float,
    on_progress: Callable[[int], None] | None = None,
    budget_s: float | None = None,
) -> dict[str, Any]:
    """`replay` in a process of its own (never a fork of the worker, whose threads are not forked)."""
    budget = BUDGET_S if budget_s is None else budget_s
    ctx = _replay_context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_replay_child, args=(child, scenario, window_s, budget), daemon=True)
    proc.start()
    child.close()
    try:
        deadline = time.monotonic() + budget + 60
        while True:
            if parent.poll(1.0):
                try:
                    kind, value = parent.recv()
                except EOFError:
                    raise RuntimeError(
                        f"the replay process ended without an answer ({proc.exitcode})"
                    ) from None
                if kind == "progress":
                    if on_progress is not None:
                        on_progress(value)
                elif kind == "done":
                    return value
                elif kind == "too_long":
                    raise ReplayTooLong(value)
                else:
                    raise RuntimeError(value)
            elif not proc.is_alive():
                raise RuntimeError(f"the replay process died (exit code {proc.exitcode})")
            elif time.monotonic() > deadline:
                raise ReplayTooLong(f"the replay took longer than {budget:.0f} s")
    finally:
        parent.close()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)


# --- comparing replays -------------------------------------------------------------------------------


def _delta(a, b):
    if isinstance(a, int | float) and isinstance(b, int | float):
        return round(b - a, 1) if isinstance(a, float) or isinstance(b, float) else b - a
    return None


CLUSTER_LABELS = (
    ("utilisation", "utilisation over the replayed window (%)"),
    ("wait_p50_s", "wait p50, every job (s)"),
    ("wait_p95_s", "wait p95, every job (s)"),
    ("preemptions", "pre-emptions"),
    ("early_preemptions", f"of them within {EARLY_S // 60} min of their start"),
    ("lost_gpu_hours", "GPU-hours of work lost to pre-emption"),
    ("owner_wait_p95_s", "owners' p95 wait for reclaimed GPUs (s)"),
    ("never_started", "jobs never started (counted as waiting until the cut)"),
    ("refused", "jobs refused (share DISABLED)"),
)


def compare(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    changed: Sequence[str] = (),
    renames: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Two summaries side by side: rows per share (under its new name when `renames` renames it) with
    each of SUMMARY_METRICS before, after and the change, and its waits by priority; the cluster's
    figures; the jobs that never started, in words; the charts' data."""
    renames = dict(renames or {})
    before_shares = {renames.get(name, name): v for name, v in before["shares"].items()}
    names = sorted(set(before_shares) | set(after["shares"]))
    rows = []
    for name in names:
        b, a = before_shares.get(name, {}), after["shares"].get(name, {})
        row: dict[str, Any] = {
            "share": name,
            "changed": name in changed,
            "renamed_from": next((old for old, new in renames.items() if new == name), None),
            "added": name not in before_shares,
            "removed": name not in after["shares"],
        }
        for metric in SUMMARY_METRICS:
            row[metric] = (b.get(metric), a.get(metric), _delta(b.get(metric), a.get(metric)))
        priorities = sorted(
            set(b.get("by_priority", {})) | set(a.get("by_priority", {})), key=lambda p: -int(p)
        )
        row["by_priority"] = [
            {
                "priority": p,
                "before": b.get("by_priority", {}).get(p),
                "after": a.get("by_priority", {}).get(p),
            }
            for p in priorities
        ]
        rows.append(row)
    tb, ta = before["cluster"], after["cluster"]
    cluster = [
        {
            "metric": label,
            "before": tb.get(key),
            "after": ta.get(key),
            "change": _delta(tb.get(key), ta.get(key)),
        }
        for key, label in CLUSTER_LABELS
    ]
    chart = {
        "shares": names,
        "before": [before_shares.get(n, {}).get("gpu_hours_run") or 0 for n in names],
        "after": [after["shares"].get(n, {}).get("gpu_hours_run") or 0 for n in names],
        "y_title": "GPU-hours run in the replayed window",
        "waits": {
            "shares": names,
            "before": [before_shares.get(n, {}).get("wait_p95_s") or 0 for n in names],
            "after": [after["shares"].get(n, {}).get("wait_p95_s") or 0 for n in names],
            "y_title": "p95 wait (s)",
        },
    }
    groups_before, groups_after = before.get("groups") or {}, after.get("groups") or {}
    group_rows = [
        {
            "group": name,
            **{
                key: (
                    groups_before.get(name, {}).get(key),
                    groups_after.get(name, {}).get(key),
                    _delta(groups_before.get(name, {}).get(key), groups_after.get(name, {}).get(key)),
                )
                for key in ("gpu_hours_from_outside", "gpu_hours_lent_outside")
            },
        }
        for name in sorted(set(groups_before) | set(groups_after))
    ]
    return {
        "rows": rows,
        "groups": group_rows,  # per group of the tree, before and after (issue 37)
        "cluster": cluster,
        "chart": chart,
        "never_started": {"before": before.get("never_started", []), "after": after.get("never_started", [])},
    }


def sweep_table(summaries: Sequence[Mapping[str, Any]], labels: Sequence[str], share: str) -> dict[str, Any]:
    """One row per swept value: the share's waits (never-started jobs counted), pre-emptions and GPU-hours,
    the cluster's utilisation over the window; and the trade-off chart's data (the share's p95 wait
    and the utilisation per value). The same figures as a what-if of that value (one summary)."""
    rows = []
    for label, s in zip(labels, summaries, strict=True):
        mine = s["shares"].get(share, {})
        rows.append(
            {
                "value": label,
                "p95_wait_s": mine.get("wait_p95_s"),
                "p50_wait_s": mine.get("wait_p50_s"),
                "preemptions": mine.get("preemptions"),
                "gpu_hours_run": mine.get("gpu_hours_run"),
                "never_started": mine.get("never_started"),
                "utilisation": s["cluster"]["utilisation"],
                "never_started_words": [w for w in s.get("never_started", []) if f" of {share} " in w],
                "lost_gpu_hours": mine.get("lost_gpu_hours"),
                "cluster_lost_gpu_hours": s["cluster"].get("lost_gpu_hours"),
                "early_preemptions": s["cluster"].get("early_preemptions"),
                "owner_wait_p95_s": s["cluster"].get("owner_wait_p95_s"),
            }
        )
    chart = {
        "share": share,
        "values": list(labels),
        "p95_wait_s": [r["p95_wait_s"] for r in rows],
        "utilisation": [r["utilisation"] for r in rows],
        # The protection window's trade-off (drawn for a min_runtime_s sweep): work thrown away by
        # pre-emption against the owners' p95 wait for reclaimed GPUs.
        "lost_gpu_hours": [r["cluster_lost_gpu_hours"] for r in rows],
        "owner_wait_p95_s": [r["owner_wait_p95_s"] for r in rows],
    }
    return {"rows": rows, "chart": chart}


def preview(*, share: str, changes: Mapping[str, Any], now: datetime | None = None) -> Preview:
    """The comparison in this process, without Celery (the shell, tests): both replays one after the
    other. Raises ReplayTooLong past the budget."""
    t0 = time.perf_counter()
    now = now or timezone.now()
    base, left_out, start = build_scenario(now=now)
    window_s = window_seconds(base, start, now)
    before = replay(base, window_s=window_s)
    after = replay(with_change(base, share, changes), window_s=window_s)
    table = compare(before, after, [share])
    return Preview(
        window_start=start,
        window_end=now,
        jobs=len(base.jobs),
        left_out=left_out,
        seconds=round(time.perf_counter() - t0, 2),
        **table,
    )


# --- runs: a request's replays as Celery tasks, their progress and results in the cache --------------


@dataclass
class RunStatus:
    """What the page shows of a run: its spec, each part's state and progress, the result when done."""

    id: str
    kind: str  # "preview" or "sweep"
    share: str
    spec: dict[str, Any]
    parts: list[dict[str, Any]]

    @property
    def labels(self) -> list[str]:
        return [v["label"] for v in self.spec["variants"]]

    @property
    def finished(self) -> bool:
        return all(p["state"] in (DONE, FAILED) for p in self.parts)

    @property
    def labelled_parts(self) -> list[tuple[str, dict[str, Any]]]:
        return list(zip(self.labels, self.parts, strict=True))

    @property
    def failed(self) -> list[tuple[str, str]]:
        """(label, why) of each part that failed."""
        return [(label, p["error"]) for label, p in self.labelled_parts if p["state"] == FAILED]

    @property
    def errors(self) -> list[str]:
        """Why parts failed, each reason once."""
        return list(dict.fromkeys(error for _, error in self.failed))

    @property
    def done_jobs(self) -> int:
        return sum(p.get("done") or 0 for p in self.parts)

    @property
    def total_jobs(self) -> int | None:
        totals = [p.get("total") for p in self.parts]
        return None if None in totals else sum(totals)

    @property
    def percent(self) -> int:
        """How far the run is: each part's share of its jobs replayed, averaged over the parts."""
        fractions = [
            1.0
            if p["state"] in (DONE, FAILED)
            else (p.get("done") or 0) / p["total"]
            if p.get("total")
            else 0.0
            for p in self.parts
        ]
        return min(100, int(100 * sum(fractions) / len(fractions)))

    @property
    def window(self) -> dict[str, Any] | None:
        """jobs replayed per part, left out, window start and end and its length in seconds (from the first
        part that read it)."""
        for p in self.parts:
            if p.get("total") is not None:
                start, end = (
                    datetime.fromisoformat(p["window_start"]),
                    datetime.fromisoformat(self.spec["now"]),
                )
                return {
                    "length_s": max(0.0, (end - start).total_seconds()),
                    "jobs": p["total"],
                    "left_out": p.get("left_out", 0),
                    "dropped": max((q.get("dropped") or 0) for q in self.parts),
                    "start": start,
                    "end": end,
                    # The plan's own temporary changes, then those applied already and still to go back.
                    "reverts": [*self.spec.get("reverts", []), *p.get("pending", [])],
                }
        return None

    @property
    def seconds(self) -> float | None:
        """Wall-clock seconds from the request to the last part's answer."""
        if not self.finished:
            return None
        ends = [p.get("ended") or 0 for p in self.parts]
        return round(max(ends) - self.spec["created"], 1)

    @property
    def result(self) -> dict[str, Any] | None:
        if not self.finished or self.failed:
            return None
        summaries = [p["summary"] for p in self.parts]
        if self.kind == "preview":
            return compare(summaries[0], summaries[1], [self.share])
        if self.kind == "layout":
            result = compare(
                summaries[0], summaries[1], self.spec.get("changed", ()), self.spec.get("renames")
            )
            for chart in (result["chart"], result["chart"]["waits"]):
                chart["after_label"] = "simulated, with the plan"
            return result
        return sweep_table(summaries, self.labels, self.share)


def _run_key(run_id: str) -> str:
    return f"{PREFIX}run:{run_id}"


def _part_key(run_id: str, index: int) -> str:
    return f"{PREFIX}run:{run_id}:part:{index}"


def status(run_id: str) -> RunStatus | None:
    from django.core.cache import cache

    spec = cache.get(_run_key(run_id))
    if spec is None:
        return None
    keys = [_part_key(run_id, i) for i in range(len(spec["variants"]))]
    got = cache.get_many(keys)
    parts = [got.get(k) or {"state": QUEUED} for k in keys]
    return RunStatus(id=run_id, kind=spec["kind"], share=spec["share"], spec=spec, parts=parts)


def start(
    *,
    kind: str,
    share: str,
    variants: Sequence[Mapping[str, Any]],
    now: datetime | None = None,
    setting_label: str = "",
    extra: Mapping[str, Any] | None = None,
) -> str:
    """Start a run of `variants` ({"label", "changes"} each: one replay per variant) for `share`, or
    return the id of the same request's run while it is still going. Each replay is its own task.
    `changes` is one share's settings, or {"layout": a planned layout} (with_layout)."""
    from django.core.cache import cache

    fingerprint = hashlib.sha256(
        json.dumps([kind, share, list(variants), extra], sort_keys=True, default=str).encode()
    ).hexdigest()[:32]
    request_key = f"{PREFIX}request:{fingerprint}"
    running = cache.get(request_key)
    if running and (st := status(running)) is not None and not st.finished:
        return running
    run_id = uuid.uuid4().hex
    spec = {
        "kind": kind,
        "share": share,
        "variants": [{"label": str(v["label"]), "changes": dict(v["changes"])} for v in variants],
        "setting_label": setting_label,
        "now": (now or window_end()).isoformat(),
        "created": time.time(),
        **(extra or {}),
    }
    cache.set(_run_key(run_id), spec, RUN_TTL_S)
    cache.set(request_key, run_id, RUN_TTL_S)
    for index in range(len(variants)):
        _enqueue(run_id, index)
    return run_id


def _enqueue(run_id: str, index: int) -> None:
    send_replay(REPLAY_TASK, run_id, index)


def send_replay(task: str, run_id: str, index: int) -> None:
    """Ask for one replay of a run by task name (on the `whatif` queue; the what-if's and the advisor's);
    eager Celery (tests) runs it here."""
    from config.celery import WHATIF_QUEUE, app

    kwargs = {"run_id": run_id, "index": index}
    if app.conf.task_always_eager:
        app.tasks[task].apply(kwargs=kwargs)
    else:
        app.send_task(task, kwargs=kwargs, queue=WHATIF_QUEUE)


def start_preview(*, share: str, changes: Mapping[str, Any]) -> str:
    return start(
        kind="preview",
        share=share,
        variants=[{"label": "as is", "changes": {}}, {"label": "with the change", "changes": changes}],
    )


def start_layout(
    *, variant: Mapping[str, Any], changed: Sequence[str], renames: Mapping[str, str] | None = None
) -> str:
    """Last week replayed as is and with a planned layout (quotas.layout), side by side."""
    reverts = [{"share": r["share"], "after_s": r["after_s"]} for r in variant.get("reverts", ())]
    return start(
        kind="layout",
        share="",
        variants=[
            {"label": "as is", "changes": {}},
            {"label": "with the plan", "changes": {"layout": dict(variant)}},
        ],
        extra={"changed": list(changed), "renames": dict(renames or {}), "reverts": reverts},
    )


def start_sweep(
    *, share: str, setting: str, values: Sequence[Any], labels: Sequence[str], setting_label: str = ""
) -> str:
    """One replay per value of `setting` ("strategy", "borrow_limit", "min_runtime_s" or "capacity:<gpu
    type>") of an existing share; the other settings stay as they are."""
    from quotas.models import Share

    variants = []
    for value, label in zip(values, labels, strict=True):
        if setting.startswith("capacity:"):
            capacity = Share.objects.get(name=share).capacity_map()
            capacity[setting.split(":", 1)[1]] = value
            changes: dict[str, Any] = {"capacity": {t: n for t, n in capacity.items() if n}}
        else:
            changes = {setting: value}
            if setting == "strategy" and value != policy.LEND_AND_BORROW:
                changes["borrow_limit"] = -1  # only a LEND_AND_BORROW share has a borrow limit
        variants.append({"label": label, "changes": changes})
    return start(kind="sweep", share=share, variants=variants, setting_label=setting_label or setting)


def run_part(run_id: str, index: int, *, isolated: bool) -> str:
    """One replay of a run (the task's body): read the window, apply the variant, replay, store the
    summary under the part's key. Idempotent: a part that has an answer is not replayed again."""
    from django.core.cache import cache

    spec = cache.get(_run_key(run_id))
    if spec is None or index >= len(spec["variants"]):
        return "unknown run"
    key = _part_key(run_id, index)
    part = cache.get(key) or {"state": QUEUED}
    if part["state"] in (DONE, FAILED):
        return part["state"]
    t0 = time.monotonic()
    part = {"state": READING, "done": 0, "total": None}
    cache.set(key, part, RUN_TTL_S)
    try:
        now = datetime.fromisoformat(spec["now"])
        scenario, left_out, window_start = build_scenario(now=now)
        window_s = window_seconds(scenario, window_start, now)
        changes = spec["variants"][index]["changes"]
        dropped = 0
        if "layout" in changes:
            scenario, dropped = with_layout(scenario, changes["layout"])
        elif changes:
            scenario = with_change(scenario, spec["share"], changes)
        pending = pending_reverts(now)
        scenario = with_pending_reverts(scenario, pending)
        part.update(
            pending=[{"share": r["share"], "after_s": r["after_s"]} for r in pending],
            state=REPLAYING,
            total=len(scenario.jobs),
            left_out=left_out,
            dropped=dropped,
            window_start=window_start.isoformat(),
        )
        cache.set(key, part, RUN_TTL_S)

        def progress(done: int) -> None:
            part["done"] = done
            cache.set(key, part, RUN_TTL_S)

        # The same scenario over the same window replays the same: a run asked again, or the as-is
        # replay of every plan of the same window, is read back instead (the engine is deterministic).
        replay_key = f"{PREFIX}replay:{scenario_digest(scenario, window_s)}"
        summary = cache.get(replay_key)
        if summary is None:
            summary = (replay_isolated if isolated else replay)(
                scenario, window_s=window_s, on_progress=progress
            )
            cache.set(replay_key, summary, RUN_TTL_S)
        else:
            part["reused"] = True
        part.update(state=DONE, done=part["total"], summary=summary)
    except ReplayTooLong as e:
        part.update(state=FAILED, error=str(e))
    except Exception as e:
        log.exception("what-if replay %s/%s failed", run_id, index)
        part.update(state=FAILED, error=f"the replay failed ({type(e).__name__}: {e})")
    part.update(ended=time.time(), seconds=round(time.monotonic() - t0, 2))
    cache.set(key, part, RUN_TTL_S)
    return part["state"]
