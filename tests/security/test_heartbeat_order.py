"""A heartbeat is ordered by when its agent sent it, not by what its boot id claims (issue 30,
finding 1a): a far-future boot id made every real heartbeat of the node look like "a late heartbeat
from a previous agent boot" for ever (the node went LOST while alive, its jobs ran on, copies started
elsewhere). A heartbeat sent before the last one applied is dropped; a heartbeat dated in the future
holds the node's order for at most MESSAGE_CLOCK_SKEW_S."""

import logging
import time

import pytest

from gpunodes.agent.main import new_boot_id
from gpunodes.models import Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat


def beat(name, boot_id, sent_at, running=()):
    inv = [g.__dict__ for g in fake_inventory(name, 2)]
    return node_heartbeat(name, "a10g", inv, [list(r) for r in running], boot_id, sent_at=sent_at)


@pytest.fixture
def node(db, settings):
    settings.NODE_AUTO_ACCEPT = True
    settings.MESSAGE_CLOCK_SKEW_S = 30
    beat("sa1", new_boot_id(), time.time())
    return "sa1"


def test_a_far_future_boot_id_does_not_pin_the_node(node):
    beat(node, "99999999999999-forged", time.time())
    real = new_boot_id()
    result = beat(node, real, time.time() + 1)
    assert not result.get("ignored")
    assert Node.objects.get(name=node).boot_id == real


def test_a_heartbeat_sent_before_the_last_applied_one_is_dropped(node, caplog):
    now = time.time()
    beat(node, "boot-b", now)
    with caplog.at_level(logging.INFO):
        assert beat(node, "boot-a", now - 5).get("ignored")  # the previous agent's last words
    assert Node.objects.get(name=node).boot_id == "boot-b"
    assert "late heartbeat" in caplog.text and node in caplog.text


def test_a_heartbeat_from_the_future_holds_the_order_for_at_most_the_clock_skew(node):
    now = time.time()
    beat(node, "boot-x", now + 10 * 365 * 86400)
    assert beat(node, "boot-y", now + 1).get("ignored")  # within the skew: late
    assert not beat(node, "boot-y", now + 31).get("ignored")  # past it: applied
    assert Node.objects.get(name=node).boot_id == "boot-y"
