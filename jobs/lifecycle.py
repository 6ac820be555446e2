"""How attempts begin and end, and what that does to their job.

Every change goes through compare-and-set updates (filter on id, state and attempt number, then update):
a duplicated or late message about an attempt changes nothing the second time, and an old attempt
number is ignored. Messages to the GPU hosts are sent only after the transaction commits.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs import signals
from jobs.choices import (
    ATTEMPT_ACTIVE_STATES,
    JOB_ACTIVE_STATES,
    AttemptState,
    EventKind,
    JobState,
    LostCause,
    Outcome,
    PreemptionReason,
)
from jobs.limits import effective_grace
from jobs.models import Attempt, GpuClaim, Job
from jobs.transitions import record_event, transition

log = logging.getLogger(__name__)

# How an agent's end report (how="shutdown") begins where it stopped the attempt for a fault of its host,
# not an orderly stop of itself (gpunodes.agent.runner: a container whose podman died under it).
HOST_FAULT = "host fault: "


def _nodes_of(placement: list[dict]) -> list[str]:
    return [p["node"] for p in placement]


def _request_pass(why: str, *, reforecast: bool = False) -> None:
    signals.announce(why, reforecast=reforecast)


def send_stop(attempt: Attempt, grace_s: int) -> None:
    """After commit, ask every host of the attempt to stop it (SIGTERM, SIGKILL after grace)."""
    from gpunodes.dispatch import preempt_attempt

    nodes = _nodes_of(attempt.placement)
    attempt_id, number = attempt.pk, attempt.number
    transaction.on_commit(lambda: [preempt_attempt(n, attempt_id, number, grace_s) for n in nodes])


@transaction.atomic
def mark_started(attempt_id: int, number: int, node: str) -> bool:
    """The host reports the process is running. Returns whether anything changed."""
    now = timezone.now()
    changed = Attempt.objects.filter(pk=attempt_id, number=number, state=AttemptState.ADMITTED).update(
        state=AttemptState.RUNNING, started_at=now
    )
    if not changed:
        return False
    job_id, placement = Attempt.objects.values_list("job_id", "placement").get(pk=attempt_id)
    transition(
        job_id,
        from_states=[JobState.ADMITTED],
        to_state=JobState.RUNNING,
        event=EventKind.STARTED,
        reason=running_on(placement, node),
        attempt_number=number,
    )
    return True


def record_pull(attempt_id: int, number: int, pull_s: float) -> None:
    """A host's pull time of the attempt's image: the longest of its hosts' (a gang starts when its
    slowest rank has the image)."""
    Attempt.objects.filter(pk=attempt_id, number=number).filter(
        Q(pull_s__isnull=True) | Q(pull_s__lt=pull_s)
    ).update(pull_s=float(pull_s))


def running_on(placement, node: str) -> str:
    """The STARTED event's words: every node of the attempt, in rank order ("running on gpu-a (rank 0),
    gpu-b (rank 1)"), not only the one whose report came first; cut to the event's 300 characters."""
    nodes = [p.get("node") for p in placement or () if isinstance(p, dict) and p.get("node")]
    if len(nodes) <= 1:
        return f"running on {nodes[0] if nodes else node}"
    words = f"running on {len(nodes)} nodes: " + ", ".join(f"{n} (rank {r})" for r, n in enumerate(nodes))
    return words if len(words) <= 300 else words[:296] + " ..."


# --- checkpoints and the work an end loses (SEMANTICS "Checkpoints and safe points") ------------------

# A checkpoint time further back than this is no time a live attempt's host could have seen.
CHECKPOINT_MAX_AGE_S = 366 * 86400


