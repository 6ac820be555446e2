"""The one compare-and-set transition every state change of a job goes through (it checks the old
state and the attempt number, and writes the event), and the event itself. The bottom of the jobs app:
it imports only the models, so the services, the lifecycle and the scheduler can all use it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.utils import timezone

from jobs.models import Job, JobEvent
from jobs.signals import job_event_recorded


def record_event(
    job_id: int,
    kind: str,
    reason: str = "",
    *,
    attempt_number: int | None = None,
    detail: Mapping[str, Any] | None = None,
    at=None,
) -> JobEvent:
    event = JobEvent.objects.create(
        job_id=job_id,
        kind=kind,
        reason=reason[:300],
        attempt_number=attempt_number,
        detail=dict(detail or {}),
        at=at or timezone.now(),
    )
    job_event_recorded.send(sender=JobEvent, event=event)  # notify.hook: queued after commit
    return event


def transition(
    job_id: int,
    *,
    from_states: Iterable[str],
    to_state: str,
    event: str,
    reason: str = "",
    attempt_number: int | None = None,
    detail: Mapping[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Move a job from one of `from_states` to `to_state` if (and only if) it is still there and, when
    given, still on `attempt_number`. Returns whether this call made the change; the loser of a race
    (or a late, duplicated message) gets False and changes nothing."""
    now = timezone.now()
    qs = Job.objects.filter(pk=job_id, state__in=list(from_states))
    if attempt_number is not None:
        qs = qs.filter(attempt_count=attempt_number)
    changed = qs.update(state=to_state, state_reason=reason[:300], updated_at=now, **fields)
    if changed:
        record_event(job_id, event, reason, attempt_number=attempt_number, detail=detail, at=now)
    return bool(changed)
