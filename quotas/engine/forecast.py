"""ETAs and queue positions: the policy's own decisions, replayed forward in virtual time.

Pure like quotas/engine/policy.py (no Django, no I/O). Starting from a snapshot it asks the policy what it
would do (a `policy.Engine` built once from the snapshot and told each change, so a pass costs what it
decides), applies the admissions and pre-emptions, and when a plan decides
nothing new it advances virtual time to the next expected end of a running attempt (its job's
max_runtime_s, or a default the caller gives, e.g. the share's median observed runtime). The instant a
queued job is admitted in that replay is its ETA; the order of admission is its queue position.

It never decides anything itself: every admission and pre-emption comes from the planner. Jobs the
replay never admits (within `max_passes` / the horizon / the time budget) have no ETA and come last,
in the share's queue order (SEMANTICS.md rule 1, with rule 7's beneficiaries first).
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from quotas.engine import collector, policy
from quotas.engine.policy import Plan, QueuedView, RunningView, Snapshot
from quotas.engine.runtimes import TOO_LITTLE_HISTORY, Guess, default_words, duration

log = logging.getLogger(__name__)

Planner = Callable[[Snapshot], Plan]

DEFAULT_HORIZON_S = 30 * 24 * 3600
DEFAULT_MAX_PASSES = 400
DEFAULT_BUDGET_S = 1.0


BOUND = "bound"  # every runtime the ETA rests on is an enforced max_runtime_s (or a grace period)
ESTIMATE = "estimate"  # some runtime it rests on is a guess (a share's median, or the default)
NONE = "none"  # the replay does not admit the job within its horizon
BORROWING_BASIS = "estimate: borrowed GPUs of its type come and go with other shares' work"
BACKFILL_BASIS = "estimate: GPUs that free early may go to smaller jobs first (backfill)"


@dataclass(frozen=True)
class Estimate:
    """Where a guessed runtime comes from: a share's observed median, or the default."""

    seconds: float
    share: str | None = None  # None: the default runtime

    def words(self) -> str:
        if self.share:
            return f"median {duration(self.seconds)} in {self.share}"
        return default_words(self.seconds)


@dataclass(frozen=True)
class Forecast:
    # job id -> expected admission time (seconds, the snapshot's clock); missing: no ETA within reach
    eta: Mapping[Hashable, float] = field(default_factory=dict)
    # job id -> BOUND / ESTIMATE for jobs with an ETA, NONE for the others
    kind: Mapping[Hashable, str] = field(default_factory=dict)
    # job id -> what the ETA rests on, in words ("estimate: 3 jobs without a max runtime end before
    # it (median 41 min in vision-main)"), or why there is none
    basis: Mapping[Hashable, str] = field(default_factory=dict)
    # job id -> (low, high): the likely range of its start (10th-90th percentile, SEMANTICS "Ranges"),
    # for jobs with an ETA when ranges were asked for; low <= eta <= high
    ranges: Mapping[Hashable, tuple[float, float]] = field(default_factory=dict)
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
    # Admitted jobs in the order of admission, then the others in queue order.
    by_id = {q.job_id: q for q in queued}
    ordered = [by_id.pop(job_id) for job_id in admitted_order if job_id in by_id]
    ordered.extend(sorted(by_id.values(), key=policy.queue_key))
    positions: dict[Hashable, dict[str, int]] = {}
    per_share: dict[str, int] = {}
    for overall, q in enumerate(ordered, start=1):
        per_share[q.share] = per_share.get(q.share, 0) + 1
        positions[q.job_id] = {"in_share": per_share[q.share], "overall": overall}
    return positions


def _basis(counts: Mapping[str, int]) -> str:
    """`counts`: how many guessed ends it waits on, by where each guess comes from (in words). A guess
    from too little history is always named (first): the ETA then says that it rests on a default."""
    n = sum(counts.values())
    jobs = "1 job" if n == 1 else f"{n} jobs"
    what = ", ".join(sorted(counts, key=lambda w: (not w.startswith(TOO_LITTLE_HISTORY), -counts[w], w))[:3])
    return f"estimate: {jobs} without a max runtime end before it ({what})"