@transaction.atomic
def record_checkpoint(attempt_id: int, number: int, *, node: str, at: float, count: int = 0) -> bool:
    """A host of a live attempt saw its job save a checkpoint at `at` (epoch seconds, the host's clock;
    one ahead of this side's is taken as now), `count` being how many it has seen in this attempt. The
    attempt's safe point moves forward only: a late or repeated report changes nothing. An attempt on
    several nodes is safe up to the oldest of the latest checkpoints of the nodes that reported any (a
    job that saves on its first node only is safe up to that one). No pass is asked for: the order of
    victims is read from the next pass's snapshot. Returns whether anything changed."""
    now = timezone.now()
    if type(at) not in (int, float) or not math.isfinite(at) or at < now.timestamp() - CHECKPOINT_MAX_AGE_S:
        return False
    at = min(float(at), now.timestamp())
    attempt = (
        Attempt.objects.select_for_update()
        .filter(pk=attempt_id, number=number, state__in=list(ATTEMPT_ACTIVE_STATES))
        .only("pk", "checkpoints", "checkpoint_by_node", "last_checkpoint_at", "admitted_at")
        .first()
    )
    if attempt is None:
        return False
    if at < attempt.admitted_at.timestamp() - settings.MESSAGE_CLOCK_SKEW_S:
        return False  # saved before this attempt existed: not its checkpoint
    by_node = dict(attempt.checkpoint_by_node or {})
    seen = max(attempt.checkpoints, count if type(count) is int and 0 <= count < 2**31 else 0)
    if type(by_node.get(node)) in (int, float) and by_node[node] >= at and seen == attempt.checkpoints:
        return False
    by_node[node] = max(at, by_node.get(node) or 0.0)
    safe = datetime.fromtimestamp(min(by_node.values()), tz=UTC)
    Attempt.objects.filter(pk=attempt.pk).update(
        checkpoint_by_node=by_node, checkpoints=seen, last_checkpoint_at=safe
    )
    return True


def lost_cause(
    outcome: str, preemption_reason: str, *, fenced: bool = False, host_fault: bool = False
) -> str:
    """Why an attempt that ended so lost its work since its safe point; "" where it lost nothing to
    anyone's decision (it succeeded, failed, timed out, or its job was cancelled). `host_fault`: its
    agent stopped it for a fault of its host (an AGENT_STOPPED end whose reason begins HOST_FAULT), not
    at an orderly stop of the agent."""
    if outcome == Outcome.PREEMPTED:
        return {
            PreemptionReason.RECLAIM: LostCause.RECLAIM,
            PreemptionReason.PRIORITY: LostCause.PRIORITY,
            PreemptionReason.FAIR_SHARE: LostCause.FAIR_SHARE,
        }.get(preemption_reason, "")
    if outcome == Outcome.NODE_LOST:
        return LostCause.FENCED if fenced else LostCause.NODE_LOST
    if outcome == Outcome.GPU_FAILED:
        return LostCause.GPU_FAILED
    if outcome == Outcome.AGENT_STOPPED:
        return LostCause.HOST_FAULT if host_fault else LostCause.AGENT_STOPPED
    return ""


def work_done_and_lost(attempt: Attempt, cause: str, ended: datetime) -> tuple[float, float]:
    """(GPU-seconds run, GPU-seconds lost) of an attempt ending at `ended`: GPUs x its run, and where
    there is a `cause`, GPUs x (end - safe point), the safe point being the later of its start and its
    last checkpoint. An attempt that never started ran and lost nothing."""
    if attempt.started_at is None:
        return 0.0, 0.0
    gpus = sum(len(p.get("gpus", ())) for p in attempt.placement or ())
    run = gpus * max(0.0, (ended - attempt.started_at).total_seconds())
    if not cause:
        return run, 0.0
    safe = max(attempt.started_at, attempt.last_checkpoint_at or attempt.started_at)
    return run, gpus * max(0.0, (ended - safe).total_seconds())


def duration_words(seconds: float) -> str:
    """A span in a few words: "42 s", "3 min", "2 h" (as quotas.services says it; not imported: the
    pass's side imports this module)."""
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    return f"{seconds // 60} min" if seconds < 7200 else f"{seconds // 3600} h"


def attempt_words(attempt_id: int, number: int | None = None) -> str:
    """An attempt as the log names it: "job 14, attempt 2" (its id is internal; what a user reads on the
    job page is its job and number). One query; "attempt id N" if it is gone."""
    row = Attempt.objects.filter(pk=attempt_id).values_list("job_id", "number").first()
    if row is None:
        return f"attempt id {attempt_id}" + (f" (number {number})" if number is not None else "")
    return f"job {row[0]}, attempt {row[1] if number is None else number}"


