"""Nodes: read by everyone logged in; admins cordon, uncordon and drain."""

from gpunodes.choices import NodeState
from gpunodes.models import Node
from gpunodes.services import fake_inventory, node_register
from tests.api.conftest import run, submit

URL = "/api/v1/nodes/"


def test_a_member_reads_nodes_with_gpus_in_use(as_bob, bob, vision_share, nodes):
    run(submit(bob, vision_share, gpus=3), nodes[0], [0, 1, 2])
    r = as_bob.get(URL)
    assert r.status_code == 200
    first = r.json()["results"][0]
    assert (first["name"], first["gpu_type"], first["gpus"], first["gpus_in_use"], first["state"]) == (
        "node-1",
        "a10g",
        4,
        3,
        "READY",
    )
    assert as_bob.get(f"{URL}node-2/").json()["gpus_in_use"] == 0


def test_a_node_name_with_dots_is_found(as_bob, bob):
    node_register(name="g5.xlarge-1", gpu_type="a10g", gpus=fake_inventory("g5.xlarge-1", 1))
    assert as_bob.get(f"{URL}g5.xlarge-1/").json()["gpus"] == 1


def test_anonymous_gets_401(anon, nodes):
    assert anon.get(URL).status_code == 401
    assert anon.post(f"{URL}node-1/cordon/").status_code == 401


def test_an_admin_cordons_and_uncordons(as_alice, nodes, no_messages, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        r = as_alice.post(f"{URL}node-1/cordon/")
    assert r.status_code == 200
    assert r.json()["state"] == NodeState.CORDONED
    assert ("pass", "node cordoned") in no_messages
    r = as_alice.post(f"{URL}node-1/uncordon/")
    assert r.json()["state"] == NodeState.READY


def test_an_admin_drains_a_node(as_alice, nodes):
    r = as_alice.post(f"{URL}node-2/drain/")
    assert r.status_code == 200
    assert Node.objects.get(name="node-2").state == NodeState.DRAINING


def test_cordoning_twice_changes_nothing(as_alice, nodes):
    as_alice.post(f"{URL}node-1/cordon/")
    assert as_alice.post(f"{URL}node-1/cordon/").json()["state"] == NodeState.CORDONED


def test_a_lost_node_cannot_be_uncordoned(as_alice, nodes):
    Node.objects.filter(name="node-1").update(state=NodeState.LOST)
    r = as_alice.post(f"{URL}node-1/uncordon/")
    assert r.status_code == 409
    assert "heartbeats again" in r.json()["detail"]


def test_members_cannot_cordon_uncordon_or_drain(as_bob, as_charlie, nodes):
    for client in (as_bob, as_charlie):
        for verb in ("cordon", "uncordon", "drain"):
            r = client.post(f"{URL}node-1/{verb}/")
            assert r.status_code == 403
            assert r.json()["detail"] == "Only an admin may do this."
    assert Node.objects.get(name="node-1").state == NodeState.READY


def test_an_unknown_node_is_a_404(as_alice, nodes):
    assert as_alice.post(f"{URL}nope/cordon/").status_code == 404


def test_the_node_list_runs_a_constant_number_of_queries(as_bob, db, django_assert_max_num_queries):
    for i in range(6):
        node_register(name=f"n{i}", gpu_type="a10g", gpus=fake_inventory(f"n{i}", 4))
    as_bob.get(URL)
    with django_assert_max_num_queries(3):
        r = as_bob.get(URL)
    assert r.json()["count"] == 6
