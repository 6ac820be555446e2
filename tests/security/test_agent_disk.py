"""One job cannot take the disk from the agent or from another job (issue 30, finding 6): a job's
output, its host log file, filled the agent's state filesystem, `_save_state` raised `OSError(28)` in
`start()` and `poll()`, and another team's finished job stayed RUNNING with its end report lost; one
job's `dd` made another's checkpoint write fail; checkpoints were never removed. Real processes, and
small filesystems (tmpfs) made and removed by each test."""

import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from gpunodes.agent import identity
from gpunodes.agent.runner import STARTED
from tests.security.agent_helpers import as_root, make_runner, uid_pool, wait_until

pytestmark = as_root
MiB = 2**20


@contextlib.contextmanager
def small_fs(size: int):
    """A tmpfs of `size` bytes under /var/tmp, reachable by the jobs' uids (0711)."""
    path = Path(tempfile.mkdtemp(prefix="gpuquota-small-fs-", dir="/var/tmp"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0711", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def fill(path: Path) -> Path:
    """Take every free byte of a filesystem (as root: what a job's output did to the agent's)."""
    filler = path / "filler"
    with open(filler, "wb") as f:
        chunk = b"\0" * MiB
        with contextlib.suppress(OSError):
            while True:
                f.write(chunk)
                f.flush()
    return filler


def test_a_chatty_job_keeps_its_log_within_the_cap_on_disk(reports):
    with small_fs(12 * MiB) as fs:
        runner = make_runner(fs, reports, uids=uid_pool(), log_cap_bytes=1 * MiB)
        try:
            chatty = "yes 0123456789abcdef | head -c 67108864; echo; echo end-of-output"
            runner.start(attempt_id=1, number=1, job_id=7, command=[chatty], use_shell=True)
            peak = 0
            end = time.monotonic() + 90
            while not reports.finished(1) and time.monotonic() < end:
                runner.poll()
                peak = max(peak, used(fs))
                time.sleep(0.02)
            assert reports.finished(1), f"no end after 90 s; the disk peaked at {peak} bytes"
        finally:
            runner.shutdown(grace_s=0)
        assert reports.finished(1)["exit_code"] == 0, reports.log_of(1)[-300:]
        assert peak <= 6 * MiB, peak  # the cap, a read and a punch step: not 64 MiB, not the whole disk
        log = fs / "logs" / "job-7" / "attempt-1.n1.log"
        assert log.stat().st_size == 64 * MiB + len("\nend-of-output\n")  # offsets kept: holes
        assert log.stat().st_blocks * 512 <= 3 * MiB
        shipped = reports.log_of(1)
        assert shipped.startswith("0123456789abcdef\n") and shipped.endswith("end-of-output\n")
        assert "bytes of output dropped here" in shipped


def test_a_full_state_disk_leaves_no_job_unreported(reports):
    with small_fs(4 * MiB) as fs:
        runner = make_runner(fs, reports, uids=uid_pool())
        try:
            runner.start(
                attempt_id=1, number=1, job_id=7, command=["sleep 1; echo first-done"], use_shell=True
            )
            filler = fill(fs)
            # A start and a reap on a full disk: neither raises, both are reported (the quick path).
            assert runner.start(attempt_id=2, number=1, job_id=8, command=["sleep 30"], use_shell=True) == (
                "started"
            )
            assert [k["attempt_id"] for k in reports.of(STARTED)] == [1, 2]
            end = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the first end")
            assert end["how"] == "exited" and end["exit_code"] == 0
            assert runner.running() == [(2, 1)]
            # Room again: the next poll writes the state file, which lists the running attempt.
            filler.unlink()
            runner.poll()
            assert '"attempt_id": 2' in (fs / "state" / "running.json").read_text()
        finally:
            runner.shutdown(grace_s=0)
        assert reports.finished(2)["how"] == "shutdown"  # an orderly stop (issue 42 item 2)


def test_one_jobs_dd_does_not_fail_anothers_checkpoint_write(reports):
    with small_fs(64 * MiB) as fs:  # JOB_ROOT, checkpoints included
        fs.chmod(0o711)
        runner = make_runner(fs, reports, uids=uid_pool(), workdir_bytes=16 * MiB)
        try:
            dd = 'dd if=/dev/zero of="$HOME/fill" bs=1M count=100 2>/dev/null; echo dd=$?; sleep 30'
            runner.start(attempt_id=1, number=1, job_id=7, command=[dd], use_shell=True)
            wait_until(lambda: "dd=" in reports.log_of(1), timeout=30, runner=runner, what="the dd")
            assert "dd=0" not in reports.log_of(1)  # its own working directory is full, not JOB_ROOT's disk
            save = 'dd if=/dev/zero of="$GPUQUOTA_CHECKPOINT_DIR/model.pt" bs=1M count=24 2>&1 && echo saved'
            runner.start(attempt_id=2, number=1, job_id=8, command=[save], use_shell=True)
            wait_until(lambda: reports.finished(2), timeout=30, runner=runner, what="the checkpoint write")
            assert "saved" in reports.log_of(2), reports.log_of(2)
        finally:
            runner.shutdown(grace_s=0)
        assert (fs / "ckpt" / "job-8" / "model.pt").stat().st_size == 24 * MiB


def test_checkpoints_of_jobs_that_no_longer_run_here_are_removed(root_dir, reports):
    runner = make_runner(root_dir, reports, uids=uid_pool())
    try:
        runner.start(attempt_id=1, number=1, job_id=7, command=["sleep 30"], use_shell=True)
        old, recent = (identity.checkpoint_dir(runner.checkpoint_root, j, None) for j in (8, 9))
        (old / "model.pt").write_text("w")
        week_ago = time.time() - 7 * 86400
        for path in (old, runner.checkpoint_root / "job-7"):
            os.utime(path, (week_ago, week_ago))
        assert runner.prune_checkpoints(3 * 86400) == 1
        assert not old.exists() and recent.exists()
        assert (runner.checkpoint_root / "job-7").exists()  # its attempt runs: the job's uid holds it
    finally:
        runner.shutdown(grace_s=0)
    ckpt = runner.checkpoint_root / "job-7"
    owner = identity.checkpoint_owner(7)
    assert ckpt.stat().st_uid == owner and ckpt.stat().st_mtime > time.time() - 60  # set back: "ran now"