def gpu_time_words(gpu_seconds: float) -> str:
    """GPU time in a few words: "45 GPU-s", "12 GPU-min", "3.5 GPU-h": the one wording of work run or
    lost, in the job's events as on its page (the template filter gpu_time)."""
    if gpu_seconds < 120:
        return f"{gpu_seconds:.0f} GPU-s"
    if gpu_seconds < 7200:
        return f"{gpu_seconds / 60:.0f} GPU-min"
    return f"{gpu_seconds / 3600:,.1f} GPU-h"


def lost_words(attempt: Attempt, lost_s: float) -> str:
    """The work an end threw away, as the job's events say it, in the words of its page's "work lost":
    "lost 8 GPU-min of work on 2 GPUs since its last checkpoint at 12:03:05", or "since its start at
    11:58:40 (no checkpoint)"."""
    gpus = sum(len(p.get("gpus", ())) for p in attempt.placement or ())
    last, started = attempt.last_checkpoint_at, attempt.started_at
    if last is not None and (started is None or last > started):
        since = f"its last checkpoint at {timezone.localtime(last):%H:%M:%S}"
    else:
        since = f"its start at {timezone.localtime(started):%H:%M:%S} (no checkpoint)"
    return f"lost {gpu_time_words(lost_s)} of work on {gpus} GPU{'s' if gpus != 1 else ''} since {since}"


def _release(attempt_id: int) -> None:
    GpuClaim.objects.filter(attempt_id=attempt_id).delete()


