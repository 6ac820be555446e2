"""Attempt lifecycle: compare-and-set transitions, idempotent reports, cancel, events."""

import pytest
from django.utils import timezone

from gpunodes.models import Gpu
from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import Conflict, job_cancel, job_set_priority, job_submit
from jobs.tasks import attempt_finished, attempt_log, attempt_started


@pytest.fixture(autouse=True)
def no_dispatch(monkeypatch):
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    return sent


@pytest.fixture
def job(bob, vision_share, nodes):
    return job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["true"])


def admit(job, node, number=1, state=AttemptState.ADMITTED):
    Job.objects.filter(pk=job.pk).update(state=JobState.ADMITTED, attempt_count=number)
    attempt = Attempt.objects.create(
        job=job, number=number, state=state, placement=[{"node": node.name, "gpus": [0, 1]}]
    )
    attempt.nodes.add(node)
    for gpu in Gpu.objects.filter(node=node, index__in=[0, 1]):
        GpuClaim.objects.create(attempt=attempt, gpu=gpu)
    return attempt


def kinds(job):
    return list(job.events.values_list("kind", flat=True))


def test_started_report_moves_job_to_running_once(job, nodes):
    a = admit(job, nodes[0])
    assert attempt_started(a.pk, 1, "node-1") is True
    assert attempt_started(a.pk, 1, "node-1") is False
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    assert kinds(job).count(EventKind.STARTED) == 1


def test_success_frees_the_gpus_and_ends_the_job(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    assert attempt_finished(a.pk, 1, "node-1", "exited", 0) is True
    job.refresh_from_db()
    a.refresh_from_db()
    assert (job.state, a.state, a.outcome) == (JobState.SUCCEEDED, AttemptState.ENDED, Outcome.SUCCEEDED)
    assert not GpuClaim.objects.exists()
    assert job.finished_at is not None


def test_a_duplicate_finish_changes_nothing(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    attempt_finished(a.pk, 1, "node-1", "exited", 0)
    before = kinds(job)
    assert attempt_finished(a.pk, 1, "node-1", "exited", 1) is False
    job.refresh_from_db()
    assert job.state == JobState.SUCCEEDED and kinds(job) == before


def test_a_report_about_an_old_attempt_number_is_ignored(job, nodes):
    a = admit(job, nodes[0], number=2, state=AttemptState.RUNNING)
    assert attempt_finished(a.pk, 1, "node-1", "exited", 1) is False
    assert attempt_started(a.pk, 1, "node-1") is False
    a.refresh_from_db()
    assert a.state == AttemptState.RUNNING


def test_a_late_start_of_an_ended_attempt_tells_the_host_to_stop(job, nodes, no_dispatch):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    attempt_finished(a.pk, 1, "node-1", "exited", 0)
    no_dispatch.clear()
    attempt_started(a.pk, 1, "node-1")
    assert [n for n, _ in no_dispatch] == ["gpunodes.agent.tasks.preempt_attempt"]


def test_nonzero_exit_fails_the_job(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    attempt_finished(a.pk, 1, "node-1", "exited", 3)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3


def test_a_stopped_preempted_attempt_requeues_with_the_original_submit_time(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    submitted = job.submitted_at
    assert lifecycle.request_stop(a, grace_s=5, preempted_by=None, reason="test")
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING, preemption_count=1)
    attempt_finished(a.pk, 1, "node-1", "stopped", 143)
    job.refresh_from_db()
    a.refresh_from_db()
    assert job.state == JobState.QUEUED and job.submitted_at == submitted
    assert a.outcome == Outcome.PREEMPTED
    assert EventKind.REQUEUED in kinds(job)


def test_a_preempted_attempt_that_still_exits_0_within_its_grace_succeeds(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    assert lifecycle.request_stop(a, grace_s=5, preempted_by=None, reason="test")
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING, preemption_count=1)
    attempt_finished(a.pk, 1, "node-1", "exited", 0)
    job.refresh_from_db()
    a.refresh_from_db()
    assert (job.state, a.outcome) == (JobState.SUCCEEDED, Outcome.SUCCEEDED)
    assert not GpuClaim.objects.filter(attempt=a).exists()


def test_pre_emption_past_max_preemptions_fails_the_job(job, nodes):
    Job.objects.filter(pk=job.pk).update(max_preemptions=0)
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    lifecycle.request_stop(a, grace_s=0)
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING, preemption_count=1)
    attempt_finished(a.pk, 1, "node-1", "stopped", -9)
    job.refresh_from_db()
    assert job.state == JobState.FAILED


def test_a_second_stop_request_changes_nothing(job, nodes, no_dispatch):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    assert lifecycle.request_stop(a, grace_s=5) is True
    assert lifecycle.request_stop(a, grace_s=5) is False


def test_cancel_of_a_queued_job_is_immediate(job, bob):
    job_cancel(user=bob, job=job)
    assert job.state == JobState.CANCELLED


def test_cancel_of_a_running_job_stops_it_and_frees_gpus_on_confirmation(job, bob, nodes, no_dispatch):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    job_cancel(user=bob, job=job)
    a.refresh_from_db()
    assert job.state == JobState.CANCELLING and a.state == AttemptState.STOPPING  # CANCELLED once stopped
    assert GpuClaim.objects.filter(attempt=a).count() == 2  # held until the host confirms
    attempt_finished(a.pk, 1, "node-1", "stopped", 143)
    a.refresh_from_db()
    assert a.outcome == Outcome.CANCELLED and not GpuClaim.objects.exists()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_cancelling_a_finished_job_is_a_conflict(job, bob):
    job_cancel(user=bob, job=job)
    with pytest.raises(Conflict):
        job_cancel(user=bob, job=job)


def test_priority_change_is_recorded(job, bob):
    job_set_priority(user=bob, job=job, priority=7)
    assert job.priority == 7
    assert EventKind.PRIORITY_CHANGED in kinds(job)


def test_log_chunks_are_stored_once(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    assert attempt_log(a.pk, 1, "node-1", 0, "hello\n") is True
    assert attempt_log(a.pk, 1, "node-1", 0, "hello\n") is False
    assert a.log_chunks.count() == 1


def test_node_lost_requeues(job, nodes):
    a = admit(job, nodes[0], state=AttemptState.RUNNING)
    lifecycle.end_attempt(a.pk, 1, outcome=Outcome.NODE_LOST, reason="gone", at=timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert kinds(job)[-1] == EventKind.NODE_LOST
