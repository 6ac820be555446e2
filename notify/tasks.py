"""Delivery, never in the pass or a request: `collect` turns committed job events into pending lines for
the channels that asked for them, `flush` makes one message of a channel's pending lines NOTIFY_BATCH_S
after the first (a burst is one message), `deliver` sends it, retried with exponential back-off; a
channel still failing NOTIFY_GIVE_UP_AFTER_H after its first failure is switched off, and its owner sees
why on the notifications page."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config.celery import app
from notify import urlcheck
from notify.messages import EVENT_OF_KIND, compose, line_for
from notify.models import Channel, Delivery, Event, Kind, Pending, Promise

log = logging.getLogger(__name__)


class DeliveryFailed(Exception):
    pass


@shared_task(name="notify.tasks.collect", ignore_result=True)
def collect(event_ids: list[int]) -> int:
    """Pending lines for every channel that wants these events; returns how many were made."""
    from jobs.models import JobEvent

    events = list(
        JobEvent.objects.filter(pk__in=event_ids).select_related("job__share__team", "job__submitted_by")
    )
    # The channels of these jobs' owners and teams, read once (an array's 1,000 events: three queries
    # and one insert, not a query and an insert each).
    users = {e.job.submitted_by_id for e in events}
    teams = {e.job.share.team_id for e in events}
    channels = list(
        Channel.objects.filter(Q(user_id__in=users) | Q(team_id__in=teams), disabled_at__isnull=True)
    )
    rows = []
    for event in events:
        kind = EVENT_OF_KIND.get(event.kind)
        if kind is None:
            continue
        job = event.job
        wanting = [
            c
            for c in channels
            if kind in c.events and (c.user_id == job.submitted_by_id or c.team_id == job.share.team_id)
        ]
        if not wanting:
            continue
        line, data = line_for(job, event.kind, event.detail or {}, event.at)
        rows += [
            Pending(channel=c, event=kind, job_id=job.pk, line=line, data=data, at=event.at) for c in wanting
        ]
    Pending.objects.bulk_create(rows, batch_size=500)
    made = len(rows)
    touched = {row.channel.pk for row in rows}
    for channel_id in touched:
        # One flush per channel at a time: later events join the one queued (compare-and-set).
        if Channel.objects.filter(pk=channel_id, flush_due=False).update(flush_due=True):
            app.send_task("notify.tasks.flush", args=[channel_id], countdown=settings.NOTIFY_BATCH_S)
    return made


@shared_task(name="notify.tasks.overdue", ignore_result=True)
def overdue(now=None) -> int:
    """Queued jobs still waiting past the end of the likely range they were first given, for channels
    that asked (a beat task, every minute); returns how many were told."""
    from jobs.choices import JobState
    from jobs.models import Job
    from quotas.models import QueueForecast, likely_range

    now = now or timezone.now()
    # A few channels at most per user and team: filtered here (SQLite has no JSON "contains").
    wanting = [c for c in Channel.objects.filter(disabled_at__isnull=True) if Event.WAITING in c.events]
    if not wanting:
        return 0
    users = {c.user_id for c in wanting if c.user_id}
    teams = {c.team_id for c in wanting if c.team_id}
    queued = Job.objects.filter(state=JobState.QUEUED).filter(
        Q(submitted_by_id__in=users) | Q(share__team_id__in=teams)
    )
    promised = dict(Promise.objects.filter(job_id__in=queued.values("pk")).values_list("job_id", "until"))
    for job_id, eta, low, high in QueueForecast.objects.filter(job__in=queued).values_list(
        "job_id", "eta", "eta_low", "eta_high"
    ):
        _, until = likely_range(eta, low, high)
        if until is not None and job_id not in promised:
            Promise.objects.create(job_id=job_id, until=until)
    told = 0
    due = Promise.objects.filter(until__lt=now, told_at__isnull=True, job_id__in=queued.values("pk"))
    for promise in due:
        # Told once: compare-and-set, so that two beats never tell it twice.
        if not Promise.objects.filter(pk=promise.pk, told_at__isnull=True).update(told_at=now):
            continue
        job = Job.objects.select_related("share__team", "submitted_by").get(pk=promise.job_id)
        line, data = line_for(job, "WAITING", {"until": promise.until.isoformat()}, now)
        for channel in [
            c for c in wanting if c.user_id == job.submitted_by_id or c.team_id == job.share.team_id
        ]:
            Pending.objects.create(
                channel=channel, event=Event.WAITING, job_id=job.pk, line=line, data=data, at=now
            )
            if Channel.objects.filter(pk=channel.pk, flush_due=False).update(flush_due=True):
                app.send_task("notify.tasks.flush", args=[channel.pk], countdown=settings.NOTIFY_BATCH_S)
        told += 1
    Promise.objects.exclude(job_id__in=Job.objects.filter(state=JobState.QUEUED).values("pk")).delete()
    return told


@shared_task(name="notify.tasks.flush", ignore_result=True)
def flush(channel_id: int) -> int | None:
    """One message of everything the channel has pending; returns the delivery's id."""
    with transaction.atomic():
        Channel.objects.filter(pk=channel_id).update(flush_due=False)
        channel = Channel.objects.filter(pk=channel_id, disabled_at__isnull=True).first()
        items = list(Pending.objects.filter(channel_id=channel_id).order_by("at", "id"))
        if channel is None or not items:
            return None
        subject, body, payload = compose(channel, items)
        delivery = Delivery.objects.create(channel=channel, subject=subject, body=body, payload=payload)
        Pending.objects.filter(pk__in=[i.pk for i in items]).delete()
        transaction.on_commit(lambda: app.send_task("notify.tasks.deliver", args=[delivery.pk]))
    return delivery.pk


