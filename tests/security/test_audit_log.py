"""The audit log: every admin change to shares, teams and nodes, who made it, before and after, through
the API, the services and the Django admin; shown read-only to admins at /api/v1/audit/."""

import re

import pytest
from django.urls import reverse

from gpunodes import services as node_services
from quotas import services
from quotas.models import AuditEntry, Share
from tests.security.conftest import client_as


def entries(**kw):
    return list(AuditEntry.objects.filter(**kw).order_by("id"))


def test_a_share_change_through_the_api_is_recorded_as_what_changed(world):
    """One entry per applied layout version: the fields that changed, before -> after, not two records."""
    r = client_as(world, "admin").patch(
        "/api/v1/shares/vision-main/", {"capacity": {"a10g": 2}, "strategy": "LEND"}, format="json"
    )
    assert r.status_code == 200
    [entry] = entries(object_type="layout")
    assert (entry.actor_name, entry.action, entry.object_id) == ("alice", "apply", "1")
    assert entry.object_repr == "version 1: 1 share: 1 changed (vision-main)"
    assert [(c["field"], c["before"], c["after"]) for c in entry.changes] == [
        ("capacity.a10g", 4, 2),
        ("strategy", "LEND_AND_BORROW", "LEND"),
    ]
    assert {c["object"] for c in entry.changes} == {"share vision-main (changed)"}


def test_share_create_and_delete_are_recorded(world):
    client = client_as(world, "admin")
    client.post("/api/v1/shares/", {"name": "s2", "team": "vision", "capacity": {"a10g": 1}}, format="json")
    client.patch("/api/v1/shares/s2/", {"state": "DISABLED"}, format="json")
    assert client.delete("/api/v1/shares/s2/").status_code == 204
    created, disabled, deleted = entries(object_type="layout")
    assert created.object_repr == "version 1: 1 share: 1 added (s2)"
    assert {
        "object": "share s2 (added)",
        "field": "capacity.a10g",
        "before": None,
        "after": 1,
    } in created.changes
    assert [(c["field"], c["before"], c["after"]) for c in disabled.changes] == [
        ("state", "ENABLED", "DISABLED")
    ]
    assert deleted.object_repr == "version 3: 1 share: 1 removed (s2)"
    assert {c["object"] for c in deleted.changes} == {"share s2 (removed)"}
    assert {"field": "team", "before": "vision", "after": None} in [
        {k: c[k] for k in ("field", "before", "after")} for c in deleted.changes
    ]


def test_a_refused_change_leaves_no_entry(world):
    before = AuditEntry.objects.count()
    client = client_as(world, "admin")
    assert client.delete("/api/v1/shares/vision-main/").status_code == 409  # has jobs
    assert client.patch("/api/v1/shares/vision-main/", {"borrow_limit": -5}, format="json").status_code == 400
    assert client_as(world, "member").patch("/api/v1/shares/vision-main/", {"description": "x"}).status_code
    assert AuditEntry.objects.count() == before


def test_an_update_that_changes_nothing_is_not_recorded(world):
    before = AuditEntry.objects.count()
    client_as(world, "admin").patch("/api/v1/shares/vision-main/", {"state": "ENABLED"}, format="json")
    assert AuditEntry.objects.count() == before


def test_team_changes_record_members(world):
    client = client_as(world, "admin")
    client.post("/api/v1/teams/", {"name": "Audio", "slug": "audio"}, format="json")
    client.patch("/api/v1/teams/audio/", {"members": [{"username": "bob", "role": "manager"}]}, format="json")
    client.delete("/api/v1/teams/audio/")
    actions = [e.action for e in entries(object_type="team", object_repr="Audio")]
    assert actions == ["create", "update", "delete"]
    update = entries(object_type="team", action="update")[0]
    assert update.before["members"] == [] and update.after["members"] == [
        {"username": "bob", "role": "manager"}
    ]


