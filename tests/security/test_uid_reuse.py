"""A uid never carries one team's leftovers to another (issue 30, finding 3): after an agent restart
another team's attempt, which used to get the same first uid again, read and overwrote a checkpoint,
read SysV shared memory and files in /var/tmp that an ended job left. Real processes, a root agent."""

import os
import secrets
import stat
import subprocess
from pathlib import Path

import pytest

from gpunodes.agent.identity import UidPool, checkpoint_owner
from tests.security.agent_helpers import as_root, job_python, make_runner, remove_shm_of, uid_pool, wait_until

pytestmark = as_root

# Team A's job: a checkpoint, a SysV shared memory segment it does not remove, a file in /var/tmp.
LEAVE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
ctypes.memmove(libc.shmat(shmid, None, 0), b"team-a-shm-secret", 17)
with open(os.environ["GPUQUOTA_CHECKPOINT_DIR"] + "/weights", "w") as f:
    f.write("team-a-weights")
fd = os.open("/var/tmp/" + sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
os.write(fd, b"team-a-vartmp-secret")
print("uid", os.getuid(), "shm", shmid)
"""

# Team B's job: everything of A's it tries; each success prints a LEAK line.
TAKE = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
for line in open("/proc/sysvipc/shm").read().splitlines()[1:]:
    addr = libc.shmat(int(line.split()[1]), None, 0)
    if addr not in (None, ctypes.c_void_p(-1).value) and ctypes.string_at(addr, 17) == b"team-a-shm-secret":
        print("LEAK:shm")
for path, what in ((sys.argv[1] + "/weights", "checkpoint"), ("/var/tmp/" + sys.argv[2], "var-tmp")):
    try:
        print("LEAK:" + what, open(path).read())
    except OSError:
        pass
    try:
        open(path, "r+").write("poisoned")  # A's file, not a new one of B's own
        print("LEAK:" + what + "-write")
    except OSError:
        pass
print("uid", os.getuid(), "done")
"""


@pytest.fixture
def pool_range():
    """A range of uids of this test's own; what the old code leaves of them is removed afterwards."""
    pool = uid_pool()
    uids = range(pool.first, pool.last + 1)
    name = f"gpuquota-left-{secrets.token_hex(4)}"
    yield pool, name
    remove_shm_of(uids)
    Path("/var/tmp", name).unlink(missing_ok=True)


def test_after_an_agent_restart_another_team_gets_nothing_an_ended_job_left(root_dir, reports, pool_range):
    pool, name = pool_range
    first = make_runner(root_dir, reports, uids=pool)
    try:
        first.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", LEAVE, name])
        wait_until(lambda: reports.finished(1), runner=first, what="team A's job to end")
    finally:
        first.shutdown(grace_s=0)
    assert reports.finished(1)["exit_code"] == 0, reports.log_of(1)
    uid_a = int(reports.log_of(1).split()[1])
    ckpt = root_dir / "ckpt" / "job-7"
    between = [(p.stat().st_uid, stat.S_IMODE(p.stat().st_mode)) for p in (ckpt, ckpt / "weights")]

    # The agent restarts: a new pool on the same range, as a new agent process builds it.
    second = make_runner(root_dir, reports, uids=UidPool(pool.first, pool.last))
    try:
        second.kill_orphans()
        second.start(attempt_id=2, number=1, job_id=8, command=[job_python(), "-c", TAKE, str(ckpt), name])
        wait_until(lambda: reports.finished(2), runner=second, what="team B's job to end")
    finally:
        second.shutdown(grace_s=0)
    out = reports.log_of(2)
    assert "done" in out and "LEAK" not in out, out
    assert (ckpt / "weights").read_text() == "team-a-weights"
    assert int(out.split()[-2]) != uid_a  # the cursor survived the restart
    # Its job's owner's, which no attempt runs as (issue 42): never left with the attempt's uid.
    owner = checkpoint_owner(7)
    weights = (owner, 0o600) if first.checkpoint_idmap else (uid_a, 0o660)
    assert between == [(owner, 0o2770), weights]


def test_a_uid_is_not_handed_out_while_files_ipc_objects_or_a_checkpoint_of_it_are_left(tmp_path):
    first = uid_pool().first
    pool = UidPool(first, first, lock_dir=tmp_path / "locks")  # a range of one uid
    left = Path("/var/tmp", f"gpuquota-left-{secrets.token_hex(4)}")
    ckpt_root = tmp_path / "ckpt"
    ckpt_root.mkdir()
    try:
        left.write_text("x")
        os.chown(left, first, first)
        with pytest.raises(RuntimeError, match="no free uid"):
            pool.acquire()
        left.unlink()

        # A SysV segment its uid made in the host's IPC namespace (an attempt without one of its own).
        make = "import ctypes; print(ctypes.CDLL(None).shmget(0, 4096, 0o1000 | 0o600))"
        subprocess.run([job_python(), "-c", make], user=first, group=first, check=True, capture_output=True)
        with pytest.raises(RuntimeError, match="no free uid"):
            pool.acquire()
        remove_shm_of(range(first, first + 1))

        # A checkpoint still its own (taking it back failed).
        (ckpt_root / "job-7").mkdir()
        os.chown(ckpt_root / "job-7", first, first)
        with pytest.raises(RuntimeError, match="no free uid"):
            pool.acquire(roots=(ckpt_root,))
        os.chown(ckpt_root / "job-7", 0, 0)

        user = pool.acquire(roots=(ckpt_root,))
        assert user.uid == first
        pool.release(user.uid)
    finally:
        left.unlink(missing_ok=True)
        remove_shm_of(range(first, first + 1))


def test_the_next_uid_is_kept_across_restarts(tmp_path):
    first = uid_pool().first
    one = UidPool(first, first + 9, lock_dir=tmp_path)
    taken = one.acquire()
    one.release(taken.uid)
    restarted = UidPool(first, first + 9, lock_dir=tmp_path)
    after = restarted.acquire()
    restarted.release(after.uid)
    assert after.uid == first + (taken.uid + 1 - first) % 10


# An agent that runs one attempt of job 7 (it writes its checkpoint, then waits) with its fence watchdog,
# as Agent.run does, and is then killed with -9 by the test. argv: root dir, first uid of its range.
DYING_AGENT = """
import sys, time
from pathlib import Path
from gpunodes.agent.fence import Watchdog
from gpunodes.agent.identity import UidPool
from gpunodes.agent.runner import Runner
root, first = Path(sys.argv[1]), int(sys.argv[2])
runner = Runner(node="n1", log_dir=root / "logs", checkpoint_root=root / "ckpt", work_root=root / "work",
                report=lambda name, kwargs: None, state_path=root / "state" / "running.json",
                uids=UidPool(first, first + 99))
dog = Watchdog(state_path=runner.state_path, tree=runner.cgroups.base if runner.cgroups else None,
               uids=(first, first + 99))
job = 'echo w > "$GPUQUOTA_CHECKPOINT_DIR/weights"; sleep 300'
runner.start(attempt_id=1, number=1, job_id=7, command=[job], use_shell=True)
while not (root / "ckpt" / "job-7" / "weights").exists():
    runner.poll(); time.sleep(0.05)
print(runner._procs[1].user.uid, flush=True)
time.sleep(300)
"""


def test_the_successor_of_a_killed_agent_lets_the_next_attempt_have_its_checkpoint(root_dir, reports):
    import signal
    import sys

    first = uid_pool().first
    dying = subprocess.Popen(
        [sys.executable, "-c", DYING_AGENT, str(root_dir), str(first)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        uid = int(dying.stdout.readline())
        ckpt = root_dir / "ckpt" / "job-7"
        assert ckpt.stat().st_uid == checkpoint_owner(7) != uid
        dying.send_signal(signal.SIGKILL)
        dying.wait()
        ended = root_dir / "state" / "running.json.ended"
        wait_until(lambda: ended.exists(), what="the watchdog's list of the attempts it killed")
    finally:
        if dying.poll() is None:
            dying.kill()
    successor = make_runner(root_dir, reports, uids=UidPool(first, first + 99))
    try:
        successor.kill_orphans()
        assert not ended.exists() and not list((root_dir / "work").iterdir())
        # The orphans held the directory (their inherited hold); gone, the job's next attempt has it.
        assert successor.checkpoint_holds.held(7) == []
        assert ckpt.stat().st_uid == checkpoint_owner(7)
        command = ['cat "$GPUQUOTA_CHECKPOINT_DIR/weights"']
        successor.start(attempt_id=1, number=2, job_id=7, command=command, use_shell=True)
        wait_until(lambda: reports.finished(1), runner=successor, what="the next attempt to end")
        assert reports.finished(1)["exit_code"] == 0 and reports.log_of(1) == "w\n", reports.log_of(1)
    finally:
        successor.shutdown(grace_s=0)
