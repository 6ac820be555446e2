"""Every attempt has limits of its own (issue 30, finding 4): a job of 26 processes × 95 MiB got both
agents OOM-killed, and their fences killed every other team's jobs; a fork bomb made other teams' new
jobs end FAILED. Now a memory hog and a fork bomb each stay inside their own attempt's limits, the
agent (this process) and another job carry on, and a start the host cannot make is re-queued. Real
processes, a root agent."""

import errno
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpunodes.agent import runner as runner_module
from gpunodes.agent.containment import AGENT_OOM_SCORE_ADJ, LimitPolicy, pids_of_uid
from gpunodes.agent.fence import Watchdog
from tests.security.agent_helpers import alive, as_root, job_python, make_runner, uid_pool, wait_until

pytestmark = as_root
MiB = 2**20

HOG = f"""
for i in $(seq 26); do
  {job_python()} -c 'import time; b = b"x" * (95 << 20); time.sleep(8)' &
done
wait
echo hog-survived
"""
# Forks children that wait, as many as it is asked to or the kernel lets it (a bounded bomb: on a host
# without limits it must not take the machine down).
BOMB = """
import os, sys, time
n = 0
for _ in range(int(sys.argv[1])):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        n += 1
    except OSError as e:
        print("fork failed:", e.strerror)
        break
print("forked", n, flush=True)
time.sleep(60)
"""
# Another team's job: alive through the other's trouble, then ends well.
STEADY = "for i in $(seq 40); do echo tick $i; sleep 0.1; done; echo steady-done"


@pytest.fixture
def limited(root_dir, reports):
    runner = make_runner(
        root_dir, reports, uids=uid_pool(), limits=LimitPolicy(memory_max_bytes=300 * MiB, pids_max=64)
    )
    if not (runner.limit_tree or (runner.cgroups and runner.cgroups.controllers)):
        runner.shutdown(grace_s=0)
        pytest.skip("this host has no memory or pids cgroup controller the agent may use")
    yield runner
    runner.shutdown(grace_s=0)


def test_a_memory_hog_is_killed_inside_its_own_limit(limited, reports):
    limited.start(attempt_id=2, number=1, job_id=8, command=[STEADY], use_shell=True)
    limited.start(attempt_id=1, number=1, job_id=7, command=[HOG], use_shell=True)
    hog_uid = limited._procs[1].user.uid
    end = wait_until(lambda: reports.finished(1), timeout=60, runner=limited, what="the hog's end")
    assert end["how"] == "exited" and end["exit_code"] != 0, (end, reports.log_of(1))
    assert end["detail"].startswith("out of memory: the kernel killed its processes"), end
    assert "memory limit is 300 MiB" in end["detail"]
    assert "hog-survived" not in reports.log_of(1)
    assert not pids_of_uid(hog_uid)  # all of it, not only the processes the kernel picked
    steady = wait_until(lambda: reports.finished(2), timeout=60, runner=limited, what="the other job's end")
    assert steady["exit_code"] == 0 and "steady-done" in reports.log_of(2), reports.log_of(2)


def test_a_fork_bomb_stays_within_its_tasks_limit(limited, reports):
    limited.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", BOMB, "400"])
    bomb_uid = limited._procs[1].user.uid
    wait_until(lambda: "forked" in reports.log_of(1), timeout=60, runner=limited, what="the bomb's loop")
    assert len(pids_of_uid(bomb_uid)) <= 64
    # Another team's attempt starts and runs, and the agent still forks.
    assert limited.start(attempt_id=2, number=1, job_id=8, command=["echo other-ran"], use_shell=True) == (
        "started"
    )
    end = wait_until(lambda: reports.finished(2), runner=limited, what="the other job's end")
    assert end["exit_code"] == 0 and "other-ran" in reports.log_of(2)
    assert subprocess.run(["true"]).returncode == 0
    limited.stop(attempt_id=1, number=1, grace_s=0)
    wait_until(lambda: reports.finished(1), runner=limited, what="the bomb's end")
    assert not pids_of_uid(bomb_uid)


def test_a_start_the_host_cannot_make_is_re_queued_not_failed(limited, reports, monkeypatch):
    def no_more_processes(*args, **kw):
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(runner_module.subprocess, "Popen", no_more_processes)
    assert limited.start(attempt_id=1, number=1, job_id=7, command=["true"]) == "refused"
    end = reports.finished(1)
    # "unknown" with a refusal: the control side re-queues it (jobs/tasks.py: NODE_LOST).
    assert end["how"] == "unknown" and end["detail"].startswith("refused: could not start 'true'"), end
    assert "Resource temporarily unavailable" in end["detail"]


def test_jobs_are_the_oom_killers_first_choice(limited, reports):
    limited.start(attempt_id=1, number=1, job_id=7, command=["cat /proc/self/oom_score_adj"], use_shell=True)
    wait_until(lambda: reports.finished(1), runner=limited)
    assert reports.log_of(1).split() == ["1000"]


def may_lower_oom_score() -> bool:
    """Lowering oom_score_adj takes CAP_SYS_RESOURCE, which a container's root may lack."""
    caps = next(
        line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff")
    )
    return bool(int(caps.split()[1], 16) & (1 << 24))


