"""Heartbeats register nodes, bring LOST nodes back, and reconcile what the host runs."""

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from gpunodes.services import fake_inventory, node_register
from gpunodes.tasks import node_heartbeat
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit


@pytest.fixture(autouse=True)
def auto_accept(settings):
    """These tests are about heartbeats, not joining: new nodes are accepted at once, as on the embedded
    default (on Redis a node joins PENDING until accepted: tests/security/test_control_messages.py)."""
    settings.NODE_AUTO_ACCEPT = True


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    return sent


def beat(name="node-9", running=(), boot="boot-1"):
    inv = [g.__dict__ for g in fake_inventory(name, 4)]
    return node_heartbeat(name, "a10g", inv, [list(r) for r in running], boot)


def test_first_heartbeat_registers_a_ready_node_with_its_gpus(db, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        beat()
    node = Node.objects.get(name="node-9")
    assert node.state == NodeState.READY and node.gpus.count() == 4 and node.last_heartbeat
    assert ("pass", "node ready") in sent


def test_a_lost_node_that_heartbeats_again_is_ready(db):
    beat()
    Node.objects.filter(name="node-9").update(state=NodeState.LOST)
    beat()
    assert Node.objects.get(name="node-9").state == NodeState.READY


def test_a_cordoned_node_stays_cordoned(db):
    beat()
    Node.objects.filter(name="node-9").update(state=NodeState.CORDONED)
    beat()
    assert Node.objects.get(name="node-9").state == NodeState.CORDONED


def test_inventory_changes_update_the_gpu_rows(db):
    node_register(name="node-9", gpu_type="a10g", gpus=fake_inventory("node-9", 2))
    beat()
    assert Node.objects.get(name="node-9").gpus.count() == 4


@pytest.fixture
def running_attempt(bob, vision_share, nodes):
    beat("node-1", boot="boot-1")
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=1)
    a = Attempt.objects.create(
        job=job, number=1, state=AttemptState.RUNNING, placement=[{"node": "node-1", "gpus": [0]}]
    )
    a.nodes.add(nodes[0])
    return a


def test_after_an_agent_restart_attempts_it_forgot_are_lost(running_attempt):
    result = beat("node-1", running=[], boot="boot-2")
    running_attempt.refresh_from_db()
    assert result["lost"] == [running_attempt.pk]
    assert running_attempt.outcome == Outcome.NODE_LOST
    assert Job.objects.get(pk=running_attempt.job_id).state == JobState.QUEUED


def test_without_a_restart_a_missing_attempt_is_left_alone(running_attempt):
    beat("node-1", running=[], boot="boot-1")
    running_attempt.refresh_from_db()
    assert running_attempt.state == AttemptState.RUNNING


def test_the_host_is_told_to_stop_an_attempt_that_is_over(
    running_attempt, sent, django_capture_on_commit_callbacks
):
    Attempt.objects.filter(pk=running_attempt.pk).update(state=AttemptState.ENDED, outcome=Outcome.SUCCEEDED)
    with django_capture_on_commit_callbacks(execute=True):
        result = beat("node-1", running=[(running_attempt.pk, 1)], boot="boot-1")
    assert result["stop"] == [(running_attempt.pk, 1)]
    assert any(n == "gpunodes.agent.tasks.preempt_attempt" for n, _ in sent)


def test_a_heartbeat_from_a_newer_agent_is_applied_and_its_unknown_fields_logged_once(db, caplog):
    """A rolling upgrade reaches the hosts first: a field this control side does not know must not fail
    the heartbeat (the node would go LOST and its jobs be re-queued)."""
    inv = [g.__dict__ for g in fake_inventory("node-9", 4)]
    with caplog.at_level("WARNING", logger="gpunodes.tasks"):
        for _ in range(3):
            node_heartbeat("node-9", "a10g", inv, [], "boot-1", gpu_temperatures=[40, 41], future={"x": 1})
    assert Node.objects.get(name="node-9").state == NodeState.READY
    warned = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warned) == 1 and "future, gpu_temperatures" in warned[0]


@pytest.mark.parametrize(
    ("state", "believed", "told"),
    [
        (NodeState.READY, "CORDONED", [NodeState.READY]),  # a stale CORDONED landed after the un-cordon
        (NodeState.READY, "READY", []),
        (NodeState.READY, "", []),  # an agent that does not say: as before
        (NodeState.CORDONED, "CORDONED", [NodeState.CORDONED]),  # (not READY: told at every heartbeat)
    ],
)
def test_an_agent_that_believes_another_state_is_told_its_state_again(
    db, sent, django_capture_on_commit_callbacks, state, believed, told
):
    """An un-cordon tells the agent READY, but a heartbeat handled from the state before it may tell it
    CORDONED after that, and an agent that believes CORDONED refuses every start: each heartbeat says
    what its agent believes, and the control side tells it the node's state where the two differ."""
    beat()
    Node.objects.filter(name="node-9").update(state=state)
    sent.clear()
    inv = [g.__dict__ for g in fake_inventory("node-9", 4)]
    with django_capture_on_commit_callbacks(execute=True):
        node_heartbeat("node-9", "a10g", inv, [], "boot-1", node_state=believed)
    assert [kw["kwargs"]["state"] for name, kw in sent if name.endswith("node_state")] == told


def test_a_heartbeat_with_a_made_up_node_state_is_refused(db, sent):
    beat()
    inv = [g.__dict__ for g in fake_inventory("node-9", 4)]
    assert node_heartbeat("node-9", "a10g", inv, [], "boot-1", node_state="ROOT") == {"refused": True}