@transaction.atomic
def end_attempt(
    attempt_id: int,
    number: int,
    *,
    outcome: str,
    exit_code: int | None = None,
    reason: str = "",
    at: datetime | None = None,
    fenced: bool = False,
    strike_node: str = "",
    no_strike: str = "",
) -> bool:
    """End a live attempt, free its GPUs, store the work it ran and the work it lost (since its safe
    point, with the cause: lost_cause; `fenced`: its host's agent killed it for a lapsed lease), and
    move its job on. `at`: when its processes ended (the caller bounds a host's word: jobs.tasks), now
    if not given; its events are dated when they are written:

    - a cancelled job (CANCELLING) → CANCELLED, now that its processes are gone and its GPUs free;
    - a stopping attempt (pre-empted) → the job is re-queued (or FAILED past max_preemptions); a
      pre-empted one whose process still exited 0 within its grace has finished its work: SUCCEEDED;
    - a running attempt that exited → SUCCEEDED / FAILED (TIMED_OUT is a failure);
    - NODE_LOST → the job is re-queued with its original submit time, or HELD when its strikes in a
      row reach HOLD_AFTER_NODE_LOST different hosts (hold_or_requeue; `strike_node`: the host it was
      lost on, its first node if not given; `no_strike`: why this end is no strike, in words);
    - AGENT_STOPPED (an orderly shutdown of its host's agent) and REFUSED (its host would not run it)
      → re-queued with its original submit time: never a strike, nor a break in the strikes' row;
    - GPU_FAILED (its GPU was found broken) → re-queued with its original submit time: not the user's
      failure, not a pre-emption (max_preemptions), and neither a step of nor a break in the streak of
      NODE_LOST ends that holds a job. Even while it was stopping (pre-empted: the pre-emption was
      counted when it was decided).
    Returns whether this call ended it (False for a duplicate or an old attempt)."""
    now = at or timezone.now()
    attempt = (
        Attempt.objects.select_for_update()
        .select_related("job")
        .filter(pk=attempt_id, number=number, state__in=list(ATTEMPT_ACTIVE_STATES))
        .first()
    )
    if attempt is None:
        return False
    job = attempt.job
    cancelling = job.state in (JobState.CANCELLING, JobState.CANCELLED)
    how = outcome
    if cancelling:
        outcome = Outcome.CANCELLED
    elif attempt.state == AttemptState.STOPPING and outcome not in (
        Outcome.NODE_LOST,
        Outcome.SUCCEEDED,
        Outcome.GPU_FAILED,
    ):
        outcome = Outcome.PREEMPTED  # one that finished within its grace (exit 0) succeeded: not run again
    cause = lost_cause(
        outcome, attempt.preemption_reason, fenced=fenced, host_fault=reason.startswith(HOST_FAULT)
    )
    run_s, lost_s = work_done_and_lost(attempt, cause, now)
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.ENDED,
        outcome=outcome,
        exit_code=exit_code,
        ended_at=now,
        end_reason=reason[:300],
        gpu_seconds_run=run_s,
        gpu_seconds_lost=lost_s,
        lost_cause=cause,
    )
    _release(attempt.pk)
    # What it lost, for the event that says it ended (PREEMPTED, NODE_LOST).
    lost, words = {}, ""
    if cause:
        last = attempt.last_checkpoint_at
        lost = {
            "gpu_seconds_lost": round(lost_s, 1),
            "lost_cause": cause,
            "last_checkpoint_at": last.isoformat() if last else None,
        }
        words = lost_words(attempt, lost_s) if attempt.started_at is not None else ""
    _request_pass("attempt ended")
    if cancelling:
        ended = "its host lost it" if how == Outcome.NODE_LOST else (reason or "stopped")
        who = job.state_reason.split(";")[0] if job.state_reason.startswith("cancelled by ") else "cancelled"
        transition(
            job.pk,
            from_states=[JobState.CANCELLING, JobState.CANCELLED],  # CANCELLED: a row from before CANCELLING
            to_state=JobState.CANCELLED,
            event=EventKind.CANCELLED,
            reason=f"{who}: attempt {number} ended ({ended}); its GPUs are free",
            attempt_number=number,
            exit_code=exit_code,
            finished_at=now,
            detail={"outcome": how, "exit_code": exit_code},
        )
        return True

    active = [s.value for s in JOB_ACTIVE_STATES]
    if outcome == Outcome.SUCCEEDED:
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.SUCCEEDED,
            event=EventKind.SUCCEEDED,
            reason=reason or "exit code 0",
            attempt_number=number,
            exit_code=exit_code,
            finished_at=now,
        )
    elif outcome in (Outcome.FAILED, Outcome.TIMED_OUT):
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.FAILED,
            event=EventKind.FAILED,
            reason=reason or f"exit code {exit_code}",
            attempt_number=number,
            exit_code=exit_code,
            finished_at=now,
            detail={"outcome": outcome},
        )
    elif outcome == Outcome.PREEMPTED:
        limit = job.max_preemptions
        if limit != -1 and job.preemption_count > limit:
            transition(
                job.pk,
                from_states=active,
                to_state=JobState.FAILED,
                event=EventKind.FAILED,
                reason=f"pre-empted more than max_preemptions={limit} times",
                attempt_number=number,
                finished_at=now,
            )
        else:
            said = attempt.end_reason or reason or "stopped"
            record_event(
                job.pk,
                EventKind.PREEMPTED,
                f"{said}; {words}" if words else said,
                attempt_number=number,
                at=now,
                detail={"preempted_by": attempt.preempted_by_id, "reason": attempt.preemption_reason, **lost},
            )
            transition(
                job.pk,
                from_states=active,
                to_state=JobState.QUEUED,
                event=EventKind.REQUEUED,
                reason="re-queued with its original submit time",
                attempt_number=number,
                node_lost_streak=0,
                strike_nodes=[],
            )
    elif outcome == Outcome.NODE_LOST:
        said = reason or "node lost"
        if not no_strike and attempt.state == AttemptState.ADMITTED:
            no_strike = "it never ran there"
        if not no_strike:
            strike_node = strike_node or _lost_node(attempt)
            from gpunodes.leases import shared_lapse

            others = shared_lapse(strike_node, timezone.now())
            if others:
                no_strike = (
                    f"{len(others)} other host{'s' if len(others) != 1 else ''} ({', '.join(others[:5])}) "
                    "lapsed at the same time: the control plane's outage, not the job's"
                )
        hold_or_requeue(
            job,
            number,
            f"{said}; {words}" if words else said,
            detail=lost,
            strike_node=None if no_strike else strike_node,
            no_strike=no_strike,
        )
    elif outcome in (Outcome.AGENT_STOPPED, Outcome.REFUSED):
        if outcome == Outcome.AGENT_STOPPED:
            said = f"{reason or 'stopped with its agent'} at {timezone.localtime(now):%H:%M:%S}"
            if words and attempt.last_checkpoint_at is not None and lost_s < 1.0:
                words = f"it saved a checkpoint at {timezone.localtime(attempt.last_checkpoint_at):%H:%M:%S}: nothing lost"
            why = "an orderly stop of its host's agent, not a lost host"
            if reason.startswith(HOST_FAULT):  # the agent stopped it for its host's fault (podman died)
                why = "its host's fault, not the job's"
        else:
            said, why = reason or "refused by its host", "its host's state or shortage, not the job's"
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.QUEUED,
            event=EventKind.AGENT_STOPPED if outcome == Outcome.AGENT_STOPPED else EventKind.REQUEUED,
            reason=f"{said}; {words + '; ' if words else ''}{why}: no strike toward holding it; re-queued with "
            "its original submit time",
            attempt_number=number,
            detail={"outcome": outcome, "strike": False, **lost},
        )
    elif outcome == Outcome.GPU_FAILED:
        said = f"{reason or 'its GPU failed'}; the hardware's fault, not the job's"
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.QUEUED,
            event=EventKind.GPU_FAILED,
            reason=f"{said}; {words}; re-queued with its original submit time"
            if words
            else f"{said}: re-queued with its original submit time",
            attempt_number=number,
            detail={"outcome": outcome, **lost},
        )
    return True


