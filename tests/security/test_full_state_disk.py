"""Issue 41 item 3, "one copy on a full disk", on the agent's side: every control message first wrote its
nonce to a SQLite file on the agent's state disk; a member filled that disk and every start and stop
failed (a pre-empted job then ran on two hosts at once). A small tmpfs is the agent's state disk (its
state, nonces, outbox, job logs and checkpoints), a job fills it, and then:

- a signed stop still stops the job (its nonce cannot be recorded: a stop runs anyway, twice is harmless);
- a signed start is refused back to the control side ("refused": re-queued, no strike), not left waiting;
- the agent gives its reserve back for its own files, alerts once, and refuses starts below
  AGENT_MIN_FREE_BYTES; it takes the reserve again once there is room.

Real processes, real keys, a real filesystem (root: mount)."""

import logging
import time
import uuid

import pytest
from celery.app.trace import trace_task

from gpunodes import signing
from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.disk import DiskGuard, free_bytes
from gpunodes.agent.runner import FINISHED, STARTED, Runner
from tests.security.agent_helpers import as_root, uid_pool, wait_until
from tests.security.signing_helpers import body, make_keys, serializer
from tests.security.test_agent_disk import MiB, small_fs

pytestmark = as_root
START = "gpunodes.agent.tasks.start_attempt"
PREEMPT = "gpunodes.agent.tasks.preempt_attempt"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"), ("gpu-1",))


@pytest.fixture
def agent(keys, reports, settings):
    """An agent of node gpu-1 whose state disk is an 8 MiB tmpfs: its nonces, outbox, state file, job
    logs and the jobs' checkpoints all there (the setup of the finding)."""
    settings.MESSAGE_SIGNING_KEY = str(keys / "gpu-1.key")  # only "is signing on?" is read
    with small_fs(8 * MiB) as fs:
        (fs / "state").mkdir(mode=0o700)
        signing.use_nonce_store(signing.SqliteNonces(fs / "state" / "seen-messages.sqlite3"))
        runner = Runner(
            node="gpu-1",
            log_dir=fs / "logs",
            checkpoint_root=fs / "ckpt",
            work_root=fs / "work",
            report=reports,
            state_path=fs / "state" / "running.json",
            uids=uid_pool(),
        )
        guard = DiskGuard([fs / "state", fs / "logs"], min_free_bytes=2 * MiB, reserve_bytes=1 * MiB)
        guard.check()
        agent_tasks.RUNNER, agent_tasks.DISK = runner, guard
        try:
            yield runner, guard, fs
        finally:
            agent_tasks.RUNNER = agent_tasks.DISK = None
            signing.use_nonce_store(None)
            runner.shutdown(grace_s=0)
            runner.outbox.close()


def deliver(keys, task, name: str, **kwargs):
    """A control-signed message for gpu-1, decoded as the agent decodes it, run as its worker runs it."""
    message = serializer(keys, "control").serialize(body(name, node="gpu-1", **kwargs))
    args, received, _ = serializer(keys, "gpu-1").deserialize(message)
    return trace_task(task, uuid.uuid4().hex, args, received, request={}, app=task.app).retval


def fill_with_a_job(keys, runner, fs):
    """A member's job fills the disk through its checkpoint directory, then waits to be stopped."""
    fill = 'dd if=/dev/zero of="$GPUQUOTA_CHECKPOINT_DIR/fill" bs=64k 2>/dev/null; echo filled; sleep 300'
    started = deliver(
        keys,
        agent_tasks.start_attempt,
        START,
        attempt_id=1,
        number=1,
        job_id=7,
        command=[fill],
        use_shell=True,
    )
    assert started == "started"
    wait_until(lambda: free_bytes(fs) < 64 * 1024, timeout=30, runner=runner, what="the disk to fill")


def test_a_stop_still_stops_the_job_on_a_full_state_disk(keys, agent, reports, caplog):
    runner, guard, fs = agent
    fill_with_a_job(keys, runner, fs)
    pid = runner._procs[1].popen.pid
    with caplog.at_level(logging.WARNING):
        assert (
            deliver(keys, agent_tasks.preempt_attempt, PREEMPT, attempt_id=1, number=1, grace_s=1)
            == "stopping"
        )
    assert "nonce not recorded, run anyway" in caplog.text
    end = wait_until(lambda: reports.finished(1), timeout=20, runner=runner, what="the job to stop")
    assert end["how"] == "stopped" and runner.running() == []
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_a_start_that_cannot_be_recorded_is_refused_back(keys, agent, reports):
    runner, guard, fs = agent
    fill_with_a_job(keys, runner, fs)
    assert (
        deliver(keys, agent_tasks.start_attempt, START, attempt_id=2, number=1, job_id=8, command=["true"])
        is None
    )
    end = reports.finished(2)
    assert end["how"] == "refused" and "cannot record the start" in end["detail"], end
    assert [k["attempt_id"] for k in reports.of(STARTED)] == [1]  # the second never ran
    # A late copy of it (the broker's redelivery, once there is room) is refused too.
    assert runner.start(attempt_id=2, number=1, job_id=8, command=["true"]) == "refused"


def test_the_agent_gives_its_reserve_back_alerts_and_refuses_starts_below_the_threshold(
    keys, agent, reports, caplog
):
    runner, guard, fs = agent
    assert (fs / "state" / "disk-reserve").stat().st_size == 1 * MiB
    fill_with_a_job(keys, runner, fs)
    with caplog.at_level(logging.ERROR):
        why = guard.check()
        guard.check()
    assert (
        why.startswith(f"the agent's disk at {fs / 'state'} has ")
        and "below AGENT_MIN_FREE_BYTES (2.0 MiB)" in why
    )
    assert not (fs / "state" / "disk-reserve").exists()  # its own files have that room now
    alerts = [r for r in caplog.records if r.getMessage().startswith("disk short:")]
    assert len(alerts) == 1 and "gave back its 1.0 MiB reserve" in alerts[0].getMessage()
    # Its own files are written in that room: the outbox takes the refusal of a start.
    runner.outbox.add(FINISHED, {"attempt_id": 99, "number": 1})
    # A start is refused with the reason (the quick path and the outbox both), not started.
    agent_tasks.start_attempt(node="gpu-1", attempt_id=3, number=1, job_id=9, command=["true"])
    end = reports.finished(3)
    assert end["how"] == "refused" and "below AGENT_MIN_FREE_BYTES" in end["detail"]
    assert any(e.kwargs.get("attempt_id") == 3 for e in runner.outbox.pending())
    # The job stopped, its checkpoint removed: room again, the reserve is taken back.
    agent_tasks.preempt_attempt(node="gpu-1", attempt_id=1, number=1, grace_s=0)
    wait_until(lambda: reports.finished(1), timeout=20, runner=runner, what="the job to stop")
    for f in (fs / "ckpt").glob("job-7/fill"):
        f.unlink()
    time.sleep(0.1)
    assert guard.check() == ""
    assert (fs / "state" / "disk-reserve").stat().st_size == 1 * MiB
