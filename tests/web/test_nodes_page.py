"""The nodes page: a grid of hosts and GPUs coloured by share, hatched while borrowed, with heartbeat
age; cordon / uncordon / drain for admins only."""

import pytest
from django.test import Client

from gpunodes.choices import NodeState
from gpunodes.models import Node
from tests.api.conftest import run
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def test_grid_colours_gpus_by_share_and_hatches_borrowed(as_bob, bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    job = submit(bob, vision_share, gpus=2)
    run(job, nodes[1], [0, 1], borrowed=True)
    body = as_bob.get("/nodes/").content.decode()
    assert 'data-node="node-1"' in body and 'data-node="node-2"' in body
    assert body.count("vision-main · borrowed") == 2
    assert body.count('hatched" title=') == 2
    assert f"job {job.pk}{' ' + job.name if job.name else ''} (borrowed GPU)" in body
    assert body.count(">free<") == 2


def test_members_see_no_admin_buttons(as_bob, nodes):
    assert "/cordon/" not in as_bob.get("/nodes/").content.decode()


def test_admin_cordons_uncordons_and_drains(as_alice, nodes):
    assert "/nodes/node-1/cordon/" in as_alice.get("/nodes/").content.decode()
    response = as_alice.post("/nodes/node-1/cordon/", HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'id="grid"' in response.content.decode()
    assert Node.objects.get(name="node-1").state == NodeState.CORDONED
    as_alice.post("/nodes/node-1/uncordon/")
    assert Node.objects.get(name="node-1").state == NodeState.READY
    response = as_alice.post("/nodes/node-1/drain/")
    assert response.status_code == 302
    assert Node.objects.get(name="node-1").state == NodeState.DRAINING


def test_members_may_not_cordon(as_bob, nodes):
    assert as_bob.post("/nodes/node-1/cordon/").status_code == 403
    assert Node.objects.get(name="node-1").state == NodeState.READY


def test_unknown_action_and_lost_node(as_alice, nodes):
    assert as_alice.post("/nodes/node-1/explode/").status_code == 400
    Node.objects.filter(name="node-1").update(state=NodeState.LOST)
    assert as_alice.post("/nodes/node-1/drain/").status_code == 409


def test_csrf_is_enforced(alice, nodes):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    assert client.post("/nodes/node-1/cordon/").status_code == 403


def test_nodes_page_runs_constant_queries(as_bob, bob, vision_share, nodes, constant_queries):
    run(submit(bob, vision_share), nodes[0], [0])

    def grow():
        for i in range(1, 4):
            run(submit(bob, vision_share), nodes[0], [i])
        for _ in range(20):
            submit(bob, vision_share)

    constant_queries(as_bob, "/nodes/", grow)
    assert hx(as_bob, "/nodes/?part=grid").content.decode().lstrip().startswith("<section")


def test_a_big_cluster_is_shown_a_page_of_nodes_at_a_time(as_bob, monkeypatch):
    from gpunodes.services import fake_inventory, node_register

    monkeypatch.setattr("gpunodes.views.NODES_PER_PAGE", 3)
    for i in range(5):
        node_register(name=f"big-{i}", gpu_type="a10g", gpus=fake_inventory(f"big-{i}", 1))
    first = as_bob.get("/nodes/").content.decode()
    second = as_bob.get("/nodes/?page=2").content.decode()
    assert first.count('data-node="big-') == 3 and second.count('data-node="big-') == 2
    assert "nodes 1–3 of 5" in first and "?page=2" in first
    assert "part=grid&amp;page=2" in second  # the live refresh stays on its page


def test_a_page_of_nodes_reads_only_those_nodes(as_bob, monkeypatch):
    from gpunodes import services
    from gpunodes.services import fake_inventory, node_register

    monkeypatch.setattr("gpunodes.views.NODES_PER_PAGE", 2)
    for i in range(5):
        node_register(name=f"big-{i}", gpu_type="a10g", gpus=fake_inventory(f"big-{i}", 1))
    asked = []
    real = services.node_grid

    def spy(**kw):
        grid = real(**kw)
        asked.append([row["node"].name for row in grid])
        return grid

    monkeypatch.setattr(services, "node_grid", spy)
    as_bob.get("/nodes/?page=2")
    assert asked == [["big-2", "big-3"]]
