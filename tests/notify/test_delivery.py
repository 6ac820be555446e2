"""Notifications delivered for real: e-mail through an SMTP server (aiosmtpd), webhooks to an HTTP
receiver; one task per transaction whatever its number of events, one message per burst (an array of
1,000 tasks started: one message); a failing endpoint retried, shown to its owner, then switched off."""

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.choices import EventKind
from jobs.services import job_array_submit
from jobs.transitions import record_event
from notify import tasks
from notify.models import Channel, Delivery, Event, Kind, Pending
from tests.api.conftest import submit

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent(no_messages, nodes):
    """What was sent to Celery (a GPU node registered, so that jobs can be submitted)."""
    return no_messages


def collect_and_flush(sent) -> list[int]:
    """Run what the hook sent (collect), then each channel's flush, as the worker would."""
    ids = [kw["args"][0] for name, kw in sent if name == "notify.tasks.collect"]
    for batch in ids:
        tasks.collect(batch)
    return [d for c in Channel.objects.filter(flush_due=True) for d in [tasks.flush(c.pk)] if d]


def test_an_array_of_1000_started_is_one_task_and_one_signed_message(
    sent, bob, vision_share, receiver, monkeypatch
):
    channel = Channel.objects.create(
        user=bob, kind=Kind.WEBHOOK, url=receiver.url, secret="s3cret", events=[Event.STARTED]
    )
    array = job_array_submit(
        user=bob, share=vision_share, size=1000, gpus=1, gpu_type="a10g", command=["python", "t.py"]
    )
    jobs = list(array.tasks.values_list("pk", flat=True))
    with transaction.atomic():
        for pk in jobs:
            record_event(pk, EventKind.STARTED, "running on gpu-a")
    collects = [kw for name, kw in sent if name == "notify.tasks.collect"]
    assert len(collects) == 1 and len(collects[0]["args"][0]) == 1000
    [delivery] = collect_and_flush(sent)
    assert not Pending.objects.exists()
    assert tasks.deliver(delivery) is True
    assert len(receiver.requests) == 1
    path, headers, body = receiver.requests[0]
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Gpuquota-Signature"] == expected
    payload = receiver.json()
    assert payload["count"] == 1000 and payload["subject"] == "gpuquota: 1000 jobs started"
    assert {e["job"] for e in payload["events"]} == set(jobs)
    channel.refresh_from_db()
    assert channel.failing_since is None


def test_a_rolled_back_transaction_sends_nothing_and_the_next_one_is_sent(sent, bob, vision_share):
    Channel.objects.create(user=bob, kind=Kind.EMAIL, events=[Event.ENDED])
    job = submit(bob, vision_share)
    with pytest.raises(RuntimeError), transaction.atomic():
        record_event(job.pk, EventKind.STARTED)
        raise RuntimeError("rolled back")
    assert not [n for n, _ in sent if n == "notify.tasks.collect"]
    with transaction.atomic():
        record_event(job.pk, EventKind.FAILED)
    assert [kw["args"][0] for n, kw in sent if n == "notify.tasks.collect"] == [
        [job.events.get(kind=EventKind.FAILED).pk]
    ]


def test_without_channels_no_task_is_sent(sent, bob, vision_share):
    record_event(submit(bob, vision_share).pk, EventKind.FAILED)
    assert not [n for n, _ in sent if n.startswith("notify.")]


def test_an_email_goes_through_a_real_smtp_server(sent, bob, vision_share, smtp, monkeypatch):
    Channel.objects.create(user=bob, kind=Kind.EMAIL, events=[Event.ENDED])
    job = submit(bob, vision_share, name="train-resnet", env={"API_KEY": "do-not-tell"})
    record_event(job.pk, EventKind.STARTED)  # not chosen: not sent
    record_event(job.pk, EventKind.FAILED, "exit code 1")
    [delivery] = collect_and_flush(sent)
    assert tasks.deliver(delivery) is True
    [message] = smtp.messages
    assert message.rcpt_tos == ["bob@example.com"]
    text = message.content.decode()
    assert "Subject: gpuquota: 1 job ended" in text
    assert f"job {job.pk} 'train-resnet' on vision-main failed" in text
    assert "do-not-tell" not in text and "train.py" not in text  # neither env nor command


