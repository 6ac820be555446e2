"""Jobs do not outlive their attempt (issue 18): each attempt runs in a cgroup of its own, and every end
(a cancel, a pre-emption after its grace, success, an agent shutdown) kills the whole of it, so a child
that called `setsid` or double-forked away is gone too. Real processes, on a root agent."""

import os
import re
import time

import pytest

from gpunodes.agent.containment import AttemptCgroup, CgroupTree, cgroup2_mount, kill_uid
from tests.security.agent_helpers import alive, as_root, make_runner, uid_pool, wait_until

pytestmark = as_root

# A job that leaves a daemon behind: a child in a new session, away from the job's process group, that
# ignores SIGTERM; the job prints the child's pid and then waits (or exits at once, for a "success").
ESCAPE = "setsid sh -c 'trap \"\" TERM; exec sleep 300' & echo child=$!; {then}"


def child_pid(reports, attempt_id=1) -> int:
    match = re.search(r"child=(\d+)", reports.log_of(attempt_id))
    return int(match.group(1)) if match else 0


def no_cgroup_v2():
    tree = CgroupTree.create(f"probe-{os.getpid()}") if cgroup2_mount() else None
    if tree is not None:
        tree.remove()
    return tree is None


@pytest.fixture(params=["cgroup", "uid-only"])
def runner(request, root_dir, reports):
    if request.param == "cgroup" and no_cgroup_v2():
        pytest.skip("this host has no writable cgroup v2 hierarchy")
    cgroups = "auto" if request.param == "cgroup" else None
    r = make_runner(root_dir, reports, uids=uid_pool(), cgroups=cgroups)
    yield r
    r.shutdown(grace_s=1)


def start_escape(runner, reports, then="sleep 300", grace_s=0):
    runner.start(
        attempt_id=1, number=1, job_id=7, command=[ESCAPE.format(then=then)], use_shell=True, grace_s=grace_s
    )
    pid = wait_until(lambda: child_pid(reports), runner=runner, what="the escaped child")
    leader = runner._procs[1].popen.pid
    wait_until(lambda: os.getsid(pid) != os.getsid(leader), what="the child in a session of its own")
    return pid


def test_a_setsid_child_does_not_survive_a_cancel(runner, reports):
    pid = start_escape(runner, reports)
    runner.stop(attempt_id=1, number=1, grace_s=0)
    wait_until(lambda: reports.finished(1), runner=runner)
    wait_until(lambda: not alive(pid), timeout=5, what="the setsid child to die")


def test_a_setsid_child_does_not_survive_a_preemption_after_its_grace(runner, reports):
    pid = start_escape(runner, reports, then="trap '' TERM; sleep 300")
    t0 = time.monotonic()
    runner.stop(attempt_id=1, number=1, grace_s=1)
    wait_until(lambda: reports.finished(1), runner=runner)
    assert time.monotonic() - t0 >= 0.9
    wait_until(lambda: not alive(pid), timeout=5, what="the setsid child to die")


def test_a_daemon_left_by_a_successful_job_is_killed(runner, reports):
    pid = start_escape(runner, reports, then="sleep 0.5; exit 0")
    wait_until(lambda: reports.finished(1), runner=runner)
    assert reports.finished(1)["exit_code"] == 0
    wait_until(lambda: not alive(pid), timeout=5, what="the daemon to die")


def test_an_agent_shutdown_leaves_nothing_behind(runner, reports):
    pid = start_escape(runner, reports)
    runner.shutdown(grace_s=0.5)
    wait_until(lambda: not alive(pid), timeout=5, what="the setsid child to die")


def test_the_attempts_cgroup_is_removed_at_its_end(root_dir, reports):
    if no_cgroup_v2():
        pytest.skip("this host has no writable cgroup v2 hierarchy")
    runner = make_runner(root_dir, reports, uids=uid_pool())
    try:
        runner.start(attempt_id=1, number=1, job_id=7, command=["sleep 0.2"], use_shell=True)
        cgroup = runner._procs[1].cgroup
        assert cgroup.path.is_dir() and runner._procs[1].popen.pid in cgroup.pids()
        wait_until(lambda: reports.finished(1), runner=runner)
        assert not cgroup.path.exists()
    finally:
        runner.shutdown(grace_s=1)
    assert not runner.cgroups.base.exists()


def test_without_cgroup_kill_the_fallback_freezes_and_kills_each_pid(root_dir, monkeypatch):
    """Kernels before 5.14 have no cgroup.kill: freeze, SIGKILL every pid of cgroup.procs, thaw."""
    if no_cgroup_v2():
        pytest.skip("this host has no writable cgroup v2 hierarchy")
    import subprocess

    monkeypatch.setattr(AttemptCgroup, "KILL_FILE", "no-cgroup.kill-here")
    tree = CgroupTree.create(f"fallback-{os.getpid()}")
    cgroup = tree.attempt("attempt-1-1")
    procs = [
        subprocess.Popen(["sh", "-c", "setsid sleep 300 & sleep 300"], preexec_fn=cgroup.enter_fn())  # noqa: PLW1509
        for _ in range(2)
    ]
    try:
        # Each sh leaves a setsid child and a sleep (dash execs its last command): four, once started.
        wait_until(lambda: len(cgroup.pids()) >= 4, timeout=30, what="four processes in the cgroup")
        pids = cgroup.pids()
        cgroup.kill()
        assert cgroup.wait_empty(5)
        for p in procs:
            p.wait(timeout=5)
        assert not [pid for pid in pids if alive(pid)]
    finally:
        tree.remove()
    assert not tree.base.exists()


