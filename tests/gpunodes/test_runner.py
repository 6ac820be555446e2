"""The host runner: real child process groups, graceful stops, timeouts, logs, orphans."""

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from gpunodes.agent import identity
from gpunodes.agent.runner import FINISHED, LOG, STARTED, Runner

TRAIN = str(Path(__file__).resolve().parents[2] / "examples" / "train.py")


class Reports(list):
    def __call__(self, name, kwargs):
        self.append((name, kwargs))

    def of(self, name):
        return [k for n, k in self if n == name]


@pytest.fixture
def reports():
    return Reports()


def make_runner(tmp_path, reports, **kw) -> Runner:
    """A runner of node n1 with its logs, checkpoints and state under tmp_path."""
    return Runner(
        node="n1",
        log_dir=tmp_path / "logs",
        checkpoint_root=tmp_path / "ckpt",
        report=reports,
        state_path=tmp_path / "state" / "running.json",
        **kw,
    )


@pytest.fixture
def runner(tmp_path, reports):
    r = make_runner(tmp_path, reports)
    yield r
    r.shutdown(grace_s=1)


def wait_finished(runner, reports, timeout=15):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        runner.poll()
        if reports.of(FINISHED):
            return reports.of(FINISHED)[-1]
        time.sleep(0.05)
    raise AssertionError("attempt did not finish")


def start(runner, command, **kw):
    return runner.start(
        attempt_id=kw.pop("attempt_id", 1),
        number=kw.pop("number", 1),
        job_id=7,
        command=command,
        gpus=kw.pop("gpus", [0, 2]),
        **kw,
    )


def test_it_runs_the_command_with_gpu_environment(runner, reports):
    code = (
        "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUQUOTA_JOB_ID'], "
        "os.environ['GPUQUOTA_ATTEMPT'], os.environ['GPUQUOTA_CHECKPOINT_DIR'].endswith('job-7'))"
    )
    assert start(runner, [sys.executable, "-c", code]) == "started"
    assert reports.of(STARTED) == [{"attempt_id": 1, "number": 1, "node": "n1"}]
    finished = wait_finished(runner, reports)
    assert finished["how"] == "exited" and finished["exit_code"] == 0
    text = "".join(k["text"] for k in reports.of(LOG))
    assert text.strip() == "0,2 7 1 True"


def test_it_reports_a_failing_exit_code(runner, reports):
    start(runner, [sys.executable, "-c", "raise SystemExit(3)"])
    assert wait_finished(runner, reports)["exit_code"] == 3


def test_a_duplicate_start_changes_nothing(runner, reports):
    start(runner, [sys.executable, "-c", "import time; time.sleep(5)"])
    assert start(runner, [sys.executable, "-c", "print('again')"]) == "duplicate"
    assert len(reports.of(STARTED)) == 1


def test_stop_sends_sigterm_and_the_job_saves_its_checkpoint(runner, reports, tmp_path):
    start(runner, [sys.executable, TRAIN, "--steps", "100", "--step-seconds", "0.05"], grace_s=5)
    time.sleep(0.8)
    assert runner.stop(attempt_id=1, number=1, grace_s=5) == "stopping"
    finished = wait_finished(runner, reports)
    assert finished["how"] == "stopped" and finished["exit_code"] == 143
    assert (tmp_path / "ckpt" / "job-7" / "train.json").exists()
    assert "saved checkpoint" in "".join(k["text"] for k in reports.of(LOG))


def test_the_next_attempt_resumes_from_the_checkpoint(runner, reports, tmp_path):
    start(runner, [sys.executable, TRAIN, "--steps", "100", "--step-seconds", "0.05"], grace_s=5)
    time.sleep(0.8)
    runner.stop(attempt_id=1, number=1, grace_s=5)
    wait_finished(runner, reports)
    reports.clear()
    start(runner, [sys.executable, TRAIN, "--steps", "3", "--step-seconds", "0.01"], attempt_id=2, number=2)
    wait_finished(runner, reports)
    assert "resuming from step" in "".join(k["text"] for k in reports.of(LOG))


def test_stop_kills_after_the_grace_when_sigterm_is_ignored(runner, reports):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    start(runner, [sys.executable, "-c", code])
    time.sleep(0.5)
    t0 = time.monotonic()
    runner.stop(attempt_id=1, number=1, grace_s=1)
    finished = wait_finished(runner, reports)
    assert finished["exit_code"] == -signal.SIGKILL
    assert 0.9 <= time.monotonic() - t0 < 5


def test_stop_of_an_old_attempt_number_is_ignored(runner, reports):
    start(runner, [sys.executable, "-c", "import time; time.sleep(5)"], number=2)
    assert runner.stop(attempt_id=1, number=1, grace_s=0) == "unknown"
    assert runner.running() == [(1, 2)]


def test_a_start_after_its_stop_is_refused(runner, reports):
    assert runner.stop(attempt_id=5, number=1, grace_s=0) == "unknown"
    assert reports.of(FINISHED)[0]["how"] == "unknown"
    assert start(runner, [sys.executable, "-c", "print(1)"], attempt_id=5) == "refused"


def test_max_runtime_is_enforced(runner, reports):
    start(runner, [sys.executable, "-c", "import time; time.sleep(30)"], max_runtime_s=1, grace_s=1)
    assert wait_finished(runner, reports)["how"] == "timed_out"


def test_commands_run_as_argv_not_through_a_shell(runner, reports):
    start(runner, ["echo", "$HOME; echo injected"])
    wait_finished(runner, reports)
    assert "".join(k["text"] for k in reports.of(LOG)).strip() == "$HOME; echo injected"


def test_a_shell_is_used_only_when_asked(runner, reports):
    start(runner, ["echo a && echo b"], use_shell=True)
    wait_finished(runner, reports)
    assert "".join(k["text"] for k in reports.of(LOG)).split() == ["a", "b"]


