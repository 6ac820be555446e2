"""Discrete-event simulator: replays a scenario through the real policy in virtual time.

This module owns the event loop around `quotas.engine.policy.plan()`, the accounting of a run and the result
format of ../shared/spec/SCENARIO.md. It imports nothing from Django, touches no database and never
sleeps: `python -m quotas.simulate SCENARIO.json --out RESULT.json [--report REPORT.html]`.

The loop keeps a heap of timed events and jumps from one instant to the next; idle time costs nothing.
At one instant it applies, in this order: attempt ends, grace expiries, node losses, node arrivals,
submissions, then the scenario's events in file order. Checkpoints (an attempt with
`checkpoint_every_s` makes one at each whole multiple of it since its start) ask for no pass: the
policy is told each attempt's latest before it next plans, so its safe point moves. Then, at a tick
(`settings.tick_s`) at which
anything changed and jobs are queued, it runs passes: snapshot -> planner -> apply, repeated until a
pass decides nothing new (so a zero-grace victim stops and its beneficiary starts at the same instant).
A victim keeps its GPUs for its whole grace and then stops, losing the work since its last periodic
checkpoint. The simulator checks every decision it applies (no double-booked GPU, right size and type,
only queued jobs admitted, only running attempts pre-empted) and raises `PolicyError` otherwise.

Definitions used in the result (all times are integer seconds of virtual time):
- ``wait_s`` = ``first_start - submit_at``: from submission to the start of the job's FIRST attempt.
  Time queued again after a pre-emption or node loss does not add to it. ``null`` if it never started.
- ``mean_wait_s`` / ``p95_wait_s`` of a share: over its jobs that started (rounded; p95 by nearest
  rank); ``null`` when none did. Jobs still queued at the end are not counted.
- ``gpu_seconds_own`` / ``_borrowed`` / ``_lent``: the time integrals of the share's own, borrowed and
  lent GPUs (policy accounting, all GPU types together), rounded.
- ``makespan_s``: the instant the last attempt stopped, or ``until_s`` if the cut left work running.
- ``utilisation``: GPU-seconds held by attempts (grace periods included) / GPU-seconds of READY
  capacity over ``[0, makespan_s]``.
- ``lost_gpu_seconds``: GPU time of work that pre-emption or node loss threw away (GPUs x the time
  since the attempt's safe point: its start or its last checkpoint); per share split by cause
  (``reclaim``, ``priority``: the pre-emption's reason; ``node_lost``), which add up to the cluster's
  total. A job with ``checkpoint_on_stop`` saves when told to stop: a pre-emption loses nothing, a
  lost node still does. Cancelled work is not counted, nor the work of a pre-empted attempt that
  finished (or was cancelled) within its grace.
- ``passes``: how many times the planner was called.
- A job submitted while its share is DISABLED is refused: ``final`` FAILED, no attempts,
  ``end`` = ``submit_at`` (and `SimResult.rejected` says why).
- A running attempt cut by ``until_s`` has ``end`` and ``outcome`` null; its job is ``RUNNING``; a job
  not yet submitted by then is reported ``QUEUED`` with no attempts.
- ``attempts[].borrowed`` and ``reason`` are as admitted; ``preempted_by`` / ``preemption_reason`` are
  set only on attempts that a pre-emption stopped (outcome PREEMPTED, or FAILED past
  ``max_preemptions``); an attempt that finished, was cancelled or lost its node during its grace
  has neither. An attempt past its job's ``max_runtime_s`` ends FAILED.

Passes: at an instant where something changed and jobs are queued, passes run until one decides
nothing (so admitting a lone job costs two passes: the one that admits it and the one that finds nothing
new); and at the instant a protection window that matters to a job waiting for protection ends
(`Plan.recheck_at`, SEMANTICS rule 10), though nothing else changed then. A plan that pre-empts a
protected attempt is refused (`PolicyError`), as any other decision that breaks the contract. `RunningView.borrowed` is passed as admitted; the policy re-classifies with
`borrowed_attempts()` itself. The timeline (`SimResult.timeline`) records `policy.usage()` per share
and type after each instant at which it changed, for the report.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import heapq
import json
import math
import sys
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotas import engine
from quotas.engine import collector, policy
from quotas.engine import runtimes as rt
from quotas.engine import scenario as sc
from quotas.engine.policy import (
    Admission,
    NodeView,
    Placement,
    Plan,
    Preemption,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
)
from quotas.engine.pyclasses import PolicyError  # noqa: F401 (read from here too)
from quotas.engine.reasons import WaitingReasons
from quotas.engine.timeline import Timeline, percentile
from quotas.engine.tree import FairShareHistory, Tree
from quotas.engine.views import UNASSIGNED, type_specs, type_usage

SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
QUEUED = "QUEUED"
RUNNING = "RUNNING"
PREEMPTED = "PREEMPTED"
NODE_LOST = "NODE_LOST"

# Event kinds, in the order they apply at one instant.
_END, _GRACE, _LOST, _READY, _SUBMIT, _EVENT, _RECHECK, _TICK = range(8)

# Lost work by cause (the result's shares[].lost_gpu_seconds), from a pre-emption's reason or a lost node.
LOST_RECLAIM, LOST_PRIORITY, LOST_FAIR, LOST_NODE = "reclaim", "priority", "fair_share", "node_lost"
LOST_CAUSES = (LOST_RECLAIM, LOST_PRIORITY, LOST_FAIR, LOST_NODE)
_CAUSE = {policy.RECLAIM: LOST_RECLAIM, policy.PRIORITY: LOST_PRIORITY, policy.FAIR_SHARE: LOST_FAIR}

# Passes at one instant that still decide something new: beyond this the policy is looping.
MAX_PASSES_PER_INSTANT = 1000
MAX_WARNINGS = 100

Planner = Callable[[Snapshot], Plan]


# ---------------------------------------------------------------------------------------------------
# Result records


@dataclass(slots=True)
class AttemptRecord:
    job_id: str
    number: int
    start: int
    placement: Placement
    borrowed: bool  # as admitted
    reason: str
    end: int | None = None
    outcome: str | None = None
    preempted_by: str | None = None
    preemption_reason: str | None = None
    # Not in the result: the first instant of the queue stay before this attempt at which the job's
    # admission needed a reclaim (a RECLAIM pre-emption named it, or it waited for protection), for
    # the owners' wait for reclaimed GPUs (bench/bench_itp.py).
    needed_reclaim_at: int | None = None
    # Not in the result either: how long the job waited for protection (rule 10: from a pass that found
    # it waiting for protection to the first pass that did not) in that stay, the longest time if
    # several, for the bound of rule 10.
    protection_wait_s: int = 0

    def __init__(  # (written out: compiled, see views.py "Views made often")
        self,
        job_id: str,
        number: int,
        start: int,
        placement: Placement,
        borrowed: bool,
        reason: str,
        end: int | None = None,
        outcome: str | None = None,
        preempted_by: str | None = None,
        preemption_reason: str | None = None,
        needed_reclaim_at: int | None = None,
        protection_wait_s: int = 0,
    ) -> None:
        self.job_id = job_id
        self.number = number
        self.start = start
        self.placement = placement
        self.borrowed = borrowed
        self.reason = reason
        self.end = end
        self.outcome = outcome
        self.preempted_by = preempted_by
        self.preemption_reason = preemption_reason
        self.needed_reclaim_at = needed_reclaim_at
        self.protection_wait_s = protection_wait_s

    @property
    def attempt_id(self) -> str:
        return f"{self.job_id}#{self.number}"

    @property
    def gpus(self) -> int:
        return sum(len(idx) for _, idx in self.placement)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "start": self.start,
            "end": self.end,
            "nodes": [node for node, _ in self.placement],
            "borrowed": self.borrowed,
            "outcome": self.outcome,
            "preempted_by": self.preempted_by,
            "reason": self.reason,
        }
        if self.preemption_reason is not None:
            out["preemption_reason"] = self.preemption_reason
        return out


@dataclass(slots=True)
class JobRecord:
    spec: sc.Job
    final: str = QUEUED
    first_start: int | None = None
    end: int | None = None
    preemptions: int = 0
    attempts: list[AttemptRecord] = field(default_factory=list)
    forecast_at_submit: dict[str, Any] | None = None  # with --forecast: {"eta": t or None, "kind": ...}

    def __init__(  # (written out: compiled, see views.py "Views made often")
        self,
        spec: sc.Job,
        final: str = QUEUED,
        first_start: int | None = None,
        end: int | None = None,
        preemptions: int = 0,
        attempts: list[AttemptRecord] | None = None,
        forecast_at_submit: dict[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.final = final
        self.first_start = first_start
        self.end = end
        self.preemptions = preemptions
        self.attempts = [] if attempts is None else attempts
        self.forecast_at_submit = forecast_at_submit

    @property
    def wait_s(self) -> int | None:
        return None if self.first_start is None else self.first_start - self.spec.submit_at

    def to_dict(self) -> dict[str, Any]:
        return {
            "final": self.final,
            "submit_at": self.spec.submit_at,
            "first_start": self.first_start,
            "end": self.end,
            "wait_s": self.wait_s,
            "preemptions": self.preemptions,
            "attempts": [a.to_dict() for a in self.attempts],
            **(
                {"forecast_at_submit": self.forecast_at_submit} if self.forecast_at_submit is not None else {}
            ),
        }


@dataclass
class SimResult:
    jobs: dict[str, JobRecord]
    shares: dict[str, dict[str, Any]]
    cluster: dict[str, Any]
    timeline: Timeline
    # Why each job still QUEUED at the end waits (the planner's last word), and refused submissions.
    waiting: dict[str, str] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)
    # Policy decisions that were odd but applicable (e.g. one pre-emption listed twice in a plan).
    warnings: list[str] = field(default_factory=list)
    # Per group: GPU-seconds its subtree took from outside itself and lent outside itself (SCENARIO.md
    # result `groups`); None when the scenario has no groups.
    groups: dict[str, dict[str, int]] | None = None

    def attempts(self) -> list[AttemptRecord]:
        return [a for job in self.jobs.values() for a in job.attempts]

    def to_dict(self) -> dict[str, Any]:
        out = {
            "jobs": {job_id: rec.to_dict() for job_id, rec in self.jobs.items()},
            "shares": self.shares,
            "cluster": self.cluster,
        }
        if self.groups is not None:
            out["groups"] = self.groups
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1) + "\n"


# ---------------------------------------------------------------------------------------------------
# The simulator


@dataclass(slots=True)
class _Run:
    """A running attempt: its record, its job and what the policy sees of it."""

    record: AttemptRecord
    job: _Job
    base_progress: int  # work saved before this attempt started
    view: RunningView
    end_at: int  # when it ends if nothing stops it first (it succeeds, or its max_runtime_s runs out)

    def __init__(  # (written out: compiled, see views.py "Views made often")
        self, record: AttemptRecord, job: _Job, base_progress: int, view: RunningView, end_at: int
    ) -> None:
        self.record = record
        self.job = job
        self.base_progress = base_progress
        self.view = view
        self.end_at = end_at


@dataclass(slots=True)
class _Job:
    spec: sc.Job
    record: JobRecord
    priority: int
    saved: int = 0  # work kept by checkpoints
    run: _Run | None = None
    beneficiary: bool = False
    needs_reclaim_since: int | None = None  # see AttemptRecord.needed_reclaim_at
    protection_wait_s: int = 0  # see AttemptRecord.protection_wait_s
    fair_reclaims: int = 0  # attempts a fair reclaim pre-empted (counted as they stop: a sum over the
    # attempts at each queueing cost the 100k trace, where a job runs up to 410 attempts, 1.2 s)

    def __init__(  # (written out: compiled, see views.py "Views made often")
        self,
        spec: sc.Job,
        record: JobRecord,
        priority: int,
        saved: int = 0,
        run: _Run | None = None,
        beneficiary: bool = False,
        needs_reclaim_since: int | None = None,
        protection_wait_s: int = 0,
        fair_reclaims: int = 0,
    ) -> None:
        self.spec = spec
        self.record = record
        self.priority = priority
        self.saved = saved
        self.run = run
        self.beneficiary = beneficiary
        self.needs_reclaim_since = needs_reclaim_since
        self.protection_wait_s = protection_wait_s
        self.fair_reclaims = fair_reclaims


class Profile:
    """Where a simulation's time goes (``--profile``): wall seconds and calls per part. The parts are
    disjoint except "reasons", which is inside "passes" (the planner writing why each job waits), and
    the indented parts, which split "passes" four ways: the first pass at an instant or one made
    again at it (after a pass that decided something), and whether it decided something.

    Without `detail` only the planner's passes are timed (one clock pair per pass): timing every event
    and reason added 5-6 % to a run, which a benchmark should not report."""

    def __init__(self, detail: bool = True) -> None:
        self.detail = detail
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + seconds
        self.calls[part] = self.calls.get(part, 0) + 1

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock = time.perf_counter

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(part, clock() - t0)

        return wrapper

    def table(self, total: float) -> str:
        lines = [f"{'part':<30}{'seconds':>10}{'share':>8}{'calls':>12}{'per call':>12}"]
        inner = sorted((p for p in self.seconds if p.startswith(" ")), key=lambda p: -self.seconds[p])
        for part in sorted(
            (p for p in self.seconds if not p.startswith(" ")), key=lambda p: -self.seconds[p]
        ):
            for name in [part, *inner] if part == "passes" else [part]:
                sec, n = self.seconds[name], self.calls[name]
                lines.append(f"{name:<30}{sec:>10.2f}{sec / total:>8.0%}{n:>12,}{sec / n * 1e6:>10.0f}us")
        lines.append(f"{'total (wall)':<30}{total:>10.2f}")
        return "\n".join(lines) + "\n"


# The run makes no reference cycles (a pass leaves none, and release() breaks the simulator's own) and
# keeps what it makes to the end: the cyclic collector's walks over its growing heap cost 2 s of the 100k
# simulation; paused, its peak memory is ~5 % higher. What it kept is then moved to the oldest
# generation, not walked by the next collection (collector: `promote`).
@collector.paused(promote=True)
def simulate(
    scenario: sc.Scenario | Mapping[str, Any],
    *,
    planner: Planner | None = None,
    forecast: bool = False,
    profile: Profile | None = None,
    on_pass: Callable[[int], None] | None = None,
    report_checkpoints: bool = True,
    check_skipped: bool = False,
) -> SimResult:
    """Replay a scenario (a `Scenario` or its decoded JSON) and return the result.

    `planner` defaults to the engine kept between passes (`policy.Engine`, the same policy as
    `policy.plan`); tests may pass a stand-in that takes a snapshot. With `forecast`, the production
    forecast (quotas.engine.forecast) runs at each job's submit and its error against the actual start is
    reported (SCENARIO.md `--forecast`). `on_pass` hears the virtual time before each pass (progress,
    a deadline: what it raises ends the run). With `report_checkpoints=False` the policy is not told
    the periodic checkpoints (every safe point is its attempt's start: victims in the order before
    safe points, for comparisons); the work lost is counted from the checkpoints either way. A pass
    whose plan is settled (Plan.settled) is not followed by the pass that would find nothing more to
    decide at that instant, and no pass is made where the engine knows it would decide nothing
    (Engine.quiet); such passes are counted all the same. With `check_skipped` they are made, and a
    PolicyError raised if one decides anything (the tests' check of both claims). Raises `ScenarioError`
    for an invalid scenario and `PolicyError` for a decision that cannot be applied.
    """
    if not isinstance(scenario, sc.Scenario):
        scenario = sc.parse(scenario)
    options = {
        "forecast": forecast,
        "profile": profile,
        "on_pass": on_pass,
        "report_checkpoints": report_checkpoints,
        "check_skipped": check_skipped,
    }
    if profile is None or not profile.detail or engine.COMPILED:
        return _run(_Simulator(scenario, planner, **options))
    # Time the planner, the event handlers, the accounting and the forecast; "reasons" times the
    # policy's own waiting-reason writer (patched for the run only: the policy has no hooks), which only
    # the engine as Python allows (a compiled one calls its own methods directly: quotas/engine/native.py).
    wait = WaitingReasons._wait
    WaitingReasons._wait = profile.timed("reasons (in passes)", wait)
    try:
        return _run(_Simulator(scenario, planner, **options))
    finally:
        WaitingReasons._wait = wait


def _run(sim: _Simulator) -> SimResult:
    try:
        return sim.run()
    finally:
        sim.release()


def _released() -> Plan:
    raise RuntimeError("the simulator has been released: it makes no more passes")


def _post_order(tree: Tree, name: str, order: list[str]) -> None:
    """Group `name` and the groups below it into `order`, each after its children. (A module function:
    as a closure that calls itself it held itself, and the tree, in a reference cycle.)"""
    for child in tree.children[name]:
        if child in tree.groups:
            _post_order(tree, child, order)
    order.append(name)


class _NetCalc:
    """tree.nets() for one type as plain lists, for the simulator's accounting after every instant:
    the same numbers (tests/quotas/test_policy_tree.py compares them), without its dictionaries."""

    def __init__(self, tree: Tree, gpu_type: str) -> None:
        names = list(tree.shares) + list(tree.groups)
        index = {name: i for i, name in enumerate(names)}
        self.names = names
        self.n_shares = len(tree.shares)
        shares = list(tree.shares.values())
        self.capacity = [max(0, s.capacity.get(gpu_type, 0)) for s in shares]
        self.lends = [s.strategy in (policy.LEND, policy.LEND_AND_BORROW) for s in shares]
        self.index = index
        order: list[str] = []
        for name in tree.top:
            if name in tree.groups:
                _post_order(tree, name, order)
        for name in tree.groups:
            if name not in order:
                _post_order(tree, name, order)
        self.groups = [
            (index[g], [index[c] for c in tree.children[g]], tree.lend_cap(g, gpu_type)) for g in order
        ]
        self.top = [index[c] for c in tree.top]
        # Groups with their children, parents before their subtrees: what each lends beyond itself is
        # counted top-down (tree.nets).
        self.levels = [(g, kids) for g, kids, _ in reversed(self.groups)]

    def run(
        self,
        used: Mapping[str, int],
        pool: int,
        gpu_type: str,
        taken: dict[tuple[str, str], int],
        lent: dict[tuple[str, str], float],
    ) -> None:
        names, n = self.names, len(self.names)
        net = [0] * n
        offer = [0] * n
        for s in range(self.n_shares):
            c, u = self.capacity[s], used.get(names[s], 0)
            v = c - u if u > c or self.lends[s] else 0
            net[s] = v
            offer[s] = v if v > 0 else 0
        for g, kids, cap in self.groups:
            total = 0
            for c in kids:
                total += offer[c] if net[c] > 0 else net[c]
            net[g] = total
            offer[g] = (cap if total > cap else total) if total > 0 else 0
        for x in range(n):
            if net[x] < 0:
                taken[(names[x], gpu_type)] = -net[x]
        lent_of = [0.0] * n
        for g, kids in [(-1, self.top), *self.levels]:
            offers = pool if g < 0 else 0
            demand = 0.0 if g < 0 else lent_of[g]
            for c in kids:
                offers += offer[c]
                if net[c] < 0:
                    demand -= net[c]
            if offers and demand:
                factor = demand / offers if demand < offers else 1.0
                for c in kids:
                    if offer[c]:
                        lent_of[c] = offer[c] * factor
                        lent[(names[c], gpu_type)] = lent_of[c]


class _OrgAccounting:
    """The organisation tree's numbers along a run: per group the GPUs its subtree takes from and lends
    outside itself at each instant (integrated into the result's `groups` block), and the decayed
    borrowing history (tree.FairShareHistory) that each pass reads. Usage counts GPUs in grace, as
    SEMANTICS' usage does."""

    def __init__(self, sim: _Simulator) -> None:
        self.sim = sim
        self.tree: Tree | None = None
        self.at = 0
        self.taken: dict[tuple[str, str], int] = {}  # (name, type) -> GPUs taken from outside now
        self.lent: dict[tuple[str, str], float] = {}
        self.from_outside_s: dict[str, float] = {g: 0.0 for g in sim.groups}
        self.lent_outside_s: dict[str, float] = {g: 0.0 for g in sim.groups}
        self.history = FairShareHistory(sim.settings.fair_share_half_life_s)

    def before_pass(self, now: int) -> None:
        if self.history.half_life_s:
            self.sim.engine.set_history(self.history.advance(now, self.taken))

    def account(self, t: int, changed: Mapping[str, tuple[Mapping[str, int], int]] | None = None) -> None:
        """After instant t: integrate what held since the last change, then, for the GPU types whose
        usage changed at the instant (per type: GPUs used per share, own and borrowed, and the
        unassigned pool's capacity), read the new numbers (the other types' stand)."""
        dt = t - self.at
        if dt:
            for (name, _), gpus in self.taken.items():
                if name in self.from_outside_s:
                    self.from_outside_s[name] += gpus * dt
            for (name, _), lent_gpus in self.lent.items():  # (not `gpus`: a float here, an int above)
                if name in self.lent_outside_s:
                    self.lent_outside_s[name] += lent_gpus * dt
        self.at = t
        if changed is None:
            return
        sim = self.sim
        if self.tree is None:  # (re)built: the simulator then recounts every type (dirty_all)
            self.tree = Tree.build([g.spec() for g in sim.groups.values()], list(sim.share_views.values()))
            self.calcs: dict[str, _NetCalc] = {}
            self.of_type: dict[str, tuple[dict, dict]] = {}
        for gpu_type, (used, pool) in changed.items():
            calc = self.calcs.get(gpu_type)
            if calc is None:
                calc = self.calcs[gpu_type] = _NetCalc(self.tree, gpu_type)
            taken: dict[tuple[str, str], int] = {}
            lent: dict[tuple[str, str], float] = {}
            if used or pool:
                calc.run(used, pool, gpu_type, taken, lent)
            self.of_type[gpu_type] = (taken, lent)
        self.taken = {k: v for taken, _ in self.of_type.values() for k, v in taken.items()}
        self.lent = {k: v for _, lent in self.of_type.values() for k, v in lent.items()}

    def result(self, end: int) -> dict[str, dict[str, int]]:
        self.account(end)  # what held since the last change, up to the end
        return {
            name: {
                "gpu_seconds_from_outside": round(self.from_outside_s[name]),
                "gpu_seconds_lent_outside": round(self.lent_outside_s[name]),
            }
            for name in sorted(self.from_outside_s)
        }


# The forecast's runtime guess for a job without max_runtime_s learns from the last rt.RECENT_SAMPLE
# successful attempts of its share and of its name, else is DEFAULT_RUNTIME_S (as in production).
DEFAULT_RUNTIME_S = 3600
FORECAST_MAX_PASSES = 20_000  # a deterministic bound (no wall-clock budget in virtual time)


class _Simulator:
    def __init__(
        self,
        scenario: sc.Scenario,
        planner: Planner | None,
        *,
        forecast: bool = False,
        profile: Profile | None = None,
        on_pass: Callable[[int], None] | None = None,
        report_checkpoints: bool = True,
        check_skipped: bool = False,
    ) -> None:
        self.scenario = scenario
        self.on_pass = on_pass
        self.checkpointing = report_checkpoints
        self.checkpoints: list[tuple[int, str]] = []  # (when, attempt id): the next one to report
        self.planner = planner
        self.profile = profile
        self.forecasting = forecast
        self.to_forecast: list[str] = []  # submitted at this instant, forecast before the pass
        self.runtimes: dict[str, deque[int]] = {}  # share -> recent successful attempt durations
        self.group_runtimes: dict[tuple[str, None, str], deque[int]] = {}  # (share, None, job name) -> same
        self.submits = sorted((j.submit_at, j.id) for j in scenario.jobs) if forecast else []
        self.settings = scenario.settings
        self.heap: list[tuple[int, int, int, Any]] = []
        self.seq = 0
        self.now = 0

        self.jobs = {j.id: _Job(spec=j, record=JobRecord(spec=j), priority=j.priority) for j in scenario.jobs}
        self.node_specs = {n.name: n for n in scenario.nodes}
        self.ready: dict[str, NodeView] = {}
        self.holders: dict[str, list[str | None]] = {}  # READY node -> attempt id holding each GPU
        self.share_specs = {s.name: s for s in scenario.shares}
        self.share_views = {s.name: self._share_view(s) for s in scenario.shares}

        self.running: dict[str, _Run] = {}
        # What the policy sees, kept by the engine between passes; the simulator reports each change
        # to it (rviews and qviews are the engine's own views, read here, never written).
        settings = scenario.settings
        self.groups = {g.name: g for g in scenario.groups}
        self.engine = policy.Engine(
            shares=self.share_views.values(),
            starvation_s=settings.starvation_s,
            groups=[g.spec() for g in self.groups.values()],
            fair_share_half_life_s=settings.fair_share_half_life_s,
            fair_reclaim=settings.fair_reclaim,
        )
        # The organisation tree's accounting (the result's `groups` block, and the history that rule 5
        # reads): None for a flat layout, which then costs nothing here.
        self.org = _OrgAccounting(self) if scenario.groups or settings.fair_share_half_life_s else None
        self.rviews: Mapping[str, RunningView] = self.engine.running
        self.qviews: Mapping[str, QueuedView] = self.engine.queued
        decide = self._engine_plan if planner is None else self._snapshot_plan
        self.decide = decide if profile is None else self._timed_passes(profile, decide)

        self.passes = 0
        # A settled plan's next pass at its instant (Plan.settled), and a pass the engine knows would
        # decide nothing (Engine.quiet, with the engine as planner), are not made where every change is
        # followed by a pass at once (tick_s 1): the reasons one would have given are asked of the
        # engine at the end, if it was the last pass (`waiting_due`, its instant), from the same state.
        self.check_skipped = check_skipped
        self.skip_settled = scenario.settings.tick_s == 1 and not check_skipped
        self.skip_quiet = self.skip_settled and planner is None
        self.waiting_due: int | None = None
        self.busy_gpu_s = 0
        self.lost_gpu_s = 0
        # share -> cause -> GPU-seconds lost (SCENARIO.md result: shares[].lost_gpu_seconds)
        self.lost: dict[str, dict[str, int]] = {
            s.name: dict.fromkeys(LOST_CAUSES, 0) for s in scenario.shares
        }
        self.last_stop = 0
        self.last_waiting: Mapping[Hashable, str] = {}
        self.rejected: dict[str, str] = {}
        self.warnings: list[str] = []
        self.timeline = Timeline()

        self.changed = False  # since the last pass: something the planner should look at
        # The accounting after each instant recomputes only the GPU types whose usage may have changed
        # since the last one (all of them after a change of shares, groups or at the start): a type's
        # numbers depend on its own nodes, shares and attempts only (views.usage_rows).
        self.dirty_all = True
        self.dirty_types: set[str] = set()
        self.used: dict[str, dict[tuple[str, str], int]] = {}  # type -> (share, type) -> GPUs held
        self.type_shares: dict[str, dict[str, ShareView]] | None = None  # type -> shares with capacity in it
        self.type_specs: dict[str, list[tuple[str, int, bool]]] = {}  # type -> views.type_specs(its shares)
        self.series_keys: dict[str, dict[str, tuple]] = {}  # type -> share -> its timeline series' keys
        # type -> share -> (own, borrowed, lent, capacity) as last recorded; type -> the unassigned pool's lent
        # and capacity and the READY cluster's GPUs, as last recorded
        self.type_values: dict[str, dict[str, tuple]] = {}
        self.type_pool: dict[str, tuple] = {}
        self.cluster_gpus: dict[str, int] = {}  # READY schedulable GPUs per type (usage's pool)
        self.cluster_caps: dict[tuple[str, str, str], int] | None = None
        self.tick_pending: set[int] = set()
        self.rechecks: set[int] = set()  # instants at which a protection window that matters ends
        self.protect_waiting: dict[Hashable, int] = {}  # job waiting for protection -> since when

        for node in scenario.nodes:
            self.push(node.ready_at, _READY, node.name)
            if node.lost_at is not None:
                self.push(node.lost_at, _LOST, node.name)
        # Submissions wait outside the heap, latest last-out, each pushed when the one before it is
        # popped (with the sequence number it would have had): the heap then holds what runs and a
        # single submission, not every job of the trace (heap operations were 2 % of a 100k run).
        subs = []
        for job in scenario.jobs:
            self.seq += 1
            subs.append((job.submit_at, _SUBMIT, self.seq, job.id))
        subs.sort(reverse=True)
        self.subs = subs
        if subs:
            heapq.heappush(self.heap, subs.pop())
        for event in scenario.events:
            self.push(event.at, _EVENT, event)

    def release(self) -> None:
        """Break the simulator's own reference cycles (its planner kept as a bound method, the
        organisation's accounting that refers back to it, the engine's) once its result is made, so that reference
        counting frees it, its engine and its jobs as simulate() returns. Left to the cyclic collector,
        they were found by a walk over everything the run made, when the collector was enabled again
        (0.3 s of an ITP replay, 0.9 s of tracegen 100k)."""
        self.decide = _released
        self.org = None
        self.engine.release()

    def _timed_passes(self, profile: Profile, decide: Callable[[], Plan]) -> Callable[[], Plan]:
        """The planner's passes, timed; with `detail`, also told apart by whether each was the first
        at its instant or a pass again after one that decided something, and whether it decided
        anything (admissions or pre-emptions): where a pass that decides nothing could be saved."""
        if not profile.detail:
            return profile.timed("passes", decide)
        clock = time.perf_counter
        last_at: int | None = None  # the instant of the pass before

        def classified() -> Plan:
            nonlocal last_at
            t0 = clock()
            plan = decide()
            seconds = clock() - t0
            again, last_at = last_at == self.now, self.now
            did = "decided" if plan.admissions or plan.preemptions else "nothing"
            profile.add("passes", seconds)
            profile.add(f"  {'again' if again else 'first'} at instant, {did}", seconds)
            return plan

        return classified

    # -- the loop -----------------------------------------------------------------------------------

    def push(self, t: int, kind: int, ref: Any) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, ref))

    def run(self) -> SimResult:
        until = self.settings.until_s
        handlers = {
            _END: self.on_end,
            _GRACE: self.on_grace,
            _LOST: self.on_lost,
            _READY: self.on_ready,
            _SUBMIT: self.on_submit,
            _EVENT: self.on_event,
            _RECHECK: self.on_recheck,
            _TICK: lambda ref: None,
        }
        account: Callable[[int], None] = self.account
        forecast_submits: Callable[[], None] = self.forecast_submits
        if self.profile is not None and self.profile.detail:
            names = {
                _END: "events: end",
                _GRACE: "events: grace",
                _LOST: "events: node lost",
                _READY: "events: node ready",
                _SUBMIT: "events: submit",
                _EVENT: "events: scenario",
            }
            for kind, name in names.items():
                handlers[kind] = self.profile.timed(name, handlers[kind])
            # (wrapped here, not set on self: a compiled class's methods are not attributes to replace)
            account = self.profile.timed("accounting", account)
            forecast_submits = self.profile.timed("forecast", forecast_submits)
        heap, subs = self.heap, self.subs
        while heap and (until is None or heap[0][0] <= until):
            t = heap[0][0]
            self.now = t
            while heap and heap[0][0] == t:
                _, kind, _, ref = heapq.heappop(heap)
                if kind == _SUBMIT and subs:
                    heapq.heappush(heap, subs.pop())
                handlers[kind](ref)
            if self.to_forecast:
                forecast_submits()
            if self.changed:
                tick = self.settings.tick_s
                if t % tick == 0:
                    self.passes_at(t)
                elif (nxt := t - t % tick + tick) not in self.tick_pending:
                    self.tick_pending.add(nxt)
                    self.push(nxt, _TICK, None)
            account(t)
        cut = until is not None and any(j.record.final in (QUEUED, RUNNING) for j in self.jobs.values())
        end = until if cut else self.last_stop
        if cut:
            self.now = until
            account(until)
        return self.result(end, cut)

    def passes_at(self, t: int) -> None:
        self.tick_pending.discard(t)
        self.changed = False
        if not self.qviews:
            return  # nothing to admit, so nothing to pre-empt for
        # The engine knows a pass now would decide nothing (Engine.quiet: nothing changed since its last
        # pass that decided nothing, or since a settled plan was applied, but jobs queued that no pass
        # could start or pre-empt for): counted, not made.
        expect_nothing = self.check_skipped and self.engine.quiet(t)
        if self.skip_quiet and self.engine.quiet(t):
            self.changed = False
            self.passes += 1
            self.waiting_due = t
            return
        for _ in range(MAX_PASSES_PER_INSTANT):
            self.changed = False
            decided = self.decide()
            self.passes += 1
            self.last_waiting = decided.waiting
            self.waiting_due = None
            if expect_nothing and (
                decided.admissions
                or decided.preemptions
                or decided.protected
                or decided.recheck_at is not None
            ):
                raise PolicyError(f"t={t}: a pass the simulator would not make decided something new")
            if decided.protected or self.protect_waiting:
                self.note_protection(decided.protected)
            if not decided.admissions and not decided.preemptions:
                if decided.recheck_at is not None:
                    self.recheck(decided.recheck_at)
                return
            self.apply(decided)
            expect_nothing = decided.settled and self.check_skipped
            if decided.settled and self.skip_settled:
                # The pass it stands for would decide nothing and leave nothing to note (no job waits
                # for protection, none did in this one).
                self.changed = False
                self.passes += 1
                self.waiting_due = t
                return
        raise PolicyError(f"t={t}: more than {MAX_PASSES_PER_INSTANT} passes still decided something new")

    def recheck(self, at: float) -> None:
        """Rule 10: a job waits for protection until `at` at the earliest; the walk is made again then
        (a pass at that instant), whatever else happens."""
        t = math.ceil(at)
        if t not in self.rechecks:
            self.rechecks.add(t)
            self.push(t, _RECHECK, t)

    def on_recheck(self, t: int) -> None:
        self.rechecks.discard(t)
        self.invalidate()

    def note_protection(self, waiting: Mapping[Hashable, Any]) -> None:
        """After a pass: which jobs wait for protection, and for how long those that no longer do
        waited."""
        for job_id, since in list(self.protect_waiting.items()):
            if job_id not in waiting:
                del self.protect_waiting[job_id]
                job = self.jobs[job_id]
                job.protection_wait_s = max(job.protection_wait_s, self.now - since)
        for job_id in waiting:
            self.protect_waiting.setdefault(job_id, self.now)
        self.note_reclaims(waiting)

    def note_reclaims(self, job_ids: Iterable[Hashable]) -> None:
        for job_id in job_ids:
            job = self.jobs.get(job_id)
            if job is not None and job.needs_reclaim_since is None and job.run is None:
                job.needs_reclaim_since = self.now

    # -- state the policy sees -----------------------------------------------------------------------

    def invalidate(self, *, usage: bool = False, gpu_type: str | None = None) -> None:
        """The planner should look again; with `usage`, who holds which GPUs changed too (GPUs of
        `gpu_type` only, when it is given)."""
        self.changed = True
        if usage:
            if gpu_type is None:
                self.dirty_all = True
            else:
                self.dirty_types.add(gpu_type)

    def snapshot(self, *, queued: bool = True) -> Snapshot:
        return self.engine.snapshot(self.now, queued=queued)

    def _engine_plan(self) -> Plan:
        if self.on_pass is not None:
            self.on_pass(self.now)
        if self.checkpoints:
            self.report_checkpoints()
        if self.org is not None:
            self.org.before_pass(self.now)
        return self.engine.plan(self.now)

    def _snapshot_plan(self) -> Plan:
        assert self.planner is not None
        if self.on_pass is not None:
            self.on_pass(self.now)
        if self.checkpoints:
            self.report_checkpoints()
        if self.org is not None:
            self.org.before_pass(self.now)
        return self.planner(self.snapshot())

    @staticmethod
    def _share_view(share: sc.Share) -> ShareView:
        return ShareView(
            name=share.name,
            capacity=dict(share.capacity),
            strategy=share.strategy,
            borrow_limit=share.borrow_limit,
            in_share_preemption=share.in_share_preemption,
            min_runtime_s=share.min_runtime_s,
            group=share.group,
            weight=share.weight,
        )

    def queue(self, job: _Job) -> None:
        self.engine.add_queued(
            QueuedView(
                job_id=job.spec.id,
                share=job.spec.share,
                gpu_type=job.spec.gpu_type,
                gpus=job.spec.gpus,
                priority=job.priority,
                submitted_at=job.spec.submit_at,
                beneficiary=job.beneficiary,
                fair_reclaims=self.fair_reclaims(job),
            )
        )
        job.record.final = QUEUED
        self.invalidate()

    @staticmethod
    def fair_reclaims(job: _Job) -> int:
        """How many of the job's attempts so far a fair reclaim pre-empted (rule 11's bound per job)."""
        return job.fair_reclaims

    def set_view(self, run: _Run, **changes: Any) -> None:
        run.view = dataclasses.replace(self.engine.current(run.record.attempt_id), **changes)
        self.engine.add_running(run.view)

    # -- event handlers -----------------------------------------------------------------------------

    def on_submit(self, job_id: str) -> None:
        job = self.jobs[job_id]
        share = self.share_specs[job.spec.share]
        if share.state == sc.DISABLED:
            self.rejected[job_id] = f'share "{share.name}" is disabled'
            self.finish(job, FAILED)
            return
        self.queue(job)
        if self.forecasting:
            self.to_forecast.append(job_id)

    def forecast_submits(self) -> None:
        """The production forecast for the jobs just submitted, from the state they were submitted
        into: what a user would have been told."""
        from quotas.engine import forecast as fc

        targets, self.to_forecast = self.to_forecast, []
        if self.checkpoints:
            self.report_checkpoints()
        model = rt.Runtimes(self.runtimes, self.group_runtimes, default_s=DEFAULT_RUNTIME_S)
        runtime: dict[Hashable, float] = {}
        estimates: dict[Hashable, rt.Guess] = {}
        spread: dict[Hashable, tuple[float, float]] = {}
        grace: dict[Hashable, float] = {}
        elapsed = {r.job.spec.id: float(self.now - r.record.start) for r in self.running.values()}
        for job_id in [*elapsed, *self.qviews]:
            spec = self.jobs[job_id].spec
            if spec.max_runtime_s is not None:
                runtime[job_id] = float(spec.max_runtime_s)
                spread[job_id] = model.bounded(
                    spec.share,
                    None,
                    spec.name or "",
                    max_runtime_s=spec.max_runtime_s,
                    elapsed=elapsed.get(job_id),
                )
            else:
                guess = model.guess(spec.share, None, spec.name or "", elapsed=elapsed.get(job_id))
                runtime[job_id], estimates[job_id] = guess.seconds, guess
                spread[job_id] = (guess.low, guess.high)
            g = spec.preemption_grace_s
            grace[job_id] = float(self.settings.preemption_grace_s if g is None else g)
        # The work expected to arrive: what came in over the last ARRIVALS_WINDOW_S, again (as production).
        arrivals = []
        first = bisect.bisect_left(self.submits, (self.now - fc.ARRIVALS_WINDOW_S,))
        for at, job_id in self.submits[first : bisect.bisect_left(self.submits, (self.now,))]:
            spec = self.jobs[job_id].spec
            phantom = f"~{job_id}"
            arrivals.append(
                QueuedView(
                    phantom, spec.share, spec.gpu_type, spec.gpus, spec.priority, at + fc.ARRIVALS_WINDOW_S
                )
            )
            if spec.max_runtime_s is not None:
                runtime[phantom] = float(spec.max_runtime_s)
            else:
                guess = model.guess(spec.share, None, spec.name or "")
                runtime[phantom], spread[phantom] = guess.seconds, (guess.low, guess.high)
            g = spec.preemption_grace_s
            grace[phantom] = float(self.settings.preemption_grace_s if g is None else g)
        result = fc.forecast(
            self.snapshot(),
            runtime_s=runtime,
            estimates=estimates,
            grace_s=grace,
            default_runtime_s=DEFAULT_RUNTIME_S,
            planner=self.planner,
            targets=targets,
            max_passes=FORECAST_MAX_PASSES,
            budget_s=float("inf"),
            spread=spread,
            arrivals=arrivals,
        )
        for job_id in targets:
            eta = result.eta.get(job_id)
            low, high = result.ranges.get(job_id, (None, None))
            self.jobs[job_id].record.forecast_at_submit = {
                "eta": None if eta is None else int(math.ceil(eta)),
                "low": None if low is None else int(math.floor(low)),
                "high": None if high is None else int(math.ceil(high)),
                "kind": result.kind.get(job_id, fc.NONE),
            }

    def on_end(self, ref: tuple[str, str]) -> None:
        attempt_id, outcome = ref
        run = self.running.get(attempt_id)
        if run is not None:
            self.stop(run, outcome)

    def on_grace(self, attempt_id: str) -> None:
        run = self.running.get(attempt_id)
        if run is not None:
            self.stop(run, PREEMPTED)

    def report_checkpoints(self) -> None:
        """Tell the policy the checkpoints made up to now (each attempt with `checkpoint_every_s` makes
        one at each whole multiple of it since its start, until it ends): each attempt's latest, so
        that its safe point is right for the pass about to be made. Nothing to decide for a checkpoint
        itself, so none asks for a pass; they wait outside the event heap for the next one (as events
        of their own they cost the 69k-job ITP trace 340k trips through the loop)."""
        due, now = self.checkpoints, self.now
        while due and due[0][0] <= now:
            at, attempt_id = heapq.heappop(due)
            run = self.running.get(attempt_id)
            if run is None:
                continue  # it stopped before this checkpoint
            every = run.job.spec.checkpoint_every_s
            at += (now - at) // every * every  # the latest one up to now
            self.engine.checkpoint_later(attempt_id, at)  # (run.view lags: set_view asks current())
            if at + every < run.end_at:
                heapq.heappush(due, (at + every, attempt_id))

    def on_ready(self, name: str) -> None:
        node = self.node_specs[name]
        self.ready[name] = NodeView(name=name, gpu_type=node.gpu_type, gpus=node.gpus)
        self.engine.set_nodes(self.ready.values())
        self.holders[name] = [None] * node.gpus
        self.cluster_caps = None
        self.invalidate(usage=True, gpu_type=node.gpu_type)

    def on_lost(self, name: str) -> None:
        for attempt_id in sorted({a for a in self.holders[name] if a is not None}):
            self.stop(self.running[attempt_id], NODE_LOST)
        gpu_type = self.ready.pop(name).gpu_type
        self.engine.set_nodes(self.ready.values())
        del self.holders[name]
        self.cluster_caps = None
        self.invalidate(usage=True, gpu_type=gpu_type)

    def on_event(self, event: sc.Event) -> None:
        if event.kind == sc.UPDATE_SHARE:
            share = dataclasses.replace(self.share_specs[event.share], **event.set)
            self.share_specs[share.name] = share
            self.share_views[share.name] = self._share_view(share)
            self.engine.set_shares(self.share_views.values())
            self.type_shares = None
            self.type_specs = {}
            if self.org is not None:
                self.org.tree = None
            self.invalidate(usage=True)
            return
        if event.kind == sc.UPDATE_GROUP:
            self.groups[event.group] = dataclasses.replace(self.groups[event.group], **event.set)
            settings = self.settings
            self.engine.set_tree(
                [g.spec() for g in self.groups.values()],
                fair_share_half_life_s=settings.fair_share_half_life_s,
                fair_reclaim=settings.fair_reclaim,
            )
            if self.org is not None:
                self.org.tree = None
            self.invalidate(usage=True)
            return
        job = self.jobs[event.job]
        if event.kind == sc.UPDATE_JOB:
            job.priority = event.set["priority"]
            if job.run is not None:
                self.set_view(job.run, priority=job.priority)
                self.invalidate()
            elif job.spec.id in self.qviews:
                self.queue(job)
        elif event.kind == sc.CANCEL:
            if job.run is not None:
                self.stop(job.run, CANCELLED)
            elif job.spec.id in self.qviews:
                self.engine.remove_queued(job.spec.id)
                self.finish(job, CANCELLED)
                self.invalidate()

    # -- applying decisions -------------------------------------------------------------------------

    def apply(self, decided: Plan) -> None:
        started: dict[str, None] = {}  # (a dict: in order, and asked whether it holds a job)
        for admission in decided.admissions:
            self.admit(admission, started)
        if started:  # out of the queue together, before the pre-emptions look at who is queued
            self.engine.remove_queued_many(started)
        seen: set[Preemption] = set()
        for preemption in decided.preemptions:
            if preemption in seen:
                # The same decision twice in one plan (a policy bug): apply it once and say so.
                self.warn(f"t={self.now}: the plan pre-empts {preemption.attempt_id!r} twice")
                continue
            seen.add(preemption)
            self.preempt(preemption)

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)

    def admit(self, admission: Admission, started: dict[str, None]) -> None:
        """Start an admitted job; its id joins `started`, the jobs for the caller to take out of the
        queue."""
        t = self.now
        job_id = admission.job_id
        if job_id not in self.qviews or job_id in started:
            raise PolicyError(f"t={t}: admitted job {job_id!r}, which is not queued")
        job = self.jobs[job_id]
        spec = job.spec
        if admission.share != spec.share:
            raise PolicyError(
                f"t={t}: admitted job {job_id!r} to share {admission.share!r}, not {spec.share!r}"
            )
        gpus = 0
        for node, idx in admission.placement:
            node_view = self.ready.get(node)
            if node_view is None or node_view.gpu_type != spec.gpu_type:
                raise PolicyError(
                    f"t={t}: job {job_id!r} placed on {node!r}: not a READY {spec.gpu_type} node"
                )
            holders = self.holders[node]
            for i in idx:
                if not 0 <= i < node_view.gpus or holders[i] is not None:
                    held = f"held by {holders[i]}" if 0 <= i < node_view.gpus else "no such GPU"
                    raise PolicyError(f"t={t}: job {job_id!r} placed on {node}:{i} ({held})")
            gpus += len(idx)
        if gpus != spec.gpus or len({(n, i) for n, idx in admission.placement for i in idx}) != gpus:
            raise PolicyError(
                f"t={t}: job {job_id!r} needs {spec.gpus} GPUs, placement gives {gpus} (or repeats)"
            )

        record = AttemptRecord(
            job_id=job_id,
            number=len(job.record.attempts) + 1,
            start=t,
            placement=admission.placement,
            borrowed=admission.borrowed,
            reason=admission.reason,
        )
        attempt_id = record.attempt_id
        for node, idx in admission.placement:
            holders = self.holders[node]
            for i in idx:
                holders[i] = attempt_id
        view = RunningView(
            attempt_id=attempt_id,
            job_id=job_id,
            share=spec.share,
            gpu_type=spec.gpu_type,
            priority=job.priority,
            submitted_at=spec.submit_at,
            started_at=t,
            placement=admission.placement,
            borrowed=admission.borrowed,
            fair_reclaims=self.fair_reclaims(job),
        )
        finish = t + spec.duration_s - job.saved
        failing = spec.max_runtime_s is not None and t + spec.max_runtime_s < finish
        end_at = t + spec.max_runtime_s if failing else finish
        run = _Run(record=record, job=job, base_progress=job.saved, view=view, end_at=end_at)
        job.run = run
        job.beneficiary = False
        record.needed_reclaim_at, job.needs_reclaim_since = job.needs_reclaim_since, None
        record.protection_wait_s, job.protection_wait_s = job.protection_wait_s, 0
        job.record.attempts.append(record)
        job.record.final = RUNNING
        if job.record.first_start is None:
            job.record.first_start = t
        started[job_id] = None
        self.running[attempt_id] = run
        self.engine.add_running(view)
        self.push(end_at, _END, (attempt_id, FAILED if failing else SUCCEEDED))
        every = spec.checkpoint_every_s
        if every and self.checkpointing and t + every < end_at:
            heapq.heappush(self.checkpoints, (t + every, attempt_id))
        used = self.used.setdefault(spec.gpu_type, {})
        key = (spec.share, spec.gpu_type)
        used[key] = used.get(key, 0) + gpus
        self.invalidate(usage=True, gpu_type=spec.gpu_type)

    def preempt(self, preemption: Preemption) -> None:
        t = self.now
        run = self.running.get(preemption.attempt_id)
        if run is None or run.view.preempting:
            state = "already pre-empting" if run is not None else "not running"
            raise PolicyError(f"t={t}: pre-empted attempt {preemption.attempt_id!r}, which is {state}")
        share = self.share_specs[run.job.spec.share]
        if t < run.record.start + share.min_runtime_s:
            raise PolicyError(
                f"t={t}: pre-empted attempt {preemption.attempt_id!r}, started at {run.record.start}, "
                f"within share {share.name}'s protection window of {share.min_runtime_s} s"
            )
        run.record.preempted_by = preemption.beneficiary_job_id
        run.record.preemption_reason = preemption.reason
        self.set_view(run, preempting=True, beneficiary_job_id=preemption.beneficiary_job_id)
        beneficiary = self.jobs.get(preemption.beneficiary_job_id)
        if preemption.reason == policy.RECLAIM:
            self.note_reclaims((preemption.beneficiary_job_id,))
        if beneficiary is not None and not beneficiary.beneficiary and beneficiary.spec.id in self.qviews:
            beneficiary.beneficiary = True
            self.queue(beneficiary)
        grace = self.scenario.grace_s(run.job.spec)
        if grace == 0:
            self.stop(run, PREEMPTED)
        else:
            self.push(t + grace, _GRACE, run.record.attempt_id)
        self.invalidate()

    def stop(self, run: _Run, outcome: str) -> None:
        """End a running attempt at `now`: free its GPUs, account its work, move its job on."""
        t = self.now
        record, job, spec = run.record, run.job, run.job.spec
        attempt_id = record.attempt_id
        for node, idx in record.placement:
            holders = self.holders[node]
            for i in idx:
                holders[i] = None
        del self.running[attempt_id]
        self.engine.remove_running(attempt_id)
        job.run = None
        record.end = t
        record.outcome = outcome
        elapsed = t - record.start
        gpus = record.gpus
        self.busy_gpu_s += gpus * elapsed
        self.last_stop = max(self.last_stop, t)
        used = self.used[spec.gpu_type]
        key = (spec.share, spec.gpu_type)
        if used[key] == gpus:
            del used[key]
        else:
            used[key] -= gpus
        self.invalidate(usage=True, gpu_type=spec.gpu_type)
        if outcome != PREEMPTED:
            # It ended (or was lost) before its grace ran out: the pre-emption did not happen.
            record.preempted_by = record.preemption_reason = None

        if outcome == SUCCEEDED and self.forecasting:
            self.runtimes.setdefault(spec.share, deque(maxlen=rt.RECENT_SAMPLE)).append(elapsed)
            if spec.name:
                group_key = (spec.share, None, spec.name)
                self.group_runtimes.setdefault(group_key, deque(maxlen=rt.RECENT_SAMPLE)).append(elapsed)
        if outcome in (PREEMPTED, NODE_LOST):
            progress = run.base_progress + elapsed
            if outcome == PREEMPTED and spec.checkpoint_on_stop:
                saved = progress  # it saved when told to stop
            elif spec.checkpoint_every_s:
                every = spec.checkpoint_every_s
                saved = run.base_progress + elapsed // every * every
            else:
                saved = run.base_progress  # what it saved when stopped before, if anything
            lost = gpus * (progress - saved)
            if lost:
                cause = _CAUSE[record.preemption_reason] if outcome == PREEMPTED else LOST_NODE
                self.lost[spec.share][cause] += lost
                self.lost_gpu_s += lost
            job.saved = saved
            if outcome == PREEMPTED:
                job.record.preemptions += 1
                if record.preemption_reason == policy.FAIR_SHARE:
                    job.fair_reclaims += 1
                if spec.max_preemptions != -1 and job.record.preemptions > spec.max_preemptions:
                    record.outcome = FAILED
                    self.finish(job, FAILED)
                    return
            self.queue(job)
        else:
            self.finish(job, outcome)

    def finish(self, job: _Job, final: str) -> None:
        job.record.final = final
        job.record.end = self.now
        job.beneficiary = False

    # -- accounting ---------------------------------------------------------------------------------

    def account(self, t: int) -> None:
        """Record own / borrowed / lent GPUs per share and type after the instant, if they changed: only
        the types whose usage may have changed are recomputed (at 50 shares, recomputing every share of
        every type after each instant was 40% of a replay)."""
        if not self.dirty_all and not self.dirty_types:
            return
        if self.cluster_caps is None:  # READY GPUs per type, recounted only when nodes come or go
            caps: dict[tuple[str, str, str], int] = {}
            schedulable: dict[str, int] = {}
            for node in self.engine.nodes:
                key = (Timeline.CLUSTER, node.gpu_type, "capacity")
                caps[key] = caps.get(key, 0) + node.gpus
                if node.schedulable:
                    schedulable[node.gpu_type] = schedulable.get(node.gpu_type, 0) + max(0, node.gpus)
            self.cluster_caps, self.cluster_gpus = caps, schedulable
        if self.type_shares is None:
            self.type_shares = {}
            for view in self.share_views.values():
                for gpu_type in view.capacity:
                    self.type_shares.setdefault(gpu_type, {})[view.name] = view
        if self.dirty_all:
            types = set(self.type_values) | set(self.cluster_gpus) | set(self.type_shares)
            types.update(gpu_type for gpu_type, used in self.used.items() if used)
            for key in self.cluster_caps:
                types.add(key[1])
        else:
            types = self.dirty_types
        self.dirty_all = False
        self.dirty_types = set()
        timeline = self.timeline
        org: dict[str, tuple[dict[str, int], int]] | None = None if self.org is None else {}
        for gpu_type in sorted(types):
            used: dict[str, int] | None = None if org is None else {}
            pool = self._account_type(gpu_type, t, used)
            if org is not None:
                org[gpu_type] = (used, pool)
        timeline.end = max(timeline.end, t)
        if self.org is not None:
            self.org.account(t, org)

    def _account_type(self, gpu_type: str, t: int, used_out: dict[str, int] | None = None) -> int:
        """usage()'s own, borrowed, lent and capacity of one GPU type into the timeline at `t`, each share's
        four numbers (and the unassigned pool's, and the READY cluster's GPUs of the type) against those
        it last recorded, a series changed only where one of them did; `used_out` gets the GPUs each
        share uses (own and borrowed: the organisation's accounting). Returns the unassigned pool."""
        assert self.type_shares is not None and self.cluster_caps is not None
        shares = self.type_shares.get(gpu_type, {})
        specs = self.type_specs.get(gpu_type)
        if specs is None:  # the type's shares as views.type_usage reads them, kept until shares change
            specs = self.type_specs[gpu_type] = type_specs(shares, gpu_type, sorted(shares))
        used = self.used.get(gpu_type, {})
        for share, _ in used:  # (a loop, not any() over a generator: this runs after most instants)
            if share not in shares:  # borrowers without capacity of the type
                everyone = {**shares, **{share: self.share_views[share] for share, _ in used}}
                specs = type_specs(everyone, gpu_type, sorted(everyone))
                break
        rows, factor, pool = type_usage(gpu_type, specs, used, self.cluster_gpus.get(gpu_type, 0))
        # Per share: its series' keys (made once) and its four numbers as last recorded (comparing one
        # tuple per share, not a dict of every series of the type, after most instants).
        series = self.series_keys.get(gpu_type)
        if series is None:
            series = self.series_keys[gpu_type] = {}
        last = self.type_values.get(gpu_type)
        if last is None:
            last = self.type_values[gpu_type] = {}
        timeline = self.timeline  # (its method called on it: compiled, a direct call)
        seen = 0
        for share, capacity, use, own, lend in rows:
            if use and used_out is not None:
                used_out[share] = use
            lent: Any = 0  # an int, or a float of the factor's (the output keeps which)
            if lend and factor:
                # round() to 3 places is slow (a decimal conversion), and a whole number is its own
                # rounding: most lenders lend all they have idle (factor 1) or nothing is borrowed.
                lent = lend * factor if factor == 1.0 else round(lend * factor, 3)
            borrowed = use - own
            now = (own, borrowed, lent, capacity)
            before = last.get(share)
            if before is not None:
                seen += 1
                if before == now:
                    continue
                own0, borrowed0, lent0, capacity0 = before
            else:
                own0 = borrowed0 = lent0 = capacity0 = 0
            # (inline, not a call per share: a lender's lent GPUs move with every change of what is
            # borrowed, so most shares record something after most instants)
            keys = series.get(share) or self._series_of(series, share, gpu_type)
            if own != own0:
                timeline.set_value(keys[0], t, own)
            if borrowed != borrowed0:
                timeline.set_value(keys[1], t, borrowed)
            if lent != lent0:
                timeline.set_value(keys[2], t, lent)
            if capacity != capacity0:
                timeline.set_value(keys[3], t, capacity)
            last[share] = now
        if seen < len(last):  # a share with neither capacity nor use of the type now: its series go to 0
            named = {row[0] for row in rows}
            for share in [x for x in last if x not in named]:
                keys = series.get(share) or self._series_of(series, share, gpu_type)
                for key, old in zip(keys, last.pop(share), strict=True):
                    if old:
                        timeline.set_value(key, t, 0)
        # The unassigned pool's lent and capacity, and the READY cluster's GPUs of the type.
        lent = round(pool * factor, 3) if pool else 0
        gpus = self.cluster_caps.get((Timeline.CLUSTER, gpu_type, "capacity"), 0)
        pool_now = (lent, pool, gpus)
        pool_before = self.type_pool.get(gpu_type, (0, 0, 0))
        if pool_before != pool_now:
            for key, old, new in zip(
                (
                    (UNASSIGNED, gpu_type, "lent"),
                    (UNASSIGNED, gpu_type, "capacity"),
                    (Timeline.CLUSTER, gpu_type, "capacity"),
                ),
                pool_before,
                pool_now,
                strict=True,
            ):
                if old != new:
                    timeline.set_value(key, t, new)
            self.type_pool[gpu_type] = pool_now
        return pool

    @staticmethod
    def _series_of(series: dict[str, tuple], share: str, gpu_type: str) -> tuple:
        """A share's four series keys of a type, made once."""
        keys = series[share] = tuple(
            (share, gpu_type, part) for part in ("own", "borrowed", "lent", "capacity")
        )
        return keys

    def result(self, end: int, cut: bool) -> SimResult:
        self.timeline.end = end
        jobs = {job_id: job.record for job_id, job in self.jobs.items()}
        if self.waiting_due is not None and self.qviews:
            # The last pass was one not made (after a settled plan, or the engine quiet): nothing changed
            # since, so a pass at its instant over the state now gives the reasons it would have given.
            now, self.now = self.now, self.waiting_due
            self.last_waiting = self.decide().waiting
            self.now = now
        if cut:
            self.busy_gpu_s += sum(r.record.gpus * (end - r.record.start) for r in self.running.values())
        capacity_gpu_s = 0
        for node in self.scenario.nodes:
            lost = end if node.lost_at is None else min(node.lost_at, end)
            capacity_gpu_s += node.gpus * max(0, lost - node.ready_at)

        shares: dict[str, dict[str, Any]] = {}
        by_share: dict[str, list[JobRecord]] = {s.name: [] for s in self.scenario.shares}
        for record in jobs.values():
            by_share[record.spec.share].append(record)
        for name, records in by_share.items():
            waits = sorted(r.wait_s for r in records if r.wait_s is not None)
            shares[name] = {
                **{
                    f"gpu_seconds_{metric}": round(
                        sum(self.timeline.integral(k) for k in self.timeline.keys(share=name, metric=metric))
                    )
                    for metric in ("own", "borrowed", "lent")
                },
                "mean_wait_s": round(sum(waits) / len(waits)) if waits else None,
                "p95_wait_s": percentile(waits, 95),
                "preempted_jobs": sum(1 for r in records if r.preemptions),
                "lost_gpu_seconds": dict(self.lost[name]),
            }
        cluster: dict[str, Any] = {
            "makespan_s": end,
            "utilisation": round(self.busy_gpu_s / capacity_gpu_s, 6) if capacity_gpu_s else 0.0,
            "lost_gpu_seconds": self.lost_gpu_s,
            "passes": self.passes,
        }
        if self.forecasting:
            cluster["forecast_error"] = forecast_error(jobs.values())
        groups = self.org.result(end) if self.org is not None and self.scenario.groups else None
        waiting = {
            job_id: str(self.last_waiting.get(job_id, "no reason given"))
            for job_id, record in jobs.items()
            if record.final == QUEUED
        }
        return SimResult(
            jobs=jobs,
            shares=shares,
            groups=groups,
            cluster=cluster,
            timeline=self.timeline,
            waiting=waiting,
            rejected=self.rejected,
            warnings=self.warnings,
        )


