"""Issue 30, finding 2: the per-node Redis ACL that the README documents keeps each node to its own
keys, against a real redis-server with real agent and control worker processes. kombu kept one
`unacked` hash for every consumer and the ACL granted `~unacked*`: any node read every node's
messages while they were being handled (other teams' env, heartbeats with NODE_JOIN_TOKEN) and could
plant an entry that a worker's restore pushed into another node's queue. Now each consumer has its own
unacknowledged-message keys, and a node's ACL user reaches only its own queue, its own keys and the
control queue (to push onto it)."""

import base64
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from kombu import Connection

from tests.faults.conftest import PrivateRedis
from tests.live.conftest import LiveCluster, wait_for
from tests.security.agent_helpers import job_root

pytestmark = [pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")]

ROOT = Path(__file__).resolve().parents[2]
SECRET = "team-b-secret-7731"


def documented_acl(node: str, password: str) -> list[str]:
    """The rules of README's `ACL SETUSER node-gpu-1 ...` line, for `node`."""
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"`(ACL SETUSER node-gpu-1 [^`]+)`", readme).group(1)
    return shlex.split(line.replace("gpu-1", node).replace("PASSWORD", password))[3:]


@pytest.fixture
def broker(tmp_path):
    """A private redis-server; ACL users for nodes gpu-1 and gpu-10 (a name that gpu-1's is a prefix
    of), as documented; returns (server, admin client, url of a node's user)."""
    server = PrivateRedis(tmp_path)
    server.start()
    admin = redis.Redis(port=server.port)
    for node in ("gpu-1", "gpu-10"):
        admin.execute_command("ACL", "SETUSER", f"node-{node}", *documented_acl(node, f"{node}-pw"))
    yield server, admin, lambda node: f"redis://node-{node}:{node}-pw@127.0.0.1:{server.port}/0"
    server.proc.terminate()
    server.proc.wait(timeout=10)


def reveals(value) -> bool:
    """Whether a Redis value holds the secret, in clear or in a kombu message's base64 body."""
    if isinstance(value, dict):
        return any(reveals(v) for v in value.values())
    if isinstance(value, list | set | tuple):
        return any(reveals(v) for v in value)
    text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    bodies = re.findall(r'\\?"body\\?": \\?"([A-Za-z0-9+/=]+)', text)
    return SECRET in text or any(SECRET in base64.b64decode(b).decode(errors="replace") for b in bodies)


def denied(call, *args) -> bool:
    try:
        call(*args)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_the_documented_acl_keeps_a_node_to_its_own_keys(broker):
    server, admin, url = broker
    admin.lpush("node.gpu-10", "a start of gpu-10's")
    admin.lpush("control", "a heartbeat with a join token")
    node = redis.Redis.from_url(url("gpu-1"))
    assert denied(node.lrange, "node.gpu-10", 0, -1)  # a queue whose name begins with its own
    assert denied(node.lpush, "node.gpu-10", "a forged start")
    assert denied(node.rpop, "control")
    assert denied(node.lrange, "control", 0, -1)
    for shared in ("unacked", "unacked_index", "unacked_mutex"):  # kombu's defaults, one for everyone
        assert denied(node.hgetall if shared == "unacked" else node.exists, shared)
    assert denied(node.sadd, "_kombu.binding.control", "control\x06\x16\x06\x16node.gpu-1")
    assert denied(node.publish, "/0.celery.pidbox", "a broadcast")
    assert denied(node.keys, "*")
    assert denied(node.lpush, "control", "a report in front of every other node's")
    assert denied(node.lpush, "control.from.gpu-10", "a report in gpu-10's name")
    # What it needs: its own queue, its own unacknowledged-message keys, and pushing reports onto its
    # own intake list.
    node.lpush("node.gpu-1", "x")
    assert node.brpop("node.gpu-1", 1) == (b"node.gpu-1", b"x")
    node.hset("node:gpu-1:unacked", "tag", "x")
    node.lpush("control.from.gpu-1", "a report")


def planted(tag: str, queue: str) -> str:
    """An unacknowledged-message entry as kombu keeps it: [message, exchange, routing key]."""
    import json

    message = {
        "body": "e30=",
        "content-type": "application/json",
        "content-encoding": "utf-8",
        "headers": {"task": "gpunodes.agent.tasks.start_attempt", "id": tag},
        "properties": {
            "delivery_tag": tag,
            "body_encoding": "base64",
            "priority": 0,
            "delivery_info": {"exchange": "", "routing_key": queue},
        },
    }
    return json.dumps([message, "", queue])


