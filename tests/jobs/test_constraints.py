"""The database refuses what must never happen, whatever code path tries it."""

import pytest
from django.db import IntegrityError, transaction

from jobs.choices import AttemptState, Outcome
from jobs.models import Attempt, GpuClaim, Job


@pytest.fixture
def job(bob, vision_share, nodes):
    return Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1, command=["true"])


def test_it_refuses_priority_above_9999(bob, vision_share):
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1, priority=10000)


def test_it_refuses_negative_priority(bob, vision_share):
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1, priority=-1)


def test_it_accepts_the_priority_bounds(bob, vision_share):
    for p in (0, 9999):
        Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1, priority=p)


def test_it_refuses_zero_gpus(bob, vision_share):
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=0)


def test_it_refuses_a_second_active_attempt(job):
    Attempt.objects.create(job=job, number=1, state=AttemptState.RUNNING)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(job=job, number=2, state=AttemptState.ADMITTED)


def test_it_allows_a_new_attempt_once_the_old_one_ended(job):
    Attempt.objects.create(job=job, number=1, state=AttemptState.ENDED, outcome=Outcome.PREEMPTED)
    Attempt.objects.create(job=job, number=2, state=AttemptState.ADMITTED)


def test_it_refuses_a_reused_attempt_number(job):
    Attempt.objects.create(job=job, number=1, state=AttemptState.ENDED, outcome=Outcome.PREEMPTED)
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(job=job, number=1, state=AttemptState.ENDED, outcome=Outcome.FAILED)


def test_it_refuses_an_ended_attempt_without_outcome(job):
    with pytest.raises(IntegrityError), transaction.atomic():
        Attempt.objects.create(job=job, number=1, state=AttemptState.ENDED)


def test_it_refuses_a_gpu_held_twice(job, bob, vision_share, nodes):
    other = Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1)
    gpu = nodes[0].gpus.get(index=0)
    first = Attempt.objects.create(job=job, number=1)
    second = Attempt.objects.create(job=other, number=1)
    GpuClaim.objects.create(attempt=first, gpu=gpu)
    with pytest.raises(IntegrityError), transaction.atomic():
        GpuClaim.objects.create(attempt=second, gpu=gpu)
