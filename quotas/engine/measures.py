"""Figures of a replay that cannot mislead: what the what-if, its sweep and a layout plan's preview show.

Read from a `simulate.SimResult` and the scenario it replayed, over the window the replay stands for
(the real week, `window_s` from the replay's start), not over however long the replay ran on:
- utilisation: GPU-seconds held by attempts within the window / READY GPU-seconds within the window
  (a replay that runs on to its cut because one job never starts no longer divides by the cut);
- waits count every job that was submitted (and not refused): one that never started waited at least
  until the cut, and counts as that (leaving it out made a share whose jobs could never start look
  faster); such jobs are also said in plain words, with why;
- per share: GPU-hours run within the window, wait p50/p95 overall and by priority, pre-emptions,
  GPU-hours borrowed and lent within the window, and lost where the result counts it.
Pure (imports nothing from Django, nor the simulator: it reads a result, whichever replay made it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from quotas.engine import policy
from quotas.engine import scenario as sc

SimResult = Any  # quotas.engine.simulate.SimResult (not imported: the simulator's CLI reads this module)
QUEUED = "QUEUED"  # a job's `final` while it waits (simulate.QUEUED)
EARLY_S = 600  # "pre-empted within 10 minutes of its start": the thrash a protection window prevents

SHARE_METRICS = (
    "gpu_hours_run",
    "wait_p50_s",
    "wait_p95_s",
    "mean_wait_s",
    "preemptions",
    "borrowed_gpu_hours",
    "lent_gpu_hours",
    "lost_gpu_hours",
    "never_started",
)


def nearest_rank(sorted_values: Sequence[float], pct: float) -> int | None:
    """Nearest-rank percentile (the simulator's), rounded; None for no values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return round(sorted_values[rank - 1])


def cut_of(scenario: sc.Scenario, result: SimResult) -> int:
    """Where the replay stopped: its cut (until_s) when work was left, else its last stop."""
    return int(result.cluster.get("makespan_s") or scenario.settings.until_s or 0)


def waits(scenario: sc.Scenario, result: SimResult) -> dict[str, tuple[int, bool]]:
    """job id -> (wait in seconds, started). A job that never started waited until the cut at least;
    refused submissions (a DISABLED share) have no wait."""
    cut = cut_of(scenario, result)
    out = {}
    for job_id, record in result.jobs.items():
        if job_id in result.rejected:
            continue
        if record.first_start is not None:
            out[job_id] = (record.first_start - record.spec.submit_at, True)
        elif record.final == QUEUED:
            out[job_id] = (max(0, cut - record.spec.submit_at), False)
    return out


def _held_within(start: int, end: int | None, cut: int, window_s: float) -> float:
    return max(0.0, min(end if end is not None else cut, window_s) - start)


def utilisation(scenario: sc.Scenario, result: SimResult, window_s: float) -> float:
    """GPU-seconds held by attempts within [0, window_s] / READY GPU-seconds within it, in percent."""
    if window_s <= 0:
        return 0.0
    cut = cut_of(scenario, result)
    busy = sum(
        a.gpus * _held_within(a.start, a.end, cut, window_s) for r in result.jobs.values() for a in r.attempts
    )
    capacity = 0.0
    for node in scenario.nodes:
        end = window_s if node.lost_at is None else min(node.lost_at, window_s)
        capacity += node.gpus * max(0.0, end - node.ready_at)
    return round(100 * busy / capacity, 1) if capacity else 0.0


def _lost_gpu_seconds(values: Mapping[str, Any]) -> float | None:
    lost = values.get("lost_gpu_seconds")
    if isinstance(lost, Mapping):
        return float(sum(v for v in lost.values() if isinstance(v, int | float)))
    return float(lost) if isinstance(lost, int | float) else None


def shares(scenario: sc.Scenario, result: SimResult, window_s: float) -> dict[str, dict[str, Any]]:
    """Per share: SHARE_METRICS, and waits by priority ({priority: {jobs, p50, p95}})."""
    cut = cut_of(scenario, result)
    job_waits = waits(scenario, result)
    by_share: dict[str, list[str]] = {s.name: [] for s in scenario.shares}
    for job_id, record in result.jobs.items():
        by_share.setdefault(record.spec.share, []).append(job_id)
    timeline = result.timeline
    out: dict[str, dict[str, Any]] = {}
    for name, ids in by_share.items():
        records = [result.jobs[i] for i in ids]
        run = sum(a.gpus * _held_within(a.start, a.end, cut, window_s) for r in records for a in r.attempts)
        counted = sorted(job_waits[i][0] for i in ids if i in job_waits)
        by_priority: dict[int, list[int]] = {}
        for i in ids:
            if i in job_waits:
                by_priority.setdefault(result.jobs[i].spec.priority, []).append(job_waits[i][0])
        flows = {
            metric: sum(
                timeline.integral(k, until=int(window_s)) for k in timeline.keys(share=name, metric=metric)
            )
            for metric in ("borrowed", "lent")
        }
        lost = _lost_gpu_seconds(result.shares.get(name, {}))
        out[name] = {
            "gpu_hours_run": round(run / 3600, 1),
            "wait_p50_s": nearest_rank(counted, 50),
            "wait_p95_s": nearest_rank(counted, 95),
            "mean_wait_s": round(sum(counted) / len(counted)) if counted else None,
            "preemptions": sum(r.preemptions for r in records),
            "borrowed_gpu_hours": round(flows["borrowed"] / 3600, 1),
            "lent_gpu_hours": round(flows["lent"] / 3600, 1),
            "lost_gpu_hours": None if lost is None else round(lost / 3600, 1),
            "never_started": sum(1 for i in ids if i in job_waits and not job_waits[i][1]),
            "by_priority": {
                str(p): {
                    "jobs": len(w),
                    "p50": nearest_rank(sorted(w), 50),
                    "p95": nearest_rank(sorted(w), 95),
                }
                for p, w in sorted(by_priority.items(), reverse=True)
            },
        }
    return out


def _final_shares(scenario: sc.Scenario) -> dict[str, sc.Share]:
    """The shares as the replay ends (its update_share events applied in order)."""
    specs = {s.name: s for s in scenario.shares}
    for event in sorted(scenario.events, key=lambda e: e.at):
        if event.kind == sc.UPDATE_SHARE and event.share in specs:
            specs[event.share] = dataclasses.replace(specs[event.share], **event.set)
    return specs


def never_started(scenario: sc.Scenario, result: SimResult, *, limit: int = 20) -> list[str]:
    """The jobs that never started, in plain words, grouped by share and size: "13 jobs of team-1 need
    64 a100 each: team-1 is LEND with 40 a100: a 64-GPU job can never start there"."""
    job_waits = waits(scenario, result)
    groups: dict[tuple[str, str, int], list[str]] = {}
    for job_id, (_, started) in job_waits.items():
        if not started:
            spec = result.jobs[job_id].spec
            groups.setdefault((spec.share, spec.gpu_type, spec.gpus), []).append(job_id)
    specs = _final_shares(scenario)
    cut = cut_of(scenario, result)
    last = max((j.submit_at for j in scenario.jobs), default=0)
    lines = []
    for (share, gpu_type, gpus), ids in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0])):
        n = len(ids)
        jobs = f"{n} job{'s' if n != 1 else ''} of {share}"
        spec = specs.get(share)
        why = None
        if spec is not None:
            view = policy.ShareView(
                name=share,
                capacity=dict(spec.capacity),
                strategy=spec.strategy,
                borrow_limit=spec.borrow_limit,
            )
            why = policy.never_fits(view, gpu_type, gpus)
        if why:
            lines.append(f"{jobs} need {gpus} {gpu_type} each: {why}")
        else:
            hours = max(0, cut - last) / 3600
            reason = result.waiting.get(ids[0])
            lines.append(
                f"{jobs} ({gpus} {gpu_type} each) never started: still waiting at the cut, {hours:.0f} h after "
                "the last submission" + (f" ({reason})" if reason and reason != "no reason given" else "")
            )
    if len(lines) > limit:
        rest = sum(len(ids) for ids in list(groups.values())[limit:])
        lines = [*lines[:limit], f"and {rest} more jobs in {len(lines) - limit} more groups"]
    return lines


