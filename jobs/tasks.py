"""Control-side tasks: what the GPU hosts report about attempts. Idempotent: a duplicate or an old
attempt number changes nothing, and a host running an attempt that is over is told to stop it."""

import logging
import math
from datetime import UTC, datetime

from celery import shared_task
from django.utils import timezone

from gpunodes.dispatch import log_cut, preempt_attempt
from jobs import lifecycle
from jobs.choices import AttemptState, Outcome
from jobs.models import Attempt

log = logging.getLogger(__name__)

# What the agent says about a process that ended, and the outcome it means for a running attempt.
HOST_OUTCOMES = {
    "exited": None,
    "timed_out": Outcome.TIMED_OUT,
    "stopped": Outcome.PREEMPTED,
    "unknown": Outcome.PREEMPTED,
    # A start its host would not run (its node cordoned, draining or pending; short of uids, GPUs or
    # disk; a start it could not record): re-queued, never a strike toward holding the job.
    "refused": Outcome.REFUSED,
    # Stopped by an orderly shutdown of its agent (Ctrl-C, a service stop): re-queued, never a strike.
    "shutdown": Outcome.AGENT_STOPPED,
    "failed_to_start": Outcome.FAILED,
    "gpu_failed": Outcome.GPU_FAILED,
    # Killed by its agent's fence watchdog (the agent lost its lease): re-queued; its work since its
    # safe point counts as lost to fencing.
    "fenced": Outcome.PREEMPTED,
}


# How an agent from before how="shutdown" said its orderly shutdown (gpunodes.agent.runner.Runner.shutdown).
OLD_SHUTDOWN = "stopped at the shutdown of the agent on "


def _in_placement(placement, node: str, attempt_id, what: str) -> bool:
    """A report about an attempt counts only from a node of its placement (the sender's name, as the
    transport authenticates it: README, "Security model"); any other is refused and logged."""
    if any(p.get("node") == node for p in placement or ()):
        return True
    log.warning(
        "refusing %s about %s from node %r: not in its placement",
        what,
        lifecycle.attempt_words(attempt_id),
        node,
    )
    return False


def _is_current(attempt_id: int, number: int) -> bool:
    return Attempt.objects.filter(pk=attempt_id, number=number).exclude(state=AttemptState.ENDED).exists()


@shared_task(name="jobs.tasks.attempt_started", ignore_result=True)
def attempt_started(attempt_id: int, number: int, node: str, pull_s: float | None = None) -> bool:
    """`pull_s`: the seconds the host took to pull a container job's image before it started (0: it had
    it), what the forecast counts for the image's next jobs (lifecycle.record_pull)."""
    placement = Attempt.objects.filter(pk=attempt_id).values_list("placement", flat=True).first()
    if placement is None or not _in_placement(placement, node, attempt_id, "a start report"):
        return False
    if type(pull_s) in (int, float) and 0 <= pull_s < 7 * 86400:
        lifecycle.record_pull(attempt_id, number, pull_s)
    changed = lifecycle.mark_started(attempt_id, number, node)
    if not changed and not _is_current(attempt_id, number):
        # A start that arrived after the attempt was over: the host must not keep it running.
        log.info(
            "host %s runs %s, which is over; stopping it", node, lifecycle.attempt_words(attempt_id, number)
        )
        preempt_attempt(node, attempt_id, number, 0)
    return changed


@shared_task(name="jobs.tasks.attempt_finished", ignore_result=True)
def attempt_finished(
    attempt_id: int,
    number: int,
    node: str,
    how: str = "exited",
    exit_code: int | None = None,
    detail: str = "",
    checkpoint_at: float | None = None,
    checkpoints: int = 0,
    gpu_faults: list | None = None,
    ended_at: float | None = None,
) -> bool:
    """`checkpoint_at`, `checkpoints`: the attempt's latest checkpoint as its host saw it by the end (one
    saved when told to stop included), applied before the end so that the work lost counts from it.
    `ended_at`: when its processes ended, by the host's clock (epoch seconds): the attempt ends then, not
    when this report is read (after an agent restart, say), within what this side can trust (ended_time).
    `gpu_faults`: with how="gpu_failed", the faults that killed it (as a heartbeat's `unhealthy` lists
    them): those GPUs leave capacity before the job is re-queued (gpunodes.services.gpu_faults_reported)."""
    attempt = Attempt.objects.filter(pk=attempt_id, number=number).first()
    if attempt is None or attempt.state == AttemptState.ENDED:
        return False
    if not _in_placement(attempt.placement, node, attempt_id, "an end report"):
        return False
    if checkpoint_at is not None:
        lifecycle.record_checkpoint(attempt_id, number, node=node, at=checkpoint_at, count=checkpoints)
    if how == "gpu_failed" and gpu_faults:
        from gpunodes.services import gpu_faults_reported

        if attempt_id in gpu_faults_reported(node, gpu_faults):
            return True  # ended there, GPU_FAILED with the fault's words
    if how == "exited":
        outcome = Outcome.SUCCEEDED if exit_code == 0 else Outcome.FAILED
    else:
        outcome = HOST_OUTCOMES.get(how, Outcome.FAILED)
    if how == "unknown" and detail.startswith(OLD_SHUTDOWN):
        outcome = Outcome.AGENT_STOPPED  # an agent from before "shutdown" (a rolling upgrade)
    elif attempt.state == AttemptState.ADMITTED and how in ("unknown", "stopped"):
        # It never started there (an older agent's word for a start it refused): no strike.
        outcome = Outcome.REFUSED
    elif attempt.state != AttemptState.STOPPING and how in ("stopped", "unknown", "fenced"):
        # The host lost or stopped it without being asked: the job is re-queued.
        outcome = Outcome.NODE_LOST
    reason = detail or {
        Outcome.SUCCEEDED: "exit code 0",
        Outcome.FAILED: f"exit code {exit_code}",
        Outcome.TIMED_OUT: "ran past max_runtime_s",
        Outcome.NODE_LOST: f"host {node} no longer runs it",
        Outcome.GPU_FAILED: f"a GPU of {node} failed",
        Outcome.AGENT_STOPPED: f"stopped at the orderly shutdown of the agent on {node}",
        Outcome.REFUSED: f"refused by {node}",
    }.get(outcome, f"stopped on {node}")
    ended = lifecycle.end_attempt(
        attempt_id,
        number,
        outcome=outcome,
        exit_code=exit_code,
        reason=reason,
        at=ended_time(attempt, node, ended_at),
        fenced=how == "fenced",
        strike_node=node,
    )
    if ended and len(attempt.placement) > 1:
        # A gang ends with its first rank to end: stop the others.
        for p in attempt.placement:
            if p["node"] != node:
                preempt_attempt(p["node"], attempt_id, number, 0)
    return ended


