"""Redis down for longer than every window and timeout involved while jobs end (the agent's durable
outbox, gpunodes/agent/outbox.py): every finished report arrives once the broker is back, and the last lines of their
logs, written while the broker was away, are sent again from the log files; nothing that succeeded
runs again, a failure keeps its exit code, the jobs the lease fenced run again once, and no two
attempts of a job overlap (the ledger, written from inside the jobs).

The redis-server is killed, not stopped: it comes back empty, so whatever it held (the reports sent
while it was going down, the heartbeats, the passes' messages) is gone, and only the outboxes can bring
the ends back. The outbox has no time window of its own (the heartbeat repeat it replaces had 120 s);
the outage, 30 s here (`GPUQUOTA_FAULT_REDIS_OUTAGE_S`, e.g. 600 for the issue's 10 minutes), outlasts
the windows set short for the test (heartbeats every 2 s): FENCE_AFTER_S + FENCE_GRACE_S (12 s),
NODE_LOST_AFTER_S (16 s), the start re-send (10 s) and PREEMPT_ACK_TIMEOUT_S (5 s)."""

from __future__ import annotations

import os
import sqlite3
import time

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState, Outcome
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from tests.faults.conftest import make_team, needs_stack, wait_for
from tests.faults.harness import wait_settled
from tests.faults.ledger import Ledger

pytestmark = [needs_stack, pytest.mark.django_db(transaction=True)]

OUTAGE_S = float(os.environ.get("GPUQUOTA_FAULT_REDIS_OUTAGE_S", "30"))
WINDOWS = {
    "HEARTBEAT_INTERVAL_S": 2,
    "NODE_LOST_AFTER_S": 16,
    "FENCE_AFTER_S": 10,
    "FENCE_GRACE_S": 2,
    "PREEMPT_ACK_TIMEOUT_S": 5,
}


def outbox_sizes(cluster, nodes) -> dict[str, int]:
    """What each agent's outbox still holds (read beside the agent: WAL allows it)."""
    sizes = {}
    for node in nodes:
        db = sqlite3.connect(cluster.var / "agent" / node / "outbox.sqlite3", timeout=5)
        try:
            sizes[node] = db.execute("SELECT count(*) FROM outbox").fetchone()[0]
        finally:
            db.close()
    return sizes


def test_every_finished_report_survives_a_redis_outage_longer_than_every_window(cluster, django_user_model):
    assert max(WINDOWS["NODE_LOST_AFTER_S"], WINDOWS["FENCE_AFTER_S"] + WINDOWS["FENCE_GRACE_S"]) < OUTAGE_S
    cluster.env.update({k: str(v) for k, v in WINDOWS.items()})
    share, [(user, _)] = make_team(django_user_model, "r", capacity=6)
    nodes = {"r1": 3, "r2": 3}
    cluster.start(nodes)
    # Three kinds of job, each with a ledger of its own (its own release): they succeed during the
    # outage, fail during it (exit 3), or run on until the lease lapses and fences them.
    ok, bad, long = (Ledger(cluster.jobs / name) for name in ("ok", "bad", "long"))

    def submit(command: str) -> Job:
        return job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=[command], use_shell=True)

    # Their last line is written during the outage: the log repair (the ends' log ranges) brings it.
    say = 'echo "hello $GPUQUOTA_JOB_ID"; {}; echo "bye $GPUQUOTA_JOB_ID"'
    succeed = [submit(say.format(ok.command())) for _ in range(2)]
    fail = [submit(say.format(bad.command()) + "; exit 3") for _ in range(2)]
    fenced = [submit(long.command()) for _ in range(2)]
    wait_for(
        lambda: Attempt.objects.filter(state="RUNNING").count() == 6,
        60,
        every=0.5,
        what="6 running",
        jobs=succeed + fail + fenced,
    )

    cluster.redis.kill()
    down_at = time.monotonic()
    time.sleep(2)
    ok.release()
    time.sleep(2)
    bad.release()
    wait_for(
        lambda: all(s.ended for s in ok.spans() + bad.spans()) and len(ok.spans() + bad.spans()) == 4,
        15,
        every=0.2,
        what="4 jobs ended during the outage",
    )
    ended_in_outage_s = time.monotonic() - down_at
    wait_for(lambda: all(s.ended for s in long.spans()), OUTAGE_S, every=0.5, what="the lease to fence")
    fenced_after_s = time.monotonic() - down_at
    # Every end waits on disk (the fenced ones a moment after their trap wrote the ledger's end).
    wait_for(
        lambda: sum(outbox_sizes(cluster, nodes).values()) >= 6, 10, every=0.2, what="6 ends in outboxes"
    )
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
    assert Job.objects.filter(state=JobState.RUNNING).count() == 6  # nothing heard of it yet
    cluster.redis.start()
    back = time.monotonic()
    # Every process outlived the outage (kombu's stock transport could kill a worker closing the lost
    # connection: config/redisbroker.py).
    assert all(p.poll() is None for p in cluster.procs.values())

    def arrived() -> bool:
        states = dict(Job.objects.values_list("pk", "state"))
        ended = set(Attempt.objects.filter(number=1, state="ENDED").values_list("job_id", flat=True))
        return (
            all(states[j.pk] == JobState.SUCCEEDED for j in succeed)
            and all(states[j.pk] == JobState.FAILED for j in fail)
            and all(j.pk in ended for j in fenced)
        )

    wait_for(arrived, 60, every=0.25, what="the ends reported during the outage")
    arrived_s = time.monotonic() - back
    wait_for(lambda: not any(outbox_sizes(cluster, nodes).values()), 30, every=0.5, what="empty outboxes")
    acked_s = time.monotonic() - back
    long.release()
    wait_settled(90)

    for job in succeed:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED and job.attempt_count == 1  # not run again
        assert [s.attempt for s in ok.attempts(job.pk)] == [1]
    for job in fail:
        job.refresh_from_db()
        assert job.state == JobState.FAILED and job.exit_code == 3 and job.attempt_count == 1
    for job in succeed + fail:
        text = "".join(
            LogChunk.objects.filter(attempt__job=job, attempt__number=1)
            .order_by("offset")
            .values_list("text", flat=True)
        )
        assert text == f"hello {job.pk}\nbye {job.pk}\n", text
    for job in fenced:
        job.refresh_from_db()
        first = Attempt.objects.get(job=job, number=1)
        assert first.outcome == Outcome.NODE_LOST  # stopped by the fence: re-queued, not failed
        assert job.state == JobState.SUCCEEDED and job.attempt_count == 2
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    checked = sum(ledger.assert_no_overlap() for ledger in (ok, bad, long))
    print(
        f"\nredis down {OUTAGE_S:.0f} s: 4 jobs ended {ended_in_outage_s:.1f} s in, 2 fenced "
        f"{fenced_after_s:.1f} s in; all 6 ends applied {arrived_s:.1f} s after redis was back, "
        f"outboxes empty after {acked_s:.1f} s; {checked} attempts, none overlapping, none re-run"
    )
