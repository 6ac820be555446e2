"""Issue 41, item 1: no node can take the shared broker from the others. A node's Redis user (the
README's ACL line, config.redisbroker.node_acl) may run only what its agent runs, and the README's
redis.conf settings bound what any client holds: the attack of the issue, a node that asks again and
again for the biggest value it can write and never reads the replies, filled Redis to `maxmemory` and
every heartbeat's LPUSH was refused. Real redis-server processes; skipped without the binary."""

import shlex
import shutil
import socket
import time

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.security.broker_helpers import ConfiguredRedis
from tests.security.test_broker_isolation import documented_acl

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")

MB = 2**20


def test_the_readme_shows_the_acl_that_node_acl_makes():
    from config.redisbroker import node_acl

    assert documented_acl("gpu-1", "PASSWORD") == shlex.split(" ".join(node_acl("gpu-1", "PASSWORD")))


def test_the_node_acl_command_prints_the_line_and_the_agents_url(capsys):
    call_command("node_acl", "gpu-7", "--password", "s3cret-pw", "--host", "10.0.0.5:6379")
    line, url = capsys.readouterr().out.splitlines()
    assert line.startswith("ACL SETUSER node-gpu-7 reset on >s3cret-pw ")
    assert "(~control.from.gpu-7 +lpush)" in line and "gpu-1" not in line
    assert url == "REDIS_URL=redis://node-gpu-7:s3cret-pw@10.0.0.5:6379/0"
    call_command("node_acl", "gpu-7")
    fresh = capsys.readouterr().out.split()[5]
    assert fresh.startswith(">") and len(fresh) > 20  # a fresh password
    for bad in (["bad name"], ["gpu-7", "--password", "a b"], ["gpu-7", "--password", "x@y"]):
        with pytest.raises(CommandError) as e:
            call_command("node_acl", *bad)
        assert e.value.returncode == 2


@pytest.fixture
def server(tmp_path):
    # The README's settings, with maxmemory scaled to this test (its clients' share, 10%, is 100 MB).
    server = ConfiguredRedis(tmp_path, maxmemory="1gb").start()
    yield server
    server.stop()


def denied(call, *args) -> bool:
    try:
        call(*args)
    except redis.exceptions.NoPermissionError:
        return True
    return False


def test_a_node_user_may_run_only_what_its_agent_runs(server):
    admin = server.admin()
    admin.set("session:other-team", "x")
    node = server.add_node("gpu-1")
    raw = node.execute_command
    for command in (
        ("GET", "session:other-team"),
        ("GET", "node:gpu-1:unacked_mutex"),  # its own lock too: the agent never reads it
        ("SET", "big", "x"),
        ("SETRANGE", "node:gpu-1:unacked_mutex", 100 * MB, "x"),
        ("APPEND", "node:gpu-1:unacked_mutex", "x"),
        ("SCAN", 0),
        ("KEYS", "*"),
        ("RANDOMKEY",),
        ("CLIENT", "LIST"),
        ("CLIENT", "NO-EVICT", "on"),
        ("MEMORY", "USAGE", "node.gpu-1"),
        ("SCRIPT", "LOAD", "while true do end"),
        ("EVAL", "while true do end", 0),
        ("FUNCTION", "LIST"),
        ("CONFIG", "GET", "*"),
        ("INFO",),
        ("MONITOR",),
        ("SUBSCRIBE", "/0.celery.pidbox"),
        ("LPUSH", "control", "a report in front of every node's heartbeat"),
        ("LPUSH", "control.from.gpu-2", "a report in gpu-2's name"),
        ("LRANGE", "node.gpu-1", 0, -1),  # not even its own queue's content: it takes, one by one
        ("HGETALL", "node:gpu-1:unacked"),
        ("LMOVE", "node.gpu-1", "node.gpu-1", "LEFT", "RIGHT"),
        ("FLUSHALL",),
    ):
        assert denied(raw, *command), command
    # What its agent runs.
    node.lpush("node.gpu-1", "a start")
    assert node.llen("node.gpu-1") == 1
    assert node.brpop("node.gpu-1", 1) == (b"node.gpu-1", b"a start")
    node.hset("node:gpu-1:unacked", "tag", "m")
    assert node.hget("node:gpu-1:unacked", "tag") == b"m"
    assert node.set("node:gpu-1:unacked_mutex", "t", nx=True, px=1000)
    node.delete("node:gpu-1:unacked_mutex")
    node.lpush("control.from.gpu-1", "a heartbeat")


