"""Issue 38, item 3, with real processes: an advice run on two real what-if workers (Celery, the
`whatif` queue, Redis) loses one replay's pool process (kill -9 of a prefork child: Celery's
WorkerLostError, the task re-queued at once) and then a whole worker (kill -9 of its process group: its
host went away; its replay comes back after the what-if visibility timeout, shortened here). The run
still ends, with the answer of a run that lost nothing, every replay counted once, and the two retries
said in its progress."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.utils import timezone

from quotas import advice, advise
from tests.live.conftest import wait_for

pytestmark = [
    pytest.mark.live,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not settings.REDIS_URL, reason="a lost worker's replay comes back through Redis"),
]

VISIBILITY_TIMEOUT_S = (
    8  # short, but longer than a replay here (under a second; a replay process starts in 2-5 s)
)


def digest(answer: dict) -> str:
    return hashlib.sha256(json.dumps(answer, sort_keys=True).encode()).hexdigest()


def replaying_on(run_id: str, pids: set[int], besides: int | None = None) -> tuple[int, int] | None:
    """(part index, pid) of a part now replaying in one of `pids` (not part `besides`)."""
    spec = advice.cache.get(advice._run_key(run_id))
    for index, part in enumerate(advice._parts(spec)):
        if index == besides:
            continue
        if part["state"] == advice.REPLAYING and int(part["on"].rsplit(":", 1)[1]) in pids:
            return index, int(part["on"].rsplit(":", 1)[1])
    return None


def children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return {int(p) for p in f.read().split()}


def lose_mid_replay(run_id: str, pids, send, besides: int | None = None) -> int:
    """Stop the process of a replay running in one of pids() (send(pid, SIGSTOP)), and once it is sure
    that the replay had not ended meanwhile, kill it (send(pid, SIGKILL)). Returns the part's index."""
    while True:
        index, pid = wait_for(
            lambda: replaying_on(run_id, pids(), besides), timeout=30, every=0.02, what="a replay"
        )
        send(pid, signal.SIGSTOP)
        time.sleep(0.3)  # a write of the part's end, already under way, lands
        if replaying_on(run_id, {pid}) == (index, pid):
            send(pid, signal.SIGKILL)
            return index
        send(pid, signal.SIGCONT)


def test_an_advice_run_survives_a_lost_pool_process_and_a_lost_worker(cluster):
    call_command("seed_history", jobs=120, stdout=io.StringIO())
    now = timezone.now()
    cluster.env.update(
        WHATIF_VISIBILITY_TIMEOUT_S=str(VISIBILITY_TIMEOUT_S),
        WHATIF_RESTORE_INTERVAL_S="1",
        ADVICE_PROCESSES="1",
    )
    prefork = cluster.start_worker("whatif-prefork", "whatif", "prefork", 1)
    threads = cluster.start_worker("whatif-threads", "whatif", "threads", 1)
    # Both take replays from the first (else one could make them all before the other is up).
    for name in ("whatif-prefork", "whatif-threads"):
        log = cluster.tmp / f"{name}.log"
        wait_for(lambda log=log: " ready." in log.read_text(), timeout=30, what=f"{name} ready")

    # One worker at a time takes replays until each has lost one: a replay takes well under a second
    # here, and with both at work the second could have made every replay left while the first lost its
    # own (the test then waited for a replay that never came). Stopped (SIGSTOP), a worker takes nothing.
    os.killpg(threads.pid, signal.SIGSTOP)
    try:
        run_id = advice.start(weeks=1, now=now)
        spec = advice.cache.get(advice._run_key(run_id))
        # A prefork pool child dies mid-replay: its parent sees WorkerLostError and re-queues the task.
        lost_child = lose_mid_replay(run_id, lambda: children(prefork.pid), os.kill)
        os.killpg(prefork.pid, signal.SIGSTOP)
        os.killpg(threads.pid, signal.SIGCONT)
        # The other worker's host goes away mid-replay: the worker and its replay process at once.
        lost_worker = lose_mid_replay(run_id, lambda: {threads.pid}, os.killpg, besides=lost_child)
    finally:
        for worker in (prefork, threads):  # (a stopped worker would not hear the teardown's SIGTERM)
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGCONT)
    threads.wait(timeout=10)
    st = wait_for(
        lambda: (s := advice.status(run_id))["finished"] and s,
        timeout=60,
        what="the run's end on the worker left",
        saw=lambda: advice.status(run_id),
    )

    assert st["state"] == advice.DONE, st
    scenario = advice._scenario(spec["digest"])
    alone = advise.search(
        scenario,
        window_s=spec["window_s"],
        replay_many=advise.local_replayer(scenario, window_s=spec["window_s"]),
    )
    assert digest(st["advice"]) == digest(alone)
    # Every replay counted once, the two lost ones included.
    assert st["replays_done"] == st["replays_total"] == st["advice"]["replays"]
    assert st["replays_final"] and st["percent"] == 100
    parts = advice._parts(advice.cache.get(advice._run_key(run_id)))
    assert {i for i, p in enumerate(parts) if p["tries"] > 1} == {lost_child, lost_worker}
    assert st["replays_retried"] == 2
    assert st["retries"] == [
        f"replay {i + 1} was made 2 times: a worker was lost mid-replay"
        for i in sorted({lost_child, lost_worker})
    ]
    # The lost worker's replay came back through the visibility timeout, to the worker left.
    assert int(parts[lost_worker]["on"].rsplit(":", 1)[1]) in children(prefork.pid)
    log = (cluster.tmp / "whatif-prefork.log").read_text()
    assert "WorkerLostError" in log and "retried (try 2)" in log