def _lost_node(attempt: Attempt) -> str:
    """The host an attempt was lost on, where the caller did not say: its node that is LOST, else its
    first node."""
    from gpunodes.choices import NodeState
    from gpunodes.models import Node

    names = _nodes_of(attempt.placement or [])
    lost = Node.objects.filter(name__in=names, state=NodeState.LOST).values_list("name", flat=True)
    return next((n for n in names if n in set(lost)), names[0] if names else "")


def hold_or_requeue(
    job: Job,
    number: int,
    reason: str,
    detail: dict | None = None,
    *,
    strike_node: str | None,
    no_strike: str = "",
) -> None:
    """An attempt ended with its host's agent while it ran (NODE_LOST). The job goes back to the queue
    with its original submit time, unless its strikes reach HOLD_AFTER_NODE_LOST different hosts: a job
    that keeps taking its hosts' agents down is HELD instead of run again for ever, until an admin
    releases it (job_release) or its owner cancels it. A strike is counted once per host: a host that
    keeps failing (or an operator restarting its agent) never holds the jobs that happen to run there.
    `strike_node` None: no strike at all (`no_strike` says why: it never ran, other hosts lapsed at the
    same time); the row of strikes is left as it was."""
    from django.conf import settings

    active = [s.value for s in JOB_ACTIVE_STATES]
    limit = settings.HOLD_AFTER_NODE_LOST
    if strike_node is None:
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.QUEUED,
            event=EventKind.NODE_LOST,
            reason=f"{reason}; no strike toward holding it ({no_strike}); re-queued with its original submit time",
            attempt_number=number,
            detail={"node_lost_in_a_row": job.node_lost_streak, "strike": False, **(detail or {})},
        )
        return
    streak = job.node_lost_streak + 1
    nodes = list(dict.fromkeys([*(job.strike_nodes or []), strike_node]))
    again = strike_node in (job.strike_nodes or [])
    counted = {"node_lost_in_a_row": streak, "strike": True, "strike_nodes": nodes, **(detail or {})}
    if not limit or len(nodes) < limit:
        of = f" of {limit}" if limit else ""
        words = (
            f"a strike on {strike_node} again: strikes count once per host ({len(nodes)}{of} hosts)"
            if again
            else f"strike on {strike_node}: {len(nodes)}{of} hosts ({', '.join(nodes)})"
        )
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.QUEUED,
            event=EventKind.NODE_LOST,
            reason=f"{reason}; {words}; re-queued with its original submit time",
            attempt_number=number,
            node_lost_streak=streak,
            strike_nodes=nodes,
            detail=counted,
        )
        return
    record_event(
        job.pk,
        EventKind.NODE_LOST,
        f"{reason}; strike on {strike_node}",
        attempt_number=number,
        detail=counted,
    )
    transition(
        job.pk,
        from_states=active,
        to_state=JobState.HELD,
        event=EventKind.HELD,
        reason=(
            f"its attempts ended with their host's agent on {len(nodes)} different hosts ({', '.join(nodes)}; "
            f"HOLD_AFTER_NODE_LOST={limit}): held, not run again until an admin releases it; or cancel it "
            "and resubmit"
        ),
        attempt_number=number,
        node_lost_streak=streak,
        strike_nodes=nodes,
        detail={"node_lost_in_a_row": streak, "strike_nodes": nodes},
    )


