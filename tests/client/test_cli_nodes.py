"""`gpuquota nodes` says how many GPUs of each node are out of capacity (found broken, or re-checking)."""

import time

from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat


def test_nodes_lists_the_unhealthy_gpus(cli, live_server, bob, nodes, config_file, settings):
    settings.NODE_AUTO_ACCEPT = True
    fault = {"index": 1, "reason": "ecc", "detail": "2 uncorrectable ECC error(s)", "at": time.time()}
    inventory = [g.__dict__ for g in fake_inventory("node-1", 4)]
    node_heartbeat("node-1", "a10g", inventory, [], "boot-1", sent_at=time.time(), unhealthy=[fault])
    code, _, err = cli("login", live_server.url, "-u", "bob", "--password-stdin", stdin="bob-pw-123\n")
    assert code == 0, err
    code, out, _ = cli("nodes")
    assert code == 0
    header, first, second = out.splitlines()[:3]
    assert "UNHEALTHY" in header
    assert first.split()[:4] == ["node-1", "a10g", "0/4", "1"]
    assert second.split()[:4] == ["node-2", "a10g", "0/4", "READY"]
