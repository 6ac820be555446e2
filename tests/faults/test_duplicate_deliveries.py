"""Every task delivered twice, late, or out of order changes nothing the second time, and a report
about an old attempt number is ignored (Celery delivers at least once: acks_late, redelivery after a
lost connection). Control side: attempt_started, attempt_finished, attempt_log, node_heartbeat; host
side: start_attempt and preempt_attempt on a real Runner. Runs on any database (no processes)."""

from __future__ import annotations

import sys
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.agent.runner import FINISHED, Runner
from gpunodes.models import Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs.choices import AttemptState, EventKind, JobState
from jobs.models import Attempt, GpuClaim, Job, JobEvent, LogChunk
from jobs.services import job_submit
from jobs.tasks import attempt_finished, attempt_log, attempt_started
from quotas import scheduler
from tests.gpunodes.test_runner import Reports, wait_finished

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_pass(no_local_messages, django_capture_on_commit_callbacks):
    def run():
        with django_capture_on_commit_callbacks(execute=True):
            return scheduler.run_pass("test")

    return run


@pytest.fixture
def fresh(nodes):
    Node.objects.update(last_heartbeat=timezone.now(), boot_id="boot-1")
    return nodes


def state_of_everything() -> tuple:
    """Every row a delivery could change (not heartbeat timestamps)."""
    return (
        list(
            Job.objects.order_by("pk").values_list(
                "pk", "state", "attempt_count", "preemption_count", "exit_code"
            )
        ),
        list(
            Attempt.objects.order_by("pk").values_list(
                "pk", "number", "state", "outcome", "started_at", "ended_at", "stop_requested_at"
            )
        ),
        sorted(GpuClaim.objects.values_list("gpu_id", "attempt_id")),
        JobEvent.objects.count(),
        LogChunk.objects.count(),
        list(Node.objects.order_by("pk").values_list("name", "state", "boot_id")),
    )


def twice(fn, *args, **kwargs):
    first = fn(*args, **kwargs)
    before = state_of_everything()
    second = fn(*args, **kwargs)
    assert state_of_everything() == before, f"{fn.__name__} changed state the second time"
    return first, second


def admitted(bob, share, run_pass, **kw) -> Attempt:
    job = job_submit(user=bob, share=share, gpus=1, gpu_type="a10g", command=["true"], **kw)
    run_pass()
    return Attempt.objects.get(job=job, number=Job.objects.get(pk=job.pk).attempt_count)


def node_of(attempt) -> str:
    return attempt.placement[0]["node"]


