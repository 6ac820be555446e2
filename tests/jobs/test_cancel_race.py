"""Cancel is one compare-and-set over every open state: it wins against a re-queue that lands at the
same moment (the benchmark found `409 Job 26 has already ended (QUEUED)` with the job left queued)."""

import threading

import pytest
from django.db import connection

from gpunodes.models import Gpu
from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import job_submit


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


def preempting_job(user, share, node) -> tuple[Job, Attempt]:
    """A job whose attempt was pre-empted and is in its grace: the host's 'stopped' will re-queue it."""
    job = job_submit(user=user, share=share, gpus=2, gpu_type="a10g", command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING, attempt_count=1, preemption_count=1)
    attempt = Attempt.objects.create(
        job=job, number=1, state=AttemptState.STOPPING, placement=[{"node": node.name, "gpus": [0, 1]}]
    )
    for gpu in Gpu.objects.filter(node=node, index__in=[0, 1]):
        GpuClaim.objects.create(attempt=attempt, gpu=gpu)
    return job, attempt


@pytest.mark.parametrize(
    "state",
    [JobState.QUEUED, JobState.HELD, JobState.ADMITTED, JobState.RUNNING, JobState.PREEMPTING],
)
def test_it_cancels_a_job_in_any_open_state(state, bob, vision_share, nodes):
    """Waiting (queued, held): CANCELLED at once. Live: CANCELLING, its attempt stopping, until its host
    reports it gone (SEMANTICS "Jobs")."""
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    live = state not in (JobState.QUEUED, JobState.HELD)
    Job.objects.filter(pk=job.pk).update(state=state, attempt_count=1 if live else 0)
    if live:
        Attempt.objects.create(
            job=job,
            number=1,
            state=AttemptState.STOPPING if state == JobState.PREEMPTING else AttemptState.RUNNING,
            placement=[{"node": "node-1", "gpus": [0]}],
        )
    assert lifecycle.cancel(job.pk, by="bob") is True
    job.refresh_from_db()
    if live:
        assert job.state == JobState.CANCELLING and job.finished_at is None
        assert Attempt.objects.get(job=job).state == AttemptState.STOPPING
    else:
        assert job.state == JobState.CANCELLED and job.finished_at is not None


def test_it_refuses_a_job_that_has_ended(bob, vision_share, nodes):
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED)
    assert lifecycle.cancel(job.pk, by="bob") is False
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED


def test_a_requeue_landing_inside_the_cancel_does_not_save_the_job(bob, vision_share, nodes, monkeypatch):
    """The interleaving of the bug, made deterministic: the attempt's end (→ QUEUED) commits after the
    cancel looked for a live attempt and before it writes."""
    job, attempt = preempting_job(bob, vision_share, nodes[0])
    real = lifecycle._live_attempt
    calls = []

    def requeue_first(job_id):
        if not calls:
            lifecycle.end_attempt(attempt.pk, 1, outcome=Outcome.PREEMPTED, exit_code=143, reason="stopped")
            assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
        calls.append(job_id)
        return real(job_id)

    monkeypatch.setattr(lifecycle, "_live_attempt", requeue_first)
    assert lifecycle.cancel(job.pk, by="bob") is True
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    assert list(job.events.values_list("kind", flat=True))[-1] == EventKind.CANCELLED


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_the_requeue_always_cancels(bob, vision_share, nodes):
    """Two threads, two database connections: the host's 'stopped' (re-queue) and a user's cancel,
    released together, many times. Whoever wins, the job ends CANCELLED with its GPUs free."""
    for _ in range(15):
        job, attempt = preempting_job(bob, vision_share, nodes[0])
        barrier = threading.Barrier(2)
        results: dict[str, object] = {}

        def run(name, fn, barrier=barrier, results=results):
            try:
                barrier.wait()
                results[name] = fn()
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                results[name] = exc
            finally:
                connection.close()

        threads = [
            threading.Thread(
                target=run,
                args=(
                    "requeue",
                    lambda a=attempt: lifecycle.end_attempt(
                        a.pk, 1, outcome=Outcome.PREEMPTED, exit_code=143, reason="stopped"
                    ),
                ),
            ),
            threading.Thread(target=run, args=("cancel", lambda j=job: lifecycle.cancel(j.pk, by="bob"))),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert results == {"requeue": True, "cancel": True}
        job.refresh_from_db()
        attempt.refresh_from_db()
        assert job.state == JobState.CANCELLED
        assert attempt.state == AttemptState.ENDED
        assert not GpuClaim.objects.filter(attempt=attempt).exists()
