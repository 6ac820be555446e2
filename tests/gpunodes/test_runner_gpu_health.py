"""The runner and the GPU health watcher (issue 29): an attempt on a GPU found broken is killed at once
and ends "gpu_failed" (the others run on); a start on a GPU the watcher holds broken is refused the same
way; the GPUs an attempt gave back are watched for processes that outlive it, and an attempt whose
processes cannot be killed makes its GPUs unhealthy."""

from __future__ import annotations

import time

import pytest

from gpunodes.agent import runner as runner_module
from gpunodes.agent.health import STUCK_PROCESS, XID, FakeNvml, Fault, HealthWatcher
from gpunodes.agent.runner import FINISHED, STARTED
from tests.gpunodes.test_runner import Reports, make_runner


@pytest.fixture
def setup(tmp_path):
    reports = Reports()
    nvml = FakeNvml("n1", 4)
    holder = {}
    watcher = HealthWatcher(
        nvml,
        {i: f"GPU-fake-n1-{i}" for i in range(4)},
        on_fault=lambda i, f: holder["runner"].gpu_failed(i, f),
    )
    watcher.start()
    runner = make_runner(tmp_path, reports, gpu_health=watcher, gpu_holders=watcher.holders)
    holder["runner"] = runner
    yield runner, reports, nvml, watcher
    runner.shutdown(grace_s=1)


def finished(runner, reports, n, timeout=15):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        runner.poll()
        if len(reports.of(FINISHED)) >= n:
            return reports.of(FINISHED)
        time.sleep(0.05)
    raise AssertionError(f"{len(reports.of(FINISHED))} of {n} attempts finished")


def test_the_attempt_on_a_broken_gpu_is_killed_and_ends_gpu_failed(setup):
    runner, reports, nvml, watcher = setup
    for attempt, gpus in ((1, [2, 3]), (2, [0])):
        assert (
            runner.start(attempt_id=attempt, number=1, job_id=attempt, command=["sleep", "60"], gpus=gpus)
            == "started"
        )
    assert len(reports.of(STARTED)) == 2
    nvml.inject({"gpu": 3, "xid": 79})
    watcher.step(wait_ms=0)
    [end] = finished(runner, reports, 1)
    assert (end["attempt_id"], end["how"]) == (1, "gpu_failed")
    assert end["detail"].startswith("GPU 3 of n1 failed: critical Xid 79")
    # The fault rides with the end: the control side takes GPU 3 out before it re-queues the job.
    [fault] = end["gpu_faults"]
    assert (fault["index"], fault["reason"], set(fault)) == (3, "xid", {"index", "reason", "detail", "at"})
    assert runner.running() == [(2, 1)]


def test_a_start_on_a_gpu_held_broken_is_refused_as_gpu_failed(setup):
    runner, reports, nvml, watcher = setup
    watcher.report(1, Fault(XID, "critical Xid 48 (double-bit ECC error)", time.time()))
    assert runner.start(attempt_id=5, number=1, job_id=5, command=["true"], gpus=[0, 1]) == "refused"
    [end] = reports.of(FINISHED)
    assert end["how"] == "gpu_failed" and "GPU 1 of n1 is unhealthy: critical Xid 48" in end["detail"]
    assert runner.start(attempt_id=6, number=1, job_id=6, command=["true"], gpus=[0]) == "started"


def test_the_gpus_an_attempt_gave_back_are_watched_until_the_next_attempt_takes_them(setup):
    runner, reports, nvml, watcher = setup
    runner.start(attempt_id=1, number=1, job_id=1, command=["true"], gpus=[1, 2])
    finished(runner, reports, 1)
    assert set(watcher._releasing) == {1, 2}
    # The next attempt on GPU 1 starts only where no process holds it: its own are not stuck ones.
    assert runner.start(attempt_id=2, number=1, job_id=2, command=["sleep", "60"], gpus=[1]) == "started"
    assert set(watcher._releasing) == {2}
    nvml.inject({"gpu": 2, "processes": [4242]})
    assert runner.start(attempt_id=3, number=1, job_id=3, command=["true"], gpus=[2]) == "refused"
    assert set(watcher._releasing) == {2}  # still watched: a stuck process there is found in time


def test_an_attempt_whose_processes_cannot_be_killed_makes_its_gpus_unhealthy(setup, monkeypatch):
    runner, reports, nvml, watcher = setup
    runner.start(attempt_id=1, number=1, job_id=1, command=["true"], gpus=[0, 2])
    monkeypatch.setattr(runner_module, "kill_attempt", lambda **kw: False)  # D state: SIGKILL does not end it
    finished(runner, reports, 1)
    faults = watcher.faults()
    assert set(faults) == {0, 2} and all(f.reason == STUCK_PROCESS for f in faults.values())
    assert "attempt 1/1 could not be killed" in faults[0].detail
