"""The GPU host agent: it refuses work meant for another node, never runs jobs as itself unless told so
loudly, gives jobs an allow-listed environment, and kills only its own orphans."""

import os
import pwd
import signal
import subprocess
import sys
import time

import pytest

from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.identity import UidPool
from gpunodes.agent.main import UNSAFE_FLAG, job_uids
from gpunodes.agent.runner import FINISHED, LOG, _process_start
from tests.gpunodes.test_runner import Reports, make_runner, wait_finished


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


def test_a_non_root_agent_refuses_to_run_jobs_as_itself(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ValueError, match=UNSAFE_FLAG):
        job_uids(uid_range="2000000-2000099")


def test_the_opt_out_is_explicit_and_loud(monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert job_uids(uid_range="2000000-2000099", unsafe_run_as_self=True) is None
    assert [r for r in caplog.records if r.levelname == "WARNING" and "UNSAFE" in r.getMessage()]


def test_the_agent_command_refuses_without_the_opt_out(monkeypatch):
    from django.core.management import CommandError, call_command

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr("gpunodes.agent.main.Agent.run", lambda self, **kw: None)
    with pytest.raises(CommandError, match=UNSAFE_FLAG):
        call_command("gpu_agent", "--name", "n1", "--fake-gpus", "1", "--gpu-type", "a10g")


def test_a_root_agent_gives_each_attempt_a_uid_of_its_own(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    pool = job_uids(uid_range="2000000-2000099", unsafe_run_as_self=True)  # the opt-out is ignored
    monkeypatch.undo()
    assert (pool.first, pool.last) == (2000000, 2000099)
    if os.geteuid() == 0:  # taking a uid locks it host-wide: only as root
        first, second = pool.acquire(), pool.acquire()
        assert first.uid != second.uid and 0 not in (first.uid, second.uid)
        pool.release(first.uid)
        pool.release(second.uid)


def test_a_uid_range_with_root_or_existing_accounts_is_refused():
    with pytest.raises(ValueError):
        UidPool.parse("0-100")
    nobody = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(ValueError, match="existing accounts"):
        UidPool(nobody - 1, nobody + 1)


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


def job_env(tmp_path, reports, agent_env, **kw) -> dict[str, str]:
    runner = make_runner(tmp_path, reports, base_env=agent_env, **kw)
    try:
        start(runner, ["env"], gpus=[0], env={"MY_SETTING": "1"})
        assert wait_finished(runner, reports)["exit_code"] == 0
        return dict(
            line.split("=", 1)
            for line in "".join(k["text"] for k in reports.of(LOG)).splitlines()
            if "=" in line
        )
    finally:
        runner.shutdown(grace_s=1)


AGENT_ENV = {
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "HF_HOME": "/data/hf",
    "DATABASE_URL": "postgres://gpuquota:hunter2@db/gpuquota",
    "REDIS_URL": "redis://:hunter2@broker:6379/0",
    "SECRET_KEY": "k",
    "METRICS_TOKEN": "t",
    "AWS_SECRET_ACCESS_KEY": "a",
    "PGPASSWORD": "p",
    "GPUQUOTA_TOKEN": "g",
    "CELERY_BROKER_URL": "redis://broker",
    # What a deny-list let through (issue 18):
    "SENTRY_DSN": "https://key@sentry.example/1",
    "OPENAI_KEY": "sk-1",
    "DB_PASS": "hunter2",
    "BROKER_URL": "redis://:pw@broker",
    "https_proxy": "http://user:pw@proxy:3128",
}


def test_a_job_gets_only_the_allow_listed_environment(tmp_path, reports):
    seen = job_env(tmp_path, reports, AGENT_ENV)
    assert seen["MY_SETTING"] == "1" and seen["CUDA_VISIBLE_DEVICES"] == "0"
    kept = ("PATH", "LANG", "LC_ALL", "TZ")
    assert {k: seen[k] for k in kept} == {k: AGENT_ENV[k] for k in kept}
    leaked = (set(AGENT_ENV) - set(kept)) & set(seen)
    assert not leaked, sorted(leaked)
    assert seen["GPUQUOTA_JOB_ID"] == "7"  # the runner's own GPUQUOTA_* only


def test_the_operator_passes_more_names_with_pass_env(tmp_path, reports):
    seen = job_env(tmp_path, reports, AGENT_ENV, pass_env=("HF_HOME",))
    assert seen["HF_HOME"] == "/data/hf" and "SENTRY_DSN" not in seen


def test_pass_env_cannot_pass_the_agents_own_secrets(tmp_path, reports):
    with pytest.raises(ValueError, match="REDIS_URL"):
        make_runner(tmp_path, reports, pass_env=("REDIS_URL",))
