"""Metrics test data: two 4-GPU a10g nodes; vision-main (capacity 4, lends and borrows) runs 6 GPUs, 2 of
them borrowed; language-main (capacity 2, LEND) runs nothing and has one job queued; an ended vision
attempt was reclaimed; three scheduling passes are on record. No messages leave the process."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.models import Gpu, Node
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import job_submit
from quotas.engine import policy
from quotas.models import SchedulerPass

NOW = timezone.now().replace(microsecond=0)


@pytest.fixture(autouse=True)
def no_messages(monkeypatch):
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": False)


def submit(user, share, gpus=1, *, waited_s=0, **kwargs) -> Job:
    job = job_submit(user=user, share=share, gpus=gpus, gpu_type="a10g", command=["true"], **kwargs)
    Job.objects.filter(pk=job.pk).update(submitted_at=NOW - timedelta(seconds=waited_s))
    job.refresh_from_db()
    return job


def run(job: Job, node, gpu_indexes, *, borrowed=False, started_at=None) -> Attempt:
    """Put a queued job on GPUs of `node` as the pass would (attempt, claims, RUNNING)."""
    started_at = started_at or NOW
    attempt = Attempt.objects.create(
        job=job,
        number=job.attempt_count + 1,
        state=AttemptState.RUNNING,
        placement=[{"node": node.name, "gpus": list(gpu_indexes)}],
        borrowed=borrowed,
        reason=policy.ADMITTED_BORROWED if borrowed else policy.ADMITTED_OWN,
        admitted_at=started_at,
        started_at=started_at,
    )
    attempt.nodes.add(node)
    for gpu in Gpu.objects.filter(node=node, index__in=list(gpu_indexes)):
        GpuClaim.objects.create(attempt=attempt, gpu=gpu)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=attempt.number)
    return attempt


@pytest.fixture
def cluster(bob, charlie, nodes, vision_share, language_share):
    node1, node2 = nodes
    Node.objects.update(last_heartbeat=timezone.now())
    run(submit(bob, vision_share, 4, waited_s=10), node1, [0, 1, 2, 3])
    run(submit(bob, vision_share, 2, waited_s=100), node2, [0, 1], borrowed=True)
    reclaimed = submit(bob, vision_share, 1, waited_s=3600)
    Attempt.objects.create(
        job=reclaimed,
        number=1,
        state=AttemptState.ENDED,
        outcome=Outcome.PREEMPTED,
        preemption_reason="RECLAIM",
        borrowed=True,
        admitted_at=NOW - timedelta(seconds=3000),
        started_at=NOW - timedelta(seconds=3000),  # waited 600 s
        ended_at=NOW - timedelta(seconds=100),
    )
    Job.objects.filter(pk=reclaimed.pk).update(attempt_count=1)
    submit(charlie, language_share, 1, waited_s=5)
    SchedulerPass.objects.bulk_create(
        [
            SchedulerPass(started_at=NOW - timedelta(seconds=s), duration_ms=ms)
            for s, ms in ((9, 3), (5, 40), (1, 700))
        ]
    )
    return nodes
