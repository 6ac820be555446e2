"""/nodes/ at two cluster sizes (issue 15): the same queries whatever the number of nodes, GPUs and jobs,
and the grid's reads of nodes, GPUs and claims name only the nodes of the page shown."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpunodes.models import Node
from gpunodes.services import fake_inventory, node_register
from tests.api.conftest import run
from tests.web.conftest import submit

pytestmark = pytest.mark.django_db

PER_PAGE = 2


def _cluster(size: int, bob, share) -> None:
    """`size` nodes of 2 GPUs, a running 1-GPU job on the first GPU of each, and as many queued."""
    for i in range(size):
        node_register(name=f"n-{i:03d}", gpu_type="a10g", gpus=fake_inventory(f"n-{i:03d}", 2))
    for node in Node.objects.order_by("name"):
        run(submit(bob, share), node, [0])
        submit(bob, share)


def _grid_reads(client, url: str) -> tuple[int, list[str], str]:
    client.get(url)  # warm: the session, content types
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    sqls = [q["sql"] for q in ctx.captured_queries]
    # The grid's own reads: GPU claims and the page's nodes with their GPUs (the paginator's name list
    # and count are the page's index; the snapshot is the policy's picture of who holds what).
    grid = [s for s in sqls if "gpuclaim" in s or ('FROM "gpunodes_node"' in s and '"name" IN' in s)]
    grid += [s for s in sqls if 'FROM "gpunodes_gpu"' in s and '"node_id" IN' in s]
    return len(sqls), grid, response.content.decode()


@pytest.mark.parametrize("page", [1, 3])
def test_nodes_page_reads_only_its_nodes_at_two_sizes(as_bob, bob, vision_share, monkeypatch, page):
    monkeypatch.setattr("gpunodes.views.NODES_PER_PAGE", PER_PAGE)
    _cluster(6, bob, vision_share)
    url = f"/nodes/?page={page}"
    small, grid, body = _grid_reads(as_bob, url)
    shown = re.findall(r'data-node="([^"]+)"', body)
    assert shown == [f"n-{i:03d}" for i in range((page - 1) * PER_PAGE, page * PER_PAGE)]
    assert grid, "the grid reads its nodes, GPUs and claims"
    others = {n for n in Node.objects.values_list("name", flat=True) if n not in shown}
    for sql in grid:
        assert not any(f"'{name}'" in sql for name in others), sql

    for i in range(6, 30):  # five times the nodes, GPUs and jobs
        node_register(name=f"n-{i:03d}", gpu_type="a10g", gpus=fake_inventory(f"n-{i:03d}", 2))
    for node in Node.objects.filter(name__gte="n-006"):
        run(submit(bob, vision_share), node, [0, 1])
        submit(bob, vision_share)
    big, grid_big, body_big = _grid_reads(as_bob, url)
    assert big == small
    assert re.findall(r'data-node="([^"]+)"', body_big) == shown
    others = {n for n in Node.objects.values_list("name", flat=True) if n not in shown}
    for sql in grid_big:
        assert not any(f"'{name}'" in sql for name in others), sql


def test_admin_buttons_follow_the_node_state(as_alice, monkeypatch):
    """An admin's buttons per node state, each posting to that node's own action."""
    from gpunodes.choices import NodeState

    for i, state in enumerate([NodeState.READY, NodeState.CORDONED, NodeState.DRAINING, NodeState.LOST]):
        node_register(name=f"s-{i}", gpu_type="a10g", gpus=fake_inventory(f"s-{i}", 1))
        Node.objects.filter(name=f"s-{i}").update(state=state)
    body = as_alice.get("/nodes/").content.decode()
    cards = {m.group(1): m.group(0) for m in re.finditer(r'data-node="(s-\d)".*?</article>', body, re.S)}

    def buttons(name):
        return re.findall(r'action="/nodes/' + name + r'/(\w+)/"', cards[name])

    assert buttons("s-0") == ["cordon", "drain"]
    assert buttons("s-1") == ["uncordon", "drain"]
    assert buttons("s-2") == ["uncordon"]
    assert buttons("s-3") == []
    assert 'hx-confirm="Cordon s-0?"' in cards["s-0"] and "csrfmiddlewaretoken" in cards["s-0"]


def test_the_grid_takes_who_is_borrowed_from_the_live_picture_not_from_every_attempt(
    as_bob, bob, vision_share
):
    """Who is borrowed depends on the whole cluster; the pages' shared live picture has it, so while
    nothing changed a /nodes/ view loads no attempts beyond the claims of the nodes it shows."""
    _cluster(4, bob, vision_share)
    as_bob.get("/nodes/")  # the live picture is built (and cached) here
    with CaptureQueriesContext(connection) as ctx:
        assert as_bob.get("/nodes/").status_code == 200
    whole = [q["sql"] for q in ctx.captured_queries if re.search(r'FROM "jobs_(attempt|job)"', q["sql"])]
    assert whole == []