@pytest.mark.skipif(not may_lower_oom_score(), reason="this host's root may not lower oom_score_adj")
def test_the_agent_and_its_fence_watchdog_are_nearly_its_last(root_dir):
    watchdog = Watchdog(state_path=root_dir / "state" / "running.json")
    try:
        score = Path(f"/proc/{watchdog.proc.pid}/oom_score_adj")
        wait_until(lambda: score.read_text().strip() == str(AGENT_OOM_SCORE_ADJ), what="its oom_score_adj")
    finally:
        watchdog.close()
    # The agent sets its own at start-up (Agent.run), with the same call.
    code = (
        "from gpunodes.agent.containment import protect_from_oom as p; p(); "
        "print(open('/proc/self/oom_score_adj').read())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(AGENT_OOM_SCORE_ADJ)


def test_the_limits_are_on_the_attempts_cgroups(root_dir, reports):
    policy = LimitPolicy(host_memory=64 * 2**30, memory_reserve_bytes=4 * 2**30, pids_max=500)
    runner = make_runner(root_dir, reports, uids=uid_pool(), limits=policy)
    runner.gpu_indexes = {0, 1, 2, 3}
    try:
        runner.start(attempt_id=1, number=1, job_id=7, command=["sleep 30"], use_shell=True, gpus=[0, 1])
        proc = runner._procs[1]
        values = {}
        for path in [proc.cgroup.path] + list(proc.limits.paths if proc.limits else ()):
            for name in ("memory.max", "memory.limit_in_bytes", "pids.max", "cpu.weight", "cpu.shares"):
                if (path / name).exists():
                    values[name] = (path / name).read_text().strip()
        if not values:
            pytest.skip("this host has no cgroup controller the agent may use")
        memory = values.get("memory.max") or values.get("memory.limit_in_bytes")
        assert memory in (None, str(30 * 2**30))  # half of (64 - 4) GiB: two of four GPUs
        assert values.get("pids.max") in (None, "500")
        assert values.get("cpu.weight", "200") == "200" and values.get("cpu.shares", "2048") == "2048"
    finally:
        runner.shutdown(grace_s=0)


@pytest.mark.parametrize(
    "policy, gpus, host_gpus, memory, weight",
    [
        (LimitPolicy(host_memory=64 * 2**30), 1, 8, (64 - 4) * 2**30 // 8, 100),
        (LimitPolicy(host_memory=8 * 2**30), 0, None, 7 * 2**30, 100),  # reserve: at least 1 GiB
        (LimitPolicy(memory_max_bytes=MiB * 512, cpu_weight_per_gpu=50), 8, 8, MiB * 512, 400),
        (LimitPolicy(host_memory=2**30, memory_reserve_bytes=2**30 - 1), 1, 1, 256 * MiB, 100),  # a floor
    ],
)
def test_an_attempt_gets_its_share_of_the_host(policy, gpus, host_gpus, memory, weight):
    limits = policy.for_attempt(gpus, host_gpus)
    assert (limits.memory_bytes, limits.cpu_weight, limits.pids) == (memory, weight, 4096)


def test_without_cgroups_a_uid_holds_at_most_its_tasks_limit(root_dir, reports):
    runner = make_runner(
        root_dir, reports, uids=uid_pool(), cgroups=None, limit_tree=None, limits=LimitPolicy(pids_max=20)
    )
    try:
        runner.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", BOMB, "100"])
        uid = runner._procs[1].user.uid
        wait_until(lambda: "forked" in reports.log_of(1), timeout=60, runner=runner, what="the loop")
        assert len(pids_of_uid(uid)) <= 20
        leader = runner._procs[1].popen.pid
    finally:
        runner.shutdown(grace_s=0)
    end = time.monotonic() + 10
    while time.monotonic() < end and (alive(leader) or pids_of_uid(uid)):
        time.sleep(0.05)
    assert not pids_of_uid(uid)


def test_on_cgroup_v2_the_limits_are_on_the_attempts_own_cgroup(tmp_path):
    """cgroup v2 is where production hosts delegate controllers; this host may have none of them, so the
    files are a directory of plain files here (what the kernel enforces is its own business)."""
    from gpunodes.agent.containment import CgroupTree, Limits, delegate_controllers

    own, base = tmp_path / "agent.service", tmp_path / "agent.service" / "gpuquota-n1-1"
    base.mkdir(parents=True)
    (own / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.subtree_control").write_text("memory\n")
    controllers = delegate_controllers(own, base)
    assert controllers == {"memory", "pids", "cpu"}
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +pids"  # what was missing, turned on
    assert (base / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    cgroup = CgroupTree(base, controllers).attempt("attempt-1-1", Limits(512 * MiB, 100, 300))
    written = {
        f: (cgroup.path / f).read_text() for f in ("memory.max", "memory.oom.group", "pids.max", "cpu.weight")
    }
    assert written == {
        "memory.max": str(512 * MiB),
        "memory.oom.group": "1",
        "pids.max": "100",
        "cpu.weight": "300",
    }
    (cgroup.path / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 3\noom_group_kill 1\n")
    assert cgroup.oom_kills() == 3
