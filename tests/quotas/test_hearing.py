"""An outage of the control side is not a mass node failure: a node is declared LOST only after its
heartbeats were missing for NODE_LOST_AFTER_S while the control side heard other nodes (quotas/hearing.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas import hearing, scheduler
from quotas.models import SchedulerPass
from tests.conftest import heard_all_along


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)


@pytest.fixture
def running(bob, vision_share, nodes, settings):
    """A job running on each node, heartbeats fresh, and a pass that has heard them for an hour."""
    settings.NODE_LOST_AFTER_S = 30
    settings.HEARTBEAT_INTERVAL_S = 5
    settings.SCHEDULER_INTERVAL_S = 2
    Node.objects.update(last_heartbeat=timezone.now())
    jobs = [
        job_submit(user=bob, share=vision_share, gpus=4, gpu_type="a10g", command=["true"]) for _ in range(2)
    ]
    scheduler.run_pass("admit")
    Attempt.objects.update(state=AttemptState.RUNNING)
    heard_all_along()
    return jobs


def silent(*names: str, for_s: float) -> None:
    Node.objects.filter(name__in=names).update(last_heartbeat=timezone.now() - timedelta(seconds=for_s))


def pass_long_ago(seconds: float, hearing_since=None) -> None:
    """The latest pass ran `seconds` ago (the control worker was down since)."""
    SchedulerPass.objects.all().delete()
    at = timezone.now() - timedelta(seconds=seconds)
    SchedulerPass.objects.create(started_at=at, hearing_since=hearing_since or at - timedelta(hours=1))


def test_a_silent_node_is_lost_while_the_others_are_heard(running):
    silent("node-1", for_s=60)
    result = scheduler.run_pass("test")
    assert result.lost_nodes == ["node-1"]
    assert Node.objects.get(name="node-2").state == NodeState.READY


def test_no_node_is_lost_while_no_heartbeat_arrives_from_anyone(running):
    silent("node-1", "node-2", for_s=600)  # the broker or the control side was away, not the nodes
    result = scheduler.run_pass("test")
    assert result.lost_nodes == [] and result.hearing_since is None
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    assert not Attempt.objects.exclude(state=AttemptState.RUNNING).exists()
    assert SchedulerPass.objects.order_by("-started_at").first().hearing_since is None


def test_after_a_silence_every_node_gets_a_fresh_node_lost_after_s(running, settings):
    silent("node-1", "node-2", for_s=600)
    scheduler.run_pass("test")  # hears nobody
    silent("node-2", for_s=0)  # node-2's heartbeats arrive again; node-1's not yet
    first = scheduler.run_pass("test")
    assert first.lost_nodes == [] and first.hearing_since is not None
    # NODE_LOST_AFTER_S after hearing again, node-1 (still silent) is lost, not before.
    SchedulerPass.objects.filter(hearing_since=first.hearing_since).update(
        hearing_since=first.hearing_since - timedelta(seconds=settings.NODE_LOST_AFTER_S - 5)
    )
    assert scheduler.run_pass("test").lost_nodes == []
    SchedulerPass.objects.update(
        hearing_since=first.hearing_since - timedelta(seconds=settings.NODE_LOST_AFTER_S)
    )
    assert scheduler.run_pass("test").lost_nodes == ["node-1"]


def test_a_control_worker_back_after_an_outage_loses_no_node_whose_backlog_it_has_not_read(running):
    """Down for 10 minutes: no pass ran. Its backlog has node-2's heartbeats first; the first pass back
    must not take node-1's old heartbeat for a silence while the control side was listening."""
    pass_long_ago(600)
    silent("node-1", for_s=600)
    result = scheduler.run_pass("test")
    assert result.lost_nodes == [] and result.hearing_since is not None
    assert set(Job.objects.filter(pk__in=[j.pk for j in running]).values_list("state", flat=True)) == {
        JobState.ADMITTED
    }


