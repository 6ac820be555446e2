"""A job that holds a context on a GPU it was not given (issue 41, item 6; shown with the fake NVML, which
reports what a test says holds each GPU). Before: every start on that GPU was refused and counted toward
holding the victims' jobs, and once the GPU's last attempt was reaped the squatter's process was taken for
a "stuck process" of that attempt: the GPU was marked UNHEALTHY. Now a holder pid is mapped to its attempt
(its uid, its cgroup): the squatter is stopped and told why, a start on the GPU meanwhile is refused
without a strike, and only a reaped attempt's own processes are ever "stuck"."""

from __future__ import annotations

import time

import pytest

from gpunodes.agent.health import FakeNvml, HealthWatcher
from tests.security.agent_helpers import Reports, as_root, make_runner, uid_pool, wait_until

pytestmark = as_root


@pytest.fixture
def host(root_dir):
    reports = Reports()
    nvml = FakeNvml("n1", 4)
    holder = {}
    watcher = HealthWatcher(
        nvml,
        {i: f"GPU-fake-n1-{i}" for i in range(4)},
        on_fault=lambda i, f: holder["runner"].gpu_failed(i, f),
        stuck_after_s=0.3,
    )
    watcher.start()
    runner = make_runner(
        root_dir,
        reports,
        uids=uid_pool(),
        gpu_health=watcher,
        gpu_holders=watcher.holders,
        gpu_use_check_s=3600,  # each test says when the periodic check runs
    )
    runner.gpu_indexes = {0, 1, 2, 3}
    holder["runner"] = runner
    yield runner, reports, nvml, watcher
    runner.shutdown(grace_s=0)


def squat(runner, nvml, attempt_id: int, gpu: int) -> int:
    """Attempt `attempt_id` (given GPU 0) opens a context on `gpu`: NVML lists its pid there."""
    assert (
        runner.start(attempt_id=attempt_id, number=1, job_id=90, command=["sleep", "60"], gpus=[0])
        == "started"
    )
    pid = runner._procs[attempt_id].popen.pid
    nvml.inject({"gpu": gpu, "processes": [pid]})
    return pid


def test_a_start_on_a_squatted_gpu_stops_the_squatter_and_is_refused_without_a_strike(host):
    runner, reports, nvml, watcher = host
    pid = squat(runner, nvml, 1, gpu=1)
    assert runner.start(attempt_id=2, number=1, job_id=91, command=["true"], gpus=[1]) == "refused"
    victim = reports.finished(2)
    assert victim["how"] == "refused", victim  # re-queued, not a step toward HELD
    squatter = wait_until(lambda: reports.finished(1), runner=runner, what="the squatter's end")
    assert squatter["how"] == "violation", squatter
    assert f"its process {pid} used GPU 1 of n1, which this attempt was not given" in squatter["detail"]
    assert watcher.faults() == {}  # the GPU did nothing wrong
    nvml.inject({"gpu": 1, "processes": []})  # the driver lets go of the dead squatter's context
    assert runner.start(attempt_id=3, number=1, job_id=91, command=["true"], gpus=[1]) == "started"


def test_a_squatter_on_a_released_gpu_is_not_that_attempts_stuck_process(host):
    runner, reports, nvml, watcher = host
    assert runner.start(attempt_id=1, number=1, job_id=91, command=["true"], gpus=[2]) == "started"
    wait_until(lambda: reports.finished(1), runner=runner, what="the first attempt's end")
    squat(runner, nvml, 2, gpu=2)
    time.sleep(0.5)  # past the stuck-process deadline of attempt 1's GPUs
    watcher.check_released()
    assert watcher.faults() == {}, watcher.faults()
    # The periodic check (every GPU_USE_CHECK_S) finds the squatter without any start on its GPU.
    runner._next_gpu_use_check = 0
    end = wait_until(lambda: reports.finished(2), runner=runner, what="the squatter's end")
    assert end["how"] == "violation" and "GPU 2 of n1" in end["detail"]


def test_a_reaped_attempts_own_process_on_its_gpu_is_still_stuck(host):
    runner, reports, nvml, watcher = host
    assert runner.start(attempt_id=1, number=1, job_id=91, command=["true"], gpus=[3]) == "started"
    wait_until(lambda: reports.finished(1), runner=runner, what="the attempt's end")
    nvml.inject({"gpu": 3, "processes": [4_000_000]})  # a pid this host cannot see: NVML's word stands
    time.sleep(0.5)
    watcher.check_released()
    assert [(i, f.reason) for i, f in watcher.faults().items()] == [(3, "stuck_process")]
