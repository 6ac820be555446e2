"""The agent process needs only the broker: it starts and heartbeats without DATABASE_URL and
SECRET_KEY, in production mode, writes its state privately, and signs what it sends with its node's key
when message signing is on (real processes, file broker)."""

import base64
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.security.agent_helpers import job_root

ROOT = Path(__file__).resolve().parents[2]


def start_agent(tmp_path, **extra_env):
    var = tmp_path / "var"
    jobs = job_root()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "SECRET_KEY", "REDIS_URL") and not k.startswith(("CELERY_", "MESSAGE_"))
    }
    env.update(
        DJANGO_ENV="production", GPUQUOTA_VAR_DIR=str(var), JOB_ROOT=str(jobs), HEARTBEAT_INTERVAL_S="1"
    )
    env.update(extra_env)
    argv = [
        sys.executable,
        "manage.py",
        "gpu_agent",
        "--name",
        "lone",
        "--fake-gpus",
        "1",
        "--gpu-type",
        "a10g",
    ]
    if os.geteuid() != 0:
        argv.append("--unsafe-run-jobs-as-agent-user")
    out = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 - closed in stop()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    return proc, var, jobs, out


def first_messages(tmp_path, proc, var) -> list[Path]:
    queue = var / "broker"
    end = time.monotonic() + 60
    while time.monotonic() < end and not any(p.is_file() for p in queue.rglob("*")):
        assert proc.poll() is None, (tmp_path / "agent.log").read_text()
        time.sleep(0.2)
    sent = [p for p in queue.rglob("*") if p.is_file()]
    assert sent, (tmp_path / "agent.log").read_text()  # a heartbeat went out
    return sent


def stop(proc, jobs, out) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out.close()
    shutil.rmtree(jobs, ignore_errors=True)


def test_the_agent_runs_without_database_url_or_secret_key(tmp_path):
    proc, var, jobs, out = start_agent(tmp_path)
    try:
        sent = first_messages(tmp_path, proc, var)
        assert stat.S_IMODE(var.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in sent)
        assert not (var / "secret_key").exists()  # nothing to keep: the agent signs no cookies
        assert not list(var.glob("*.sqlite3"))  # and opens no database
    finally:
        stop(proc, jobs, out)


def test_a_signing_agent_signs_its_heartbeats_with_its_nodes_key(tmp_path):
    from gpunodes import signing

    keys = tmp_path / "keys"
    for name in ("control", "lone"):
        signing.make_credentials(name, keys)
    (keys / "agent-trusts").mkdir()
    (keys / "control-trusts").mkdir()
    shutil.copy(keys / "control.pem", keys / "agent-trusts")
    for name in ("control", "lone"):
        shutil.copy(keys / f"{name}.pem", keys / "control-trusts")
    proc, var, jobs, out = start_agent(
        tmp_path,
        MESSAGE_SIGNING_KEY=str(keys / "lone.key"),
        MESSAGE_SIGNING_CERT=str(keys / "lone.pem"),
        MESSAGE_TRUSTED_CERTS=str(keys / "agent-trusts"),
    )
    try:
        message = json.loads(first_messages(tmp_path, proc, var)[0].read_text())
    finally:
        stop(proc, jobs, out)
    assert message["content-type"] == "application/x-gpuquota-auth"
    control = signing.make_serializer(
        str(keys / "control.key"), str(keys / "control.pem"), str(keys / "control-trusts")
    )
    assert control.deserialize(base64.b64decode(message["body"]))[1]["name"] == "lone"