def forecast_error(records: Iterable[JobRecord]) -> dict[str, Any]:
    """ETA at submit against the actual first start (SCENARIO.md `--forecast`): over the jobs that
    started and had an ETA, the median and p90 absolute error, and the share whose actual wait was
    within 25% of the forecast wait or within 60 s; the same under `waited` for the jobs whose actual
    wait exceeded 60 s (most jobs start at once, and an average over them says little). Then how often
    the actual start lay within the forecast's range (`range_coverage`, and under `waited`) and the
    ranges' median width. Also how many jobs had each kind of ETA, and bound ETAs missed."""
    kinds: dict[str, int] = {}
    bound_late = 0
    every: list[tuple[int, bool, bool | None, int | None]] = []  # (error, within 25%, in range, width)
    waited: list[tuple[int, bool, bool | None, int | None]] = []
    for r in records:
        f = r.forecast_at_submit
        if f is None:
            continue
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
        if f["eta"] is None or r.first_start is None:
            continue
        err = abs(r.first_start - f["eta"])
        forecast_wait = f["eta"] - r.spec.submit_at
        low, high = f.get("low"), f.get("high")
        inside = None if low is None or high is None else low <= r.first_start <= high
        width = None if low is None or high is None else high - low
        row = (err, err <= max(60, 0.25 * forecast_wait), inside, width)
        every.append(row)
        if r.first_start - r.spec.submit_at > 60:
            waited.append(row)
        if f["kind"] == "bound" and r.first_start > f["eta"]:
            bound_late += 1
    return {
        **_errors(every),
        "waited": _errors(waited),
        "kinds": dict(sorted(kinds.items())),
        "bound_started_late": bound_late,
    }