def never_read(server: ConfiguredRedis, node: str, key: str, field: str, requests: int) -> socket.socket:
    """A connection of `node`'s user that asks `requests` times for a hash field and reads nothing."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the replies pile up in Redis, not here

    def command(*args) -> bytes:
        parts = [f"*{len(args)}\r\n".encode()]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(parts)

    sock.sendall(command("AUTH", f"node-{node}", f"{node}-pw"))
    sock.sendall(command("HGET", key, field) * requests)
    return sock


def still_connected(server: ConfiguredRedis, socks: list[socket.socket]) -> list[socket.socket]:
    """The attacker's connections the server still serves (looked at from the server: reading them
    here would drain the replies the attack leaves waiting)."""
    addresses = {c["addr"] for c in server.admin().client_list()}
    return [s for s in socks if "{}:{}".format(*s.getsockname()) in addresses]


def attack(server: ConfiguredRedis, connections: int, requests: int) -> list[socket.socket]:
    """The issue's attack: the biggest value the node may write (proto-max-bulk-len allows 32 MB; 8 MB
    here), asked for again and again on many connections, the replies never read."""
    node = server.add_node("evil")
    node.hset("node:evil:unacked", "big", b"x" * 8 * MB)
    return [never_read(server, "evil", "node:evil:unacked", "big", requests) for _ in range(connections)]


def test_a_node_that_never_reads_its_replies_takes_no_memory_from_the_heartbeats(server):
    admin = server.admin()
    maxmemory = int(admin.config_get("maxmemory")["maxmemory"])
    other = server.add_node("gpu-2")
    # 12 connections that would each hold 40-80 MB of replies: 720 MB, against 1 GB of memory for all.
    socks = attack(server, connections=12, requests=6) + attack(server, connections=1, requests=10)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and still_connected(server, socks):
            other.lpush("control.from.gpu-2", "a heartbeat")  # every one taken, throughout
            time.sleep(0.01)
        # Cut off: past the output buffer's limit (64 MB at once, 16 MB for 10 s), or the largest while
        # all clients together hold more than maxmemory-clients.
        assert still_connected(server, socks) == []
        memory = admin.info("memory")
        assert memory["used_memory_peak"] < maxmemory * 0.5, memory["used_memory_peak_human"]
        for _ in range(100):
            other.lpush("control.from.gpu-2", "a heartbeat")
        assert admin.info("stats")["evicted_clients"] >= 1  # maxmemory-clients did its part
    finally:
        for s in socks:
            s.close()


def test_without_the_limits_the_same_attack_refuses_the_heartbeats(tmp_path):
    """What the limits prevent: the attack as the issue found it (Redis's defaults, a maxmemory),
    here on a server of 256 MB: the replies held for the attacker take it, and a heartbeat is refused."""
    server = ConfiguredRedis(tmp_path, conf=[("maxmemory", "256mb"), ("maxmemory-policy", "noeviction")])
    server.start()
    try:
        other = server.add_node("gpu-2")
        socks = attack(server, connections=4, requests=10)  # 320 MB of replies waiting
        with pytest.raises(redis.exceptions.ResponseError, match="used memory > 'maxmemory'"):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                other.lpush("control.from.gpu-2", "a heartbeat")
        for s in socks:
            s.close()
    finally:
        server.stop()