def owner_waits(result: SimResult) -> list[int]:
    """Owners' waits for reclaimed GPUs in a replay, sorted: over the attempts admitted on own capacity
    whose admission needed GPUs back (a reclaim named the job, or it waited for protection), from the
    first instant that needed them to the start (bench/bench_itp.py's definition; quotas/sharing.py
    counts the same in production)."""
    return sorted(
        a.start - a.needed_reclaim_at
        for job in result.jobs.values()
        for a in job.attempts
        if a.needed_reclaim_at is not None and a.reason == policy.ADMITTED_OWN
    )


def early_preemptions(result: SimResult) -> int:
    """Attempts pre-empted within EARLY_S of their start: the thrash a protection window prevents."""
    return sum(
        1
        for job in result.jobs.values()
        for a in job.attempts
        if a.preemption_reason is not None and a.end is not None and a.end - a.start < EARLY_S
    )


def summary(scenario: sc.Scenario, result: SimResult, window_s: float) -> dict[str, Any]:
    """Everything the pages show of one replay, JSON-ready: per share, the cluster (with the two sides
    of a protection window: early pre-emptions and the owners' wait for reclaimed GPUs), never started."""
    per_share = shares(scenario, result, window_s)
    job_waits = waits(scenario, result)
    counted = sorted(w for w, _ in job_waits.values())
    lost = result.cluster.get("lost_gpu_seconds") or 0
    owners = owner_waits(result)
    return {
        "shares": per_share,
        "cluster": {
            "utilisation": utilisation(scenario, result, window_s),
            "wait_p50_s": nearest_rank(counted, 50),
            "wait_p95_s": nearest_rank(counted, 95),
            "preemptions": sum(r.preemptions for r in result.jobs.values()),
            "early_preemptions": early_preemptions(result),
            "lost_gpu_hours": round(lost / 3600, 1),
            "owner_wait_p50_s": nearest_rank(owners, 50),
            "owner_wait_p95_s": nearest_rank(owners, 95),
            "never_started": sum(1 for _, started in job_waits.values() if not started),
            "refused": len(result.rejected),
        },
        "never_started": never_started(scenario, result),
        "jobs": len(result.jobs),
        "window_s": int(window_s),
    }


