"""The jobs app's events, handed to Celery once their transaction commits: the ids of every event that
may interest a channel, one task per transaction (a pass that starts 1,000 tasks of an array sends one
task message, not 1,000). Nothing here reads a channel or sends anything: that is notify.tasks'."""

from __future__ import annotations

from django.db import transaction

from jobs.choices import EventKind

KINDS = frozenset(
    {EventKind.STARTED, EventKind.PREEMPTED, EventKind.SUCCEEDED, EventKind.FAILED, EventKind.CANCELLED}
)


class Batch:
    """The event ids of one transaction, sent as one task when it commits."""

    def __init__(self) -> None:
        self.ids: list[int] = []

    def __call__(self) -> None:
        from config.celery import app
        from notify.models import Channel

        # One indexed query per transaction: an installation (or a test) without channels sends nothing.
        if self.ids and Channel.objects.filter(disabled_at__isnull=True).exists():
            app.send_task("notify.tasks.collect", args=[self.ids])


def on_job_event(sender, event, **kwargs) -> None:
    if event.kind not in KINDS:
        return
    connection = transaction.get_connection()
    batch = getattr(connection, "notify_batch", None)
    # A batch whose callback is gone (its transaction or savepoint rolled back, or it committed) is stale.
    if batch is None or not any(item[1] is batch for item in connection.run_on_commit):
        batch = connection.notify_batch = Batch()
        batch.ids.append(event.pk)
        transaction.on_commit(batch)  # outside a transaction: at once
        return
    batch.ids.append(event.pk)
