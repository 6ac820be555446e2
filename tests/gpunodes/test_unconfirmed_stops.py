"""Issue 41 item 3, the control side: a pre-empted job was re-queued after its stop timed out (the
agent's full disk had eaten the stop) and ran on two hosts at once. A job runs again elsewhere only when
its old copy is known to be gone: its host said so (an end report, or a heartbeat that no longer lists
it), or its host's lease has lapsed. Meanwhile a host that still runs it is told to stop again."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.models import Node
from gpunodes.tasks import node_heartbeat
from jobs import lifecycle
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from quotas import scheduler
from tests.jobs.test_checkpoints_and_lost_work import ago, running

PREEMPT = "gpunodes.agent.tasks.preempt_attempt"


@pytest.fixture
def sent(monkeypatch, settings):
    settings.NODE_AUTO_ACCEPT = True
    settings.PREEMPT_ACK_TIMEOUT_S = 30
    out = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: out.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    return out


@pytest.fixture
def stopping(bob, vision_share, nodes, sent):
    """A pre-empted attempt on node-1 whose stop was never confirmed: its grace and
    PREEMPT_ACK_TIMEOUT_S are long over."""
    from jobs.services import job_submit

    job = job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["train"])
    attempt = running(job, [("node-1", [0, 1])])
    lifecycle.request_stop(attempt, grace_s=10, reason="PREEMPTED_RECLAIM by job 99")
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING)
    Attempt.objects.filter(pk=attempt.pk).update(stop_deadline=timezone.now() - timedelta(seconds=120))
    return attempt


def beat(running, boot="b1"):
    inventory = [{"index": i, "uuid": f"GPU-fake-node-1-{i}"} for i in range(4)]
    return node_heartbeat(
        name="node-1", gpu_type="a10g", inventory=inventory, running=running, boot_id=boot, sent_at=ago(0)
    )


def test_a_host_that_still_runs_it_keeps_it_and_is_told_again(
    stopping, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        beat([[stopping.pk, 1]])
        scheduler.run_pass("test")
    stopping.refresh_from_db()
    assert stopping.state == AttemptState.STOPPING  # its GPUs held: the job runs nowhere else
    assert Job.objects.get(pk=stopping.job_id).state == JobState.PREEMPTING
    stops = [kw["kwargs"] for name, kw in sent if name == PREEMPT]
    assert {"node": "node-1", "attempt_id": stopping.pk, "number": 1, "grace_s": 0} in stops


def test_a_host_whose_heartbeat_no_longer_lists_it_has_said_it_is_gone(stopping, sent):
    beat([[stopping.pk, 1]])
    beat([])
    stopping.refresh_from_db()
    assert (stopping.state, stopping.outcome) == (AttemptState.ENDED, Outcome.PREEMPTED)
    assert "no longer runs it" in stopping.end_reason
    assert Job.objects.get(pk=stopping.job_id).state == JobState.QUEUED


def test_a_silent_host_frees_it_only_once_its_lease_has_lapsed(
    stopping, settings, django_capture_on_commit_callbacks
):
    settings.FENCE_AFTER_S, settings.FENCE_GRACE_S, settings.HEARTBEAT_INTERVAL_S = 20, 5, 2
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=20))  # within its lease
    with django_capture_on_commit_callbacks(execute=True):
        scheduler.run_pass("test")
    assert Attempt.objects.get(pk=stopping.pk).state == AttemptState.STOPPING
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=28))  # 20 + 5 + 2 ago: lapsed
    with django_capture_on_commit_callbacks(execute=True):
        scheduler.run_pass("test")
    stopping.refresh_from_db()
    assert (stopping.state, stopping.outcome) == (AttemptState.ENDED, Outcome.PREEMPTED)
    assert stopping.end_reason == "the host did not confirm the stop, and its lease has lapsed since"