def test_kill_uid_refuses_root_and_the_agents_own_uid():
    with pytest.raises(ValueError):
        kill_uid(0)
    with pytest.raises(ValueError):
        kill_uid(os.getuid())


def test_a_restarted_agent_kills_what_the_previous_one_left_in_its_cgroups(root_dir, reports):
    if no_cgroup_v2():
        pytest.skip("this host has no writable cgroup v2 hierarchy")
    uids = uid_pool()
    first = make_runner(root_dir, reports, uids=uids)
    pid = start_escape(first, reports)
    leader = first._procs[1].popen
    # The first agent dies without cleaning up (kill -9): a second one on the same state file.
    second = make_runner(root_dir, reports, uids=uids)
    try:
        second.kill_orphans()
        leader.wait(timeout=5)
        wait_until(lambda: not alive(pid), timeout=5, what="the orphan's setsid child to die")
    finally:
        second.shutdown(grace_s=0)
        first._procs.clear()
        first.cgroups.remove()


def no_device_cgroups():
    from gpunodes.agent.containment import DeviceTree

    tree = DeviceTree.create(f"probe-{os.getpid()}")
    if tree is not None:
        tree.remove()
    return tree is None


def test_an_attempt_is_denied_the_devices_of_gpus_it_was_not_given(root_dir, reports):
    """Two character devices stand in for /dev/nvidia0 and /dev/nvidia1 (this host need not have GPUs):
    given GPU 0 only, the job opens GPU 0's device and is refused GPU 1's."""
    if no_device_cgroups():
        pytest.skip(
            "this host has no cgroup v1 devices controller (pure cgroup v2: containers are the route)"
        )
    runner = make_runner(root_dir, reports, uids=uid_pool(), gpu_devices={0: "/dev/zero", 1: "/dev/full"})
    try:
        probe = "head -c1 /dev/zero >/dev/null && echo gpu0-ok; head -c1 /dev/full >/dev/null 2>&1 && echo gpu1-LEAK"
        runner.start(attempt_id=1, number=1, job_id=7, command=[probe], use_shell=True, gpus=[0])
        devices = runner._procs[1].devices
        wait_until(lambda: reports.finished(1), runner=runner)
        out = reports.log_of(1)
        assert "gpu0-ok" in out and "LEAK" not in out, out
        assert not devices.path.exists()  # removed with the attempt
    finally:
        runner.shutdown(grace_s=0)
    assert not runner.device_cgroups.base.exists()


def test_a_gpu_that_a_process_still_uses_is_not_handed_out(root_dir, reports, caplog):
    """NVML (here a stand-in) says GPU 1 is used by pid 4242: a start on it is refused and logged, and
    the control side hears at once (it re-queues the attempt); a start on GPU 0 goes ahead."""
    import logging

    runner = make_runner(
        root_dir, reports, uids=uid_pool(), gpu_holders=lambda gpus: {1: [4242]} if 1 in gpus else {}
    )
    try:
        with caplog.at_level(logging.ERROR):
            assert runner.start(attempt_id=1, number=1, job_id=7, command=["true"], gpus=[0, 1]) == "refused"
        assert "GPU 1 is still used by pid 4242" in caplog.text
        assert reports.finished(1)["how"] == "refused"  # re-queued without a strike (issue 41)
        assert runner.start(attempt_id=2, number=1, job_id=7, command=["true"], gpus=[0]) == "started"
    finally:
        runner.shutdown(grace_s=0)


def test_fencing_kills_every_attempt_of_the_host_at_once(runner, reports):
    """What the fencing issue builds on: Runner.fence() ends every attempt, escaped children included,
    without a grace; the next poll reports them."""
    children = []
    for attempt_id in (1, 2):
        runner.start(
            attempt_id=attempt_id,
            number=1,
            job_id=attempt_id,  # two jobs: two attempts of one job never run on a host at once
            command=[ESCAPE.format(then="sleep 300")],
            use_shell=True,
            grace_s=30,
        )
        children.append(wait_until(lambda a=attempt_id: child_pid(reports, a), runner=runner))
    assert sorted(runner.fence()) == [(1, 1), (2, 1)]
    wait_until(lambda: reports.finished(1) and reports.finished(2), runner=runner, timeout=5)
    wait_until(lambda: not any(alive(pid) for pid in children), timeout=5, what="every child to die")