def ended_time(attempt: Attempt, node: str, ended_at) -> datetime:
    """When an attempt's processes ended, as its host says (`ended_at`, epoch seconds), within what this
    side can trust: not before the attempt was started (admitted, if it never was), not after now (the
    report's receipt), nor after its host's lease ran out (gpunodes.leases.lease_end: its fence had
    killed them by then). Now where the host says nothing (an older agent)."""
    from gpunodes.leases import lease_end

    now = timezone.now()
    if type(ended_at) not in (int, float) or not math.isfinite(ended_at):
        return now
    low = attempt.started_at or attempt.admitted_at
    high = min(now, lease_end(node) or now)
    said = datetime.fromtimestamp(min(max(ended_at, 0.0), now.timestamp()), UTC)
    return max(low, min(said, high))


@shared_task(name="jobs.tasks.attempt_checkpoint", ignore_result=True)
def attempt_checkpoint(attempt_id: int, number: int, node: str, at: float, count: int = 0) -> bool:
    """A host saw the job of a live attempt save a checkpoint at `at` (epoch seconds): the attempt's
    safe point moves (jobs.lifecycle.record_checkpoint). From a node of its placement only."""
    if type(attempt_id) is not int or type(number) is not int:
        return False
    placement = (
        Attempt.objects.filter(pk=attempt_id, number=number).values_list("placement", flat=True).first()
    )
    if placement is None or not _in_placement(placement, node, attempt_id, "a checkpoint report"):
        return False
    return lifecycle.record_checkpoint(attempt_id, number, node=node, at=at, count=count)


@shared_task(name="jobs.tasks.attempt_pulling", ignore_result=True)
def attempt_pulling(attempt_id: int, number: int, node: str, text: str) -> bool:
    """A host is pulling the image of an attempt it was told to start: while the attempt waits for it
    (ADMITTED), its job's reason says how far ("pulling image X, 1.2 of 3.4 GB"). Best effort: a lost
    report costs one line. From a node of its placement only."""
    from jobs.choices import JobState
    from jobs.models import Job

    if type(attempt_id) is not int or type(number) is not int or not isinstance(text, str):
        return False
    row = (
        Attempt.objects.filter(pk=attempt_id, number=number, state=AttemptState.ADMITTED)
        .values_list("placement", "job_id")
        .first()
    )
    if row is None or not _in_placement(row[0], node, attempt_id, "a pull report"):
        return False
    reason = "".join(c for c in text if c.isprintable())[:300]
    return (
        Job.objects.filter(pk=row[1], state=JobState.ADMITTED, attempt_count=number).update(
            state_reason=reason
        )
        == 1
    )


@shared_task(name="jobs.tasks.attempt_log", ignore_result=True)
def attempt_log(attempt_id: int, number: int, node: str, offset: int, text: str) -> bool:
    """A chunk of an attempt's output, stored within its team's budget (jobs.services.log_append)."""
    from jobs.services import log_append

    row = (
        Attempt.objects.filter(pk=attempt_id, number=number)
        .values_list("placement", "job__share__team_id")
        .first()
    )
    if row is None or not _in_placement(row[0], node, attempt_id, "a log chunk"):
        return False
    if type(offset) is not int or offset < 0 or not isinstance(text, str):
        log.warning("refusing a malformed log chunk of attempt %s from node %r", attempt_id, node)
        return False
    outcome = log_append(attempt_id=attempt_id, node=node, offset=offset, text=text, team_id=row[1])
    if outcome == "cut":
        # Its host ships no more of it (each chunk that still comes asks again: a lost message costs one).
        log_cut(node, attempt_id, number)
    return outcome == "stored"


@shared_task(name="jobs.tasks.prune_job_output", ignore_result=True)
def prune_job_output() -> int:
    """Beat, hourly: the output of jobs ended more than JOB_OUTPUT_KEEP_DAYS ago is removed."""
    from django.conf import settings

    from jobs.services import prune_job_output as prune

    removed = prune()
    if removed:
        log.info(
            "removed %d log chunks of jobs ended more than %d days ago (JOB_OUTPUT_KEEP_DAYS)",
            removed,
            settings.JOB_OUTPUT_KEEP_DAYS,
        )
    return removed
