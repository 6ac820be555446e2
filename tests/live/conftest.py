"""A live cluster for end-to-end tests: a real control Celery worker, Celery beat and fake-GPU agents
as separate processes, on the test database and the configured broker (Redis in CI)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _database_url() -> str:
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def _purge_broker() -> None:
    if settings.REDIS_URL:
        import redis

        redis.Redis.from_url(settings.REDIS_URL).flushdb()
    else:
        for sub in ("queue", "processed"):
            folder = settings.BROKER_DIR / sub
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True, exist_ok=True)


class LiveCluster:
    """The product's processes, each in its own session, on the test database. tests/faults builds on
    it (with a private Redis and a web server)."""

    def __init__(self, tmp: Path, **env: str):
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}
        # The agents' state of earlier tests (their outboxes above all: reports about attempt ids that
        # this test's fresh database hands out again) must not reach this test's control side.
        shutil.rmtree(Path(settings.VAR_DIR) / "agent", ignore_errors=True)
        # The jobs' directories must be reachable by their uids (a root agent): not under pytest's 0700 tmp.
        self.jobs = Path(tempfile.mkdtemp(prefix="gpuquota-live-", dir="/var/tmp"))
        self.jobs.chmod(0o711)
        # So must the programs they run: a copy of examples/, whatever the checkout's own place and
        # permissions (a clone under `mktemp -d`, 0700, or under /root: the job's uid reads nothing there).
        self.programs = self.jobs / "programs"
        shutil.copytree(EXAMPLES, self.programs)
        for path in [self.programs, *self.programs.rglob("*")]:
            path.chmod(0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644)
        self.env = {
            **os.environ,
            "DATABASE_URL": _database_url(),
            "GPUQUOTA_VAR_DIR": str(settings.VAR_DIR),
            "JOB_LOG_DIR": str(tmp / "logs"),
            "JOB_ROOT": str(self.jobs),
            # Control side and agents share it: new nodes join READY on Redis too (else PENDING).
            "NODE_JOIN_TOKEN": "live-cluster-join-token",
            "CHECKPOINT_ROOT": str(self.jobs / "checkpoints"),
            "SCHEDULER_INTERVAL_S": "1",
            "HEARTBEAT_INTERVAL_S": "1",
            "NODE_LOST_AFTER_S": "4",
            # No lease: 4 s leave no room for one (gpunodes/checks.py); the fencing tests set their own.
            "FENCE_AFTER_S": "0",
            "PREEMPT_ACK_TIMEOUT_S": "5",
            "LOG_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **env,
        }

    def program(self, name: str) -> str:
        """The absolute path of examples/<name> as the jobs' uids can read it (see __init__)."""
        return str(self.programs / name)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs[name] = proc
        return proc

    def start_worker(
        self, name: str, queue: str, pool: str = "threads", concurrency: int = 4
    ) -> subprocess.Popen:
        """A Celery worker of `queue` (control: the passes and the nodes' messages; whatif: replays)."""
        return self._spawn(
            name,
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                queue,
                "-P",
                pool,
                "-c",
                str(concurrency),
                "-n",
                f"{name}-{os.getpid()}-{time.monotonic_ns()}@%h",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
        )

    def start_control(self, name: str = "control", concurrency: int = 4) -> subprocess.Popen:
        return self.start_worker(name, "control", "threads", concurrency)

    def start_beat(self) -> subprocess.Popen:
        return self._spawn(
            "beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "beat",
                "-l",
                "INFO",
                "--schedule",
                str(self.tmp / "beat-schedule"),
            ],
        )

    def start_control_plane(self) -> None:
        self.start_control()
        self.start_beat()

    def start_agent(self, name: str, gpus: int, gpu_type: str = "a10g") -> subprocess.Popen:
        return self._spawn(
            f"agent-{name}",
            [
                sys.executable,
                "manage.py",
                "gpu_agent",
                "--name",
                name,
                "--fake-gpus",
                str(gpus),
                "--gpu-type",
                gpu_type,
                # Not root: no uid per attempt; run the jobs as this user, as `make run` does.
                *([] if os.geteuid() == 0 else ["--unsafe-run-jobs-as-agent-user"]),
            ],
        )

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        os.kill(proc.pid, sig)  # the process only, not its children: like a crash of the agent
        proc.wait(timeout=20)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        shutil.rmtree(self.jobs, ignore_errors=True)

    def logs(self, tail: int = 4000) -> str:
        return "\n".join(
            f"===== {p.name}\n{p.read_text(errors='replace')[-tail:]}" for p in sorted(self.tmp.glob("*.log"))
        )


def wait_for(predicate, timeout: float = 30, every: float = 0.1, what: str = "condition", jobs=(), saw=None):
    """Wait until `predicate()` is true. Giving up, say what it waited for and, for each of `jobs`,
    what it saw: the job's state and reason, its attempts and its last events, so that a CI excerpt
    shows the cause (a job that could not start says why there, not only "timed out"); `saw`, a
    callable, adds what else the test looked at."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    seen = "".join(f"\n  {job_story(job)}" for job in jobs)
    if saw is not None:
        seen += f"\n  saw: {saw()!r}"
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{seen}")


def job_story(job, events: int = 5) -> str:
    """One job as the database has it now: state and reason, each attempt, the last few events."""
    from jobs.models import Attempt, Job, JobEvent

    pk = getattr(job, "pk", job)
    job = Job.objects.filter(pk=pk).first()
    if job is None:
        return f"job {pk}: not in the database"
    text = f"job {job.pk} {job.name}: {job.state}" + (f" ({job.state_reason})" if job.state_reason else "")
    attempts = [
        f"#{a.number} {a.state}"
        + (f" {a.outcome}" if a.outcome else "")
        + (f", exit code {a.exit_code}" if a.exit_code is not None else "")
        + (f" ({a.end_reason})" if a.end_reason else "")
        for a in Attempt.objects.filter(job=job).order_by("number")
    ]
    text += "; attempts: " + (", ".join(attempts) or "none")
    last = list(JobEvent.objects.filter(job=job).order_by("-at", "-id")[:events])[::-1]
    text += "; last events: " + " | ".join(
        f"{e.at:%H:%M:%S} {e.kind}" + (f" {e.reason}" if e.reason else "") for e in last
    )
    return text


@pytest.fixture
def cluster(transactional_db, tmp_path, request):
    _purge_broker()
    live = LiveCluster(tmp_path)
    yield live
    live.stop_all()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(live.logs())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
