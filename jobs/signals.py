"""What the jobs app tells the rest of the product, without knowing who listens.

`queue_changed` is sent, once the transaction that made the change has committed, whenever a change to
jobs may let the scheduling pass decide something new (a submit, an end, a cancel, a priority, a
release). The scheduling side subscribes (quotas.apps) and asks for a pass; jobs never imports the
pass, so the dependency goes one way: quotas' scheduler uses jobs, jobs uses nothing of the scheduler.
Receivers get `why` (a few words for the log), `coalesce` (a submit: fold a burst into a few passes) and
`reforecast` (the queue itself changed: a job joined or left it or moved in it, so the stored forecast of
positions and ETAs is stale and the pass it asks for is to forecast again, SEMANTICS "Forecast")."""

from django.db import transaction
from django.dispatch import Signal

queue_changed = Signal()
# Sent with `event` for each JobEvent record_event writes (the notifications subscribe, notify.hook).
job_event_recorded = Signal()


def announce(why: str, *, coalesce: bool = False, reforecast: bool = False) -> None:
    """Send queue_changed after the current transaction commits (at once outside one)."""
    transaction.on_commit(
        lambda: queue_changed.send(sender=None, why=why, coalesce=coalesce, reforecast=reforecast)
    )
