"""The audit log's filter by object type offers every type it records: GPUs too (their faults and repairs
are audited as `gpu`, and neither the API's filter nor the page's offered it: issue 42.6)."""

import pytest

from quotas.models import AuditEntry

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu_and_node_entries():
    AuditEntry.objects.create(action="gpu_unhealthy", object_type="gpu", object_id="7", object_repr="gpu-1/2")
    AuditEntry.objects.create(action="cordon", object_type="node", object_id="1", object_repr="gpu-1")


def test_the_api_filters_gpu_entries(as_alice, gpu_and_node_entries):
    r = as_alice.get("/api/v1/audit/", {"object_type": "gpu"})
    assert r.status_code == 200, r.content
    assert [e["object_repr"] for e in r.json()["results"]] == ["gpu-1/2"]


def test_the_audit_page_offers_and_filters_gpu_entries(client, alice, gpu_and_node_entries):
    client.force_login(alice)
    page = client.get("/audit/", {"type": "gpu"}).content.decode()
    assert '<option value="gpu" selected>GPU</option>' in page
    assert "gpu-1/2" in page and "<b>gpu-1</b>" not in page