def test_a_missing_program_fails_cleanly(runner, reports):
    assert start(runner, ["/nonexistent/program"]) == "failed"
    assert reports.of(FINISHED)[0]["how"] == "failed_to_start"


def test_a_restarted_agent_never_runs_a_stale_start_of_an_attempt_that_ended_here(tmp_path, reports):
    # A start sent again while the attempt ran (the control side re-sends starts it has not heard of)
    # can wait on the queue past the attempt's end and the agent's restart: it must not run the
    # finished job again. The time of its admission tells it from an attempt of the same id of a
    # control side whose database was made anew, which runs.
    first = make_runner(tmp_path, reports)
    cmd = [sys.executable, "-c", "print(1)"]
    assert start(first, cmd, attempt_id=3, admitted_us=1_700_000_000_123_456) == "started"
    assert wait_finished(first, reports)["exit_code"] == 0
    first.shutdown(grace_s=1)
    first.outbox.close()
    again = Reports()
    second = make_runner(tmp_path, again)
    try:
        assert start(second, cmd, attempt_id=3, admitted_us=1_700_000_000_123_456) == "duplicate"
        assert second.running() == [] and not again.of(STARTED)
        assert start(second, cmd, attempt_id=3, admitted_us=1_800_000_000_000_000) == "started"  # anew
    finally:
        second.shutdown(grace_s=1)


def test_a_restarted_agent_kills_the_orphans_of_the_previous_one(tmp_path, reports):
    state = tmp_path / "state" / "running.json"
    first = Runner(
        node="n1", log_dir=tmp_path / "l", checkpoint_root=tmp_path / "c", report=reports, state_path=state
    )
    start(first, [sys.executable, "-c", "import time; time.sleep(60)"])
    pid = first._procs[1].popen.pid
    # The first agent dies without cleaning up (kill -9): its child lives on.
    second = Runner(
        node="n1", log_dir=tmp_path / "l", checkpoint_root=tmp_path / "c", report=reports, state_path=state
    )
    assert second.kill_orphans() == [pid]
    first._procs[1].popen.wait(timeout=5)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_a_shutdown_reports_its_attempts_stopped_at_the_shutdown(tmp_path, reports):
    """Issue 42 item 2: an orderly shutdown (Ctrl-C) is said as such ("shutdown": its own outcome on the
    control side, never a lost host), dated by this host's clock, with the checkpoint the job saved on
    SIGTERM."""
    r = make_runner(tmp_path, reports)
    saves = (
        "import os, signal, sys, time\n"
        "def save(*_):\n"
        "    open(os.path.join(os.environ['GPUQUOTA_CHECKPOINT_DIR'], 'model.pt'), 'w').write('w')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    assert start(r, [sys.executable, "-c", saves]) == "started"
    end = time.monotonic() + 10
    while "ready" not in "".join(k["text"] for k in reports.of(LOG)) and time.monotonic() < end:
        r.poll()
        time.sleep(0.05)
    r.shutdown(grace_s=5)
    finished = reports.of(FINISHED)[-1]
    assert finished["how"] == "shutdown" and finished["exit_code"] == 0
    assert finished["detail"] == "stopped at the orderly shutdown of the agent on n1"
    assert abs(finished["ended_at"] - time.time()) < 5
    assert finished["checkpoint_at"] <= finished["ended_at"]


def test_a_start_refused_for_the_nodes_state_is_reported_as_refused_and_stays_refused(runner, reports):
    """Its end says "refused" (not "unknown"): the control side re-queues the job without counting it
    toward holding it (jobs.lifecycle.hold_or_requeue); a late start of it is refused as well."""
    runner.refuse(5, 1, "n1 is CORDONED")
    end = reports.of(FINISHED)[-1]
    assert (end["attempt_id"], end["how"], end["detail"]) == (5, "refused", "refused: n1 is CORDONED")
    start(runner, ["true"], attempt_id=5)
    assert not runner.running()


def test_ended_attempts_let_go_of_their_checkpoint_directories_before_any_report_is_sent(tmp_path):
    """A host cut off from the broker: each send waits for it (here it only records what it saw). Two
    attempts end at once; the second's checkpoint directory must not stay held while the first's end
    is being sent, else a copy of its job started elsewhere (its host declared LOST) is refused."""
    seen = []
    holds = identity.CheckpointHolds(tmp_path / "ckpt")

    class Cut(Reports):
        def __call__(self, name, kwargs):
            if name in (LOG, FINISHED):
                seen.append((name, kwargs["attempt_id"], holds.held(7) + holds.held(8)))
            super().__call__(name, kwargs)

    reports = Cut()
    runner = make_runner(tmp_path, reports)
    go = tmp_path / "go"
    command = ["sh", "-c", f"echo up; while [ ! -e {go} ]; do sleep 0.05; done"]
    try:
        for attempt_id, job_id in ((1, 7), (2, 8)):
            assert (
                runner.start(
                    attempt_id=attempt_id, number=1, job_id=job_id, command=command, gpus=[attempt_id]
                )
                == "started"
            )
        assert sorted(holds.held(7) + holds.held(8)) == ["1-1.n1", "2-1.n1"]
        go.touch()
        deadline = time.monotonic() + 10
        while any(p.popen.poll() is None for p in runner._procs.values()):
            assert time.monotonic() < deadline, "the attempts did not end"
            time.sleep(0.05)
        runner.poll()  # both ended: one poll reaps them
        assert sorted(k["attempt_id"] for k in reports.of(FINISHED)) == [1, 2]
        assert seen and all(held == [] for _, _, held in seen), seen
    finally:
        runner.shutdown(grace_s=1)
