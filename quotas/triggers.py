"""Coalesced triggers of the scheduling pass.

A submit, a job end, a share change or a node change asks for a pass at once. A flag in the cache
coalesces a burst (1,000 submits → a few passes, not 1,000): only the first request while no pass is
pending enqueues one, and the pass clears the flag before it reads its snapshot, so a change that lands
after that read asks for the next pass.
"""

from __future__ import annotations

import logging

from django.core.cache import cache

PENDING_KEY = "gpuquota:pass-pending"
PENDING_TTL_S = 10  # a lost pass message must not block triggers for long

log = logging.getLogger(__name__)


def request_pass(why: str = "") -> bool:
    """Ask for a pass soon. Returns whether a new pass was enqueued."""
    from quotas.tasks import scheduling_pass

    try:
        if not cache.add(PENDING_KEY, why or "1", timeout=PENDING_TTL_S):
            return False
        scheduling_pass.apply_async(kwargs={"trigger": why})
    except Exception:  # the beat runs a pass every SCHEDULER_INTERVAL_S anyway
        log.warning("could not enqueue a scheduling pass (%s)", why, exc_info=True)
        return False
    return True


def clear_pending() -> None:
    try:
        cache.delete(PENDING_KEY)
    except Exception:
        log.warning("could not clear the pass-pending flag", exc_info=True)
