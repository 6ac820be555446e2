"""An attempt's checkpoints on the control side (its safe point) and the work its end throws away: the
report task, the heartbeat's outbox, the end report's last checkpoint, and lost work per attempt with
its cause (SEMANTICS "Checkpoints and safe points")."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.models import Gpu
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState, LostCause, Outcome, PreemptionReason
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import job_submit
from jobs.tasks import attempt_checkpoint, attempt_finished
from quotas.templatetags.gpuquota import gpu_time

CHECKPOINT = "jobs.tasks.attempt_checkpoint"


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch, settings):
    settings.NODE_AUTO_ACCEPT = True
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    return sent


@pytest.fixture
def job(bob, vision_share, nodes):
    return job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["true"])


def running(job, placement, *, started_ago_s=600.0, number=1):
    """A RUNNING attempt of `job` on `placement` [(node, [gpus])], started that long ago."""
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=number)
    started = timezone.now() - timedelta(seconds=started_ago_s)
    attempt = Attempt.objects.create(
        job=job,
        number=number,
        state=AttemptState.RUNNING,
        placement=[{"node": n, "gpus": list(g)} for n, g in placement],
        admitted_at=started,
        started_at=started,
    )
    for node, gpus in placement:
        for gpu in Gpu.objects.filter(node__name=node, index__in=gpus):
            GpuClaim.objects.create(attempt=attempt, gpu=gpu)
            attempt.nodes.add(gpu.node)
    return attempt


def ago(seconds):
    return (timezone.now() - timedelta(seconds=seconds)).timestamp()


# --- the safe point ---------------------------------------------------------------------------------


def test_a_checkpoint_moves_the_safe_point_forward_only(job, nodes):
    a = running(job, [("node-1", [0, 1])])
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(300), 1) is True
    a.refresh_from_db()
    assert a.last_checkpoint_at.timestamp() == pytest.approx(ago(300), abs=1) and a.checkpoints == 1
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(400), 1) is False  # older: a late copy
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(120), 2) is True
    a.refresh_from_db()
    assert a.last_checkpoint_at.timestamp() == pytest.approx(ago(120), abs=1) and a.checkpoints == 2


@pytest.mark.parametrize(
    "at, count, why",
    [
        ("soon", 1, "not a number"),
        (float("nan"), 1, "not finite"),
        (1.0, 1, "a time no live attempt's host saw (1970)"),
        (None, 1, "no time"),
    ],
)
def test_a_malformed_checkpoint_report_changes_nothing(job, nodes, at, count, why):
    a = running(job, [("node-1", [0, 1])])
    assert attempt_checkpoint(a.pk, 1, "node-1", at, count) is False, why
    a.refresh_from_db()
    assert a.last_checkpoint_at is None and a.checkpoints == 0


def test_a_checkpoint_dated_before_the_attempt_was_admitted_is_not_its(job, nodes, settings):
    """A stale report (an outbox that outlived its database, a clock far behind) says nothing of this
    attempt: one dated more than MESSAGE_CLOCK_SKEW_S before its admission is refused."""
    a = running(job, [("node-1", [0, 1])])
    Attempt.objects.filter(pk=a.pk).update(admitted_at=timezone.now() - timedelta(seconds=60))
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(60 + settings.MESSAGE_CLOCK_SKEW_S + 5), 3) is False
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(60 + settings.MESSAGE_CLOCK_SKEW_S - 5), 1) is True


def test_a_checkpoint_dated_ahead_of_this_side_is_taken_as_now(job, nodes):
    a = running(job, [("node-1", [0, 1])])
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(-3600), 1)  # a host clock an hour ahead
    a.refresh_from_db()
    assert a.last_checkpoint_at <= timezone.now()


def test_a_checkpoint_report_from_another_node_or_of_another_attempt_is_refused(job, nodes, caplog):
    a = running(job, [("node-1", [0, 1])])
    assert attempt_checkpoint(a.pk, 1, "node-2", ago(10), 1) is False
    assert "not in its placement" in caplog.text
    assert attempt_checkpoint(a.pk, 2, "node-1", ago(10), 1) is False
    lifecycle.end_attempt(a.pk, 1, outcome=Outcome.SUCCEEDED)
    assert attempt_checkpoint(a.pk, 1, "node-1", ago(5), 1) is False  # over: changes nothing
    a.refresh_from_db()
    assert a.last_checkpoint_at is None


def test_an_attempt_on_several_nodes_is_safe_up_to_the_oldest_of_their_latest(job, nodes):
    a = running(job, [("node-1", [0]), ("node-2", [0])])
    attempt_checkpoint(a.pk, 1, "node-1", ago(100), 1)
    a.refresh_from_db()
    assert a.last_checkpoint_at.timestamp() == pytest.approx(ago(100), abs=1)  # one node saves: its time
    attempt_checkpoint(a.pk, 1, "node-2", ago(160), 1)
    attempt_checkpoint(a.pk, 1, "node-1", ago(40), 2)
    a.refresh_from_db()
    assert a.last_checkpoint_at.timestamp() == pytest.approx(ago(160), abs=1)  # node-2 lags behind


def test_a_heartbeat_applies_checkpoint_reports_from_its_outbox(job, nodes, no_dispatch):
    a = running(job, [("node-1", [0, 1])])
    report = {"attempt_id": a.pk, "number": 1, "node": "node-1", "at": ago(30), "count": 3}
    inv = [g.__dict__ for g in fake_inventory("node-1", 4)]
    node_heartbeat(
        "node-1",
        "a10g",
        inv,
        [[a.pk, 1]],
        "boot-1",
        outbox=[{"id": 9, "name": CHECKPOINT, "kwargs": report}],
        outbox_epoch="e1",
    )
    a.refresh_from_db()
    assert a.last_checkpoint_at.timestamp() == pytest.approx(ago(30), abs=1) and a.checkpoints == 3
    acks = [kw["kwargs"]["ids"] for name, kw in no_dispatch if name == "gpunodes.agent.tasks.outbox_ack"]
    assert acks == [[9]]


@pytest.mark.parametrize("kwargs", [{"at": "x"}, {"at": None}, {"at": float("inf")}, {"number": "1"}, {}])
def test_a_malformed_checkpoint_report_in_a_heartbeat_is_logged_acknowledged_and_changes_nothing(
    job, nodes, no_dispatch, caplog, kwargs
):
    a = running(job, [("node-1", [0, 1])])
    report = {"attempt_id": a.pk, "number": 1, "node": "node-1", "count": 1, **kwargs}
    if not kwargs:
        report.pop("at", None)
    inv = [g.__dict__ for g in fake_inventory("node-1", 4)]
    node_heartbeat(
        "node-1",
        "a10g",
        inv,
        [[a.pk, 1]],
        "boot-1",
        outbox=[{"id": 4, "name": CHECKPOINT, "kwargs": report}],
        outbox_epoch="e1",
    )
    a.refresh_from_db()
    assert a.last_checkpoint_at is None
    assert "ignoring a malformed report in a heartbeat of node-1" in caplog.text
    acks = [kw["kwargs"]["ids"] for name, kw in no_dispatch if name == "gpunodes.agent.tasks.outbox_ack"]
    assert acks == [[4]]


# --- lost work, per attempt, with its cause ----------------------------------------------------------


def preempted(attempt, reason):
    lifecycle.request_stop(
        attempt, grace_s=30, preempted_by=attempt.job_id, preemption_reason=reason, reason="t"
    )
    Job.objects.filter(pk=attempt.job_id).update(state=JobState.PREEMPTING, preemption_count=1)


@pytest.mark.parametrize(
    "how, reason, checkpoint_ago, cause, lost_s",
    [
        # pre-empted by a reclaim, checkpointed 100 s before the stop: 2 GPUs x 100 s
        ("stopped", PreemptionReason.RECLAIM, 100, LostCause.RECLAIM, 200),
        ("stopped", PreemptionReason.PRIORITY, 100, LostCause.PRIORITY, 200),
        # no checkpoint: everything since its start (600 s) on 2 GPUs
        ("stopped", PreemptionReason.RECLAIM, None, LostCause.RECLAIM, 1200),
        # its host stopped it unasked (its agent restarted): node lost
        ("unknown", None, 100, LostCause.NODE_LOST, 200),
        # its agent's fence watchdog killed it (a lapsed lease)
        ("fenced", None, 250, LostCause.FENCED, 500),
        # it ended by itself: nothing lost to anyone's decision
        ("exited", None, 100, "", 0),
        ("timed_out", None, 100, "", 0),
    ],
)
def test_the_end_stores_the_work_run_and_lost_with_its_cause(
    job, nodes, how, reason, checkpoint_ago, cause, lost_s
):
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    if checkpoint_ago is not None:
        attempt_checkpoint(a.pk, 1, "node-1", ago(checkpoint_ago), 1)
    if reason:
        preempted(a, reason)
    assert attempt_finished(a.pk, 1, "node-1", how, 143 if how != "exited" else 1)
    a.refresh_from_db()
    assert a.lost_cause == cause
    assert a.gpu_seconds_run == pytest.approx(1200, abs=4)  # 2 GPUs x 600 s
    assert a.gpu_seconds_lost == pytest.approx(lost_s, abs=4)


def test_a_node_lost_by_the_control_side_loses_the_work_since_its_last_checkpoint(job, nodes):
    a = running(job, [("node-1", [0, 1])], started_ago_s=900)
    attempt_checkpoint(a.pk, 1, "node-1", ago(60), 5)
    lifecycle.end_attempt(a.pk, 1, outcome=Outcome.NODE_LOST, reason="node node-1 stopped heartbeating")
    a.refresh_from_db()
    assert (a.lost_cause, round(a.gpu_seconds_lost)) == (LostCause.NODE_LOST, 120)
    event = job.events.get(kind=EventKind.NODE_LOST)
    # The job page's "work lost" words (the gpu_time filter), not "2 GPUs × 60 s" beside "2 GPU-min".
    assert (
        f"lost {gpu_time(a.gpu_seconds_lost)} of work on 2 GPUs since its last checkpoint at" in event.reason
    )
    assert event.detail["lost_cause"] == "node_lost" and event.detail["gpu_seconds_lost"] == pytest.approx(
        120, abs=2
    )


def test_the_end_report_carries_the_checkpoint_saved_when_told_to_stop(job, nodes):
    """train.py saves on SIGTERM: its end report's checkpoint_at is applied before the end, so the
    attempt loses only the moments between that save and its end."""
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    attempt_checkpoint(a.pk, 1, "node-1", ago(290), 9)
    preempted(a, PreemptionReason.RECLAIM)
    assert attempt_finished(a.pk, 1, "node-1", "stopped", 143, checkpoint_at=ago(1), checkpoints=10)
    a.refresh_from_db()
    assert a.gpu_seconds_lost == pytest.approx(2, abs=2) and a.checkpoints == 10
    event = job.events.get(kind=EventKind.PREEMPTED)
    assert (
        f"lost {gpu_time(a.gpu_seconds_lost)} of work on 2 GPUs since its last checkpoint at" in event.reason
    )
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_a_cancelled_or_never_started_attempt_loses_nothing(job, nodes):
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    lifecycle.cancel(job.pk, by="bob")
    attempt_finished(a.pk, 1, "node-1", "stopped", 143)
    a.refresh_from_db()
    assert (a.outcome, a.lost_cause, a.gpu_seconds_lost) == (Outcome.CANCELLED, "", 0)
    other = job_submit(user=job.submitted_by, share=job.share, gpus=1, gpu_type="a10g", command=["true"])
    b = running(other, [("node-2", [0])])
    Attempt.objects.filter(pk=b.pk).update(state=AttemptState.ADMITTED, started_at=None)
    attempt_finished(b.pk, 1, "node-2", "unknown", None, "refused: no free uid")
    b.refresh_from_db()
    assert (b.outcome, b.gpu_seconds_run, b.gpu_seconds_lost) == (Outcome.REFUSED, 0, 0)
