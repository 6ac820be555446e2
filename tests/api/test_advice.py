"""/api/v1/advice/ (issue 38): admins only, field messages on bad input, a run's status and answer, a
point made into a layout plan."""

import io

import pytest
from django.core.management import call_command

from quotas.models import LayoutPlan
from tests.api.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(db):
    call_command("seed_history", jobs=60, stdout=io.StringIO())


def test_only_admins_ask_for_advice(as_bob, as_charlie, anon):
    for client in (as_bob, as_charlie):
        assert client.post("/api/v1/advice/", {"weeks": 1}, format="json").status_code == 403
        assert client.get("/api/v1/advice/x/").status_code == 403
    assert anon.post("/api/v1/advice/", {"weeks": 1}, format="json").status_code in (401, 403)


@pytest.mark.parametrize("weeks", [0, 5, "two", None])
def test_bad_weeks_are_a_400_naming_the_field(as_alice, weeks):
    r = as_alice.post("/api/v1/advice/", {"weeks": weeks}, format="json")
    assert r.status_code == 400
    assert "weeks" in r.json() and r.json()["weeks"][0]


def test_a_run_answers_with_its_advice(as_alice, history, celery_eager):
    r = as_alice.post("/api/v1/advice/", {"weeks": 1}, format="json")
    assert r.status_code == 202
    body = r.json()
    assert body["url"].endswith(f"/api/v1/advice/{body['id']}/")
    got = as_alice.get(body["url"]).json()
    assert got["state"] == "done"
    a = got["advice"]
    assert a["replays"] == got["replays_done"] > 1
    assert {"today", "frontier", "recommended", "rule"} <= set(a)
    assert {"shares", "groups", "settings"} <= set(a["frontier"][0]["layout"])
    for key in ("utilisation", "owners_p95_wait_s", "lost_gpu_seconds", "changes"):
        assert key in a["frontier"][0]
    # A point off the frontier is a 400 naming the field; a point on it a plan (201), applied by nobody.
    r = as_alice.post(f"/api/v1/advice/{body['id']}/plan/", {"point": len(a["frontier"])}, format="json")
    assert r.status_code == 400 and "point" in r.json()
    r = as_alice.post(f"/api/v1/advice/{body['id']}/plan/", {"point": "x"}, format="json")
    assert r.status_code == 400 and "point" in r.json()
    r = as_alice.post(f"/api/v1/advice/{body['id']}/plan/", {"point": 0}, format="json")
    assert r.status_code == 201
    assert LayoutPlan.objects.filter(pk=r.json()["plan"]).exists()


def test_an_unknown_run_is_a_404(as_alice):
    assert as_alice.get("/api/v1/advice/nope/").status_code == 404
    assert as_alice.post("/api/v1/advice/nope/cancel/").status_code == 404


def test_cancel_says_the_run_is_cancelled(as_alice, history, monkeypatch):
    monkeypatch.setattr("quotas.advice._enqueue", lambda run_id, index: None)
    run_id = as_alice.post("/api/v1/advice/", {"weeks": 1}, format="json").json()["id"]
    r = as_alice.post(f"/api/v1/advice/{run_id}/cancel/")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client_for().get(f"/api/v1/advice/{run_id}/").status_code in (401, 403)
