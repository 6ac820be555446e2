"""A PENDING node's heartbeats change nothing but its own join request (issue 30, finding 1 and the
low item "a PENDING node's heartbeat creates GPU rows and inventories are unbounded"): no GPU rows until
an admin accepts it, and what any heartbeat may register is bounded (GPUs, and the size of each field).
A refused heartbeat is logged with the node and the reason."""

import logging

import pytest

from gpunodes import services
from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat


def beat(name, inventory=None, **kw):
    inv = inventory if inventory is not None else [g.__dict__ for g in fake_inventory(name, 4)]
    return node_heartbeat(name, "a10g", inv, kw.pop("running", []), kw.pop("boot_id", "boot-1"), **kw)


@pytest.fixture
def pending_by_default(db, settings):
    settings.NODE_AUTO_ACCEPT = False
    settings.NODE_JOIN_TOKEN = "join-secret"


def test_a_pending_node_gets_no_gpu_rows_until_accepted(pending_by_default, alice, no_messages):
    assert beat("pend")["state"] == NodeState.PENDING
    node = Node.objects.get(name="pend")
    assert node.state == NodeState.PENDING and not Gpu.objects.filter(node=node).exists()
    services.node_accept(node=node, actor=alice)
    beat("pend", boot_id="boot-1")
    assert Gpu.objects.filter(node=node).count() == 4


def test_a_node_with_the_join_token_gets_its_gpu_rows_at_once(pending_by_default):
    assert beat("joined", join_token="join-secret")["state"] == NodeState.READY
    assert Gpu.objects.filter(node__name="joined").count() == 4


def gpus(n, **field):
    return [
        {"index": i, "uuid": f"GPU-big-{i}", "model": "NVIDIA A10G", "memory_mb": 1, **field}
        for i in range(n)
    ]


@pytest.mark.parametrize(
    "why, heartbeat",
    [
        ("GPUs", {"inventory": gpus(10_000)}),
        ("uuid", {"inventory": gpus(1, uuid="U" * 100_000)}),
        ("model", {"inventory": gpus(1, model="M" * 100_000)}),
        ("memory", {"inventory": gpus(1, memory_mb=2**70)}),
        ("index", {"inventory": gpus(1, index=-1)}),
        ("index", {"inventory": [*gpus(1), *gpus(1)]}),
        ("field", {"inventory": gpus(1, extra="x")}),
        ("labels", {"labels": {f"k{i}": "v" for i in range(10_000)}}),
        ("labels", {"labels": {"k": "v" * 100_000}}),
        ("hostname", {"hostname": "h" * 100_000}),
        ("boot", {"boot_id": "b" * 100_000}),
        ("running", {"running": [[i, 1] for i in range(100_000)]}),
        ("running", {"running": [["1", "x"]]}),
        ("unhealthy", {"unhealthy": [{"index": 9, "reason": "xid", "detail": "", "at": 1.0}]}),
        ("unhealthy", {"unhealthy": [{"index": 1, "reason": "cosmic-rays", "detail": "", "at": 1.0}]}),
        ("unhealthy", {"unhealthy": [{"index": 1, "reason": "xid", "detail": "", "at": float("nan")}]}),
        ("unhealthy", {"unhealthy": [{"index": 1, "reason": "xid", "detail": "", "at": 1.0, "x": 1}]}),
        ("unhealthy", {"unhealthy": [{"index": 1, "reason": "xid", "detail": "", "at": 1.0}] * 2}),
        ("unhealthy", {"unhealthy": {"index": 1}}),
        ("detail", {"unhealthy": [{"index": 1, "reason": "xid", "detail": "D" * 100_000, "at": 1.0}]}),
        ("rechecked", {"rechecked": [[1, "x"]]}),
        ("rechecked", {"rechecked": [[9, 1]]}),
        ("rechecked", {"rechecked": [[1, 1]] * 100_000}),
        ("address", {"address": "10.0.0.1 && reboot"}),
        ("address", {"address": "a" * 100_000}),
    ],
)
@pytest.mark.parametrize("state", ["new", "accepted"])
def test_an_oversized_or_malformed_heartbeat_is_refused_and_logged(
    db, settings, caplog, why, heartbeat, state
):
    settings.NODE_AUTO_ACCEPT = True
    if state == "accepted":
        beat("big")
    before = list(Gpu.objects.values_list("node__name", "index", "uuid", "model", "health"))
    labels = dict(Node.objects.filter(name="big").values_list("name", "labels"))
    with caplog.at_level(logging.WARNING):
        assert beat("big", **heartbeat).get("refused")
    assert list(Gpu.objects.values_list("node__name", "index", "uuid", "model", "health")) == before
    assert dict(Node.objects.filter(name="big").values_list("name", "labels")) == labels
    assert not Node.objects.exclude(address="").exists()
    assert "big" in caplog.text and why in caplog.text
