"""A job reaches nothing but its own (issue 18): on a root agent each attempt runs as a uid of its own,
in a private working directory, with real processes. A job of team A cannot read team B's environment,
log or checkpoint, nor the state directory, the database or the broker, nor signal B's processes."""

import os
import stat
from pathlib import Path

from django.conf import settings

from gpunodes.agent.identity import checkpoint_owner
from tests.security.agent_helpers import as_root, job_python, wait_until

pytestmark = as_root

# Team B's job: a secret in its environment and its log, a checkpoint, then it keeps running.
VICTIM = 'echo "victim-log-secret"; echo weights > "$GPUQUOTA_CHECKPOINT_DIR/model.pt"; exec sleep 60'


def attack_script(pid: int, log: Path, ckpt: Path) -> str:
    """Everything team A's job tries; each success prints a LEAK line."""
    tries = [
        (f"tr '\\0' '\\n' < /proc/{pid}/environ | grep HF_TOKEN", "environ"),
        (f"cat {log}", "log"),
        (f"cat {ckpt}/model.pt", "checkpoint-read"),
        (f"echo attacker > {ckpt}/model.pt", "checkpoint-write"),
        (f"ls {settings.VAR_DIR}", "state-dir"),
        (f"cat {settings.VAR_DIR / 'secret_key'}", "secret-key"),
        (f"touch {settings.BROKER_DIR / 'queue' / 'forged.msg'}", "broker-write"),
        (f"kill -9 {pid}", "kill"),
    ]
    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        tries.append((f"cat {db['TEST']['NAME']} {db['NAME']}", "database"))
    return "; ".join(f"{cmd} >/dev/null 2>&1 && echo LEAK:{what}" for cmd, what in tries) + "; echo done"


def test_a_job_cannot_reach_another_teams_env_log_checkpoint_state_or_processes(root_runner, reports):
    root_runner.start(
        attempt_id=2, number=1, job_id=8, command=[VICTIM], use_shell=True, env={"HF_TOKEN": "hf-team-b"}
    )
    victim = root_runner._procs[2]
    ckpt = root_runner.checkpoint_root / "job-8"
    wait_until(lambda: (ckpt / "model.pt").exists(), runner=root_runner, what="the victim's checkpoint")
    root_runner.start(
        attempt_id=1,
        number=1,
        job_id=7,
        command=[attack_script(victim.popen.pid, victim.log_path, ckpt)],
        use_shell=True,
    )
    attacker = root_runner._procs[1]
    wait_until(lambda: reports.finished(1), runner=root_runner, what="the attacker to finish")
    out = reports.log_of(1)
    assert "done" in out and "LEAK" not in out, out
    assert {attacker.user.uid, victim.user.uid}.isdisjoint({0, os.getuid()})
    assert attacker.user.uid != victim.user.uid
    assert victim.popen.poll() is None  # not killed
    assert (ckpt / "model.pt").read_text() == "weights\n"
    assert "victim-log-secret" in reports.log_of(2)


def test_each_attempt_has_a_private_working_directory_outside_checkout_and_state(root_runner, reports):
    root_runner.start(
        attempt_id=1,
        number=1,
        job_id=7,
        command=['pwd; echo "$HOME $TMPDIR"; id -u; id -G; stat -c "%a %u" .'],
        use_shell=True,
    )
    proc = root_runner._procs[1]
    wait_until(lambda: reports.finished(1), runner=root_runner)
    cwd, dirs, uid, groups, mode_owner = reports.log_of(1).splitlines()
    assert dirs == f"{cwd} {cwd}" and Path(cwd) == proc.workdir
    assert int(uid) == proc.user.uid and groups.split() == [uid]  # no supplementary groups, no root's
    assert mode_owner == f"700 {uid}"
    assert not Path(cwd).is_relative_to(settings.BASE_DIR) and not Path(cwd).is_relative_to(settings.VAR_DIR)
    assert not Path(cwd).exists()  # removed with the attempt


