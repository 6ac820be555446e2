"""Issue 30, finding 6 (control side): the output of ended jobs (LogChunk rows) was never removed. A beat
task removes it JOB_OUTPUT_KEEP_DAYS after the job ended; the job page and the API say it is gone."""

from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_logs, job_submit
from jobs.tasks import prune_job_output


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


def job_with_output(bob, share, *, state, ended_days_ago=None, chunks=3):
    job = job_submit(user=bob, share=share, gpus=1, gpu_type="a10g", command=["true"])
    finished = timezone.now() - timedelta(days=ended_days_ago) if ended_days_ago is not None else None
    Job.objects.filter(pk=job.pk).update(state=state, attempt_count=1, finished_at=finished)
    ended = state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
    attempt = Attempt.objects.create(
        job=job,
        number=1,
        state=AttemptState.ENDED if ended else AttemptState.RUNNING,
        outcome="SUCCEEDED" if ended else "",
        placement=[{"node": "node-1", "gpus": [0]}],
    )
    LogChunk.objects.bulk_create(
        LogChunk(attempt=attempt, node="node-1", offset=i, text=f"line {i}\n") for i in range(chunks)
    )
    job.refresh_from_db()
    return job


def test_the_output_of_jobs_ended_long_ago_is_removed(bob, vision_share, nodes, settings):
    settings.JOB_OUTPUT_KEEP_DAYS = 30
    old = job_with_output(bob, vision_share, state=JobState.SUCCEEDED, ended_days_ago=31)
    failed = job_with_output(bob, vision_share, state=JobState.FAILED, ended_days_ago=45, chunks=5)
    recent = job_with_output(bob, vision_share, state=JobState.CANCELLED, ended_days_ago=29)
    running = job_with_output(bob, vision_share, state=JobState.RUNNING)
    assert prune_job_output() == 8
    left = set(LogChunk.objects.values_list("attempt__job_id", flat=True))
    assert left == {recent.pk, running.pk}
    assert job_logs(job=old)["removed"] is True and job_logs(job=old)["text"] == ""
    assert job_logs(job=failed)["removed"] is True
    assert job_logs(job=recent)["removed"] is False and job_logs(job=recent)["text"]
    assert prune_job_output() == 0  # nothing left to do: idempotent


def test_it_works_in_batches(bob, vision_share, nodes, settings):
    from jobs.services import prune_job_output as prune

    settings.JOB_OUTPUT_KEEP_DAYS = 1
    job_with_output(bob, vision_share, state=JobState.SUCCEEDED, ended_days_ago=2, chunks=7)
    assert prune(batch=3) == 7 and not LogChunk.objects.exists()


def test_zero_days_keeps_everything(bob, vision_share, nodes, settings):
    settings.JOB_OUTPUT_KEEP_DAYS = 0
    old = job_with_output(bob, vision_share, state=JobState.SUCCEEDED, ended_days_ago=3650)
    assert prune_job_output() == 0 and LogChunk.objects.filter(attempt__job=old).count() == 3
    assert job_logs(job=old)["removed"] is False


def test_the_beat_runs_it_and_the_pages_say_so(alice, bob, vision_share, nodes, settings, client):
    assert django_settings.CELERY_BEAT_SCHEDULE["prune-job-output"]["task"] == "jobs.tasks.prune_job_output"
    settings.JOB_OUTPUT_KEEP_DAYS = 30
    old = job_with_output(bob, vision_share, state=JobState.SUCCEEDED, ended_days_ago=40)
    prune_job_output()
    client.force_login(bob)
    assert 'data-testid="log-removed"' in client.get(f"/jobs/{old.pk}/").content.decode()
    from tests.api.conftest import client_for

    assert client_for(bob).get(f"/api/v1/jobs/{old.pk}/logs/").json()["removed"] is True
