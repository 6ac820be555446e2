"""A Redis ACL user per node (README, "Production setup"): with it, a real agent runs and heartbeats,
but cannot take the control queue's messages (other nodes' reports) nor write another node's queue
(starts). Real redis-server and agent processes; skipped without the redis-server binary."""

import shutil

import pytest
import redis

from tests.faults.conftest import PrivateRedis
from tests.live.conftest import wait_for
from tests.security.test_agent_process import start_agent, stop

pytestmark = pytest.mark.skipif(not shutil.which("redis-server"), reason="needs the redis-server binary")


def node_acl(name: str, password: str) -> list[str]:
    """The ACL of the README for node `name`."""
    from tests.security.test_broker_isolation import documented_acl

    return documented_acl(name, password)


@pytest.fixture
def broker(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    admin = redis.Redis(port=server.port)
    admin.execute_command("ACL", "SETUSER", "node-lone", *node_acl("lone", "lone-pw"))
    yield server, admin
    server.proc.terminate()
    server.proc.wait(timeout=10)


def test_an_agent_with_its_acl_user_runs_and_reaches_only_its_own(tmp_path, broker):
    server, admin = broker
    url = f"redis://node-lone:lone-pw@127.0.0.1:{server.port}/0"
    proc, var, jobs, out = start_agent(tmp_path, REDIS_URL=url)
    try:
        wait_for(lambda: admin.llen("control.from.lone") >= 2, 60, what="heartbeats on its intake list")
    finally:
        stop(proc, jobs, out)
    node = redis.Redis.from_url(url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        node.rpop("control")  # another node's report, taken away
    with pytest.raises(redis.exceptions.NoPermissionError):
        node.lpush("control", "a flood in front of every node's heartbeats")
    with pytest.raises(redis.exceptions.NoPermissionError):
        node.lpush("node.other", "a forged start")
    with pytest.raises(redis.exceptions.NoPermissionError):
        node.keys("*")