def natural_window(scenario: sc.Scenario) -> int:
    """A scenario's own window when no real one is known: until the last job could have ended had it
    started at once (never the replay's cut)."""
    return max((j.submit_at + j.duration_s for j in scenario.jobs), default=0)


def compare_note(
    runs: Sequence[tuple[sc.Scenario, SimResult]], labels: Sequence[str], *, window_s: float | None = None
) -> str:
    """What `python -m quotas.simulate --variant` adds under its table: per run the utilisation over
    the window, each share's waits counting the jobs that never started (as waiting until the cut), and
    those jobs in words, so that a share whose jobs could never start does not look faster."""
    if window_s is None:
        # No real window: as long as the longest run that was not cut took, or the scenario's own.
        finished = [
            r.cluster["makespan_s"]
            for _, r in runs
            if not any(j.final in (QUEUED, "RUNNING") for j in r.jobs.values())
        ]
        window_s = max([natural_window(s) for s, _ in runs] + finished)
    window = window_s
    lines = [
        f"counting every job (one that never started waits until the cut), over the first {window:,.0f} s:"
    ]
    figures = [shares(s, r, window) for s, r in runs]
    util = [utilisation(s, r, window) for s, r in runs]
    lines.append(
        "  utilisation %: " + " | ".join(f"{label} {u}" for label, u in zip(labels, util, strict=True))
    )
    for name in sorted({n for f in figures for n in f}):
        cells = []
        for label, f in zip(labels, figures, strict=True):
            mine = f.get(name, {})
            p50, p95 = (mine.get(k) for k in ("wait_p50_s", "wait_p95_s"))
            cells.append(
                f"{label}: p50 {'-' if p50 is None else p50}, p95 {'-' if p95 is None else p95}, "
                f"never started {mine.get('never_started', 0)}"
            )
        lines.append(f"  {name} wait_s: " + " | ".join(cells))
    for label, (s, r) in zip(labels, runs, strict=True):
        lines += [f"  never started ({label}): {words}" for words in never_started(s, r)]
    return "\n".join(lines) + "\n"