def test_node_cordon_uncordon_drain_are_recorded_once(world):
    client = client_as(world, "admin")
    for verb in ("cordon", "cordon", "uncordon", "drain"):
        assert client.post(f"/api/v1/nodes/node-1/{verb}/").status_code == 200
    got = [(e.action, e.before["state"], e.after["state"]) for e in entries(object_type="node")]
    assert got == [
        ("cordon", "READY", "CORDONED"),
        ("uncordon", "CORDONED", "READY"),
        ("drain", "READY", "DRAINING"),
    ]
    assert {e.actor_name for e in entries(object_type="node")} == {"alice"}


def test_a_service_call_without_actor_is_recorded_as_the_system(world):
    share = Share.objects.get(name="vision-main")
    services.share_update(share=share, description="by a script")
    node_services.node_cordon(node=world_node(world))
    got = entries(action__in=["apply", "cordon"])
    assert [e.action for e in got] == ["apply", "cordon"] and {e.actor_name for e in got} == {""}


def world_node(world):
    from gpunodes.models import Node

    return Node.objects.get(name=world["node"])


def test_the_django_admin_records_changes_with_inlines(world, client):
    client.force_login(world["users"]["admin"])
    share = Share.objects.get(name="spare")
    url = reverse("admin:quotas_share_change", args=[share.pk])
    cap = share.capacities.get()
    data = {
        "name": "spare",
        "team": share.team_id,
        "description": "changed in the admin",
        "strategy": "LEND",
        "borrow_limit": "-1",
        "min_runtime_s": "0",
        "state": "ENABLED",
        "weight": "1",
        "allowed_images": "[]",
        "capacities-TOTAL_FORMS": "1",
        "capacities-INITIAL_FORMS": "1",
        "capacities-MIN_NUM_FORMS": "0",
        "capacities-MAX_NUM_FORMS": "1000",
        "capacities-0-id": str(cap.pk),
        "capacities-0-share": str(share.pk),
        "capacities-0-gpu_type": "a10g",
        "capacities-0-max_gpus": "3",
    }
    r = client.post(url, data)
    assert r.status_code == 302, re.findall(r"errorlist.{0,300}", r.content.decode(), re.S)
    [entry] = entries(object_type="share", action="update", object_repr="spare")
    assert entry.actor_name == "alice"
    assert entry.before["capacity"] == {"a10g": 1} and entry.after["capacity"] == {"a10g": 3}
    assert entry.after["description"] == "changed in the admin"


def test_the_django_admin_records_node_edits_and_deletes(world, client):
    from gpunodes.models import Node

    client.force_login(world["users"]["admin"])
    node = Node.objects.get(name="node-2")
    r = client.post(reverse("admin:gpunodes_node_delete", args=[node.pk]), {"post": "yes"})
    assert r.status_code == 302
    [entry] = entries(object_type="node", action="delete")
    assert entry.before["name"] == "node-2" and entry.actor_name == "alice"


def test_the_audit_log_is_read_only_in_the_admin(world, client):
    client.force_login(world["users"]["admin"])
    assert client.get(reverse("admin:quotas_auditentry_changelist")).status_code == 200
    assert client.get(reverse("admin:quotas_auditentry_add")).status_code == 403


@pytest.mark.parametrize(
    "query,count",
    [("", 3), ("object_type=node", 2), ("actor=alice", 3), ("action=cordon", 1), ("object=spare", 1)],
)
def test_the_audit_api_filters(world, query, count):
    client = client_as(world, "admin")
    client.post("/api/v1/nodes/node-1/cordon/")
    client.post("/api/v1/nodes/node-1/drain/")
    r = client.get(f"/api/v1/audit/?{query}")
    assert r.status_code == 200 and r.json()["count"] == count
    first = r.json()["results"][0]
    assert set(first) == {
        "id",
        "at",
        "actor",
        "action",
        "object_type",
        "object_id",
        "object_repr",
        "before",
        "after",
    }