def test_a_single_node_is_never_lost_by_silence_alone(bob, vision_share, settings):
    """No other witness: its silence cannot be told from the control side's own."""
    from gpunodes.services import fake_inventory, node_register

    node_register(name="only", gpu_type="a10g", gpus=fake_inventory("only", 4))
    heard_all_along()
    silent("only", for_s=3600)
    assert scheduler.run_pass("test").lost_nodes == []
    assert Node.objects.get(name="only").state == NodeState.READY


def test_the_gap_is_a_few_heartbeats_and_at_most_half_of_node_lost_after_s(settings):
    settings.HEARTBEAT_INTERVAL_S, settings.SCHEDULER_INTERVAL_S, settings.NODE_LOST_AFTER_S = 5, 2, 300
    assert hearing.gap_s() == 15
    settings.NODE_LOST_AFTER_S = 20
    assert hearing.gap_s() == 10


def test_the_read_side_says_outage_then_resumed_then_normal(running, settings):
    heard = hearing.hearing(timezone.now())
    assert not heard.outage and not heard.suspended and heard.resumed_s == pytest.approx(3600, abs=60)
    silent("node-1", "node-2", for_s=120)
    heard = hearing.hearing(timezone.now())
    assert heard.outage and heard.suspended and heard.silence_s == pytest.approx(120, abs=5)
    scheduler.run_pass("test")  # hears nobody
    silent("node-1", "node-2", for_s=0)
    scheduler.run_pass("test")  # heard again: hearing starts now
    heard = hearing.hearing(timezone.now())
    assert not heard.outage and heard.suspended and heard.resumed_s == pytest.approx(0, abs=5)


def booted(name: str, at) -> None:
    """The node's agent started at `at` (its boot id begins with its start time in milliseconds)."""
    Node.objects.filter(name=name).update(boot_id=f"{int(at.timestamp() * 1000):014d}-abc")


def test_hearing_that_begins_with_a_first_start_follows_no_silence(bob, vision_share, nodes, settings):
    settings.NODE_LOST_AFTER_S = 30
    Node.objects.update(last_heartbeat=timezone.now())
    scheduler.run_pass("first")  # no pass before it ever heard a node
    heard = hearing.hearing(timezone.now())
    assert heard.suspended and heard.resumed_s is not None
    assert heard.silence_before_s is None


def test_hearing_after_a_restart_of_the_whole_cluster_follows_no_silence(running):
    """Ctrl-C, then `make run` an hour later: the agents started after the last pass that heard them."""
    pass_long_ago(3600)
    for name in ("node-1", "node-2"):
        booted(name, timezone.now() - timedelta(seconds=20))
    scheduler.run_pass("test")
    heard = hearing.hearing(timezone.now())
    assert heard.suspended and heard.resumed_s == pytest.approx(0, abs=5)
    assert heard.silence_before_s is None


def test_hearing_again_after_agents_ran_unheard_follows_a_silence(running, settings):
    """The control worker was away 10 minutes while the agents ran on: that is a silence."""
    for name in ("node-1", "node-2"):
        booted(name, timezone.now() - timedelta(hours=2))
    pass_long_ago(600)
    scheduler.run_pass("test")
    heard = hearing.hearing(timezone.now())
    assert heard.silence_before_s == pytest.approx(600, abs=5)
    assert heard.checks_resume_in_s == pytest.approx(settings.NODE_LOST_AFTER_S, abs=5)


def test_one_agent_that_ran_through_a_restart_makes_it_a_silence(running):
    pass_long_ago(600)
    booted("node-1", timezone.now() - timedelta(seconds=20))
    booted("node-2", timezone.now() - timedelta(hours=2))
    scheduler.run_pass("test")
    assert hearing.hearing(timezone.now()).silence_before_s == pytest.approx(600, abs=5)


def test_the_agent_start_time_is_read_from_its_boot_id():
    from gpunodes.agent.main import new_boot_id

    before = timezone.now()
    started = hearing.agent_started_at(new_boot_id())
    assert before - timedelta(seconds=1) <= started <= timezone.now()
    assert hearing.agent_started_at("") is None and hearing.agent_started_at("older-style-id") is None
