"""What-if preview of a share change: the last 7 days of real submissions, replayed through the simulator
twice (the shares as they are, and with the proposed change), side by side.

The scenario is built in memory from the database (quotas.scenario dataclasses; nothing is written):
the registered nodes, every share as configured, and the jobs submitted in the window, each needing the
run time its latest attempt actually took (a job that never ran needs its max_runtime_s, or an hour).
The replay is bounded: at most MAX_JOBS jobs (the most recent), a cut at the end of the window plus a
day, and a wall-clock budget for both runs (past it the preview says so instead of answering late);
the page says when jobs were left out.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.utils import timezone

from quotas import policy, simulate
from quotas import scenario as sc

WINDOW = timedelta(days=7)
MAX_JOBS = 500
BUDGET_S = 10.0  # both replays together
DEFAULT_RUNTIME_S = 3600
TAIL_S = 24 * 3600  # simulated time after the last submission before the replay is cut


class ReplayTooLong(Exception):
    """The replays ran past BUDGET_S."""


def _bounded_planner(deadline: float):
    def planner(snapshot):
        if time.monotonic() > deadline:
            raise ReplayTooLong(f"the replay took longer than {BUDGET_S:.0f} s")
        return policy.plan(snapshot)

    return planner


@dataclass
class Preview:
    window_start: datetime
    window_end: datetime
    jobs: int  # replayed
    left_out: int  # submissions in the window beyond MAX_JOBS (oldest first) or fitting no node
    rows: list[dict[str, Any]]  # per share: mean/p95 wait, pre-empted jobs, GPU-seconds, before and after
    cluster: list[dict[str, Any]]  # utilisation, pre-emptions, lost GPU-seconds, never started
    chart: dict[str, Any]  # plotly-ready grouped bars of mean wait per share
    seconds: float


def build_scenario(*, now: datetime | None = None) -> tuple[sc.Scenario, int, datetime]:
    """The last 7 days (from the first submission replayed, if later) as a Scenario. Returns (scenario,
    jobs left out, window start)."""
    from gpunodes.models import Node
    from jobs.models import Attempt, Job
    from quotas.models import Share

    now = now or timezone.now()
    start = now - WINDOW
    nodes = tuple(
        sc.Node(name=name, gpu_type=gpu_type, gpus=n)
        for name, gpu_type, n in Node.objects.annotate(n=Count("gpus"))
        .filter(n__gt=0)
        .order_by("name")
        .values_list("name", "gpu_type", "n")
    )
    shares = tuple(
        sc.Share(
            name=s.name,
            team=s.team.slug,
            capacity=s.capacity_map(),
            strategy=s.strategy,
            borrow_limit=s.borrow_limit,
            in_share_preemption=s.in_share_preemption,
        )
        for s in Share.objects.select_related("team").prefetch_related("capacities").order_by("name")
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
    for job_id, started, ended in (
        Attempt.objects.filter(job_id__in=[r[0] for r in rows], started_at__isnull=False)
        .order_by("job_id", "number")
        .values_list("job_id", "started_at", "ended_at")
    ):
        ran[job_id] = max(1, int(((ended or now) - started).total_seconds()))  # the latest attempt wins
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
            )
        )
    last = max((j.submit_at for j in jobs), default=0)
    scenario = sc.Scenario(
        settings=sc.Settings(tick_s=1, until_s=last + TAIL_S),
        nodes=nodes,
        shares=shares,
        jobs=tuple(jobs),
        description="last 7 days of submissions",
    )
    return scenario, total - len(jobs), start


def with_change(scenario: sc.Scenario, share: str, changes: Mapping[str, Any]) -> sc.Scenario:
    """The scenario with one share's settings replaced (strategy, borrow_limit, in_share_preemption,
    capacity); a new share (not in the scenario) is added."""
    allowed = {"strategy", "borrow_limit", "in_share_preemption", "capacity", "team"}
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


def _delta(a, b):
    if isinstance(a, int | float) and isinstance(b, int | float):
        return b - a
    return None


def preview(*, share: str, changes: Mapping[str, Any], now: datetime | None = None) -> Preview:
    """Replay the window with the shares as they are and with `changes` applied to `share`. Raises
    ReplayTooLong past the budget."""
    t0 = time.perf_counter()
    now = now or timezone.now()
    base, left_out, start = build_scenario(now=now)
    changed = with_change(base, share, changes)
    planner = _bounded_planner(time.monotonic() + BUDGET_S)
    before = simulate.simulate(base, planner=planner)
    after = simulate.simulate(changed, planner=planner)
    rows = []
    names = sorted(set(before.shares) | set(after.shares))
    for name in names:
        b, a = before.shares.get(name, {}), after.shares.get(name, {})
        row = {"share": name, "changed": name == share}
        for metric in ("mean_wait_s", "p95_wait_s", "preempted_jobs", "gpu_seconds_borrowed"):
            row[metric] = (b.get(metric), a.get(metric), _delta(b.get(metric), a.get(metric)))
        rows.append(row)

    def totals(result) -> dict[str, Any]:
        jobs = result.jobs.values()
        return {
            "utilisation": round(100 * result.cluster["utilisation"], 1),
            "preemptions": sum(j.preemptions for j in jobs),
            "lost_gpu_hours": round(result.cluster["lost_gpu_seconds"] / 3600, 1),
            "never_started": sum(1 for j in jobs if j.first_start is None),
        }

    tb, ta = totals(before), totals(after)
    cluster = [
        {"metric": label, "before": tb[key], "after": ta[key], "change": _delta(tb[key], ta[key])}
        for key, label in (
            ("utilisation", "utilisation (%)"),
            ("preemptions", "pre-emptions"),
            ("lost_gpu_hours", "GPU-hours of work lost to pre-emption"),
            ("never_started", "jobs not started by the cut"),
        )
    ]
    chart = {
        "shares": names,
        "before": [before.shares.get(n, {}).get("mean_wait_s") or 0 for n in names],
        "after": [after.shares.get(n, {}).get("mean_wait_s") or 0 for n in names],
    }
    return Preview(
        window_start=start,
        window_end=now,
        jobs=len(base.jobs),
        left_out=left_out,
        rows=rows,
        cluster=cluster,
        chart=chart,
        seconds=round(time.perf_counter() - t0, 2),
    )
