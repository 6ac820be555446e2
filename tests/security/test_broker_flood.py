"""Issue 41, item 1: one node's flood is bounded. Pushing 20,000 junk messages onto `control` took a
node 0.3 s and froze the passes and every other node's heartbeats for ~12 s. Now each node pushes onto
its own intake list, which the control worker moves onto `control` a few messages per node at a time
(config.redisbroker.Intake), and keeps each node's keys bounded. Real redis-server (the README's
settings and ACL users), a real control worker and agent; skipped without the redis-server binary."""

import logging
import shutil
import time

import pytest
from kombu import Connection

from config.redisbroker import Intake
from gpunodes.choices import NodeState
from gpunodes.models import Node
from quotas.models import SchedulerPass
from tests.live.conftest import LiveCluster, wait_for
from tests.security.broker_helpers import ConfiguredRedis
from tests.security.test_broker_isolation import start_agent, stop

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")

FLOOD = 20_000
MB = 2**20


@pytest.fixture
def server(tmp_path):
    server = ConfiguredRedis(tmp_path, maxmemory="1gb").start()
    yield server
    server.stop()


def test_each_turn_moves_a_few_messages_of_every_node_and_control_stays_short(server):
    admin = server.admin()
    flood, quiet = server.add_node("flood"), server.add_node("gpu-2")
    flood.lpush("control.from.flood", *[f"junk {i}" for i in range(FLOOD)])
    quiet.lpush("control.from.gpu-2", "heartbeat 1")
    intake = Intake(admin, backlog=50, per_node=20, node_max_messages=FLOOD * 2)
    intake.discover()
    assert intake.round() == 21  # 20 of the flood's, and the other node's heartbeat
    assert admin.lrange("control", 0, -1)[-1] == b"junk 0"  # oldest first
    assert b"heartbeat 1" in admin.lrange("control", 0, -1)
    quiet.lpush("control.from.gpu-2", "heartbeat 2")
    assert intake.round() == 15  # the room left, shared: 14 of the flood's, and the heartbeat
    while intake.round():
        pass
    assert admin.llen("control") == 50  # never more than the backlog
    assert intake.round() == 0  # full: nothing more until the control worker takes some
    assert b"heartbeat 2" in admin.lrange("control", 0, -1)
    assert admin.llen("control.from.flood") == FLOOD - 48  # 48 of its and 2 heartbeats: 50


def test_a_nodes_list_and_keys_past_their_bounds_lose_their_oldest(server, caplog):
    admin = server.admin()
    flood = server.add_node("flood")
    flood.lpush("control.from.flood", *[f"junk {i}" for i in range(FLOOD)])
    intake = Intake(admin, node_max_messages=2000, node_max_bytes=4 * MB)
    intake.discover()
    with caplog.at_level(logging.WARNING, logger="config.redisbroker"):
        intake.police()
    assert admin.llen("control.from.flood") == 2000
    assert admin.lindex("control.from.flood", -1) == f"junk {FLOOD - 2000}".encode()  # the newest kept
    assert "node flood had more than 2000 messages waiting: dropped its 18000 oldest" in caplog.text
    # Big messages: bounded in bytes too.
    flood.lpush("control.from.flood", *[b"x" * 100_000 for _ in range(100)])  # 10 MB
    intake.police()
    assert admin.memory_usage("control.from.flood", samples=0) <= 4 * MB
    assert admin.lindex("control.from.flood", 0) == b"x" * 100_000  # the newest kept
    # Its unacknowledged-message hash, written 1:1 by the node (no other way to fill memory is left).
    for i in range(3):
        flood.hset("node:flood:unacked", f"f{i}", b"x" * 2 * MB)
    with caplog.at_level(logging.ERROR, logger="config.redisbroker"):
        intake.police()
    assert not admin.exists("node:flood:unacked")
    assert "node flood held" in caplog.text


