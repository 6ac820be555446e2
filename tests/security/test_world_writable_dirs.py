"""What one job can do to a host's uids (issue 41, item 4). Before: /run/lock was shared and never cleaned,
so files a job left there kept its uid busy for ever; with the range used up every start on the host was
refused and counted toward holding the job (then HELD); 200,000 entries there blinded the leftover scan
of /tmp, /var/tmp and /dev/shm. Now every world-writable directory of the host is the attempt's own (an
empty one mounted over it) or cleaned at its end, each directory is scanned on its own budget, and no
free uid is the host's shortage: the start is refused with no strike, and said. Real processes, a root
agent."""

import os
import secrets
import stat
from pathlib import Path

import pytest

from gpunodes.agent import identity
from gpunodes.agent.identity import NoFreeUid, UidPool, owners_in, world_writable_dirs
from tests.security.agent_helpers import as_root, job_python, make_runner, uid_pool, wait_until

pytestmark = as_root


@pytest.fixture
def names():
    """Names of this test's own in the host's shared directories, removed afterwards whatever happens."""
    token = secrets.token_hex(4)
    made = [Path(d, f"gpuquota-left-{token}") for d in ("/run/lock", "/tmp", "/dev/shm", "/var/tmp")]
    yield token, made
    for path in made:
        if path.is_dir() and not path.is_symlink():
            identity.remove_tree(path)
        else:
            path.unlink(missing_ok=True)


LEAVE = """
import os, sys
for d in ("/run/lock", "/tmp", "/dev/shm", "/var/tmp"):
    path = d + "/gpuquota-left-" + sys.argv[1]
    try:
        if d == "/tmp":
            os.mkdir(path); open(path + "/inside", "w").write("x")
        else:
            open(path, "w").write("x")
        print("wrote", path)
    except OSError as e:
        print("could not write", path, e)
"""


def test_run_lock_is_the_attempts_own(root_dir, reports, names):
    if not os.path.isdir("/run/lock"):
        pytest.skip("this host has no /run/lock")
    token, made = names
    runner = make_runner(root_dir, reports, uids=uid_pool())
    try:
        assert "/run/lock" in runner._shadowed
        runner.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", LEAVE, token])
        wait_until(lambda: reports.finished(1), runner=runner)
        out = reports.log_of(1)
        assert f"wrote /run/lock/gpuquota-left-{token}" in out, out
        assert not any(p.exists() for p in made), [p for p in made if p.exists()]
    finally:
        runner.shutdown(grace_s=0)


def test_without_private_namespaces_what_a_job_leaves_goes_at_its_end(root_dir, reports, names):
    """An agent whose host forbids mount namespaces (an unprivileged container): the attempt writes the
    host's shared directories themselves; at its end all of it is removed and its uid is free again."""
    token, made = names
    pool = uid_pool()
    runner = make_runner(root_dir, reports, uids=pool)
    runner.private_mounts = False  # as namespaces_fn does where unshare fails
    try:
        runner.start(attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", LEAVE, token])
        end = wait_until(lambda: reports.finished(1), runner=runner)
        assert end["exit_code"] == 0, reports.log_of(1)
        assert "wrote /tmp/" in reports.log_of(1)
        assert not any(p.exists() for p in made), [p for p in made if p.exists()]
        assert not pool._used  # its uid is free again
    finally:
        runner.shutdown(grace_s=0)


def test_a_directory_full_of_entries_does_not_blind_the_scan_of_another(tmp_path, monkeypatch):
    monkeypatch.setattr(identity, "SCAN_BUDGET", 500)
    quiet, full = tmp_path / "tmp", tmp_path / "lock"
    quiet.mkdir()
    full.mkdir()
    (quiet / "left").write_text("x")
    os.chown(quiet / "left", 3_999_999, 3_999_999)
    for n in range(2_000):
        (full / str(n)).touch()
    assert 3_999_999 in owners_in([quiet, full])
    assert 3_999_999 in owners_in([full, quiet])


def test_every_world_writable_directory_is_found_at_a_mount_point_too(tmp_path):
    (tmp_path / "a" / "scratch").mkdir(parents=True)
    (tmp_path / "a" / "scratch").chmod(0o1777)
    (tmp_path / "a" / "private").mkdir()
    deep = tmp_path / "x" / "y" / "z" / "w" / "v" / "mnt"
    deep.mkdir(parents=True)
    deep.chmod(0o777)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"36 25 0:32 / {deep} rw,relatime - tmpfs tmpfs rw\n")
    found = world_writable_dirs(str(tmp_path), max_depth=3, mountinfo=str(mountinfo))
    assert sorted(found) == sorted([str(tmp_path / "a" / "scratch"), str(deep)])
    assert stat.S_IMODE(os.stat(tmp_path / "a" / "scratch").st_mode) == 0o1777


def test_no_free_uid_is_the_hosts_shortage_refused_without_a_strike(root_dir, reports, tmp_path, caplog):
    first = uid_pool().first
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "left").write_text("x")
    os.chown(shared / "left", first, first)  # left by someone the agent cannot clean up after
    pool = UidPool(first, first, lock_dir=tmp_path / "locks", shared_dirs=[shared], find_shared=False)
    with pytest.raises(NoFreeUid):
        pool.acquire()
    runner = make_runner(root_dir, reports, uids=pool)
    try:
        with caplog.at_level("ERROR"):
            assert runner.start(attempt_id=1, number=1, job_id=7, command=["true"]) == "refused"
        end = reports.finished(1)
        assert end["how"] == "refused", end  # re-queued, not a step toward HELD
        assert "n1 has no free uid in --uid-range" in end["detail"]
        assert "HOST SHORTAGE on n1" in caplog.text
    finally:
        runner.shutdown(grace_s=0)
