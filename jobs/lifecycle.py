"""How attempts begin and end, and what that does to their job.

Every change goes through compare-and-set updates (filter on id, state and attempt number, then update):
a duplicated or late message about an attempt changes nothing the second time, and an old attempt
number is ignored. Messages to the GPU hosts are sent only after the transaction commits.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from jobs.choices import (
    ATTEMPT_ACTIVE_STATES,
    JOB_ACTIVE_STATES,
    JOB_OPEN_STATES,
    AttemptState,
    EventKind,
    JobState,
    Outcome,
)
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import record_event, transition

log = logging.getLogger(__name__)


def _nodes_of(placement: list[dict]) -> list[str]:
    return [p["node"] for p in placement]


def _request_pass(why: str) -> None:
    from quotas.triggers import request_pass

    transaction.on_commit(lambda: request_pass(why))


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
    job_id = Attempt.objects.values_list("job_id", flat=True).get(pk=attempt_id)
    transition(
        job_id,
        from_states=[JobState.ADMITTED],
        to_state=JobState.RUNNING,
        event=EventKind.STARTED,
        reason=f"running on {node}",
        attempt_number=number,
    )
    return True


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
) -> bool:
    """End a live attempt, free its GPUs, and move its job on:

    - a stopping attempt (pre-empted or cancelled) → the job is re-queued (or FAILED past
      max_preemptions); a cancelled job stays CANCELLED; a pre-empted one whose process still exited 0
      within its grace has finished its work: SUCCEEDED;
    - a running attempt that exited → SUCCEEDED / FAILED (TIMED_OUT is a failure);
    - NODE_LOST → the job is re-queued with its original submit time.
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
    was_stopping = attempt.state == AttemptState.STOPPING
    if was_stopping and outcome != Outcome.NODE_LOST:
        if job.state == JobState.CANCELLED:
            outcome = Outcome.CANCELLED
        elif outcome != Outcome.SUCCEEDED:  # one that finished within its grace succeeded: not run again
            outcome = Outcome.PREEMPTED
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.ENDED, outcome=outcome, exit_code=exit_code, ended_at=now, end_reason=reason[:300]
    )
    _release(attempt.pk)
    _request_pass("attempt ended")
    if job.state == JobState.CANCELLED:
        record_event(
            job.pk,
            EventKind.CANCELLED,
            reason or "stopped",
            attempt_number=number,
            at=now,
            detail={"outcome": outcome},
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
            record_event(
                job.pk,
                EventKind.PREEMPTED,
                attempt.end_reason or reason or "stopped",
                attempt_number=number,
                at=now,
                detail={"preempted_by": attempt.preempted_by_id, "reason": attempt.preemption_reason},
            )
            transition(
                job.pk,
                from_states=active,
                to_state=JobState.QUEUED,
                event=EventKind.REQUEUED,
                reason="re-queued with its original submit time",
                attempt_number=number,
            )
    elif outcome == Outcome.NODE_LOST:
        transition(
            job.pk,
            from_states=active,
            to_state=JobState.QUEUED,
            event=EventKind.NODE_LOST,
            reason=reason or "node lost; re-queued with its original submit time",
            attempt_number=number,
        )
    return True


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
    """Cancel a job in any open state (queued, admitted, running, pre-empting) with one compare-and-set.
    Queued: done at once. Live: the job is CANCELLED now and its attempt is stopped with the job's grace;
    the GPUs are freed when the host confirms. False only if the job had already ended.

    The state is not read first and then acted on: a pre-empted attempt being re-queued between the read
    and the write used to make a cancel answer "already ended (QUEUED)" and leave the job queued."""
    attempt = _live_attempt(job_id)
    now = timezone.now()
    changed = Job.objects.filter(pk=job_id, state__in=[s.value for s in JOB_OPEN_STATES]).update(
        state=JobState.CANCELLED,
        state_reason=f"by {by}"[:300],
        finished_at=now,
        updated_at=now,
        beneficiary=False,
    )
    if not changed:
        return False
    if attempt is None:  # one admitted since the lock above was looked for, while the row was free
        attempt = _live_attempt(job_id)
    if attempt is None:
        record_event(job_id, EventKind.CANCELLED, f"by {by}", at=now)
        _request_pass("cancel")
        return True
    record_event(
        job_id,
        EventKind.CANCEL_REQUESTED,
        f"by {by}; stopping the running attempt",
        attempt_number=attempt.number,
        at=now,
    )
    if attempt.state != AttemptState.STOPPING:
        request_stop(attempt, grace_s=attempt.job.preemption_grace_s, reason=f"cancelled by {by}")
    return True


def bump_preemptions(job_ids: list[int]) -> None:
    Job.objects.filter(pk__in=job_ids).update(preemption_count=F("preemption_count") + 1)