def test_a_preemption_says_the_work_lost_and_the_checkpoint_age(
    sent, bob, vision_share, receiver, monkeypatch
):
    Channel.objects.create(user=bob, kind=Kind.CHAT, url=receiver.url, events=[Event.PREEMPTED])
    job = submit(bob, vision_share)
    at = timezone.now()
    record_event(
        job.pk,
        EventKind.PREEMPTED,
        "reclaimed by job 99 of language",
        at=at,
        detail={
            "gpu_seconds_lost": 5400.0,
            "last_checkpoint_at": (at - timedelta(minutes=12)).isoformat(),
            "preempted_by": 99,
        },
    )
    [delivery] = collect_and_flush(sent)
    tasks.deliver(delivery)
    text = receiver.json()["text"]
    assert "was pre-empted: 90 min of GPU work lost, its last checkpoint 12 min old" in text
    assert "99" not in text and "language" not in text  # not the other team's job


def test_a_team_channel_hears_of_the_teams_jobs_and_a_user_only_of_their_own(
    sent, bob, charlie, vision, vision_share, language_share, receiver, monkeypatch, django_user_model
):
    team = Channel.objects.create(team=vision, kind=Kind.CHAT, url=receiver.url, events=[Event.ENDED])
    mine = Channel.objects.create(user=charlie, kind=Kind.CHAT, url=receiver.url, events=[Event.ENDED])
    record_event(submit(bob, vision_share).pk, EventKind.SUCCEEDED)
    record_event(submit(charlie, language_share).pk, EventKind.SUCCEEDED)
    collect_and_flush(sent)
    assert [d.channel_id for d in Delivery.objects.order_by("channel_id")] == sorted([team.pk, mine.pk])
    assert "bob" not in Delivery.objects.get(channel=mine).body


def test_a_failing_endpoint_is_retried_shown_then_switched_off(
    sent, bob, vision_share, receiver, monkeypatch, client
):
    channel = Channel.objects.create(user=bob, kind=Kind.CHAT, url=receiver.url, events=[Event.ENDED])
    record_event(submit(bob, vision_share).pk, EventKind.SUCCEEDED)
    [delivery] = collect_and_flush(sent)
    receiver.status = 500
    with pytest.raises(tasks.DeliveryFailed):  # Celery retries it, with back-off
        tasks.deliver(delivery)
    channel.refresh_from_db()
    assert channel.failing_since is not None and "HTTP 500" in channel.last_error
    client.force_login(bob)
    page = client.get("/account/notifications/").content.decode()
    assert "failing since" in page and "HTTP 500" in page

    Channel.objects.filter(pk=channel.pk).update(failing_since=timezone.now() - timedelta(hours=25))
    assert tasks.deliver(delivery) is False  # no retry: switched off
    channel.refresh_from_db()
    assert channel.disabled_at is not None
    assert Delivery.objects.get(pk=delivery).gave_up_at is not None
    assert "switched off" in client.get("/account/notifications/").content.decode()
    record_event(submit(bob, vision_share).pk, EventKind.SUCCEEDED)
    assert collect_and_flush(sent) == []  # a switched-off channel hears nothing more


def test_a_delivery_is_sent_once(sent, bob, vision_share, receiver, monkeypatch):
    Channel.objects.create(user=bob, kind=Kind.CHAT, url=receiver.url, events=[Event.ENDED])
    record_event(submit(bob, vision_share).pk, EventKind.SUCCEEDED)
    [delivery] = collect_and_flush(sent)
    assert tasks.deliver(delivery) is True
    assert tasks.deliver(delivery) is False  # a duplicated task changes nothing
    assert len(receiver.requests) == 1


def test_a_job_still_waiting_past_its_likely_range_is_told_once(sent, bob, vision_share, receiver):
    from quotas.models import QueueForecast

    Channel.objects.create(user=bob, kind=Kind.CHAT, url=receiver.url, events=[Event.WAITING])
    job = submit(bob, vision_share, name="long-wait")
    now = timezone.now()
    QueueForecast.objects.create(
        job=job,
        position_in_share=1,
        position_overall=1,
        eta=now + timedelta(minutes=10),
        eta_low=now + timedelta(minutes=5),
        eta_high=now + timedelta(minutes=30),
        kind="estimate",
        computed_at=now,
    )
    assert tasks.overdue(now=now) == 0  # the range it was given: until now + 30 min
    # a later forecast moves the range on: the promise made stays the one first given
    QueueForecast.objects.filter(job=job).update(eta_high=now + timedelta(hours=5))
    assert tasks.overdue(now=now + timedelta(minutes=45)) == 1
    assert tasks.overdue(now=now + timedelta(minutes=46)) == 0  # told once
    [delivery] = collect_and_flush(sent)
    tasks.deliver(delivery)
    assert (
        "'long-wait' on vision-main is still waiting: its likely start range ended 15 min ago"
        in receiver.json()["text"]
    )
