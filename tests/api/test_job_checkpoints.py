"""A job's checkpoints and the work its attempts lost, where its owner reads them: GET /api/v1/jobs/{id}/
and the job page (`gpuquota status`: tests/client/test_cli_checkpoints_and_protection.py) ("last checkpoint 4 min ago"; per attempt: its last checkpoint and the
work lost with its cause)."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from jobs import lifecycle
from jobs.choices import PreemptionReason
from jobs.tasks import attempt_checkpoint
from tests.api.conftest import run, submit


@pytest.fixture
def story(bob, vision_share, nodes):
    return make_story(bob, vision_share, nodes)


def make_story(bob, vision_share, nodes):
    """Attempt 1 ran 10 min on 2 GPUs, checkpointed 4 min before it was reclaimed (8 GPU-min lost);
    attempt 2 runs now, its last checkpoint 4 min ago."""
    job = submit(bob, vision_share, gpus=2)
    first = run(job, nodes[0], [0, 1], started_at=timezone.now() - timedelta(minutes=30))
    attempt_checkpoint(first.pk, 1, "node-1", (timezone.now() - timedelta(minutes=24)).timestamp(), 3)
    lifecycle.request_stop(
        first,
        grace_s=5,
        preempted_by=job.pk,
        preemption_reason=PreemptionReason.RECLAIM,
        reason="PREEMPTED_RECLAIM by job 9 of share x",
    )
    lifecycle.end_attempt(first.pk, 1, outcome="PREEMPTED", at=timezone.now() - timedelta(minutes=20))
    job.refresh_from_db()
    second = run(job, nodes[0], [0, 1], started_at=timezone.now() - timedelta(minutes=10))
    attempt_checkpoint(second.pk, 2, "node-1", (timezone.now() - timedelta(minutes=4)).timestamp(), 1)
    return job


def test_the_api_gives_the_last_checkpoint_and_each_attempts_lost_work(as_bob, story):
    data = as_bob.get(f"/api/v1/jobs/{story.pk}/").json()
    assert 239 <= data["last_checkpoint_age_s"] <= 250
    first, second = data["attempts"]
    assert (first["lost_cause"], first["checkpoints"]) == ("reclaim", 3)
    assert first["gpu_seconds_lost"] == pytest.approx(2 * 240, abs=3)  # 2 GPUs x 4 min
    assert first["gpu_seconds_run"] == pytest.approx(2 * 600, abs=3)
    assert second["gpu_seconds_lost"] is None and second["last_checkpoint_at"] == data["last_checkpoint_at"]
    preempted = [e for e in data["events"] if e["kind"] == "PREEMPTED"][0]
    assert "lost 8 GPU-min of work on 2 GPUs since its last checkpoint at" in preempted["reason"]
    assert preempted["detail"]["lost_cause"] == "reclaim"


def test_the_job_page_shows_the_last_checkpoint_and_the_work_lost(bob, story):
    client = Client()
    client.force_login(bob)
    page = client.get(f"/jobs/{story.pk}/").content.decode().replace("\xa0", " ")  # timesince's spaces
    assert 'data-testid="last-checkpoint"' in page and "4 minutes ago" in page
    lost = page.split('data-testid="lost-1">', 1)[1].split("</td>", 1)[0]
    assert "8 GPU-min" in lost and "reclaim of borrowed capacity" in lost
    assert '<span class="muted">none</span>' not in page.split('data-testid="lost-2">', 1)[1][:40]


def test_a_job_without_checkpoints_says_so(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share, gpus=1)
    run(job, nodes[0], [0])
    assert as_bob.get(f"/api/v1/jobs/{job.pk}/").json()["last_checkpoint_at"] is None
    client = Client()
    client.force_login(bob)
    assert "none reported" in client.get(f"/jobs/{job.pk}/").content.decode()
