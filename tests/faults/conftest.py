"""Fault tests: a real cluster (granian web, control Celery worker, beat, fake-GPU agents) as separate
processes on the test database, with a PRIVATE redis-server started for each test on a free port, so a
test can kill and restart its broker without touching anyone else's. Faults are injected with real
signals (kill -9), real broker restarts and real PostgreSQL backend terminations.

The process tests need PostgreSQL (DATABASE_URL) and the redis-server binary; elsewhere they skip
with that reason. After each test the SEMANTICS.md invariants are checked on the database
(tests/faults/audit.py). The processes are tests/live's LiveCluster.
"""

from __future__ import annotations

import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

from config.webserver import granian_argv
from tests.live.conftest import LiveCluster, wait_for

ON_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")
HAVE_REDIS = shutil.which("redis-server") is not None

needs_stack = pytest.mark.skipif(
    not (ON_POSTGRES and HAVE_REDIS),
    reason="fault tests with real processes need PostgreSQL (DATABASE_URL) and the redis-server binary",
)
needs_postgres = pytest.mark.skipif(not ON_POSTGRES, reason="needs PostgreSQL (DATABASE_URL)")


def pytest_configure(config):
    config.addinivalue_line("markers", "load: the load test (GPUQUOTA_LOAD_JOBS jobs; -m 'not load' skips)")
    config.addinivalue_line("markers", "no_audit: the test checks the invariants itself")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of the test's own, without persistence: a restart loses everything it held,
    like a crashed broker. `also_bind`: addresses besides 127.0.0.1 to listen on (the host side of a
    test's veth pairs, tests/faults/netns.py), without protected mode (no password: a test network)."""

    def __init__(self, tmp: Path, also_bind: str | list[str] | None = None):
        self.port = free_port()
        self.tmp = tmp
        self.also_bind = [also_bind] if isinstance(also_bind, str) else list(also_bind or [])
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        out = open(self.tmp / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                *([*self.also_bind, "--protected-mode", "no"] if self.also_bind else []),
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.tmp,
            start_new_session=True,
        )
        wait_for(self.ping, 10, what="redis-server to answer")

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self, down_s: float = 0.0) -> None:
        self.kill()
        time.sleep(down_s)
        self.start()


class Cluster(LiveCluster):
    """tests/live's cluster on a private Redis, with a web server, fast grace and no submit throttle."""

    def __init__(self, tmp: Path, redis: PrivateRedis):
        self.redis = redis
        self.var = tmp / "var"
        self.var.mkdir()
        self.web_url: str | None = None
        super().__init__(
            tmp,
            REDIS_URL=redis.url,
            GPUQUOTA_VAR_DIR=str(self.var),
            SECRET_KEY=secrets.token_urlsafe(40),
            DEFAULT_PREEMPTION_GRACE_S="2",
            SUBMIT_RATE="1000000/min",
            DB_CONN_MAX_AGE="60",
        )

    def agent_state_file(self, node: str) -> Path:
        return self.var / "agent" / node / "running.json"

    def start_web(self, workers: int = 2, threads: int = 8) -> str:
        port = free_port()
        self._spawn(
            "web",
            granian_argv(sys.executable, host="127.0.0.1", port=port, workers=workers, threads=threads),
        )
        self.web_url = f"http://127.0.0.1:{port}"

        def up():
            import requests

            try:
                return requests.get(f"{self.web_url}/healthz", timeout=1).status_code == 200
            except requests.RequestException:
                return False

        wait_for(up, 60, what="the web server")
        return self.web_url

    def start(self, agents: dict[str, int]) -> None:
        """Control worker, beat, and an agent per {node: gpus}; waits for the nodes to be READY."""
        from gpunodes.choices import NodeState
        from gpunodes.models import Node

        self.start_control()
        self.start_beat()
        for node, gpus in agents.items():
            self.start_agent(node, gpus)
        wait_for(
            lambda: Node.objects.filter(name__in=list(agents), state=NodeState.READY).count() == len(agents),
            90,
            every=0.25,
            what=f"{len(agents)} READY nodes",
        )


@pytest.fixture
def no_local_messages(monkeypatch):
    """The test process itself sends nothing to any broker (the cluster's processes do the work)."""
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    # A submit's request is coalesced on a timer that would land after a test cleared `sent`: at once.
    monkeypatch.setattr("quotas.triggers.request_pass_soon", lambda why="": sent.append(("pass", why)))
    return sent


@pytest.fixture
def cluster(transactional_db, tmp_path, request, no_local_messages):
    if not (ON_POSTGRES and HAVE_REDIS):
        pytest.skip("needs PostgreSQL and the redis-server binary")
    redis = PrivateRedis(tmp_path)
    redis.start()
    live = Cluster(tmp_path, redis)
    failed = False
    from tests.faults import harness

    harness.LOG_DIR = tmp_path  # a stall's diagnosis names the control worker's last lines
    try:
        yield live
    finally:
        harness.LOG_DIR = None
        live.stop_all()
        redis.kill()
        rep = getattr(request.node, "rep_call", None)
        failed = rep is not None and rep.failed
        if failed:
            print(live.logs())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """After a fault test that passed (and before its database goes away): the SEMANTICS.md invariants
    hold on the database, read as one consistent snapshot while the cluster may still be running."""
    result = yield
    uses_db = item.get_closest_marker("django_db") or {"db", "transactional_db"} & set(item.fixturenames)
    if uses_db and not item.get_closest_marker("no_audit"):
        from tests.faults.audit import check_invariants

        check_invariants()
    return result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


# --- people and shares ---------------------------------------------------------------------------


def make_team(
    django_user_model, slug: str, *, users: int = 1, capacity: int = 4, strategy: str = "LEND_AND_BORROW"
):
    """A team with `users` members and one share `slug`-share of `capacity` a10g GPUs."""
    from knox.models import AuthToken

    from quotas.choices import Role
    from quotas.models import Membership, Share, ShareCapacity, Team

    team = Team.objects.create(name=slug, slug=slug)
    share = Share.objects.create(team=team, name=f"{slug}-share", strategy=strategy)
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=capacity)
    members = []
    for i in range(users):
        user = django_user_model.objects.create_user(f"{slug}-u{i}", password="pw-123456")
        Membership.objects.create(team=team, user=user, role=Role.MEMBER)
        members.append((user, AuthToken.objects.create(user=user)[1]))
    return share, members