def start_agent(tmp_path: Path, name: str, redis_url: str, **extra) -> tuple[subprocess.Popen, Path, Path]:
    import os

    var, jobs = tmp_path / f"var-{name}", job_root()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "SECRET_KEY", "REDIS_URL") and not k.startswith(("CELERY_", "MESSAGE_"))
    }
    env.update(
        GPUQUOTA_VAR_DIR=str(var), JOB_ROOT=str(jobs), HEARTBEAT_INTERVAL_S="1", REDIS_URL=redis_url, **extra
    )
    argv = [
        sys.executable,
        "manage.py",
        "gpu_agent",
        "--name",
        name,
        "--fake-gpus",
        "1",
        "--gpu-type",
        "a10g",
    ]
    if os.geteuid() != 0:
        argv.append("--unsafe-run-jobs-as-agent-user")
    log = tmp_path / f"agent-{name}.log"
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
    )
    return proc, jobs, log


def stop(proc: subprocess.Popen, jobs: Path) -> None:
    import os

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    shutil.rmtree(jobs, ignore_errors=True)


def test_a_message_a_node_holds_unacknowledged_is_not_readable_by_another_node(broker, tmp_path):
    """A real agent under its documented ACL user runs (heartbeats, consumes its queue, gives back what
    it held when it stops), and what it holds unacknowledged is out of another node's reach."""
    from config.celery import app

    server, admin, url = broker
    proc, jobs, log = start_agent(tmp_path, "gpu-1", url("gpu-1"))
    try:
        wait_for(lambda: admin.llen("control.from.gpu-1") >= 2, 90, what="gpu-1's heartbeats")
        # A start with another team's env, due in two minutes: the agent holds it unacknowledged.
        with Connection(server.url) as conn:
            type(app).send_task(  # not app.send_task: the suite's fixtures record what goes through it
                app,
                "gpunodes.agent.tasks.start_attempt",
                kwargs={
                    "node": "gpu-1",
                    "attempt_id": 1,
                    "number": 1,
                    "job_id": 1,
                    "command": ["true"],
                    "env": {"TOKEN": SECRET},
                },
                queue="node.gpu-1",
                countdown=120,
                connection=conn,
                serializer="json",
            )
        wait_for(lambda: admin.llen("node.gpu-1") == 0, 60, what="the agent to take the start")
        held = wait_for(
            lambda: [k for k in admin.keys("*") if admin.type(k) == b"hash" and reveals(admin.hgetall(k))],
            30,
            what="the start among the agent's unacknowledged messages",
        )
        other = redis.Redis.from_url(url("gpu-10"))
        for key in admin.keys("*"):
            kind = admin.type(key).decode()
            read = {
                "hash": other.hgetall,
                "list": lambda k: other.lrange(k, 0, -1),
                "zset": lambda k: other.zrange(k, 0, -1),
                "set": other.smembers,
                "string": other.get,
            }
            if kind in read:
                try:
                    assert not reveals(read[kind](key)), key
                except redis.exceptions.NoPermissionError:
                    pass
        assert [k.decode() for k in held] == ["node:gpu-1:unacked"]
    finally:
        stop(proc, jobs)
    text = log.read_text(errors="replace")
    assert "NOPERM" not in text and "NoPermission" not in text, text[-3000:]
    denials = [e for e in admin.execute_command("ACL", "LOG") if e[b"username"] == b"node-gpu-1"]
    assert denials == []  # all the agent does, its ACL user may do
    assert admin.llen("node.gpu-1") == 1  # given back to its own queue at shutdown, under its own ACL


@pytest.mark.django_db(transaction=True)
def test_an_entry_planted_by_a_node_is_never_restored_into_another_nodes_queue(broker, tmp_path):
    """A planted entry (an old signed start, routed to gpu-1's queue) is restored by whoever owns the
    hash it lies in: a worker restores what it finds at start-up. gpu-10 can plant only into its own
    keys, and its own agent cannot push into gpu-1's queue."""
    server, admin, url = broker
    node = redis.Redis.from_url(url("gpu-10"))
    for key, index in (
        ("unacked", "unacked_index"),
        ("control:unacked", "control:unacked_index"),
        ("node:gpu-10:unacked", "node:gpu-10:unacked_index"),
    ):
        try:
            node.hset(key, f"tag-{key}", planted(f"tag-{key}", "node.gpu-1"))
            node.zadd(index, {f"tag-{key}": 0})  # handed out long ago: due for restoring
        except redis.exceptions.NoPermissionError:
            pass

    live = LiveCluster(tmp_path, REDIS_URL=server.url)
    proc, jobs, log = start_agent(tmp_path, "gpu-10", url("gpu-10"))
    try:
        live.start_control()
        wait_for(
            lambda: "ready" in (tmp_path / "control.log").read_text(errors="replace"),
            90,
            what="the control worker",
        )
        wait_for(lambda: "ready" in log.read_text(errors="replace"), 90, what="gpu-10's agent")
        time.sleep(3)  # both restored what they found at start-up
        assert admin.llen("node.gpu-1") == 0, admin.lrange("node.gpu-1", 0, -1)
        assert proc.poll() is None, log.read_text()[-3000:]  # its own planted entry did not stop it
    finally:
        stop(proc, jobs)
        live.stop_all()
