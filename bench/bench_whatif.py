"""Benchmark 9: the what-if preview at full scale (issue 14), from the request to the result the page shows.

`seed_history --jobs N` seeds a week of finished jobs in the bench database (PostgreSQL, emptied first);
then a preview of one share's change (hist-team-1 -> RESERVE) is started as the page starts it
(`whatif.start_preview`). Each of its two replays runs as the whatif worker runs it (`run_part(...,
isolated=True)`: the window read from the database, the replay in a process of its own), both at once;
a thread per task stands in for the Celery worker's pool, so the broker hop (milliseconds) is not in
the figure. Reported: seconds from the request to the last part's answer (what `RunStatus.seconds`
shows on the page), and each replay's own seconds.

Run with `python -m bench --only whatif`, or call `run()`.
"""

from __future__ import annotations

import io
import threading
import time

from bench.common import setup_django, wipe

JOBS = 20_000
TARGET_S = 10.0


def run(jobs: int = JOBS, timeout_s: float = 900.0) -> list[dict]:
    setup_django()
    from django.core.management import call_command
    from django.db import connection

    from quotas import whatif

    wipe()
    t0 = time.perf_counter()
    call_command("seed_history", jobs=jobs, stdout=io.StringIO())
    seeded_s = time.perf_counter() - t0

    threads: list[threading.Thread] = []

    def work(run_id: str, index: int) -> None:
        try:
            whatif.run_part(run_id, index, isolated=True)
        finally:
            connection.close()

    def enqueue(run_id: str, index: int) -> None:
        thread = threading.Thread(target=work, args=(run_id, index), daemon=True)
        threads.append(thread)
        thread.start()

    real_enqueue = whatif._enqueue
    whatif._enqueue = enqueue
    try:
        run_id = whatif.start_preview(
            share="hist-team-1", changes={"strategy": "RESERVE", "borrow_limit": -1}
        )
        for thread in threads:
            thread.join(timeout_s)
    finally:
        whatif._enqueue = real_enqueue
    status = whatif.status(run_id)
    assert status is not None and status.finished, "the preview did not finish"
    failed = status.failed
    parts = [p.get("seconds") for p in status.parts]
    replayed = status.parts[0].get("total") or 0
    wipe()
    return [
        {
            "bench": "9 what-if",
            "size": f"preview, {replayed:,} submissions in the 7-day window, both replays",
            "n": 1,
            "median_s": status.seconds,
            "p95_s": status.seconds,
            "target": f"< {TARGET_S:.0f} s to the result" if jobs >= JOBS else "",
            "met": (not failed and status.seconds < TARGET_S) if jobs >= JOBS else None,
            "note": (
                f"replays {', '.join(f'{s:.1f} s' for s in parts if s is not None)} (side by side); "
                f"seeding {seeded_s:.0f} s" + (f"; FAILED: {failed}" if failed else "")
            ),
        }
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
