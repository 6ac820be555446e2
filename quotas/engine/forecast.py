"""ETAs and queue positions: the policy's own decisions, replayed forward in virtual time.

Pure like quotas/engine/policy.py (no Django, no I/O). Starting from a snapshot it asks `policy.plan` what it
would do, applies the admissions and pre-emptions to a copy of the snapshot, and when a plan decides
nothing new it advances virtual time to the next expected end of a running attempt (its job's
max_runtime_s, or a default the caller gives, e.g. the share's median observed runtime). The instant a
queued job is admitted in that replay is its ETA; the order of admission is its queue position.

It never decides anything itself: every admission and pre-emption comes from the planner. Jobs the
replay never admits (within `max_passes` / the horizon / the time budget) have no ETA and come last,
in the share's queue order (SEMANTICS.md rule 1, with rule 7's beneficiaries first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from quotas.engine import policy
from quotas.engine.policy import Plan, QueuedView, RunningView, Snapshot

log = logging.getLogger(__name__)

Planner = Callable[[Snapshot], Plan]

DEFAULT_HORIZON_S = 30 * 24 * 3600
DEFAULT_MAX_PASSES = 400
DEFAULT_BUDGET_S = 1.0


BOUND = "bound"  # every runtime the ETA rests on is an enforced max_runtime_s (or a grace period)
ESTIMATE = "estimate"  # some runtime it rests on is a guess (a share's median, or the default)
NONE = "none"  # the replay does not admit the job within its horizon


@dataclass(frozen=True)
class Estimate:
    """Where a guessed runtime comes from: a share's observed median, or the default."""

    seconds: float
    share: str | None = None  # None: the default runtime

    def words(self) -> str:
        if self.share:
            return f"median {_duration(self.seconds)} in {self.share}"
        return f"default {_duration(self.seconds)}"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.1f} days".replace(".0 days", " days")


@dataclass(frozen=True)
class Forecast:
    # job id -> expected admission time (seconds, the snapshot's clock); missing: no ETA within reach
    eta: Mapping[Hashable, float] = field(default_factory=dict)
    # job id -> BOUND / ESTIMATE for jobs with an ETA, NONE for the others
    kind: Mapping[Hashable, str] = field(default_factory=dict)
    # job id -> what the ETA rests on, in words ("estimate: 3 jobs without a max runtime end before
    # it (median 41 min in vision-main)"), or why there is none
    basis: Mapping[Hashable, str] = field(default_factory=dict)
    # job id -> {"in_share": n, "overall": n}, 1-based, for every queued job of the snapshot
    positions: Mapping[Hashable, dict[str, int]] = field(default_factory=dict)
    # job id -> why it waits now (the first plan's words)
    waiting: Mapping[Hashable, str] = field(default_factory=dict)
    # False when the planner failed (a bug, logged): positions are then
    # the plain queue order and there are no ETAs.
    planned: bool = True
    passes: int = 0


def _positions(
    queued: Iterable[QueuedView], admitted_order: list[Hashable]
) -> dict[Hashable, dict[str, int]]:
    queued = list(queued)
    rank = {job_id: i for i, job_id in enumerate(admitted_order)}
    later = len(rank)
    ordered = sorted(queued, key=lambda q: (rank.get(q.job_id, later), policy.queue_key(q)))
    positions: dict[Hashable, dict[str, int]] = {}
    per_share: dict[str, int] = {}
    for overall, q in enumerate(ordered, start=1):
        per_share[q.share] = per_share.get(q.share, 0) + 1
        positions[q.job_id] = {"in_share": per_share[q.share], "overall": overall}
    return positions


def _basis(counts: dict[Estimate, int]) -> str:
    n = sum(counts.values())
    jobs = "1 job" if n == 1 else f"{n} jobs"
    what = ", ".join(
        e.words() for e in sorted(counts, key=lambda e: (-counts[e], e.share or "", e.seconds))[:3]
    )
    return f"estimate: {jobs} without a max runtime end before it ({what})"


