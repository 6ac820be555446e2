"""Helpers for the host-side security tests: a Runner as a root agent would build it (a uid per attempt,
a cgroup per attempt, job directories the jobs' uids can reach), and ways to wait on real processes."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from gpunodes.agent.identity import UidPool
from gpunodes.agent.runner import FINISHED, LOG, Runner

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a uid per attempt needs the agent to run as root")


class Reports(list):
    def __call__(self, name, kwargs):
        self.append((name, kwargs))

    def of(self, name):
        return [k for n, k in self if n == name]

    def log_of(self, attempt_id: int) -> str:
        return "".join(k["text"] for k in self.of(LOG) if k["attempt_id"] == attempt_id)

    def finished(self, attempt_id: int) -> dict | None:
        done = [k for k in self.of(FINISHED) if k["attempt_id"] == attempt_id]
        return done[-1] if done else None


def uid_pool() -> UidPool:
    """A range of its own (tests of several sessions may run on one host at once)."""
    first = 3_000_000 + random.randrange(10_000) * 100
    return UidPool(first, first + 99)


def job_root() -> Path:
    """Where the jobs' directories go: under /var/tmp (reachable), not pytest's 0700 tmp."""
    root = Path(tempfile.mkdtemp(prefix="gpuquota-test-", dir="/var/tmp"))
    root.chmod(0o711)
    return root


def make_runner(root: Path, reports: Reports, **kw) -> Runner:
    return Runner(
        node="n1",
        log_dir=root / "logs",
        checkpoint_root=root / "ckpt",
        work_root=root / "work",
        report=reports,
        state_path=root / "state" / "running.json",
        **kw,
    )


def wait_until(predicate, timeout: float = 15, runner: Runner | None = None, what: str = "condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if runner is not None:
            runner.poll()
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture
def root_dir():
    root = job_root()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def reports():
    return Reports()


@pytest.fixture
def root_runner(root_dir, reports):
    runner = make_runner(root_dir, reports, uids=uid_pool())
    yield runner
    runner.shutdown(grace_s=1)


def reachable_by_others(path: str) -> bool:
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in real.parents) and bool(os.stat(real).st_mode & 0o001)


def job_python() -> str:
    """A Python the jobs' uids can run: this one, by its real path (a venv's link may sit in a private
    checkout the jobs cannot enter), unless it lives somewhere private (pyenv in /root)."""
    import sys

    if os.geteuid() != 0:
        return sys.executable
    real = os.path.realpath(sys.executable)
    if reachable_by_others(real):
        return real
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def remove_shm_of(uids: range) -> None:
    """Remove the host's SysV shared memory segments that uids of a test's range own or made (an
    agent that gives attempts no IPC namespace of their own leaves them behind)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]:
        fields = line.split()  # key shmid perms size cpid lpid nattch uid gid cuid ...
        if int(fields[7]) in uids or int(fields[9]) in uids:
            libc.shmctl(int(fields[1]), 0, None)  # IPC_RMID