def test_checkpoints_follow_the_job_across_attempts_each_with_its_own_uid(root_runner, reports):
    write = 'id -u > "$GPUQUOTA_CHECKPOINT_DIR/step"'
    root_runner.start(attempt_id=1, number=1, job_id=7, command=[write], use_shell=True)
    wait_until(lambda: reports.finished(1), runner=root_runner)
    first_uid = int((root_runner.checkpoint_root / "job-7" / "step").read_text())
    read = 'cat "$GPUQUOTA_CHECKPOINT_DIR/step" && id -u >> "$GPUQUOTA_CHECKPOINT_DIR/step"'
    read += ' && stat -c "owner=%u" "$GPUQUOTA_CHECKPOINT_DIR"'
    root_runner.start(attempt_id=1, number=2, job_id=7, command=[read], use_shell=True)
    second_uid = root_runner._procs[1].user.uid
    wait_until(lambda: reports.finished(1) and reports.finished(1)["number"] == 2, runner=root_runner)
    assert reports.finished(1)["exit_code"] == 0, reports.log_of(1)
    assert first_uid != second_uid
    # The job's owner's, always (issue 42), seen by each attempt as its own through an idmapped mount.
    owner = checkpoint_owner(7)
    assert f"owner={second_uid if root_runner.checkpoint_idmap else owner}" in reports.log_of(1)
    ckpt = root_runner.checkpoint_root / "job-7"
    st = ckpt.stat()
    assert stat.S_IMODE(st.st_mode) == 0o2770 and st.st_uid == owner
    assert (ckpt / "step").read_text().split() == [str(first_uid), str(second_uid)]