def forecast(
    snapshot: Snapshot,
    *,
    runtime_s: Mapping[Hashable, float],
    estimates: Mapping[Hashable, Estimate] | None = None,
    grace_s: Mapping[Hashable, float] | None = None,
    default_runtime_s: float = 3600,
    default_grace_s: float = 30,
    planner: Planner | None = None,
    targets: Iterable[Hashable] | None = None,
    max_passes: int = DEFAULT_MAX_PASSES,
    horizon_s: float = DEFAULT_HORIZON_S,
    budget_s: float = DEFAULT_BUDGET_S,
) -> Forecast:
    """Replay the planner forward from `snapshot`. `runtime_s` / `grace_s` are per job id. A job in
    `estimates` has a guessed runtime (where it comes from); any other job's runtime in `runtime_s` is
    its enforced max_runtime_s, and a job in neither gets `default_runtime_s`, a guess. An ETA is
    BOUND when no guessed end of its GPU type comes before it in the replay. With `targets`, stop as
    soon as those queued jobs have an ETA (positions then still cover every job, those not reached
    in queue order after the ones admitted)."""
    planner = planner or policy.plan
    grace_s = grace_s or {}
    start = snapshot.now
    deadline = time.monotonic() + budget_s
    queued: dict[Hashable, QueuedView] = {q.job_id: q for q in snapshot.queued}
    waiting_at_start = set(queued)  # a pre-empted job queued again later gets no ETA: it was running
    wanted = set(queued) if targets is None else set(targets) & set(queued)

    estimates = estimates or {}
    default_estimate = Estimate(float(default_runtime_s))

    def runtime(job_id: Hashable) -> float:
        return float(runtime_s.get(job_id, default_runtime_s))

    def guess(job_id: Hashable) -> Estimate | None:
        """Where this job's runtime comes from if it is a guess; None for an enforced limit."""
        if job_id in estimates:
            return estimates[job_id]
        return None if job_id in runtime_s else default_estimate

    # Per GPU type, the guessed ends the replay has passed so far: an ETA after any is an estimate.
    guessed: dict[str, dict[Estimate, int]] = {}
    kind: dict[Hashable, str] = {}
    basis: dict[Hashable, str] = {}
    guessed_ends: set[Hashable] = set()  # attempt ids whose end in the replay is a guess

    def grace(job_id: Hashable) -> float:
        return float(grace_s.get(job_id, default_grace_s))

    running: dict[Hashable, RunningView] = {}
    ends: dict[Hashable, float] = {}
    for r in snapshot.running:
        running[r.attempt_id] = r
        expected = start + grace(r.job_id) if r.preempting else r.started_at + runtime(r.job_id)
        if not r.preempting and guess(r.job_id) is not None:
            guessed_ends.add(r.attempt_id)
            if expected <= start:
                # Running past its guess: it is no reason to expect it to end this instant (an ETA of
                # "now" that never comes). Expect it to run half as long again as it has, a minute at least.
                expected = start + max(60.0, (start - r.started_at) / 2)
        ends[r.attempt_id] = max(start, expected)

    t = start
    stop = f"beyond what the forecast replays ({max_passes} passes, {budget_s:g} s)"
    eta: dict[Hashable, float] = {}
    order: list[Hashable] = []
    waiting: dict[Hashable, str] = {}
    passes = 0
    replayed = 0
    while wanted - set(eta) and passes < max_passes and time.monotonic() < deadline:
        snap = replace(
            snapshot,
            now=t,
            running=tuple(running.values()),
            queued=tuple(sorted(queued.values(), key=lambda q: q.job_id)),
        )
        try:
            decided = planner(snap)
        except Exception:  # an ETA is advice: a planner bug must not break the page that shows it
            log.exception("forecast: the planner failed; showing the plain queue order")
            return Forecast(positions=_positions(snapshot.queued, []), planned=False, passes=passes)
        if passes == 0:
            waiting = dict(decided.waiting)
        passes += 1

        changed = False
        for adm in decided.admissions:
            q = queued.pop(adm.job_id, None)
            if q is None:
                continue
            changed = True
            if adm.job_id in waiting_at_start and adm.job_id not in eta:
                eta[adm.job_id] = t
                order.append(adm.job_id)
                counts = guessed.get(q.gpu_type)
                if counts:
                    kind[adm.job_id], basis[adm.job_id] = ESTIMATE, _basis(counts)
                else:
                    kind[adm.job_id], basis[adm.job_id] = (
                        BOUND,
                        "bound: every job before it has a max runtime",
                    )
            # Real attempt ids are positive ints; replayed ones count down from -1, so that all ids stay
            # of one orderable type (the planner breaks ties by id).
            replayed += 1
            attempt_id = -replayed
            running[attempt_id] = RunningView(
                attempt_id=attempt_id,
                job_id=q.job_id,
                share=q.share,
                gpu_type=q.gpu_type,
                priority=q.priority,
                submitted_at=q.submitted_at,
                started_at=t,
                placement=adm.placement,
                borrowed=adm.borrowed,
            )
            ends[attempt_id] = t + runtime(q.job_id)
            if guess(q.job_id) is not None:
                guessed_ends.add(attempt_id)
        beneficiaries = set()
        for pre in decided.preemptions:
            victim = running.get(pre.attempt_id)
            if victim is None or victim.preempting:
                continue
            changed = True
            running[pre.attempt_id] = replace(
                victim, preempting=True, beneficiary_job_id=pre.beneficiary_job_id
            )
            if t + grace(victim.job_id) < ends[pre.attempt_id]:
                ends[pre.attempt_id] = t + grace(victim.job_id)
                guessed_ends.discard(pre.attempt_id)  # the grace period is enforced
            beneficiaries.add(pre.beneficiary_job_id)
        for job_id in beneficiaries:
            if job_id in queued:
                queued[job_id] = replace(queued[job_id], beneficiary=True)
        if changed:
            continue  # passes repeat at one instant until one decides nothing new

        if not ends:
            stop = "nothing running or admitted ends to make room for it"
            break  # what is still queued waits for capacity that is not there
        t_next = max(t, min(ends.values()))
        if t_next - start > horizon_s:
            stop = f"not started within the {_duration(horizon_s)} forecast horizon"
            break
        t = t_next
        for attempt_id in [a for a, end in ends.items() if end <= t]:
            del ends[attempt_id]
            r = running.pop(attempt_id)
            if attempt_id in guessed_ends:
                guessed_ends.discard(attempt_id)
                est = guess(r.job_id) or default_estimate
                counts = guessed.setdefault(r.gpu_type, {})
                counts[est] = counts.get(est, 0) + 1
            if r.preempting:  # a pre-empted job goes back to the queue with its original submit time
                queued[r.job_id] = QueuedView(
                    job_id=r.job_id,
                    share=r.share,
                    gpu_type=r.gpu_type,
                    gpus=r.gpus,
                    priority=r.priority,
                    submitted_at=r.submitted_at,
                )

    for q in snapshot.queued:
        if q.job_id not in eta and (targets is None or q.job_id in wanted):
            kind[q.job_id] = NONE
            basis[q.job_id] = f"{waiting.get(q.job_id) or 'waiting'}; {stop}"
    return Forecast(
        eta=eta,
        kind=kind,
        basis=basis,
        positions=_positions(snapshot.queued, order),
        waiting=waiting,
        planned=True,
        passes=passes,
    )