@shared_task(
    name="notify.tasks.deliver",
    bind=True,
    ignore_result=True,
    autoretry_for=(DeliveryFailed,),
    retry_backoff=True,
    retry_backoff_max=3600,
    retry_jitter=False,
    max_retries=None,  # bounded by NOTIFY_GIVE_UP_AFTER_H, not by a count
)
def deliver(self, delivery_id: int) -> bool:
    delivery = Delivery.objects.select_related("channel__user").filter(pk=delivery_id).first()
    if delivery is None or delivery.sent_at or delivery.gave_up_at:
        return False  # done already (a duplicate task changes nothing)
    channel = delivery.channel
    Delivery.objects.filter(pk=delivery.pk).update(tries=delivery.tries + 1)
    try:
        send(channel, delivery)
    except (DeliveryFailed, urlcheck.Refused, OSError) as exc:
        return _failed(self, channel, delivery, str(exc)[:300])
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(sent_at=now, last_error="")
    Channel.objects.filter(pk=channel.pk).update(failing_since=None, last_error="")
    return True


def _failed(task, channel, delivery, error: str) -> bool:
    now = timezone.now()
    Delivery.objects.filter(pk=delivery.pk).update(last_error=error)
    Channel.objects.filter(pk=channel.pk, failing_since__isnull=True).update(failing_since=now)
    Channel.objects.filter(pk=channel.pk).update(last_error=error)
    since = Channel.objects.values_list("failing_since", flat=True).get(pk=channel.pk)
    if now - since >= timedelta(hours=settings.NOTIFY_GIVE_UP_AFTER_H):
        Channel.objects.filter(pk=channel.pk).update(disabled_at=now)
        Delivery.objects.filter(channel=channel, sent_at__isnull=True, gave_up_at__isnull=True).update(
            gave_up_at=now
        )
        log.warning("notification channel %s switched off: failing since %s (%s)", channel.pk, since, error)
        return False
    raise DeliveryFailed(error)


def signature(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def send(channel, delivery) -> None:
    if channel.kind == Kind.EMAIL:
        address = channel.user.email if channel.user else ""
        if not address:
            raise DeliveryFailed("the account has no e-mail address")
        send_mail(delivery.subject, delivery.body, settings.DEFAULT_FROM_EMAIL, [address])
        return
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "gpuquota-notify"}
    if channel.kind == Kind.WEBHOOK and channel.secret:
        headers["X-Gpuquota-Signature"] = signature(channel.secret, body)
    status = post(channel.url, body, headers)
    if not 200 <= status < 300:
        raise DeliveryFailed(f"the endpoint answered HTTP {status}")


def post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST to the address urlcheck approved just now (not to whatever the name resolves to next), no
    redirects followed."""
    from urllib.parse import urlsplit

    import urllib3

    host, port, addresses = urlcheck.check(url)
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    timeout = urllib3.Timeout(connect=5, read=settings.NOTIFY_TIMEOUT_S)
    address = addresses[0]
    if parts.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            address, port, server_hostname=host, assert_hostname=host, timeout=timeout, retries=False
        )
    else:
        pool = urllib3.HTTPConnectionPool(address, port, timeout=timeout, retries=False)
    try:
        response = pool.urlopen(
            "POST",
            path,
            body=body,
            headers={**headers, "Host": parts.netloc.rsplit("@", 1)[-1]},
            redirect=False,
            preload_content=True,
        )
    except urllib3.exceptions.HTTPError as exc:
        raise DeliveryFailed(f"could not reach the endpoint: {exc}") from exc
    finally:
        pool.close()
    return response.status
