"""Pausing Python's cyclic garbage collector around a long replay (the forecast, the simulator).

A replay allocates hundreds of thousands of long-lived objects (attempts, ETAs, records) and makes no
reference cycles (tests/quotas/test_engine_incremental.py checks that a pass leaves none, and that a
whole simulation leaves none), so reference counting frees all of its garbage. The cyclic collector
only walks the growing heap over and over: a fifth of the forecast of 98k queued jobs. Paused, peak
memory stays the same (measured).

Process-wide, as `gc.disable()` is: nested and concurrent pauses are counted, and the collector is
enabled again when the last one ends, if it was enabled when the first one began.

`promote`: what the pause made and kept is all young when it ends, and the first collection after
would walk every object of it to find nothing to free (0.25 s of an ITP replay's 4-6 s, 0.55 s of a
100k-job one). A pause whose run leaves no reference cycles (the simulator: tested) asks for
everything to be moved to the oldest generation instead (freeze, then unfreeze: what a later full
collection reads anyway), where the process froze nothing itself (a web worker freezes what it loaded,
config/wsgi.py: that stays frozen). Done only when every pause of the span asked for it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_was_enabled = False
_promote = False


@contextmanager
def paused(*, promote: bool = False) -> Iterator[None]:
    global _pauses, _was_enabled, _promote
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            _promote = True
            gc.disable()
        _pauses += 1
        _promote = _promote and promote
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                if _promote and not gc.get_freeze_count():
                    gc.freeze()  # every generation into the permanent one (the young one's count to 0)
                    gc.unfreeze()  # and all of it into the oldest
                gc.enable()