def _merged(by_share: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for counts in by_share.values():
        for words, n in counts.items():
            out[words] = out.get(words, 0) + n
    return out


def _on_its_own(snapshot: Snapshot) -> set[tuple[str, str]]:
    """(share, gpu type) whose one-GPU jobs wait on nothing but their own share's work: a RESERVE share
    of a type that is not over-committed. It lends nothing and borrows nothing, and the cover (rule 3)
    keeps as many GPUs free as RESERVE shares have idle, so when one of its jobs ends the next starts at
    once, whatever the other shares run. (A job of several GPUs also needs them on one node, which other
    shares' work can fragment; an over-committed type cannot keep every guarantee.)"""
    cluster: dict[str, int] = {}
    for n in snapshot.nodes:
        if n.schedulable:
            cluster[n.gpu_type] = cluster.get(n.gpu_type, 0) + n.gpus
    promised: dict[str, int] = {}
    for v in snapshot.shares:
        for gpu_type, cap in v.capacity.items():
            promised[gpu_type] = promised.get(gpu_type, 0) + cap
    return {
        (v.name, gpu_type)
        for v in snapshot.shares
        if v.strategy == policy.RESERVE
        for gpu_type in v.capacity
        if promised.get(gpu_type, 0) <= cluster.get(gpu_type, 0)
    }


def _backfill_estimates(
    snapshot: Snapshot,
    eta: Mapping[Hashable, float],
    alone: set[Hashable],
    kind: dict[Hashable, str],
    basis: dict[Hashable, str],
) -> None:
    """Bound ETAs that backfill (rule 6, best-effort) can break become estimates. The replay ends every
    job at its max runtime; a job that ends sooner frees its GPUs early, and what starts in them then
    differs from the replay:
    - a job of several GPUs can be overtaken by smaller jobs, or find the free blocks on other nodes
      than in the replay, where attempts end early one by one: it stays bound only when it waits for
      the one attempt of its type (`alone`: no other ran or was replayed before it);
    - a job the replay starts ahead of its share's order (into a gap a bigger job before it could not
      use) may find no such gap;
    - in a share with in-share pre-emption and work of several priorities, backfilled work can be
      pre-empted and run again, later than in the replay.
    A bound holds against the queue as it is: work that arrives later can still delay it (higher
    priority, or a smaller job that backfills)."""
    now = snapshot.now

    def downgrade(q: QueuedView) -> None:
        if eta.get(q.job_id, now) > now and kind.get(q.job_id) == BOUND:
            kind[q.job_id], basis[q.job_id] = ESTIMATE, BACKFILL_BASIS

    groups: dict[tuple[str, str], list[QueuedView]] = {}
    for q in snapshot.queued:
        groups.setdefault((q.share, q.gpu_type), []).append(q)
        if q.gpus > 1 and q.job_id not in alone:
            downgrade(q)
    # In-share pre-emption (rule 4) between work of several priorities: a job that backfilled early
    # can be pre-empted and run again later than the replay has it, in front of lower priorities.
    preempting = {v.name for v in snapshot.shares if v.in_share_preemption}
    priorities: dict[tuple[str, str], set[int]] = {}
    for work in (*snapshot.queued, *snapshot.running):
        if work.share in preempting:
            priorities.setdefault((work.share, work.gpu_type), set()).add(work.priority)
    for key, levels in priorities.items():
        if len(levels) > 1:
            for q in groups.get(key, ()):
                downgrade(q)
    for jobs in groups.values():
        jobs.sort(key=policy.queue_key)
        latest = now  # the latest ETA of the jobs before it in the share's order (inf: one has none)
        for q in jobs:
            at = eta.get(q.job_id, math.inf)
            if latest > at:
                downgrade(q)
            latest = max(latest, at)


# The replay makes no reference cycles; the collector's walks over its growing heap were a fifth of it.
@collector.paused()
def forecast(
    snapshot: Snapshot,
    *,
    runtime_s: Mapping[Hashable, float],
    estimates: Mapping[Hashable, Estimate | Guess] | None = None,
    grace_s: Mapping[Hashable, float] | None = None,
    default_runtime_s: float = 3600,
    default_grace_s: float = 30,
    planner: Planner | None = None,
    targets: Iterable[Hashable] | None = None,
    max_passes: int = DEFAULT_MAX_PASSES,
    horizon_s: float = DEFAULT_HORIZON_S,
    budget_s: float = DEFAULT_BUDGET_S,
    spread: Mapping[Hashable, tuple[float, float]] | None = None,
    arrivals: Sequence[QueuedView] = (),
) -> Forecast:
    """Replay the planner forward from `snapshot`. `runtime_s` / `grace_s` are per job id. A job in
    `estimates` has a guessed runtime (where it comes from); any other job's runtime in `runtime_s` is
    its enforced max_runtime_s, and a job in neither gets `default_runtime_s`, a guess. An ETA is
    BOUND when no guessed end it may wait on comes before it in the replay and backfill cannot break
    it (_backfill_estimates). With `targets`, stop as
    soon as those queued jobs have an ETA (positions then still cover every job, those not reached
    in queue order after the ones admitted). With `spread` (job id -> its guessed runtime's low and
    high points), the ETAs get their likely ranges too, and with `arrivals` the estimates allow for
    the work expected to come in meanwhile (likely_ranges)."""
    point = _replay(
        snapshot,
        runtime_s=runtime_s,
        estimates=estimates,
        grace_s=grace_s,
        default_runtime_s=default_runtime_s,
        default_grace_s=default_grace_s,
        planner=planner,
        targets=targets,
        max_passes=max_passes,
        horizon_s=horizon_s,
        budget_s=budget_s,
    )
    if spread is None or not point.eta:
        return point
    return likely_ranges(
        snapshot,
        point,
        runtime_s=runtime_s,
        spread=spread,
        arrivals=arrivals,
        grace_s=grace_s,
        default_runtime_s=default_runtime_s,
        default_grace_s=default_grace_s,
        planner=planner,
        max_passes=max_passes,
        horizon_s=horizon_s,
        budget_s=budget_s,
    )


# The work expected to arrive is what came in over the last ARRIVALS_WINDOW_S, again: each job submitted
# that long before now comes in again that long after its submit (a day keeps the day's rhythm).
ARRIVALS_WINDOW_S = 86_400
ARRIVALS_BASIS = "; allows for new work as much as came in the last day"


def likely_ranges(
    snapshot: Snapshot,
    point: Forecast,
    *,
    runtime_s: Mapping[Hashable, float],
    spread: Mapping[Hashable, tuple[float, float]],
    arrivals: Sequence[QueuedView] = (),
    grace_s: Mapping[Hashable, float] | None = None,
    default_runtime_s: float = 3600,
    default_grace_s: float = 30,
    planner: Planner | None = None,
    max_passes: int = DEFAULT_MAX_PASSES,
    horizon_s: float = DEFAULT_HORIZON_S,
    budget_s: float = DEFAULT_BUDGET_S,
) -> Forecast:
    """`point` with its estimates made with the work expected to arrive, and the likely range of each
    ETA (SEMANTICS "Ranges"); more replays of the same policy:
    - with `arrivals` (work expected to come in, with its guessed runtimes in `runtime_s`/`spread`): the
      point again with them. A job that must borrow waits behind what other teams submit meanwhile
      (their own capacity comes first, rule 2), which the queue as it is cannot show; the estimates
      are then that replay's starts. Bounds and kinds stay those of the queue as it is (a bound holds
      against it, and new work cannot make an enforced runtime longer);
    - one with every guessed runtime at its low point (runtimes.LOW_Q) and one at its high point
      (HIGH_Q): a job's range runs from its start in the first to its start in the second, widened to
      hold the ETA. Quantile replays rather than sampled ones: they cost what a replay costs, whatever
      the queue (the whole queue's ranges within a minute at 100k jobs), and they are deterministic.
      All guesses at one quantile at once overstates the spread where a job waits on many ends (they
      do not all run short or long together); the work that arrives meanwhile, which moves starts
      later, is left out of them, and the two roughly offset (measured: bench 12).
    The range always holds the ETA; a BOUND ETA's range ends at it (nothing it rests on can run longer).
    A range has the width of what is not known: an estimate whose replays all start it at one instant
    gets no range rather than one of no width (a range "between 02:02 and 02:02" promises a certainty that
    an estimate does not have), and with no spread at all only bounds get one (the ETA itself). A job the
    high replay does not start (horizon, budget) gets no range."""
    if not spread:
        return replace(
            point, ranges={job: (t, t) for job, t in point.eta.items() if point.kind.get(job) == BOUND}
        )
    options = dict(
        grace_s=grace_s,
        default_runtime_s=default_runtime_s,
        default_grace_s=default_grace_s,
        planner=planner,
        targets=list(point.eta),
        max_passes=max_passes,
        horizon_s=horizon_s,
        budget_s=budget_s,
    )

    def at(side: int) -> dict[Hashable, float]:
        runtimes = dict(runtime_s)
        for job_id, points in spread.items():
            runtimes[job_id] = points[side]
        return runtimes

    eta = dict(point.eta)
    basis = dict(point.basis)
    if arrivals:
        expected = _replay(snapshot, runtime_s=runtime_s, estimates={}, arrivals=arrivals, **options).eta
        for job_id, t in expected.items():
            if point.kind.get(job_id) == ESTIMATE and t != eta[job_id]:
                eta[job_id] = t
                basis[job_id] = basis.get(job_id, "") + ARRIVALS_BASIS
    low_eta = _replay(snapshot, runtime_s=at(0), estimates={}, **options).eta
    high_eta = _replay(snapshot, runtime_s=at(1), estimates={}, **options).eta
    ranges: dict[Hashable, tuple[float, float]] = {}
    for job_id, t in eta.items():
        low = min(low_eta.get(job_id, t), t)
        if point.kind.get(job_id) == BOUND:
            ranges[job_id] = (low, t)
        elif job_id in high_eta and max(high_eta[job_id], t) > low:
            ranges[job_id] = (low, max(high_eta[job_id], t))
    return replace(point, eta=eta, basis=basis, ranges=ranges)


def _replay(
    snapshot: Snapshot,
    *,
    runtime_s: Mapping[Hashable, float],
    estimates: Mapping[Hashable, Estimate | Guess] | None,
    grace_s: Mapping[Hashable, float] | None,
    default_runtime_s: float,
    default_grace_s: float,
    planner: Planner | None,
    targets: Iterable[Hashable] | None,
    max_passes: int,
    horizon_s: float,
    budget_s: float,
    arrivals: Sequence[QueuedView] = (),
) -> Forecast:
    """forecast() without the ranges: one replay. `arrivals`: queued work that comes in at its
    submitted_at, a time after the snapshot's (work expected to arrive; it gets no ETA itself)."""
    # The default planner is the engine kept between the replay's passes (each pass costs what it
    # decides); a planner given by the caller (tests, stand-ins) gets a snapshot per pass.
    engine = policy.Engine.from_snapshot(snapshot) if planner is None else None
    grace_s = grace_s or {}
    start = snapshot.now
    deadline = time.monotonic() + budget_s
    queued: dict[Hashable, QueuedView] = {q.job_id: q for q in snapshot.queued}
    waiting_at_start = set(queued)  # a pre-empted job queued again later gets no ETA: it was running
    # Work expected to arrive (never given an ETA itself), the earliest first.
    coming = sorted((q for q in arrivals if q.submitted_at > start), key=lambda q: q.submitted_at)
    arrived = 0
    wanted = set(queued) if targets is None else set(targets) & set(queued)
    unanswered = len(wanted)

    estimates = estimates or {}
    default_estimate = Estimate(float(default_runtime_s))

    def runtime(job_id: Hashable) -> float:
        return float(runtime_s.get(job_id, default_runtime_s))

    def guess(job_id: Hashable) -> Estimate | Guess | None:
        """Where this job's runtime comes from if it is a guess; None for an enforced limit."""
        if job_id in estimates:
            return estimates[job_id]
        return None if job_id in runtime_s else default_estimate

    # Per GPU type and share, the guessed ends the replay has passed so far (counted by where each
    # guess comes from): an ETA after any that it may wait on is an estimate.
    guessed: dict[str, dict[str, dict[str, int]]] = {}
    # Per (GPU type, share or None for all), _basis of its counts while they do not change: the jobs
    # admitted between two guessed ends share it (sorting the estimates for each took a tenth of a replay).
    basis_of: dict[tuple[str, str | None], str] = {}
    on_its_own = _on_its_own(snapshot)
    kind: dict[Hashable, str] = {}
    basis: dict[Hashable, str] = {}
    guessed_ends: set[Hashable] = set()  # attempt ids whose end in the replay is a guess
    fair_taken: set[Hashable] = set()  # attempt ids the replay's fair reclaims pre-empt (rule 11)

    def grace(job_id: Hashable) -> float:
        return float(grace_s.get(job_id, default_grace_s))

    running: dict[Hashable, RunningView] = {}
    ends: dict[Hashable, float] = {}
    # (end, n, attempt id), the earliest first; an entry whose end is no longer ends[attempt] is stale
    # (the attempt ended, or a pre-emption brought its end forward).
    end_heap: list[tuple[float, int, Hashable]] = []
    pushed = 0

    def expect_end(attempt_id: Hashable, at: float) -> None:
        nonlocal pushed
        ends[attempt_id] = at
        pushed += 1
        heapq.heappush(end_heap, (at, pushed, attempt_id))

    borrowing = {r.gpu_type for r in snapshot.running if r.borrowed}  # types with borrowed work so far
    attempts_seen: dict[str, int] = {}  # per type: attempts running at the start or replayed so far
    for r in snapshot.running:
        attempts_seen[r.gpu_type] = attempts_seen.get(r.gpu_type, 0) + 1
    alone: set[Hashable] = set()  # admitted when at most one attempt of its type had run
    for r in snapshot.running:
        running[r.attempt_id] = r
        expected = start + grace(r.job_id) if r.preempting else r.started_at + runtime(r.job_id)
        if not r.preempting and guess(r.job_id) is not None:
            guessed_ends.add(r.attempt_id)
            if expected <= start:
                # Running past its guess: it is no reason to expect it to end this instant (an ETA of
                # "now" that never comes). Expect it to run half as long again as it has, a minute at least.
                expected = start + max(60.0, (start - r.started_at) / 2)
        expect_end(r.attempt_id, max(start, expected))

    def put_queued(q: QueuedView) -> None:
        queued[q.job_id] = q
        if engine is not None:
            engine.add_queued(q)

    def put_running(r: RunningView) -> None:
        running[r.attempt_id] = r
        if engine is not None:
            engine.add_running(r)

    t = start
    stop = f"beyond what the forecast replays ({max_passes} passes, {budget_s:g} s)"
    eta: dict[Hashable, float] = {}
    order: list[Hashable] = []
    waiting: dict[Hashable, str] = {}
    protected: dict[Hashable, policy.ProtectionWait] = {}  # rule 10: who waits for protection now
    passes = 0
    replayed = 0
    while unanswered and passes < max_passes and time.monotonic() < deadline:
        try:
            if engine is not None:
                decided = engine.plan(t)
            else:
                decided = planner(
                    replace(
                        snapshot,
                        now=t,
                        running=tuple(running.values()),
                        queued=tuple(sorted(queued.values(), key=lambda q: q.job_id)),
                    )
                )
        except Exception:  # an ETA is advice: a planner bug must not break the page that shows it
            log.exception("forecast: the planner failed; showing the plain queue order")
            return Forecast(positions=_positions(snapshot.queued, []), planned=False, passes=passes)
        if passes == 0:
            waiting = dict(decided.waiting)
            protected = dict(decided.protected)
        passes += 1

        changed = False
        started: list[Hashable] = []
        for adm in decided.admissions:
            q = queued.pop(adm.job_id, None)
            if q is None:
                continue
            started.append(adm.job_id)
            changed = True
            if adm.job_id in waiting_at_start and adm.job_id not in eta:
                eta[adm.job_id] = t
                order.append(adm.job_id)
                if attempts_seen.get(q.gpu_type, 0) <= 1:
                    alone.add(adm.job_id)
                if adm.job_id in wanted:
                    unanswered -= 1
                # What it waits on: its own share's work where nothing else can hold it back, else all
                # the work of its type.
                own = q.gpus == 1 and (q.share, q.gpu_type) in on_its_own
                by_share = guessed.get(q.gpu_type, {})
                key = (q.gpu_type, q.share if own else None)
                if by_share.get(q.share) if own else by_share:
                    words = basis_of.get(key)
                    if words is None:
                        words = basis_of[key] = _basis(by_share[q.share] if own else _merged(by_share))
                    kind[adm.job_id], basis[adm.job_id] = ESTIMATE, words
                elif own:
                    kind[adm.job_id], basis[adm.job_id] = (
                        BOUND,
                        "bound: every job before it in its share has a max runtime",
                    )
                elif t > start and (
                    adm.borrowed or (q.gpu_type in borrowing and adm.job_id not in protected)
                ):
                    # Borrowed GPUs come and go with other shares' work, which ends early too. Not for a
                    # job that waits for protection: no new borrowing of its type starts meanwhile (rule
                    # 10), so its wait rests on the windows' ends and the grace periods, both enforced.
                    kind[adm.job_id], basis[adm.job_id] = ESTIMATE, BORROWING_BASIS
                elif adm.job_id in protected:
                    kind[adm.job_id], basis[adm.job_id] = (
                        BOUND,
                        "bound: the protection windows it waits for end, and every job before it has a "
                        "max runtime",
                    )
                else:
                    kind[adm.job_id], basis[adm.job_id] = (
                        BOUND,
                        "bound: every job before it has a max runtime",
                    )
            # Real attempt ids are positive ints; replayed ones count down from -1, so that all ids stay
            # of one orderable type (the planner breaks ties by id).
            replayed += 1
            attempt_id = -replayed
            put_running(
                RunningView(
                    attempt_id=attempt_id,
                    job_id=q.job_id,
                    share=q.share,
                    gpu_type=q.gpu_type,
                    priority=q.priority,
                    submitted_at=q.submitted_at,
                    started_at=t,
                    placement=adm.placement,
                    borrowed=adm.borrowed,
                    fair_reclaims=q.fair_reclaims,  # rule 11's bound per job holds in the replay too
                )
            )
            expect_end(attempt_id, t + runtime(q.job_id))
            if adm.borrowed:
                borrowing.add(q.gpu_type)
            attempts_seen[q.gpu_type] = attempts_seen.get(q.gpu_type, 0) + 1
            if guess(q.job_id) is not None:
                guessed_ends.add(attempt_id)
        if engine is not None and started:
            engine.remove_queued_many(started)
        beneficiaries = set()
        for pre in decided.preemptions:
            victim = running.get(pre.attempt_id)
            if victim is None or victim.preempting:
                continue
            changed = True
            put_running(replace(victim, preempting=True, beneficiary_job_id=pre.beneficiary_job_id))
            if pre.reason == policy.FAIR_SHARE:
                fair_taken.add(pre.attempt_id)
            if t + grace(victim.job_id) < ends[pre.attempt_id]:
                expect_end(pre.attempt_id, t + grace(victim.job_id))
                guessed_ends.discard(pre.attempt_id)  # the grace period is enforced
            beneficiaries.add(pre.beneficiary_job_id)
        for job_id in beneficiaries:
            if job_id in queued:
                put_queued(replace(queued[job_id], beneficiary=True))
        if changed and not decided.settled:
            continue  # passes repeat at one instant until one decides nothing new (Plan.settled: known)

        while end_heap and ends.get(end_heap[0][2]) != end_heap[0][0]:
            heapq.heappop(end_heap)  # stale
        # The next instant: an end, or a protection window that matters ending (rule 10: the walk is
        # made again then, so an ETA behind protected jobs is that instant or later).
        recheck = decided.recheck_at
        if not end_heap and recheck is None and arrived == len(coming):
            stop = "nothing running or admitted ends to make room for it"
            break  # what is still queued waits for capacity that is not there
        t_next = end_heap[0][0] if end_heap else math.inf
        if recheck is not None and recheck < t_next:
            t_next = recheck
        if arrived < len(coming) and coming[arrived].submitted_at < t_next:
            t_next = coming[arrived].submitted_at
        t_next = max(t, t_next)
        if t_next - start > horizon_s:
            stop = f"not started within the {duration(horizon_s)} forecast horizon"
            break
        t = t_next
        while end_heap and end_heap[0][0] <= t:
            end, _, attempt_id = heapq.heappop(end_heap)
            if ends.get(attempt_id) != end:
                continue  # stale
            del ends[attempt_id]
            r = running.pop(attempt_id)
            if engine is not None:
                engine.remove_running(attempt_id)
            if attempt_id in guessed_ends:
                guessed_ends.discard(attempt_id)
                words = (guess(r.job_id) or default_estimate).words()
                counts = guessed.setdefault(r.gpu_type, {}).setdefault(r.share, {})
                basis_of.pop((r.gpu_type, None), None)
                basis_of.pop((r.gpu_type, r.share), None)
                counts[words] = counts.get(words, 0) + 1
            if r.preempting:  # a pre-empted job goes back to the queue with its original submit time
                put_queued(
                    QueuedView(
                        job_id=r.job_id,
                        share=r.share,
                        gpu_type=r.gpu_type,
                        gpus=r.gpus,
                        priority=r.priority,
                        submitted_at=r.submitted_at,
                        fair_reclaims=r.fair_reclaims + (attempt_id in fair_taken),
                    )
                )
        while arrived < len(coming) and coming[arrived].submitted_at <= t:
            put_queued(coming[arrived])
            arrived += 1

    _backfill_estimates(snapshot, eta, alone, kind, basis)
    # A job waiting for protection is told when the windows end (its reason); where the replay starts it
    # sooner (the jobs it needs end by their max runtime or their guess, or other GPUs free), the reason
    # says so, so that its ETA is never before a time its reason names.
    for job_id, wait in protected.items():
        at = eta.get(job_id)
        if at is not None and at < wait.until and waiting.get(job_id):
            waiting[job_id] = f"{waiting[job_id]}, or as soon as GPUs free before then ({policy.at_time(at)})"
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
