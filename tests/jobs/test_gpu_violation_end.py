"""The control side's end of an attempt its host stopped for using a GPU it was not given (issue 41,
item 6): how="violation" is the job's own doing, so it ends FAILED with the host's words (not
re-queued, not a lost node), and the job that was refused on that GPU meanwhile gets no strike."""

import pytest

from jobs.choices import JobState, Outcome
from jobs.models import Attempt, Job
from jobs.tasks import attempt_finished
from tests.jobs.test_held_jobs import attempt_of, job  # noqa: F401 - a fixture


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


def test_a_violation_ends_the_job_failed_with_why(job, nodes):  # noqa: F811
    attempt = attempt_of(job, nodes[0])
    why = "stopped: its process 4711 used GPU 2 of node-1, which this attempt was not given (it was given GPU 0)"
    assert attempt_finished(attempt.pk, 1, "node-1", "violation", -9, why)
    attempt.refresh_from_db()
    assert (attempt.outcome, attempt.end_reason) == (Outcome.FAILED, why)
    assert Job.objects.get(pk=job.pk).state == JobState.FAILED


def test_the_start_refused_on_the_squatted_gpu_is_no_strike(job, nodes, settings):  # noqa: F811
    settings.HOLD_AFTER_NODE_LOST = 1
    attempt = attempt_of(job, nodes[0])
    assert attempt_finished(
        attempt.pk, 1, "node-1", "refused", None, "refused: GPU 0 is still used by pid 4711"
    )
    assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.REFUSED
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