def junk(server: ConfiguredRedis) -> bytes:
    """A message as a node could push it: a heartbeat the control worker reads, and refuses."""
    from config.celery import app

    with Connection(server.url) as conn:
        type(app).send_task(
            app,
            "gpunodes.tasks.node_heartbeat",
            kwargs={"name": "flood", "gpu_type": "a10g", "inventory": "junk", "running": [], "boot_id": "x"},
            queue="scratch",
            connection=conn,
            serializer="json",
        )
    return server.admin().rpop("scratch")


def probe_pass(server: ConfiguredRedis, trigger: str) -> None:
    from config.celery import app

    with Connection(server.url) as conn:
        type(app).send_task(
            app, "quotas.tasks.scheduling_pass", kwargs={"trigger": trigger}, queue="control", connection=conn
        )


def staleness() -> float:
    """How old the latest heartbeat of gpu-2 that the control side applied is (when its agent sent it)."""
    sent = Node.objects.filter(name="gpu-2").values_list("last_sent_at", flat=True).first()
    return time.time() - (sent or 0)


def under_flood(server: ConfiguredRedis, push, name: str) -> tuple[float, float]:
    """Push the flood, then (the worst age of gpu-2's applied heartbeat over the next 15 s or until
    the flood is gone; how long a pass asked for 1 s after the flood waited)."""
    admin = server.admin()
    push()
    start = time.monotonic()
    worst, asked, waited = 0.0, None, None
    while time.monotonic() - start < 15 or admin.llen("control") + admin.llen("control.from.flood") > 0:
        if time.monotonic() - start > 90:
            break
        worst = max(worst, staleness())
        if asked is None and time.monotonic() - start >= 1:
            probe_pass(server, f"probe-{name}")
            asked = time.monotonic()
        if waited is None and asked and SchedulerPass.objects.filter(trigger=f"probe-{name}").exists():
            waited = time.monotonic() - asked
        if waited is not None and time.monotonic() - start >= 15:
            break
        time.sleep(0.1)
    return worst, waited if waited is not None else float("inf")


@pytest.mark.live
@pytest.mark.django_db(transaction=True)
def test_a_flood_from_one_node_delays_no_other_nodes_heartbeat_nor_a_pass(server, tmp_path):
    admin = server.admin()
    flood = server.add_node("flood")
    server.add_node("gpu-2")
    Node.objects.create(name="gpu-2", gpu_type="a10g", state=NodeState.READY)
    message = junk(server)
    # No trimming in this test: every message of the flood goes through the control worker.
    cluster = LiveCluster(tmp_path, REDIS_URL=server.url, BROKER_NODE_MAX_MESSAGES=str(FLOOD * 2))
    proc, jobs, log = start_agent(tmp_path, "gpu-2", server.user_url("gpu-2"))
    try:
        cluster.start_control()
        wait_for(lambda: staleness() < 2, 90, what="gpu-2's heartbeats applied")

        def onto_its_own_list():
            flood.pipeline(transaction=False).lpush("control.from.flood", *[message] * FLOOD).execute()

        # The same flood pushed straight onto `control` (what the old ACL let a node do) froze gpu-2's
        # heartbeat and a pass for ~12 s: measured once (issue 41's closing note), not every run.
        after = under_flood(server, onto_its_own_list, "after")
        print(
            f"\n20,000 junk messages from the node's own list: gpu-2's heartbeat at worst {after[0]:.1f} s "
            f"old, a pass waited {after[1]:.1f} s"
        )
        # A heartbeat comes every second: 1.3-1.5 s at worst on a quiet 2-core machine; room for a busy one.
        assert after[0] < 4.0 and after[1] < 3.0
        assert admin.llen("control.from.flood") < FLOOD  # the flood was served meanwhile, a turn at a time
    finally:
        stop(proc, jobs)
        cluster.stop_all()
    assert "NOPERM" not in log.read_text(errors="replace")
