"""When the control worker recomputes the stored forecast: after a pass that decided something, at most
every FORECAST_MIN_INTERVAL_S (a change inside the interval is made up for by a later pass), at least
every FORECAST_MAX_AGE_S, and never two at once."""

import time

import pytest
from django.core.cache import cache

from quotas import tasks


@pytest.fixture(autouse=True)
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.FORECAST_MIN_INTERVAL_S, settings.FORECAST_MAX_AGE_S = 3, 30
    cache.clear()


def forecast_made(seconds_ago):
    cache.set(tasks.FORECAST_LAST, time.time() - seconds_ago, None)
    cache.delete(tasks.FORECAST_ASKED)


def test_a_pass_that_decided_something_asks_for_a_forecast():
    forecast_made(10)
    assert tasks.forecast_due(changed=True)
    assert not tasks.forecast_due(changed=True)  # once per interval


def test_a_change_inside_the_interval_is_made_up_for_by_a_later_pass():
    forecast_made(1)
    assert not tasks.forecast_due(changed=True)
    forecast_made(4)
    assert tasks.forecast_due(changed=False)  # the change was remembered
    forecast_made(5)
    assert not tasks.forecast_due(changed=False)


def test_a_change_while_a_forecast_is_asked_for_is_not_lost():
    # A no-change pass asks for the first forecast; it reads the queue; meanwhile another pass admits a
    # job and commits. That pass's change must be forecast again once the interval has passed, not
    # wait FORECAST_MAX_AGE_S with positions that count the admitted job as queued.
    cache.delete(tasks.FORECAST_LAST)
    assert tasks.forecast_due(changed=False)
    assert not tasks.forecast_due(changed=True)  # one is asked for already
    forecast_made(4)
    assert tasks.forecast_due(changed=False)


def test_a_skipped_or_failed_forecast_is_made_up_for(monkeypatch):
    forecast_made(10)
    assert not tasks.forecast_due(changed=False)
    cache.add(tasks.FORECAST_LOCK, 1, 60)
    tasks.forecast_queue()  # skipped: one is running
    cache.delete(tasks.FORECAST_LOCK)
    assert tasks.forecast_due(changed=False)

    def broken():
        raise RuntimeError("bug")

    monkeypatch.setattr("quotas.services.forecast_refresh", broken)
    forecast_made(10)
    tasks.forecast_queue()
    assert tasks.forecast_due(changed=False)


def test_an_old_forecast_is_made_again_even_when_nothing_changed():
    forecast_made(10)
    assert not tasks.forecast_due(changed=False)
    forecast_made(31)
    assert tasks.forecast_due(changed=False)


def test_never_two_forecasts_at_once(monkeypatch):
    calls = []
    monkeypatch.setattr("quotas.services.forecast_refresh", lambda: calls.append(1) or {"jobs": 0})
    cache.add(tasks.FORECAST_LOCK, 1, 60)
    assert tasks.forecast_queue() == {"skipped": "a forecast is running"} and not calls
    cache.delete(tasks.FORECAST_LOCK)
    assert tasks.forecast_queue() == {"jobs": 0} and calls == [1]
    assert cache.get(tasks.FORECAST_LOCK) is None


def test_a_failed_forecast_does_not_fail_the_pass(monkeypatch):
    def broken():
        raise RuntimeError("bug")

    monkeypatch.setattr("quotas.services.forecast_refresh", broken)
    assert tasks.forecast_queue() == {"failed": True}
    assert cache.get(tasks.FORECAST_LOCK) is None
