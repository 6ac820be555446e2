"""API test helpers: token clients for alice (admin), bob (vision), charlie (language) and anonymous;
no messages leave the process; a fresh in-memory cache per test (throttles, pass trigger)."""

import pytest
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from gpunodes.models import Gpu
from jobs.api import fast_submit
from jobs.choices import AttemptState, EventKind, JobState
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import job_submit, record_event
from quotas.engine import policy


@pytest.fixture
def taken(monkeypatch):
    """The submits the quick way answered (its 201s)."""
    answered = []
    real = fast_submit.fast_submit

    def spy(request):
        response = real(request)
        if response is not None:
            answered.append(response)
        return response

    monkeypatch.setattr(fast_submit, "fast_submit", spy)
    return answered


@pytest.fixture(autouse=True)
def _quiet(no_messages):
    return no_messages


def client_for(user=None) -> APIClient:
    client = APIClient()
    if user is not None:
        _, key = AuthToken.objects.create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


@pytest.fixture
def anon():
    return APIClient()


@pytest.fixture
def as_alice(alice):
    return client_for(alice)


@pytest.fixture
def as_bob(bob):
    return client_for(bob)


@pytest.fixture
def as_charlie(charlie):
    return client_for(charlie)


def submit(user, share, gpus=1, **kwargs):
    kwargs.setdefault("command", ["python", "train.py"])
    return job_submit(user=user, share=share, gpus=gpus, gpu_type=kwargs.pop("gpu_type", "a10g"), **kwargs)


def run(job: Job, node, gpu_indexes, *, borrowed=False, started_at=None) -> Attempt:
    """Put a queued job on GPUs of `node` as the pass would (attempt, claims, RUNNING), without it."""
    now = started_at or timezone.now()
    number = job.attempt_count + 1
    attempt = Attempt.objects.create(
        job=job,
        number=number,
        state=AttemptState.RUNNING,
        placement=[{"node": node.name, "gpus": list(gpu_indexes)}],
        borrowed=borrowed,
        reason=policy.ADMITTED_BORROWED if borrowed else policy.ADMITTED_OWN,
        admitted_at=now,
        started_at=now,
    )
    attempt.nodes.add(node)
    for gpu in Gpu.objects.filter(node=node, index__in=list(gpu_indexes)):
        GpuClaim.objects.create(attempt=attempt, gpu=gpu)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=number)
    record_event(job.pk, EventKind.STARTED, f"running on {node.name}", attempt_number=number)
    job.refresh_from_db()
    return attempt
