"""Broker messages are not trusted blindly (issue 18): a forged heartbeat does not make a node READY,
a report about an attempt counts only from a node of its placement, and an agent validates every field
of a start and refuses starts while its node is not READY. Each refusal is logged."""

import logging

import pytest

from gpunodes import services
from gpunodes.agent import identity
from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.runner import FINISHED
from gpunodes.choices import SCHEDULABLE_STATES, NodeState
from gpunodes.models import Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs.models import LogChunk
from jobs.tasks import attempt_finished, attempt_log, attempt_started
from tests.api.conftest import run, submit
from tests.security.agent_helpers import make_runner


def heartbeat(name, **kw):
    inv = [g.__dict__ for g in fake_inventory(name, 4)]
    return node_heartbeat(name, "a10g", inv, [], kw.pop("boot_id", "00000000000001-a"), **kw)


@pytest.fixture
def redis_deployment(settings):
    """New nodes are not accepted at once (what a Redis deployment gets by default)."""
    settings.NODE_AUTO_ACCEPT = False
    settings.NODE_JOIN_TOKEN = "join-secret-1"


def test_a_forged_heartbeat_registers_a_pending_node_that_takes_no_work(db, redis_deployment, caplog):
    with caplog.at_level(logging.WARNING):
        assert heartbeat("evil")["state"] == NodeState.PENDING
    node = Node.objects.get(name="evil")
    assert node.state == NodeState.PENDING and node.state not in SCHEDULABLE_STATES
    assert "evil" in caplog.text and "PENDING" in caplog.text
    heartbeat("evil")  # heartbeating on changes nothing
    assert Node.objects.get(name="evil").state == NodeState.PENDING


def test_a_wrong_join_token_leaves_it_pending_the_right_one_makes_it_ready(db, redis_deployment):
    assert heartbeat("n9", join_token="guess")["state"] == NodeState.PENDING
    assert heartbeat("n9", join_token="join-secret-1")["state"] == NodeState.READY
    assert Node.objects.get(name="n9").state == NodeState.READY


def test_an_admin_accepts_a_pending_node(
    db, redis_deployment, alice, no_messages, django_capture_on_commit_callbacks
):
    heartbeat("n9")
    with django_capture_on_commit_callbacks(execute=True):
        node = services.node_accept(node=Node.objects.get(name="n9"), actor=alice)
    assert node.state == NodeState.READY
    assert (
        "gpunodes.agent.tasks.node_state",
        {"kwargs": {"node": "n9", "state": "READY"}, "queue": "node.n9"},
    ) in [(n, {k: kw[k] for k in ("kwargs", "queue")}) for n, kw in no_messages if n != "pass"]
    from quotas.models import AuditEntry

    assert AuditEntry.objects.filter(action="accept").exists()


def test_a_malformed_heartbeat_is_refused(db, caplog):
    assert heartbeat("../evil")["refused"]
    assert not Node.objects.filter(name="../evil").exists()


@pytest.fixture
def running(bob, vision_share, nodes):
    return run(submit(bob, vision_share), nodes[0], [0])


def test_an_end_report_from_a_node_outside_the_placement_is_refused(running, caplog):
    with caplog.at_level(logging.WARNING):
        assert not attempt_finished(running.pk, running.number, "node-2", how="exited", exit_code=137)
    running.refresh_from_db()
    assert running.state == "RUNNING" and "not in its placement" in caplog.text
    assert attempt_finished(running.pk, running.number, "node-1", how="exited", exit_code=0)


def test_a_log_line_from_a_node_outside_the_placement_is_refused(running):
    assert not attempt_log(running.pk, running.number, "node-2", 0, "forged line\n")
    assert not LogChunk.objects.filter(attempt=running).exists()


def test_a_start_report_from_a_node_outside_the_placement_is_refused(running):
    assert not attempt_started(running.pk, running.number, "node-2")


def test_a_repeated_end_report_counts_for_the_heartbeats_sender_only(running):
    forged = [
        {
            "attempt_id": running.pk,
            "number": running.number,
            "node": "node-1",
            "how": "exited",
            "exit_code": 1,
        }
    ]
    heartbeat("node-2", finished=forged)  # node-2 says node-1's attempt ended
    running.refresh_from_db()
    assert running.state == "RUNNING"


# --- the agent side ----------------------------------------------------------------------------------


@pytest.fixture
def agent(tmp_path, reports, monkeypatch):
    runner = make_runner(tmp_path, reports)
    runner.gpu_indexes = {0, 1, 2, 3}
    monkeypatch.setattr(agent_tasks, "RUNNER", runner)
    yield runner
    runner.shutdown(grace_s=0)


GOOD = {"node": "n1", "attempt_id": 1, "number": 1, "job_id": 7, "command": ["true"], "gpus": [0]}


@pytest.mark.parametrize(
    "bad",
    [
        {"job_id": "0/../../../../../tmp/x"},
        {"job_id": True},
        {"attempt_id": "1"},
        {"number": 0},
        {"command": "rm -rf /"},
        {"command": ["true", 1]},
        {"env": {"BAD NAME": "x"}},
        {"env": {"A": 1}},
        {"gpus": [7]},  # not on this host
        {"gpus": [0, 0]},
        {"world": ["../x"]},
        {"use_shell": "yes"},
        {"grace_s": -1},
        {"max_runtime_s": "1"},
    ],
)
def test_a_start_message_with_a_bad_field_is_refused_and_logged(agent, reports, tmp_path, bad, caplog):
    with caplog.at_level(logging.ERROR):
        assert agent_tasks.start_attempt.run(**{**GOOD, **bad}) == "refused"
    assert agent.running() == [] and reports == [] and "refusing" in caplog.text
    # No job's directory was made (the agent's own .holds, made when it started, is not one).
    ckpt = tmp_path / "ckpt"
    assert not ckpt.exists() or not [p for p in ckpt.iterdir() if p.name != identity.HOLDS_DIR]


def test_a_good_start_message_runs(agent):
    assert agent_tasks.start_attempt.run(**GOOD) == "started"


@pytest.mark.parametrize("state", ["CORDONED", "DRAINING", "PENDING"])
def test_an_agent_refuses_starts_while_its_node_is_not_ready(agent, reports, state, caplog):
    assert agent_tasks.node_state.run(node="n1", state=state) == state
    with caplog.at_level(logging.WARNING):
        assert agent_tasks.start_attempt.run(**GOOD) == "refused"
    assert agent.running() == [] and state in caplog.text
    # The control side re-queues it at once, not counting it toward holding the job (HOLD_AFTER_NODE_LOST).
    assert reports.of(FINISHED)[0]["how"] == "refused"
    agent_tasks.node_state.run(node="n1", state="READY")
    assert agent_tasks.start_attempt.run(**{**GOOD, "attempt_id": 2}) == "started"


def test_cordoning_tells_the_agent(db, nodes, alice, no_messages, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        services.node_cordon(node=nodes[0], actor=alice)
    assert any(
        n == "gpunodes.agent.tasks.node_state" and kw["kwargs"] == {"node": "node-1", "state": "CORDONED"}
        for n, kw in no_messages
    )