def test_a_duplicate_started_report_changes_nothing(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    assert twice(attempt_started, a.pk, 1, node_of(a)) == (True, False)
    assert Job.objects.get(pk=a.job_id).state == JobState.RUNNING
    assert JobEvent.objects.filter(job=a.job_id, kind=EventKind.STARTED).count() == 1


def test_a_duplicate_finished_report_changes_nothing(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    attempt_started(a.pk, 1, node_of(a))
    assert twice(attempt_finished, a.pk, 1, node_of(a), "exited", 0) == (True, False)
    assert Job.objects.get(pk=a.job_id).state == JobState.SUCCEEDED
    assert not GpuClaim.objects.exists()


def test_finished_before_started_then_a_late_start_is_told_to_stop(
    bob, vision_share, fresh, run_pass, no_local_messages
):
    a = admitted(bob, vision_share, run_pass)
    assert attempt_finished(a.pk, 1, node_of(a), "exited", 0)
    no_local_messages.clear()
    before = state_of_everything()
    assert attempt_started(a.pk, 1, node_of(a)) is False  # reordered: it arrived after the end
    assert state_of_everything() == before
    assert [n for n, _ in no_local_messages] == ["gpunodes.agent.tasks.preempt_attempt"]


def test_reports_about_an_old_attempt_number_are_ignored(bob, vision_share, fresh, run_pass):
    first = admitted(bob, vision_share, run_pass)
    attempt_started(first.pk, 1, node_of(first))
    # The node's agent restarted and lost it: the job is re-queued and admitted again.
    node_heartbeat(
        node_of(first), "a10g", [g.__dict__ for g in fake_inventory(node_of(first), 4)], [], "boot-2"
    )
    run_pass()
    second = Attempt.objects.get(job=first.job_id, number=2)
    attempt_started(second.pk, 2, node_of(second))
    before = state_of_everything()
    for node in ("node-1", "node-2"):
        assert attempt_started(first.pk, 1, node) is False
        assert attempt_finished(first.pk, 1, node, "exited", 0) is False
        assert attempt_finished(second.pk, 1, node, "exited", 1) is False  # right id, old number
        assert attempt_log(first.pk, 2, node, 0, "x") is False  # a number that attempt never had
    assert state_of_everything() == before
    assert Job.objects.get(pk=first.job_id).state == JobState.RUNNING


def test_a_duplicate_log_chunk_is_stored_once(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    assert twice(attempt_log, a.pk, 1, node_of(a), 0, "hello\n") == (True, False)
    assert LogChunk.objects.count() == 1


def test_a_duplicate_heartbeat_changes_nothing(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    attempt_started(a.pk, 1, node_of(a))
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    first, second = twice(node_heartbeat, node_of(a), "a10g", inv, [[a.pk, 1]], "boot-1")
    assert first["lost"] == second["lost"] == []


def test_a_late_heartbeat_from_before_a_start_changes_nothing(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    attempt_started(a.pk, 1, node_of(a))
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    before = state_of_everything()
    node_heartbeat(node_of(a), "a10g", inv, [], "boot-1")  # sent before the attempt began
    assert state_of_everything() == before


def test_a_heartbeat_that_repeats_an_old_finished_report_changes_nothing(bob, vision_share, fresh, run_pass):
    a = admitted(bob, vision_share, run_pass)
    attempt_started(a.pk, 1, node_of(a))
    attempt_finished(a.pk, 1, node_of(a), "exited", 0)
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    report = {"attempt_id": a.pk, "number": 1, "node": node_of(a), "how": "exited", "exit_code": 1}
    before = state_of_everything()
    node_heartbeat(node_of(a), "a10g", inv, [], "boot-1", finished=[report])
    assert state_of_everything() == before
    assert Job.objects.get(pk=a.job_id).state == JobState.SUCCEEDED  # not turned into a failure


def test_a_finished_report_lost_with_the_broker_arrives_with_the_next_heartbeat(
    bob, vision_share, fresh, run_pass
):
    a = admitted(bob, vision_share, run_pass)
    attempt_started(a.pk, 1, node_of(a))
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    report = {"attempt_id": a.pk, "number": 1, "node": node_of(a), "how": "exited", "exit_code": 0}
    twice(node_heartbeat, node_of(a), "a10g", inv, [], "boot-1", finished=[report])
    assert Job.objects.get(pk=a.job_id).state == JobState.SUCCEEDED


def test_a_start_lost_with_the_broker_is_sent_again(
    bob, vision_share, fresh, run_pass, no_local_messages, settings
):
    a = admitted(bob, vision_share, run_pass)
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    no_local_messages.clear()
    assert node_heartbeat(node_of(a), "a10g", inv, [], "boot-1")["resent"] == []  # too soon: may be queued
    Attempt.objects.filter(pk=a.pk).update(admitted_at=timezone.now() - timedelta(minutes=1))
    result = node_heartbeat(node_of(a), "a10g", inv, [], "boot-1")
    assert result["resent"] == [a.pk]
    assert Attempt.objects.get(pk=a.pk).state == AttemptState.ADMITTED


def test_a_started_report_lost_with_the_broker_is_made_good_by_the_heartbeat(
    bob, vision_share, fresh, run_pass
):
    a = admitted(bob, vision_share, run_pass)
    inv = [g.__dict__ for g in fake_inventory(node_of(a), 4)]
    twice(node_heartbeat, node_of(a), "a10g", inv, [[a.pk, 1]], "boot-1")
    assert Attempt.objects.get(pk=a.pk).state == AttemptState.RUNNING


def test_a_late_heartbeat_of_a_previous_agent_boot_is_ignored(bob, vision_share, fresh, run_pass):
    """The control worker handles heartbeats on several threads: the last one of a killed agent can be
    applied after the first one of its successor. It must not read as yet another restart."""
    from gpunodes.agent.main import new_boot_id

    old, new = new_boot_id(), None
    time.sleep(0.002)
    new = new_boot_id()
    a = admitted(bob, vision_share, run_pass)
    name = node_of(a)
    inv = [g.__dict__ for g in fake_inventory(name, 4)]
    sent = time.time()
    node_heartbeat(name, "a10g", inv, [[a.pk, 1]], new, sent_at=sent)
    attempt_started(a.pk, 1, name)
    before = state_of_everything()
    # The old agent's last words (sent before the new agent's first heartbeat), applied late.
    result = node_heartbeat(name, "a10g", inv, [], old, sent_at=sent - 0.5)
    assert state_of_everything() == before and result.get("ignored")
    assert Node.objects.get(name=name).boot_id == new


# --- the host side: a real Runner --------------------------------------------------------------


@pytest.fixture
def runner(tmp_path):
    reports = Reports()
    r = Runner(
        node="n1",
        log_dir=tmp_path / "logs",
        checkpoint_root=tmp_path / "ckpt",
        report=reports,
        state_path=tmp_path / "state" / "running.json",
    )
    r.reports = reports
    yield r
    r.shutdown(grace_s=1)


def start(runner, number=1, attempt_id=1, command=None):
    return runner.start(
        attempt_id=attempt_id,
        number=number,
        job_id=7,
        command=command or [sys.executable, "-c", "import time; time.sleep(30)"],
        gpus=[0],
        grace_s=1,
    )


def test_a_duplicate_start_runs_one_process(runner):
    assert start(runner) == "started"
    assert start(runner) == "duplicate"
    assert runner.running() == [(1, 1)]


def test_a_start_after_its_attempt_finished_is_not_run_again(runner):
    start(runner, command=["true"])
    wait_finished(runner, runner.reports)
    assert start(runner, command=["true"]) == "duplicate"
    assert runner.running() == []


def test_a_duplicate_preempt_stops_once_and_reports_once(runner):
    start(runner)
    assert runner.stop(attempt_id=1, number=1, grace_s=1) == "stopping"
    assert runner.stop(attempt_id=1, number=1, grace_s=1) == "stopping"
    finished = wait_finished(runner, runner.reports)
    assert finished["how"] == "stopped"
    assert runner.stop(attempt_id=1, number=1, grace_s=1) == "finished"
    assert len(runner.reports.of(FINISHED)) == 1


def test_a_preempt_before_its_start_means_the_late_start_is_refused(runner):
    assert runner.stop(attempt_id=1, number=1, grace_s=1) == "unknown"
    assert start(runner) == "refused"
    assert runner.running() == []


def test_a_preempt_for_an_old_number_does_not_touch_the_running_attempt(runner):
    start(runner, number=2)
    assert runner.stop(attempt_id=1, number=1, grace_s=0) == "unknown"
    runner.poll()
    assert runner.running() == [(1, 2)]


def test_the_runner_keeps_its_finished_report_for_the_heartbeat(runner):
    start(runner, command=["true"])
    wait_finished(runner, runner.reports)
    [report] = [e.kwargs for e in runner.outbox.pending() if e.name == FINISHED]
    assert (report["attempt_id"], report["number"], report["how"]) == (1, 1, "exited")


def test_a_duplicate_pass_decides_nothing_new(bob, vision_share, fresh, run_pass, no_local_messages):
    admitted(bob, vision_share, run_pass)
    no_local_messages.clear()
    before = state_of_everything()
    result = run_pass()
    assert (result.admitted, result.preempted, result.ended) == ([], [], [])
    assert state_of_everything() == before and no_local_messages == []