def test_logs_and_the_state_file_are_the_agents_alone(root_runner, reports):
    root_runner.start(attempt_id=1, number=1, job_id=7, command=["sleep 5"], use_shell=True)
    proc = root_runner._procs[1]
    assert stat.S_IMODE(proc.log_path.stat().st_mode) == 0o600 and proc.log_path.stat().st_uid == 0
    assert stat.S_IMODE(root_runner.log_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(root_runner.state_path.stat().st_mode) == 0o600


def test_the_state_directory_and_its_files_are_private():
    assert stat.S_IMODE(Path(settings.VAR_DIR).stat().st_mode) == 0o700
    assert stat.S_IMODE((Path(settings.VAR_DIR) / "secret_key").stat().st_mode) == 0o600
    assert os.umask(0o077) == 0o077  # set by the settings, before anything is written


def test_the_job_runs_with_no_new_privileges(root_runner, reports):
    root_runner.start(
        attempt_id=1, number=1, job_id=7, command=["grep NoNewPrivs /proc/self/status"], use_shell=True
    )
    wait_until(lambda: reports.finished(1), runner=root_runner)
    assert reports.log_of(1).split() == ["NoNewPrivs:", "1"]


def test_a_start_whose_paths_escape_their_root_is_refused(root_runner, reports, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    outside.chmod(0o755)
    (root_runner.checkpoint_root / "job-9").symlink_to(outside)
    assert root_runner.start(attempt_id=1, number=1, job_id=9, command=["true"]) == "failed"
    assert os.stat(outside).st_uid == 0 and stat.S_IMODE(os.stat(outside).st_mode) == 0o755  # not chowned
    assert reports.finished(1)["how"] == "failed_to_start"
    # A job id that is a path: refused before any directory is made. (A name of its own: /tmp/x may be
    # where the checkout running this sits.)
    target = f"/tmp/gpuquota-escaped-{os.getpid()}"
    bad = f"0/../../../..{target}"
    assert root_runner.start(attempt_id=2, number=1, job_id=bad, command=["true"]) == "failed"
    assert not Path(target).exists() and reports.finished(2)["how"] == "failed_to_start"


def test_python_jobs_work_as_a_uid_without_an_account(root_runner, reports):
    root_runner.start(
        attempt_id=1, number=1, job_id=7, command=[job_python(), "-c", "import os; print(os.getuid())"]
    )
    wait_until(lambda: reports.finished(1), runner=root_runner)
    assert reports.finished(1)["exit_code"] == 0, reports.log_of(1)


def test_when_every_uid_is_taken_the_start_fails_cleanly(root_dir, reports):
    from gpunodes.agent.identity import UidPool
    from tests.security.agent_helpers import make_runner, uid_pool

    first = uid_pool().first
    runner = make_runner(root_dir, reports, uids=UidPool(first, first))  # a range of one uid
    try:
        assert (
            runner.start(attempt_id=1, number=1, job_id=7, command=["sleep 5"], use_shell=True) == "started"
        )
        # The host is short of uids, not the job at fault: refused, and the control side re-queues it.
        assert runner.start(attempt_id=2, number=1, job_id=8, command=["true"]) == "refused"
        assert (
            "no free uid" in reports.finished(2)["detail"] and reports.finished(2)["how"] == "refused"
        )  # no strike (issue 41)
    finally:
        runner.shutdown(grace_s=0)


def test_each_attempt_has_its_own_tmp_and_dev_shm(root_runner, reports):
    leave = "echo a > /tmp/left-by-a; echo a > /dev/shm/left-by-a; ls /tmp /dev/shm; exec sleep 30"
    root_runner.start(attempt_id=1, number=1, job_id=7, command=[leave], use_shell=True)
    wait_until(lambda: "left-by-a" in reports.log_of(1), runner=root_runner, what="a's files")
    root_runner.start(attempt_id=2, number=1, job_id=8, command=["ls -a /tmp /dev/shm"], use_shell=True)
    wait_until(lambda: reports.finished(2), runner=root_runner)
    assert reports.finished(2)["exit_code"] == 0, reports.log_of(2)
    assert "left-by-a" not in reports.log_of(2)
    assert not Path("/tmp/left-by-a").exists() and not Path("/dev/shm/left-by-a").exists()  # not the host's


def test_a_job_sees_its_own_processes_only(root_runner, reports):
    root_runner.start(
        attempt_id=1, number=1, job_id=7, command=["exec sleep 30 --secret-in-argv"], use_shell=True
    )
    victim = root_runner._procs[1].popen.pid
    look = f"cat /proc/{victim}/cmdline && echo LEAK; ls /proc | grep -c '^[0-9]'"
    root_runner.start(attempt_id=2, number=1, job_id=8, command=[look], use_shell=True)
    wait_until(lambda: reports.finished(2), runner=root_runner)
    out = reports.log_of(2)
    assert "LEAK" not in out and "secret-in-argv" not in out, out
    assert int(out.split()[-1]) < 10  # its shell, ls, grep: not the host's processes


def test_jobs_whose_files_are_under_tmp_start_without_a_warning_each(root_runner, reports, caplog):
    """With a checkout under /tmp (`make run` in a CI clone) every job's program lies under the host's
    /tmp: the attempt sees that entry through its own /tmp (test_private_dirs), and no start logs a
    WARNING about it (it used to, at every job start)."""
    import logging
    import shutil
    import tempfile

    here = Path(tempfile.mkdtemp(prefix="gpuquota-tmp-job-", dir="/tmp"))
    try:
        here.chmod(0o755)
        program = here / "job.sh"
        program.write_text("#!/bin/sh\necho ran\n")
        program.chmod(0o755)
        with caplog.at_level(logging.DEBUG, logger="gpunodes.agent.runner"):
            for attempt in (1, 2, 3):
                root_runner.start(attempt_id=attempt, number=1, job_id=attempt, command=[str(program)])
                wait_until(lambda a=attempt: reports.finished(a), runner=root_runner)
                assert reports.finished(attempt)["exit_code"] == 0, reports.log_of(attempt)
    finally:
        shutil.rmtree(here, ignore_errors=True)
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not said, [r.getMessage() for r in said]
