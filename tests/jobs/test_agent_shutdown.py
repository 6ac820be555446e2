"""Issue 42 item 2: a routine stop was counted as lost work. A job that saved on SIGTERM when `make
run` was stopped (Ctrl-C: the agent's orderly shutdown) had its attempt's end dated when the control
side read the report after the restart: the whole downtime became "lost work" and "GPU time run",
under node_lost, labelled NODE_LOST. An attempt ends when its processes ended (the host's time, within
what this side can trust), work saved on SIGTERM is not lost, and an orderly agent shutdown is an
outcome of its own (AGENT_STOPPED: re-queued, not a lost host, never a strike)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.models import Node
from gpunodes.tasks import FINISHED, node_heartbeat
from jobs.choices import EventKind, JobState, LostCause, Outcome
from jobs.models import Attempt
from jobs.tasks import attempt_finished
from tests.jobs.test_checkpoints_and_lost_work import ago, running

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch, settings):
    settings.NODE_AUTO_ACCEPT = True
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)


@pytest.fixture
def job(bob, vision_share, nodes):
    from jobs.services import job_submit

    return job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["train"])


def test_a_job_that_saved_on_sigterm_at_a_shutdown_lost_nothing_and_ran_until_then(job, nodes):
    # Ran 10 minutes, then the agent was stopped (Ctrl-C); the control side reads the report after
    # 10 more minutes of downtime.
    a = running(job, [("node-1", [0, 1])], started_ago_s=1200)
    stopped = ago(600)
    assert attempt_finished(
        a.pk,
        1,
        "node-1",
        "shutdown",
        -15,
        "stopped at the orderly shutdown of the agent on node-1",
        checkpoint_at=stopped - 0.4,
        checkpoints=3,
        ended_at=stopped,
    )
    a.refresh_from_db()
    assert a.outcome == Outcome.AGENT_STOPPED and a.lost_cause == LostCause.AGENT_STOPPED
    assert a.ended_at.timestamp() == pytest.approx(stopped, abs=0.01)
    assert a.gpu_seconds_run == pytest.approx(2 * 600, abs=2)  # not 2 x 1200: the downtime is not run
    assert a.gpu_seconds_lost == pytest.approx(2 * 0.4, abs=0.1)  # saved on SIGTERM: not lost
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 0 and job.strike_nodes == []
    event = job.events.order_by("at", "id").last()
    assert event.kind == EventKind.AGENT_STOPPED
    assert event.reason.startswith("stopped at the orderly shutdown of the agent on node-1 at ")
    assert "it saved a checkpoint at" in event.reason and "nothing lost" in event.reason
    assert (
        "not a lost host: no strike toward holding it; re-queued with its original submit time"
        in event.reason
    )


def test_the_job_page_says_it(job, nodes, client, bob):
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    attempt_finished(a.pk, 1, "node-1", "shutdown", -15, ended_at=ago(300))
    client.force_login(bob)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "AGENT_STOPPED" in page and "orderly shutdown of the agent on node-1" in page
    assert (
        "its host&#x27;s agent was stopped" in page.lower() or "its host's agent was stopped" in page.lower()
    )
    assert "NODE_LOST" not in page


def test_the_end_comes_with_the_heartbeats_outbox_after_a_restart(job, nodes):
    a = running(job, [("node-1", [0, 1])], started_ago_s=1200)
    stopped = ago(600)
    end = {
        "attempt_id": a.pk,
        "number": 1,
        "node": "node-1",
        "how": "shutdown",
        "exit_code": -15,
        "ended_at": stopped,
        "detail": "stopped at the orderly shutdown of the agent on node-1",
    }
    node_heartbeat(
        name="node-1",
        gpu_type="a10g",
        inventory=[{"index": i, "uuid": f"GPU-fake-node-1-{i}"} for i in range(4)],
        running=[],
        boot_id="boot-2",
        sent_at=ago(0),
        outbox=[{"id": 1, "name": FINISHED, "kwargs": end}],
        outbox_epoch="e1",
    )
    a.refresh_from_db()
    assert a.outcome == Outcome.AGENT_STOPPED and a.ended_at.timestamp() == pytest.approx(stopped, abs=0.01)


@pytest.mark.parametrize(
    "said, expected",
    [
        (lambda started: started - 3600, "started"),  # before the attempt started: its start
        (lambda started: ago(-3600), "now"),  # ahead of this side's clock: its receipt
        (lambda started: float("nan"), "now"),  # no time: its receipt
    ],
)
def test_the_hosts_time_is_bounded_by_what_this_side_can_trust(job, nodes, said, expected):
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    started = a.started_at.timestamp()
    attempt_finished(a.pk, 1, "node-1", "exited", 0, ended_at=said(started))
    a.refresh_from_db()
    want = started if expected == "started" else timezone.now().timestamp()
    assert a.ended_at.timestamp() == pytest.approx(want, abs=2)


def test_not_after_its_hosts_lease_ran_out(job, nodes, settings):
    settings.FENCE_AFTER_S, settings.FENCE_GRACE_S, settings.HEARTBEAT_INTERVAL_S = 20, 5, 2
    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    heard = timezone.now() - timedelta(seconds=500)
    Node.objects.filter(name="node-1").update(last_heartbeat=heard)
    attempt_finished(a.pk, 1, "node-1", "fenced", -9, ended_at=ago(10))  # its clock ran ahead
    a.refresh_from_db()
    assert a.ended_at == heard + timedelta(seconds=20 + 5 + 2)


def test_an_agent_that_restarts_after_a_crash_dates_the_end_at_its_last_heartbeat(job, nodes):
    """No report (the agent died): the attempt it no longer runs ended after the last heartbeat that
    said it ran, not when the new agent first speaks."""
    a = running(job, [("node-1", [0, 1])], started_ago_s=1200)
    inventory = [{"index": i, "uuid": f"GPU-fake-node-1-{i}"} for i in range(4)]
    node_heartbeat(
        name="node-1", gpu_type="a10g", inventory=inventory, running=[[a.pk, 1]], boot_id="b1", sent_at=ago(0)
    )
    heard = Node.objects.get(name="node-1").last_heartbeat
    Node.objects.filter(name="node-1").update(last_heartbeat=heard - timedelta(seconds=300))
    node_heartbeat(
        name="node-1", gpu_type="a10g", inventory=inventory, running=[], boot_id="b2", sent_at=ago(0)
    )
    a = Attempt.objects.get(pk=a.pk)
    assert a.outcome == Outcome.NODE_LOST
    assert a.ended_at == heard - timedelta(seconds=300)
    assert a.gpu_seconds_run == pytest.approx(2 * 900, abs=5)
