"""Coalesced triggers of the scheduling pass.

A submit, a job end, a share change or a node change asks for a pass at once. A flag in the cache
coalesces a burst (1,000 submits → a few passes, not 1,000): only the first request while no pass is
pending enqueues one, and the pass clears the flag before it reads its snapshot, so a change that lands
after that read asks for the next pass.
"""

from __future__ import annotations

import logging
import threading
import time

from django.core.cache import cache

PENDING_KEY = "gpuquota:pass-pending"
PENDING_TTL_S = 10  # a lost pass message must not block triggers for long
# Submits within this window of one process share one request (the first at once, one more at the end
# of the window for those that came after it): a burst costs no cache round trip per submit.
COALESCE_S = 0.25

log = logging.getLogger(__name__)


PASS_TASK = "quotas.tasks.scheduling_pass"


def request_pass(why: str = "") -> bool:
    """Ask for a pass soon. Returns whether a new pass was enqueued."""
    from config.celery import app

    try:
        if not cache.add(PENDING_KEY, why or "1", timeout=PENDING_TTL_S):
            return False
        # By name from the app's registry (eager in tests, like the task object): the tasks module is the
        # top of the scheduling side and nothing below it imports it.
        app.tasks[PASS_TASK].apply_async(kwargs={"trigger": why})
    except Exception:  # the beat runs a pass every SCHEDULER_INTERVAL_S anyway
        log.warning("could not enqueue a scheduling pass (%s)", why, exc_info=True)
        return False
    return True


RECHECK_KEY = "gpuquota:pass-recheck-at"
# A pass asked for at a protection window's end comes this much after it: the window has ended when the
# pass reads the clock (the policy protects an attempt while its window's end is later than now).
RECHECK_MARGIN_S = 0.05


def request_pass_at(at: float, why: str = "recheck") -> bool:
    """Ask for a pass at the instant `at` (epoch seconds): where a job waits for protection (rule 10),
    the walk is to be made again when the first window that matters ends (Plan.recheck_at), and nothing
    else is sure to happen then. Passes that ask for the same instant or a later one while an earlier
    one is still to come ask once (that pass asks for the next). Returns whether one was asked for."""
    from datetime import UTC, datetime

    from config.celery import app

    try:
        scheduled = cache.get(RECHECK_KEY)
        now = time.time()
        if isinstance(scheduled, float) and now <= scheduled <= at:
            return False
        at = max(at, now)
        cache.set(RECHECK_KEY, at, timeout=int(at - now) + 60)
        eta = datetime.fromtimestamp(at + RECHECK_MARGIN_S, tz=UTC)
        app.tasks[PASS_TASK].apply_async(kwargs={"trigger": why}, eta=eta)
    except Exception:  # the beat's passes come every SCHEDULER_INTERVAL_S anyway
        log.warning("could not ask for a pass at %s (%s)", at, why, exc_info=True)
        return False
    return True


# The stored forecast is stale: a pass decided something, or the queue itself changed (a submit, a
# priority, a cancel of a queued job, a release), since the last forecast. The next pass forecasts
# again (quotas.tasks.forecast_due), still at most every FORECAST_MIN_INTERVAL_S and one at a time, so
# that a user sees their job's position and ETA seconds after a change, not at FORECAST_MAX_AGE_S.
FORECAST_DIRTY = "gpuquota:forecast-dirty"


def mark_forecast_stale() -> None:
    """Before the pass is asked for: that pass, or the next one, then sees the mark."""
    try:
        cache.set(FORECAST_DIRTY, 1, None)
    except Exception:  # advice only: the forecast is made again at FORECAST_MAX_AGE_S anyway
        log.warning("could not mark the stored forecast stale", exc_info=True)


def clear_pending() -> None:
    try:
        cache.delete(PENDING_KEY)
    except Exception:
        log.warning("could not clear the pass-pending flag", exc_info=True)


class _Coalescer:
    """Per process: the first request in a quiet period goes out at once (a lone submit starts without
    delay); later ones within COALESCE_S are folded into one trailing request when the window ends, so
    a job submitted after a pass read its snapshot still gets a pass of its own. Only submits come
    through here, and each changes the queue: each request sent marks the stored forecast stale first
    (once per request, not per submit; the trailing one covers the submits folded into it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last = float("-inf")
        self._timer: threading.Timer | None = None

    def request(self, why: str) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last >= COALESCE_S and self._timer is None:
                self._last = now
                send = True
            else:
                send = False
                if self._timer is None:
                    self._timer = threading.Timer(max(0.0, self._last + COALESCE_S - now), self._fire, (why,))
                    self._timer.daemon = True
                    self._timer.start()
        if send:
            self._send(why)

    def _fire(self, why: str) -> None:
        with self._lock:
            self._timer = None
            self._last = time.monotonic()
        self._send(why)

    def settle(self) -> None:
        """Drop a trailing request not sent yet, and wait for one being sent (tests: a request timed by
        one test must not fire into the next, nor into a pass a test swapped in after its submits)."""
        with self._lock:
            timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join(30)

    @staticmethod
    def _send(why: str) -> None:
        mark_forecast_stale()
        request_pass(why)


_coalescer = _Coalescer()


def request_pass_soon(why: str = "") -> None:
    """Ask for a pass soon, coalesced in this process first (for the submit path)."""
    _coalescer.request(why)


def on_queue_changed(
    sender, *, why: str = "", coalesce: bool = False, reforecast: bool = False, **kwargs
) -> None:
    """Receiver of jobs.signals.queue_changed (connected in quotas.apps): a submit is coalesced in this
    process first, anything else asks at once; where the queue itself changed (`reforecast`), the stored
    forecast is marked stale before the pass is asked for (by the coalescer for a submit, once a burst),
    so that pass forecasts again. The names are looked up when called (tests replace them)."""
    if coalesce:
        request_pass_soon(why)
        return
    if reforecast:
        mark_forecast_stale()
    request_pass(why)
