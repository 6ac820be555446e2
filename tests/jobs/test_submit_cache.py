"""The submit path's cache of node shapes and team memberships: one cache read per submit, and every
change that matters is seen by the very next submit."""

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpunodes.models import Gpu, Node
from gpunodes.services import fake_inventory, node_register
from jobs import submit_cache
from jobs.services import job_submit, node_shapes
from quotas.choices import Role
from quotas.models import Membership


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


def submit(user, share, **kw):
    fields = {"gpus": 1, "gpu_type": "a10g", "command": ["true"], **kw}
    return job_submit(user=user, share=share, **fields)


def test_a_warm_submit_reads_no_shapes_and_no_membership(bob, vision_share, nodes):
    submit(bob, vision_share)
    with CaptureQueriesContext(connection) as q:
        submit(bob, vision_share)
    sql = " ".join(x["sql"] for x in q.captured_queries)
    assert "gpunodes_node" not in sql and "quotas_membership" not in sql
    # One statement stores the job and its event on PostgreSQL; two INSERTs in a transaction elsewhere.
    inserts = [x for x in q.captured_queries if "INSERT" in x["sql"]]
    assert len(inserts) == (1 if connection.vendor == "postgresql" else 2)


def test_a_new_node_type_is_seen_by_the_next_submit(bob, vision_share, nodes):
    submit(bob, vision_share)
    with pytest.raises(ValidationError, match="h100"):
        submit(bob, vision_share, gpu_type="h100")
    node_register(name="h-1", gpu_type="h100", gpus=fake_inventory("h-1", 8))
    assert submit(bob, vision_share, gpu_type="h100", gpus=8).gpu_type == "h100"


def test_a_node_that_gains_gpus_is_seen(bob, vision_share, nodes):
    with pytest.raises(ValidationError, match="largest has 4"):
        submit(bob, vision_share, gpus=6)
    node_register(name="node-1", gpu_type="a10g", gpus=fake_inventory("node-1", 8))
    assert node_shapes()["a10g"] == {8: 1, 4: 1}
    submit(bob, vision_share, gpus=8)


def test_a_deleted_node_and_deleted_gpus_are_seen(bob, vision_share, nodes):
    assert node_shapes() == {"a10g": {4: 2}}
    Gpu.objects.filter(node=nodes[1], index__gte=2).delete()
    assert node_shapes() == {"a10g": {4: 1, 2: 1}}
    Node.objects.filter(pk=nodes[0].pk).delete()
    assert node_shapes() == {"a10g": {2: 1}}
    with pytest.raises(ValidationError, match="only 1 exist"):
        submit(bob, vision_share, gpus=4)


def test_a_node_changing_gpu_type_is_seen(bob, vision_share, nodes):
    submit(bob, vision_share)
    node_register(name="node-1", gpu_type="l4", gpus=fake_inventory("node-1", 4))
    assert node_shapes() == {"a10g": {4: 1}, "l4": {4: 1}}


def test_a_new_member_can_submit_at_once(charlie, vision, vision_share, nodes):
    with pytest.raises(PermissionDenied):
        submit(charlie, vision_share)
    Membership.objects.create(team=vision, user=charlie, role=Role.MEMBER)
    assert submit(charlie, vision_share).submitted_by == charlie


def test_a_removed_member_is_refused_at_once(bob, vision, vision_share, nodes):
    submit(bob, vision_share)
    Membership.objects.filter(user=bob, team=vision).delete()
    with pytest.raises(PermissionDenied):
        submit(bob, vision_share)


def test_a_deleted_team_takes_its_memberships_from_the_cache(bob, vision, nodes):
    assert submit_cache.lookup(bob.pk)[1] == [vision.pk]
    Membership.objects.filter(team=vision).delete()
    assert submit_cache.lookup(bob.pk)[1] == []


def test_a_membership_change_is_forgotten_again_after_commit(
    bob, vision, nodes, django_capture_on_commit_callbacks
):
    """A submit that read the old rows between the change and its commit must not leave them cached."""
    with django_capture_on_commit_callbacks(execute=True):
        Membership.objects.filter(user=bob, team=vision).delete()
        # Another process re-fills the cache from rows it still sees (simulated: the old answer).
        submit_cache._set_many({submit_cache.teams_key(bob.pk): [vision.pk]})
    assert submit_cache.lookup(bob.pk)[1] == []


def test_without_a_cache_it_asks_the_database(bob, vision_share, nodes, monkeypatch):
    class Down:
        def __getattr__(self, name):
            def fail(*args, **kwargs):
                raise ConnectionError("cache down")

            return fail

    monkeypatch.setattr(submit_cache, "cache", Down())
    assert submit(bob, vision_share).pk
