"""Control-side tasks of the quotas app: the scheduling pass (beat and event triggered)."""

from celery import shared_task

from quotas import scheduler, triggers


@shared_task(name="quotas.tasks.scheduling_pass", ignore_result=True)
def scheduling_pass(trigger: str = "beat") -> dict:
    result = scheduler.run_pass(trigger)
    if forecast_due(changed=bool(result.admitted or result.preempted or result.ended)):
        forecast_queue()  # here, after the pass committed: no message to wait for
    return {"admitted": len(result.admitted), "preempted": len(result.preempted), "ms": result.duration_ms}


FORECAST_LOCK = "gpuquota:forecast-running"
FORECAST_ASKED = "gpuquota:forecast-asked"
FORECAST_LAST = "gpuquota:forecast-last"
# A pass decided something, or the queue changed (triggers.mark_forecast_stale), since the last forecast.
FORECAST_DIRTY = triggers.FORECAST_DIRTY


def forecast_due(*, changed: bool) -> bool:
    """After a pass: is a new stored forecast due? When the pass decided something or the queue changed
    since the last one (a submit, a priority, a cancel: triggers.mark_forecast_stale), at most every
    FORECAST_MIN_INTERVAL_S; or when the stored one is older than FORECAST_MAX_AGE_S, so that an ETA
    that has passed is forecast again from the new state. One pass in an interval says yes."""
    import logging
    import time

    from django.conf import settings
    from django.core.cache import cache

    try:
        if changed:
            # Remembered first, whatever is decided below: a forecast already running (or asked for) may
            # have read the queue before this pass committed, and a later pass must make up for it.
            cache.set(FORECAST_DIRTY, 1, None)
        age = time.time() - float(cache.get(FORECAST_LAST) or 0)
        if age < settings.FORECAST_MIN_INTERVAL_S:
            return False
        if not (changed or cache.get(FORECAST_DIRTY)) and age < settings.FORECAST_MAX_AGE_S:
            return False
        if not cache.add(FORECAST_ASKED, 1, timeout=settings.FORECAST_MIN_INTERVAL_S):
            return False
        cache.delete(FORECAST_DIRTY)
        return True
    except Exception:  # advice only: the next pass asks again
        logging.getLogger(__name__).warning("could not check whether a forecast is due", exc_info=True)
        return False


@shared_task(name="quotas.tasks.forecast_queue", ignore_result=True)
def forecast_queue() -> dict:
    """Forecast the whole queue and store it; never two at once (a cache lock)."""
    import logging
    import time

    from django.conf import settings
    from django.core.cache import cache

    from quotas import services

    if not cache.add(FORECAST_LOCK, 1, timeout=settings.FORECAST_BUDGET_S * 6 + 60):
        cache.set(FORECAST_DIRTY, 1, None)  # the running one may have read the queue too early
        return {"skipped": "a forecast is running"}
    try:
        result = services.forecast_refresh()
        cache.set(FORECAST_LAST, time.time(), None)
        return result
    except Exception:  # advice only: a failed forecast must not fail the pass that ran it
        logging.getLogger(__name__).exception("the queue forecast failed")
        cache.set(FORECAST_DIRTY, 1, None)
        return {"failed": True}
    finally:
        cache.delete(FORECAST_LOCK)


@shared_task(name="quotas.tasks.prune_pass_records", ignore_result=True)
def prune_pass_records() -> int:
    return scheduler.prune_pass_records()


@shared_task(name="quotas.tasks.sample_usage", ignore_result=True)
def sample_usage() -> int:
    """Every minute: one UsageSample per share and GPU type (the dashboard's history)."""
    from quotas import usage

    return usage.sample()


@shared_task(name="quotas.tasks.compact_usage", ignore_result=True)
def compact_usage() -> dict:
    """Hourly: thin samples older than a day to 15-minute buckets, delete those older than 90 days."""
    from quotas import usage

    return {"downsampled": usage.downsample(), "pruned": usage.prune()}


# Replays are acknowledged late and rejected when their worker is lost: the broker gives the replay to
# another worker (the part, found half-done, is replayed to the same figures). Redelivered or long
# queued, a replay's signed message still runs (gpunodes.signing.SignedTask.redelivered_ok).
@shared_task(
    name="quotas.tasks.whatif_replay",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    redelivered_ok=True,
)
def whatif_replay(run_id: str, index: int) -> str:
    """One replay of a what-if run or sweep (quotas.whatif.run_part); on a worker in a process of its
    own, so that a run's replays use the cores side by side. Eager (tests), or in a prefork pool's
    process (daemonic: multiprocessing refuses it a child, and it is a process of its own already): in
    this process."""
    import multiprocessing

    from quotas import whatif

    inline = whatif_replay.request.is_eager or multiprocessing.current_process().daemon
    return whatif.run_part(run_id, index, isolated=not inline)


@shared_task(
    name="quotas.tasks.advice_replay",
    ignore_result=True,
    acks_late=True,
    reject_on_worker_lost=True,
    redelivered_ok=True,
)
def advice_replay(run_id: str, index: int) -> str:
    """One replay of an advice run (quotas.advice.run_part), on the `whatif` queue."""
    from quotas import advice

    return advice.run_part(run_id, index)


@shared_task(name="quotas.tasks.revert_temporary_changes", ignore_result=True)
def revert_temporary_changes() -> int:
    """Every LAYOUT_REVERT_INTERVAL_S: set back the temporary layout changes whose time has come
    (quotas.layout.revert_due: once each, idempotent, a field changed again since left as it is)."""
    from quotas import layout

    return len(layout.revert_due())


@shared_task(name="quotas.tasks.prune_layout_plans", ignore_result=True)
def prune_layout_plans() -> int:
    """Hourly: plans never applied go after 30 days (applied ones stay with their version)."""
    from quotas import layout

    return layout.expire_plans()
