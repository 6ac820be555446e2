"""A change to the queue is forecast within seconds, not at FORECAST_MAX_AGE_S: a submit (single or
array), a priority change and a cancel of a queued job mark the stored forecast stale (through
jobs.signals, which the scheduling side hears), so the pass they ask for forecasts the queue again even
when it admits nothing (a full cluster). Passes run eagerly here, through the real triggers."""

import time

import pytest
from django.core.cache import cache

from jobs.models import Job
from jobs.services import job_array_submit, job_cancel, job_set_priority
from quotas import services, tasks
from quotas.models import QueueForecast, SchedulerPass
from tests.api.conftest import run, submit


@pytest.fixture(autouse=True)
def eager_passes(celery_eager, monkeypatch, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.FORECAST_MIN_INTERVAL_S, settings.FORECAST_MAX_AGE_S = 3, 30
    cache.clear()
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append(name))
    return sent


@pytest.fixture
def full(bob, vision_share, nodes):
    """Both nodes taken by vision's jobs (4 own, 4 borrowed): nothing more can start."""
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=4), nodes[1], [0, 1, 2, 3], borrowed=True)
    return vision_share


def forecast_made(seconds_ago):
    """The last stored forecast was made this long ago (and nothing has marked it stale since)."""
    cache.set(tasks.FORECAST_LAST, time.time() - seconds_ago, None)
    cache.delete(tasks.FORECAST_ASKED)
    cache.delete(tasks.FORECAST_DIRTY)


def position(job):
    f = QueueForecast.objects.get(job=job)
    return f.position_in_share, f.position_overall


def test_a_pass_that_admits_nothing_after_a_submit_forecasts_the_new_job(
    bob, full, django_capture_on_commit_callbacks
):
    forecast_made(10)
    tasks.scheduling_pass("beat")  # nothing changed: the stored forecast is not due yet
    assert not QueueForecast.objects.exists()
    passes = SchedulerPass.objects.count()
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(bob, full, gpus=4)
    assert SchedulerPass.objects.count() == passes + 1
    assert SchedulerPass.objects.latest("started_at").admitted == 0
    assert Job.objects.get(pk=job.pk).state == "QUEUED"
    f = QueueForecast.objects.get(job=job)
    assert (f.position_in_share, f.position_overall) == (1, 1)
    assert f.reason and f.computed_at >= Job.objects.get(pk=job.pk).updated_at


def test_an_array_submit_is_forecast_by_the_pass_it_asks_for(bob, full, django_capture_on_commit_callbacks):
    forecast_made(10)
    with django_capture_on_commit_callbacks(execute=True):
        array = job_array_submit(
            user=bob, share=full, size=3, gpus=4, gpu_type="a10g", command=["python", "train.py"]
        )
    assert QueueForecast.objects.filter(job__array=array).count() == 3


def test_a_priority_change_is_forecast_by_the_pass_it_asks_for(bob, full, django_capture_on_commit_callbacks):
    first, second = submit(bob, full, gpus=4), submit(bob, full, gpus=4)
    services.forecast_refresh()
    assert (position(first), position(second)) == ((1, 1), (2, 2))
    forecast_made(10)
    with django_capture_on_commit_callbacks(execute=True):
        job_set_priority(user=bob, job=second, priority=50)
    assert (position(second), position(first)) == ((1, 1), (2, 2))


def test_a_cancel_of_a_queued_job_is_forecast_by_the_pass_it_asks_for(
    bob, full, django_capture_on_commit_callbacks
):
    first, second = submit(bob, full, gpus=4), submit(bob, full, gpus=4)
    services.forecast_refresh()
    forecast_made(10)
    with django_capture_on_commit_callbacks(execute=True):
        job_cancel(user=bob, job=first)
    assert position(second) == (1, 1)
    assert not QueueForecast.objects.filter(job=first).exists()


def test_a_change_inside_the_interval_is_forecast_by_a_later_pass(
    bob, full, django_capture_on_commit_callbacks
):
    # Still at most one forecast every FORECAST_MIN_INTERVAL_S: a change just after one is remembered,
    # and the first pass after the interval (the beat's, every few seconds) makes up for it.
    forecast_made(1)
    with django_capture_on_commit_callbacks(execute=True):
        job = submit(bob, full, gpus=4)
    assert not QueueForecast.objects.filter(job=job).exists()
    cache.set(tasks.FORECAST_LAST, time.time() - 4, None)
    cache.delete(tasks.FORECAST_ASKED)
    tasks.scheduling_pass("beat")
    assert position(job) == (1, 1)
