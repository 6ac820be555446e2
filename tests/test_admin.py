"""The admin is useful from day one: every model's list and change pages render for an admin."""

import pytest
from django.urls import reverse

from jobs.models import Job

PAGES = [
    "quotas_team",
    "quotas_share",
    "quotas_sharecapacity",
    "quotas_membership",
    "gpunodes_node",
    "gpunodes_gpu",
    "gpunodes_gpufailure",
    "jobs_job",
    "jobs_attempt",
    "jobs_jobevent",
]


@pytest.mark.parametrize("name", PAGES)
def test_admin_changelist_renders(client, alice, bob, vision_share, nodes, name):
    Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1)
    client.force_login(alice)
    assert client.get(reverse(f"admin:{name}_changelist")).status_code == 200


def test_admin_job_page_shows_attempts_and_events(client, alice, bob, vision_share, nodes):
    job = Job.objects.create(share=vision_share, submitted_by=bob, gpu_type="a10g", gpus=1)
    client.force_login(alice)
    response = client.get(reverse("admin:jobs_job_change", args=[job.pk]))
    assert response.status_code == 200
    assert b"Attempts" in response.content and b"Job events" in response.content


def test_admin_refuses_anonymous(client, db):
    assert client.get(reverse("admin:jobs_job_changelist")).status_code == 302


def test_admin_cordons_and_drains_nodes_through_the_service(client, alice, nodes, monkeypatch):
    from gpunodes.choices import NodeState
    from gpunodes.models import Node
    from quotas.models import AuditEntry

    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    client.force_login(alice)
    url = reverse("admin:gpunodes_node_changelist")
    first, second = nodes
    response = client.post(url, {"action": "cordon", "_selected_action": [first.pk]}, follow=True)
    assert response.status_code == 200
    client.post(url, {"action": "drain", "_selected_action": [second.pk]})
    states = dict(Node.objects.values_list("name", "state"))
    assert states[first.name] == NodeState.CORDONED
    assert states[second.name] in (NodeState.DRAINING, NodeState.CORDONED)
    assert AuditEntry.objects.filter(object_type="node", action="cordon", actor=alice).exists()
    client.post(url, {"action": "uncordon", "_selected_action": [first.pk]})
    assert Node.objects.get(pk=first.pk).state == NodeState.READY
