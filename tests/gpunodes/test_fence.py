"""The fence watchdog (gpunodes/agent/fence.py), with real processes: a job's processes never outlive
their agent (kill -9), and an agent that cannot renew its lease (frozen) has its jobs stopped with
SIGTERM, grace, SIGKILL, then is watched again once it renews."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpunodes.agent.containment import CgroupTree
from gpunodes.agent.fence import fenced_keys, group_running
from tests.live.conftest import wait_for

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for the agent: starts the watchdog and one "attempt" (a process group of its own, with a
# child, that writes "term" when it gets SIGTERM), records it in its state file as the runner does, then
# renews the lease every 0.2 s for ever. argv: state file, marker file, fence-after, grace, tree or "".
FAKE_AGENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from pathlib import Path
    from gpunodes.agent.fence import Watchdog
    from gpunodes.agent.containment import AttemptCgroup
    state, marker, fence_after, grace, tree = sys.argv[1:6]
    tree = Path(tree) if tree else None
    dog = Watchdog(state_path=Path(state), tree=tree, fence_after_s=float(fence_after), grace_s=float(grace))
    enter = None
    if tree is not None:
        cg = AttemptCgroup(tree / "attempt-1-1")
        cg.path.mkdir()
        enter = cg.enter_fn()
    script = "trap 'echo term >> %s; exit 143' TERM; (setsid sleep 300 &); sleep 300 & wait" % marker
    def pre():
        if enter:
            enter()
    job = subprocess.Popen(["/bin/sh", "-c", script], start_new_session=True, preexec_fn=pre)
    with open(f"/proc/{job.pid}/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19])
    Path(state).write_text(json.dumps([{"attempt_id": 1, "number": 1, "pgid": job.pid, "started": started,
                                        "cgroup": str(cg.path) if tree else None, "uid": None}]))
    print(job.pid, flush=True)
    while True:
        dog.renew()
        time.sleep(0.2)
    """
)


def sleeps_of(marker: Path) -> list[int]:
    """The `sleep 300` processes of this test's jobs (the setsid one escapes the process group)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == b"sleep\x00300\x00" and _env_has(d, marker):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def _env_has(proc: Path, marker: Path) -> bool:
    try:
        return str(marker.parent).encode() in (proc / "environ").read_bytes()
    except OSError:
        return False


@pytest.fixture
def agent(tmp_path):
    procs = []

    def start(*, fence_after: float = 0.0, grace: float = 0.0, tree: Path | None = None):
        marker = tmp_path / "term"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "FENCE_TEST_DIR": str(tmp_path)}
        proc = subprocess.Popen(
            [sys.executable, "-c", FAKE_AGENT, str(tmp_path / "running.json"), str(marker)]
            + [str(fence_after), str(grace), str(tree or "")],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        procs.append(proc)
        pgid = int(proc.stdout.readline())
        return proc, pgid, marker

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    for pid in sleeps_of(tmp_path / "term"):
        os.kill(pid, signal.SIGKILL)


def test_the_jobs_of_an_agent_killed_with_9_stop_within_a_second(agent, tmp_path):
    proc, pgid, marker = agent()
    wait_for(lambda: len(sleeps_of(marker)) == 2, 10, what="the job and its setsid child")
    assert group_running(pgid)
    proc.kill()  # kill -9: the watchdog reads EOF on its pipe
    t0 = time.monotonic()
    wait_for(lambda: not group_running(pgid), 5, every=0.02, what="the job's process group killed")
    took = time.monotonic() - t0
    assert took < 2, took
    assert fenced_keys(tmp_path / "running.json") == set()  # killed, not fenced: nobody reports it
    # Nothing left: a restarted agent must not take their uids (free again, maybe another attempt's by
    # then) for orphans of its own.
    wait_for(lambda: not (tmp_path / "running.json").exists(), 5, what="the state file cleared")
    print(f"\njobs of an agent killed with -9 stopped after {took * 1000:.0f} ms")


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root")
def test_a_setsid_child_of_a_job_dies_with_the_agent_through_the_attempt_cgroup(agent):
    tree = CgroupTree.create(f"fence-test-{os.getpid()}")
    if tree is None:
        pytest.skip("no cgroup v2 this process may write")
    try:
        proc, _pgid, marker = agent(tree=tree.base)
        wait_for(lambda: len(sleeps_of(marker)) == 2, 10, what="the job and its setsid child")
        proc.kill()
        wait_for(lambda: not sleeps_of(marker), 5, every=0.05, what="every process of the attempt killed")
    finally:
        tree.remove()


def test_a_frozen_agent_has_its_jobs_fenced_with_sigterm_then_is_watched_again(agent, tmp_path):
    proc, pgid, marker = agent(fence_after=1.5, grace=1.0)
    time.sleep(0.5)  # a few renewals
    proc.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    wait_for(lambda: not group_running(pgid), 10, every=0.05, what="the job fenced")
    took = time.monotonic() - t0
    assert 0.8 <= took < 6, took  # the lease from the last renewal (<= the freeze), then SIGTERM
    assert marker.read_text().strip() == "term"  # a chance to checkpoint
    assert fenced_keys(tmp_path / "running.json") == {"1/1"}  # the agent reports it stopped, not exited
    print(f"\nfrozen agent: its job stopped {took:.1f} s after the freeze (lease 1.5 s)")
    proc.send_signal(signal.SIGCONT)
    # Renewing again: the watchdog watches on, and fences nothing while the lease holds.
    state = json.loads((tmp_path / "running.json").read_text())
    assert state and proc.poll() is None
    time.sleep(2.5)
    assert proc.poll() is None


def test_a_uid_another_agent_holds_is_not_a_previous_agents_orphan(tmp_path):
    """The watchdog killed the orphans and freed their uids: a restarted agent reading an old state file
    must not kill the attempt another agent now runs as one of them (Runner.kill_orphans)."""
    from gpunodes.agent.identity import UidPool

    first = 2_000_000 + os.getpid() % 90_000
    other, restarted = (UidPool(first, first + 9, lock_dir=tmp_path) for _ in range(2))
    user = other.acquire()
    assert restarted.held_elsewhere(user.uid)
    other.release(user.uid)
    assert not restarted.held_elsewhere(user.uid)