def _errors(rows: Sequence[tuple[int, bool, bool | None, int | None]]) -> dict[str, Any]:
    """The error figures of some jobs: (error, within 25%, start in range, range width) each."""
    errors = sorted(e for e, *_ in rows)
    inside = [i for _, _, i, _ in rows if i is not None]
    return {
        "n": len(errors),
        "median_abs_s": percentile(errors, 50),
        "p90_abs_s": percentile(errors, 90),
        "within_25pct": round(sum(1 for _, ok, *_ in rows if ok) / len(rows), 4) if rows else None,
        "range_coverage": round(sum(inside) / len(inside), 4) if inside else None,
        "range_width_median_s": percentile(sorted(w for *_, w in rows if w is not None), 50),
    }


# ---------------------------------------------------------------------------------------------------
# CLI


def compare_table(results: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    """A side-by-side text table of the headline numbers of two or more results."""
    rows: list[tuple[str, list[Any]]] = [
        ("utilisation", [r["cluster"]["utilisation"] for r in results]),
        ("makespan_s", [r["cluster"]["makespan_s"] for r in results]),
        ("lost_gpu_seconds", [r["cluster"]["lost_gpu_seconds"] for r in results]),
        *(
            (f"  lost to {cause.replace('_', ' ')}", [_lost_by(r, cause) for r in results])
            for cause in LOST_CAUSES
        ),
        ("pre-emptions", [sum(j["preemptions"] for j in r["jobs"].values()) for r in results]),
        (
            "jobs never started",
            [sum(1 for j in r["jobs"].values() if j["first_start"] is None) for r in results],
        ),
    ]
    share_names = sorted({name for r in results for name in r["shares"]})
    for name in share_names:
        for metric, label in (
            ("mean_wait_s", "mean wait_s"),
            ("p95_wait_s", "p95 wait_s"),
            ("preempted_jobs", "pre-empted jobs"),
        ):
            rows.append((f"{name} {label}", [r["shares"].get(name, {}).get(metric) for r in results]))
        rows.append((f"{name} lost GPU-s", [_lost_by(r, None, name) for r in results]))

    def fmt(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.4f}"
        return f"{value:,}"

    def delta(values: list[Any]) -> str:
        a, b = values[0], values[-1]
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return ""
        diff = b - a
        text = f"{diff:+.4f}" if isinstance(diff, float) else f"{diff:+,}"
        return text + (f" ({diff / a:+.0%})" if a and not isinstance(diff, float) else "")

    header = ["metric", *labels, "change"]
    body = [[label, *(fmt(v) for v in values), delta(values)] for label, values in rows]
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = []
    for n, row in enumerate([header, *body]):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _lost_by(result: Mapping[str, Any], cause: str | None, share: str | None = None) -> int | None:
    """GPU-seconds lost in a result, of one cause (None: all) and one share (None: all); None for a
    result written before lost work was counted by cause."""
    total = 0
    for name, stats in result["shares"].items():
        by_cause = stats.get("lost_gpu_seconds")
        if share is not None and name != share:
            continue
        if by_cause is None:
            return None
        total += by_cause[cause] if cause is not None else sum(by_cause.values())
    return total


def variant(scenario: sc.Scenario, spec: str) -> sc.Scenario:
    """The scenario with some shares' strategy set: ``STRATEGY`` (all shares) or ``STRATEGY:a,b``."""
    strategy, _, names = spec.partition(":")
    if strategy not in policy.STRATEGIES:
        raise sc.ScenarioError([f"--variant: strategy must be one of {', '.join(policy.STRATEGIES)}"])
    wanted = set(filter(None, names.split(","))) or {s.name for s in scenario.shares}
    unknown = wanted - {s.name for s in scenario.shares}
    if unknown:
        raise sc.ScenarioError([f'--variant: share "{name}" is not defined' for name in sorted(unknown)])
    shares = tuple(
        dataclasses.replace(s, strategy=strategy) if s.name in wanted else s for s in scenario.shares
    )
    return dataclasses.replace(scenario, shares=shares)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m quotas.simulate",
        description="Replay a gpuquota scenario in virtual time with the real policy.",
    )
    parser.add_argument("scenario", nargs="?", help="scenario JSON (../shared/spec/SCENARIO.md)")
    parser.add_argument("--out", help="write the result JSON here (default: standard output)")
    parser.add_argument(
        "--profile", action="store_true", help="print where the time goes (passes, events, reasons, ...)"
    )
    parser.add_argument(
        "--forecast",
        action="store_true",
        help="run the production forecast at each job's submit and report its error against the actual start",
    )
    parser.add_argument("--report", help="write a self-contained HTML report here")
    parser.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two result files")
    parser.add_argument(
        "--variant",
        metavar="STRATEGY[:share,...]",
        help="run the scenario as given and with these shares' strategy set (all shares if none named) "
        "and print a comparison; --out and --report then refer to the run as given",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error
        return int(exc.code or 0)

    if args.compare:
        try:
            results = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.compare]
            sys.stdout.write(compare_table(results, [Path(p).name for p in args.compare]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"cannot compare: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.scenario:
        parser.print_usage(sys.stderr)
        print("error: a scenario file is required (or --compare A.json B.json)", file=sys.stderr)
        return 2

    try:
        scenario = sc.load(args.scenario)
        other = variant(scenario, args.variant) if args.variant else None
    except sc.ScenarioError as exc:
        print(f"invalid scenario {args.scenario}:", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 2
    try:
        profile = Profile() if args.profile else None
        started = time.perf_counter()
        result = simulate(scenario, forecast=args.forecast, profile=profile)
        if profile is not None:
            sys.stderr.write(profile.table(time.perf_counter() - started))
        other_result = simulate(other, forecast=args.forecast) if other is not None else None
    except PolicyError as exc:
        print(f"simulation failed: {exc}", file=sys.stderr)
        return 1

    if args.out:
        Path(args.out).write_text(result.to_json(), encoding="utf-8")
    elif other_result is None:
        sys.stdout.write(result.to_json())
    if args.report:
        from quotas.engine.report import render_report

        Path(args.report).write_text(render_report(scenario, result, result.timeline), encoding="utf-8")
    if other_result is not None:
        sys.stdout.write(
            compare_table([result.to_dict(), other_result.to_dict()], ["as given", args.variant])
        )
        from quotas.engine import measures  # waits that count never-started jobs (issue 28)

        sys.stdout.write(
            measures.compare_note([(scenario, result), (other, other_result)], ["as given", args.variant])
        )
    if args.out and other_result is None:  # the result went to a file: say what happened, in a line
        print(_summary_line(result.to_dict(), args.out, args.report))
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for job_id, why in sorted(result.waiting.items())[:10]:
        print(f"note: job {job_id} never finished queueing: {why}", file=sys.stderr)
    return 0


def _summary_line(result: Mapping[str, Any], out: str, report: str | None) -> str:
    """'simulated 20 jobs over 37.2 h (virtual): 18 SUCCEEDED, 2 FAILED; utilisation 87.3%; result in
    out.json' (a run with --out printed nothing at all)."""
    finals: dict[str, int] = {}
    for job in result["jobs"].values():
        finals[job["final"]] = finals.get(job["final"], 0) + 1
    cluster = result["cluster"]
    words = ", ".join(f"{n} {final}" for final, n in sorted(finals.items(), key=lambda kv: (-kv[1], kv[0])))
    line = (
        f"simulated {len(result['jobs'])} jobs over {cluster['makespan_s'] / 3600:.1f} h (virtual)"
        f"{': ' + words if words else ''}; utilisation {100 * cluster['utilisation']:.1f}%; result in {out}"
    )
    return line + (f", report in {report}" if report else "")


if __name__ == "__main__":
    sys.exit(main())
