"""The GPU host agent: it refuses work meant for another node, drops every privilege of root for the
jobs when told to run them as an unprivileged user, and kills only its own orphans."""

import os
import signal
import subprocess
import sys
import time

import pytest

from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.runner import FINISHED, LOG, RunAs, Runner, _process_start
from tests.gpunodes.test_runner import Reports, wait_finished

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs the agent to run as root")


def make_runner(tmp_path, reports, **kw):
    return Runner(
        node="n1",
        log_dir=tmp_path / "logs",
        checkpoint_root=tmp_path / "ckpt",
        report=reports,
        state_path=tmp_path / "state" / "running.json",
        **kw,
    )


def start(runner, command, **kw):
    return runner.start(attempt_id=kw.pop("attempt_id", 1), number=1, job_id=7, command=command, **kw)


@pytest.fixture
def reports():
    return Reports()


def test_a_start_for_another_node_is_refused(tmp_path, reports, monkeypatch):
    runner = make_runner(tmp_path, reports)
    monkeypatch.setattr(agent_tasks, "RUNNER", runner)
    kwargs = {"attempt_id": 1, "number": 1, "job_id": 7, "command": ["true"]}
    assert agent_tasks.start_attempt.run(node="n2", **kwargs) == "refused"
    assert agent_tasks.preempt_attempt.run(node="n2", attempt_id=1, number=1) == "refused"
    assert runner.running() == [] and reports == []


def test_an_agent_without_a_runner_refuses_everything(monkeypatch):
    monkeypatch.setattr(agent_tasks, "RUNNER", None)
    assert agent_tasks.start_attempt.run(node="n1", attempt_id=1, number=1, job_id=7, command=["true"]) == (
        "refused"
    )


def test_run_as_root_or_an_unknown_user_is_refused():
    with pytest.raises(ValueError, match="not root"):
        RunAs.resolve("root")
    with pytest.raises(ValueError, match="no user named"):
        RunAs.resolve("no-such-user-here")
    assert RunAs.resolve(None) is None


@as_root
def test_jobs_run_as_the_configured_user_with_its_groups_only(tmp_path, reports):
    import pwd

    nobody = pwd.getpwnam("nobody")
    runner = make_runner(tmp_path, reports, run_as="nobody")
    try:
        # /bin/sh: the venv's python may not be readable by nobody.
        start(runner, ["id -u; id -g; id -G; echo $HOME"], use_shell=True, gpus=[0])
        assert wait_finished(runner, reports)["exit_code"] == 0, "".join(k["text"] for k in reports.of(LOG))
        uid, gid, groups, home = "".join(k["text"] for k in reports.of(LOG)).splitlines()
        assert (int(uid), int(gid)) == (nobody.pw_uid, nobody.pw_gid)
        assert "0" not in groups.split(), groups  # root's groups are dropped too
        assert home == nobody.pw_dir
        ckpt = tmp_path / "ckpt" / "job-7"
        assert ckpt.stat().st_uid == nobody.pw_uid  # the job may write its checkpoints
    finally:
        runner.shutdown(grace_s=1)


def test_a_reused_pid_is_not_killed_as_an_orphan(tmp_path, reports):
    import json

    # An unrelated process group that happens to hold the pid the state file names.
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        state = tmp_path / "state" / "running.json"
        state.parent.mkdir(parents=True)
        state.write_text(json.dumps([{"attempt_id": 1, "number": 1, "pgid": other.pid, "started": "1"}]))
        runner = make_runner(tmp_path, reports)
        assert runner.kill_orphans() == []
        assert other.poll() is None
        # With its real start time it is the previous agent's: killed.
        state.write_text(
            json.dumps(
                [{"attempt_id": 1, "number": 1, "pgid": other.pid, "started": _process_start(other.pid)}]
            )
        )
        assert runner.kill_orphans() == [other.pid]
        other.wait(timeout=5)
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
            other.wait()


def test_the_agents_own_process_group_is_never_killed(tmp_path, reports):
    import json

    state = tmp_path / "state" / "running.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps([{"attempt_id": 1, "number": 1, "pgid": os.getpgrp()}, {"pgid": 1}]))
    assert make_runner(tmp_path, reports).kill_orphans() == []


def test_the_state_file_records_the_start_time(tmp_path, reports):
    import json

    runner = make_runner(tmp_path, reports)
    try:
        start(runner, [sys.executable, "-c", "import time; time.sleep(30)"])
        [entry] = json.loads((tmp_path / "state" / "running.json").read_text())
        assert entry["started"] == _process_start(entry["pgid"]) is not None
    finally:
        runner.shutdown(grace_s=1)
    time.sleep(0)
    assert reports.of(FINISHED)


def test_a_job_does_not_inherit_the_agents_configuration_or_secrets(tmp_path, reports):
    agent_env = {
        "PATH": os.environ["PATH"],
        "HF_HOME": "/data/hf",
        "DATABASE_URL": "postgres://gpuquota:hunter2@db/gpuquota",
        "REDIS_URL": "redis://:hunter2@broker:6379/0",
        "SECRET_KEY": "k",
        "METRICS_TOKEN": "t",
        "AWS_SECRET_ACCESS_KEY": "a",
        "PGPASSWORD": "p",
        "GPUQUOTA_TOKEN": "g",
        "CELERY_BROKER_URL": "redis://broker",
    }
    runner = make_runner(tmp_path, reports, base_env=agent_env)
    try:
        start(runner, ["env"], gpus=[0], env={"MY_SETTING": "1"})
        assert wait_finished(runner, reports)["exit_code"] == 0
        seen = dict(
            line.split("=", 1)
            for line in "".join(k["text"] for k in reports.of(LOG)).splitlines()
            if "=" in line
        )
    finally:
        runner.shutdown(grace_s=1)
    assert seen["HF_HOME"] == "/data/hf" and seen["MY_SETTING"] == "1" and seen["CUDA_VISIBLE_DEVICES"] == "0"
    leaked = (set(agent_env) - {"PATH", "HF_HOME"}) & set(seen)
    assert not leaked, sorted(leaked)
