"""The agent process needs only the broker: it starts and heartbeats without DATABASE_URL and
SECRET_KEY, in production mode, and writes its state privately (real process, file broker)."""

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from tests.security.agent_helpers import job_root

ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_runs_without_database_url_or_secret_key(tmp_path):
    var = tmp_path / "var"
    jobs = job_root()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "SECRET_KEY", "REDIS_URL") and not k.startswith("CELERY_")
    }
    env.update(
        DJANGO_ENV="production", GPUQUOTA_VAR_DIR=str(var), JOB_ROOT=str(jobs), HEARTBEAT_INTERVAL_S="1"
    )
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
    out = open(tmp_path / "agent.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        queue = var / "broker"
        end = time.monotonic() + 60
        while time.monotonic() < end and not any(p.is_file() for p in queue.rglob("*")):
            assert proc.poll() is None, (tmp_path / "agent.log").read_text()
            time.sleep(0.2)
        sent = [p for p in queue.rglob("*") if p.is_file()]
        assert sent, (tmp_path / "agent.log").read_text()  # a heartbeat went out
        assert stat.S_IMODE(var.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in sent)
        assert not (var / "secret_key").exists()  # nothing to keep: the agent signs nothing
        assert not list(var.glob("*.sqlite3"))  # and opens no database
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
        import shutil

        shutil.rmtree(jobs, ignore_errors=True)