@transaction.atomic
def request_stop(
    attempt: Attempt,
    *,
    grace_s: int,
    preempted_by: int | None = None,
    preemption_reason: str = "",
    reason: str = "",
) -> bool:
    """Move a live attempt to STOPPING (its GPUs stay held until the host confirms) and, after commit,
    tell its hosts. A second request for the same attempt changes nothing."""
    now = timezone.now()
    fields = {
        "state": AttemptState.STOPPING,
        "stop_requested_at": now,
        "stop_deadline": now + timedelta(seconds=grace_s),
        "end_reason": reason[:300],
    }
    if preempted_by is not None:
        fields.update(preempted_by_id=preempted_by, preemption_reason=preemption_reason)
    changed = Attempt.objects.filter(
        pk=attempt.pk, number=attempt.number, state__in=[AttemptState.ADMITTED, AttemptState.RUNNING]
    ).update(**fields)
    if changed:
        attempt.refresh_from_db()
        send_stop(attempt, grace_s)
    return bool(changed)


def _live_attempt(job_id: int) -> Attempt | None:
    """The job's live attempt, locked (with its job) in the order end_attempt and the pass lock them:
    attempt, then job, so a cancel racing either waits instead of deadlocking."""
    return (
        Attempt.objects.select_for_update()
        .select_related("job")
        .filter(job_id=job_id, state__in=list(ATTEMPT_ACTIVE_STATES))
        .first()
    )


@transaction.atomic
def cancel(job_id: int, *, by: str) -> bool:
    """Cancel a job that has not ended. Queued or held: CANCELLED at once. Live (admitted, running,
    pre-empting): CANCELLING now, its attempt stopped as a pre-emption stops it (SIGTERM, SIGKILL when
    the job's grace ends); it becomes CANCELLED only when its host reports the processes gone (or the
    stop expires, expire_stops), its GPUs held until then (end_attempt). True also for a job already
    CANCELLING (nothing more to do); False only if the job had already ended.

    Each write is a compare-and-set: a pre-empted attempt re-queued between the look-up and the write
    used to make a cancel answer "already ended (QUEUED)" and leave the job queued."""
    attempt = _live_attempt(job_id)
    now = timezone.now()
    if attempt is None:
        if _cancel_at_once(job_id, by, now):
            return True
        attempt = _live_attempt(job_id)  # one admitted since the first look, while the row was free
        if attempt is None:
            return _cancel_at_once(job_id, by, now) or _is_cancelling(job_id)
    grace = effective_grace(attempt.job.preemption_grace_s)
    if attempt.state == AttemptState.STOPPING:  # pre-empted: already stopping, with its grace
        how = f"attempt {attempt.number} is already stopping (pre-empted); the job ends CANCELLED, not re-queued"
    else:
        how = f"stopping attempt {attempt.number}: SIGTERM now, SIGKILL after {grace} s if still running"
    if not transition(
        job_id,
        from_states=[JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING],
        to_state=JobState.CANCELLING,
        event=EventKind.CANCEL_REQUESTED,
        reason=f"cancelled by {by}; {how}; its GPUs stay held until its host reports it stopped",
        attempt_number=attempt.number,
        detail={"by": by, "grace_s": grace},
        beneficiary=False,
    ):
        return _is_cancelling(job_id)
    if attempt.state != AttemptState.STOPPING:
        request_stop(attempt, grace_s=grace, reason=f"cancelled by {by}")
    return True


def _cancel_at_once(job_id: int, by: str, now: datetime) -> bool:
    """A queued or held job (no live attempt): CANCELLED now, with its event."""
    changed = Job.objects.filter(pk=job_id, state__in=[JobState.QUEUED, JobState.HELD]).update(
        state=JobState.CANCELLED,
        state_reason=f"by {by}"[:300],
        finished_at=now,
        updated_at=now,
        beneficiary=False,
    )
    if changed:
        record_event(job_id, EventKind.CANCELLED, f"by {by}", at=now)
        _request_pass("cancel", reforecast=True)  # a queued job left the queue
    return bool(changed)


def _is_cancelling(job_id: int) -> bool:
    return Job.objects.filter(pk=job_id, state=JobState.CANCELLING).exists()


def bump_preemptions(job_ids: list[int]) -> None:
    Job.objects.filter(pk__in=job_ids).update(preemption_count=F("preemption_count") + 1)
