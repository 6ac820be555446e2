"""Each attempt has /tmp, /var/tmp, /dev/shm and SysV IPC of its own, whatever its command names
(issue 30: a job whose argv ended in a `/tmp/...` path kept the host's /tmp; attempts shared /var/tmp
and SysV IPC). What it names under /tmp still reaches it (a checkout there): that entry alone. Real
processes, a root agent."""

import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.security.agent_helpers import as_root, job_python, remove_shm_of, wait_until

pytestmark = as_root


@pytest.fixture
def host_tmp():
    """A file of the host's /tmp anyone may read, and a checkout under /tmp with a program in it."""
    secret = Path("/tmp", f"gpuquota-host-secret-{secrets.token_hex(4)}")
    secret.write_text("host-tmp-secret")
    secret.chmod(0o644)
    checkout = Path(tempfile.mkdtemp(prefix="gpuquota-checkout-", dir="/tmp"))
    checkout.chmod(0o755)
    (checkout / "train.sh").write_text("#!/bin/sh\necho trained; ls /tmp\n")
    (checkout / "train.sh").chmod(0o755)
    yield secret, checkout
    secret.unlink(missing_ok=True)
    shutil.rmtree(checkout, ignore_errors=True)


def test_naming_a_tmp_path_does_not_bring_the_hosts_tmp(root_runner, reports, host_tmp):
    secret, _ = host_tmp
    look = "cat /tmp/gpuquota-host-secret-* && echo LEAK; ls /tmp; echo looked"
    root_runner.start(attempt_id=1, number=1, job_id=7, command=["/bin/sh", "-c", look, "/tmp/x"])
    wait_until(lambda: reports.finished(1), runner=root_runner)
    out = reports.log_of(1)
    assert "looked" in out and "LEAK" not in out and secret.name not in out, out


def test_a_program_under_tmp_runs_and_brings_only_its_own_entry(root_runner, reports, host_tmp):
    secret, checkout = host_tmp
    root_runner.start(attempt_id=1, number=1, job_id=7, command=[str(checkout / "train.sh")])
    wait_until(lambda: reports.finished(1), runner=root_runner)
    out = reports.log_of(1)
    assert reports.finished(1)["exit_code"] == 0 and "trained" in out, out
    assert checkout.name in out.split() and secret.name not in out


def test_two_attempts_share_no_var_tmp_and_no_sysv_ipc(root_runner, reports):
    name = f"left-{secrets.token_hex(4)}"
    leave = (
        f"import ctypes, time; open('/var/tmp/{name}', 'w').write('a');"
        "print('shm', ctypes.CDLL(None).shmget(0, 4096, 0o1000 | 0o644), flush=True); time.sleep(30)"
    )
    root_runner.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", leave])
    wait_until(lambda: "shm" in reports.log_of(1), runner=root_runner, what="a's segment")
    look = f"ls /var/tmp; cat /var/tmp/{name} 2>/dev/null && echo LEAK; tail -n +2 /proc/sysvipc/shm | wc -l"
    try:
        root_runner.start(attempt_id=2, number=1, job_id=8, command=[look], use_shell=True)
        wait_until(lambda: reports.finished(2), runner=root_runner)
        out = reports.log_of(2)
        assert "LEAK" not in out and name not in out and out.split()[-1] == "0", out
        assert not Path("/var/tmp", name).exists()  # not the host's either
    finally:
        Path("/var/tmp", name).unlink(missing_ok=True)
        remove_shm_of(range(root_runner.uids.first, root_runner.uids.last + 1))


def test_a_job_cannot_make_a_user_namespace_but_still_forks_threads_and_spawns(root_runner, reports):
    code = (
        "import os, subprocess, threading; t = threading.Thread(target=print, args=('thread',)); t.start(); "
        "t.join(); print(subprocess.run(['true']).returncode == 0 and 'spawned'); "
        "r = subprocess.run(['unshare', '-Ur', 'id', '-u'], capture_output=True, text=True); "
        "print('userns', r.returncode, r.stdout.strip() or r.stderr.strip())"
    )
    root_runner.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", code])
    wait_until(lambda: reports.finished(1), runner=root_runner)
    out = reports.log_of(1)
    assert reports.finished(1)["exit_code"] == 0 and "thread" in out and "spawned" in out, out
    status = out.split("userns ", 1)[1]
    assert not status.startswith("0 "), out  # `unshare -Ur id -u` printed 0 (root inside) before
    assert "Operation not permitted" in status, out
