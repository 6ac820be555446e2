"""/advice/ (issue 38): admins start a run, watch it (htmx polls; 286 when done), read the trade-off
(chart data, the frontier with today's point and the recommended one, what changes for whom) and make a
layout plan of a point, which opens the plan's page (its what-if), changing nothing."""

import io
import json
import re

import pytest
from django.core.management import call_command

from quotas.models import LayoutPlan, Share
from tests.web.conftest import hx

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(db):
    call_command("seed_history", jobs=60, stdout=io.StringIO())


def test_only_admins_see_the_advisor(as_alice, as_bob):
    assert as_bob.get("/advice/").status_code == 403
    page = as_alice.get("/advice/")
    assert page.status_code == 200
    assert b'data-testid="advice-form"' in page.content
    assert b'href="/advice/"' in as_alice.get("/layout/").content  # found from the layout page


def test_bad_weeks_are_said_beside_the_form(as_alice):
    r = as_alice.post("/advice/", {"weeks": "9"})
    assert r.status_code == 400
    assert "less than or equal to 4" in r.content.decode()


def test_a_run_shows_the_trade_off_and_a_point_becomes_a_plan(as_alice, history, celery_eager):
    r = as_alice.post("/advice/", {"weeks": "1"})
    assert r.status_code == 302
    url = r["Location"]
    page = as_alice.get(url).content.decode()
    assert 'data-state="done"' in page
    assert 'data-testid="advice-frontier"' in page and ">today<" in page and "recommended" in page
    assert "replays in" in page and "History: 1 week" in page
    data = json.loads(re.search(r'<script id="advice-data"[^>]*>(.*?)</script>', page, re.S).group(1))
    assert data["today"]["utilisation"] >= 0 and len(data["points"]["utilisation"]) > 1
    assert len(data["frontier"]["utilisation"]) >= 1
    # htmx polling stops (286) once the answer is there.
    assert hx(as_alice, url).status_code == 286
    before = list(
        Share.objects.values_list("name", "strategy", "borrow_limit", "min_runtime_s").order_by("name")
    )
    r = as_alice.post(url + "plan/", {"point": "0"})
    assert r.status_code == 302 and "/layout/plans/" in r["Location"]
    assert LayoutPlan.objects.count() == 1
    assert as_alice.get(r["Location"]).status_code == 200
    assert (
        list(Share.objects.values_list("name", "strategy", "borrow_limit", "min_runtime_s").order_by("name"))
        == before
    )
    r = as_alice.post(url + "plan/", {"point": "x"})
    assert r.status_code == 400 and "point must be a number" in r.content.decode()


def test_a_running_run_shows_its_progress_and_polls(as_alice, history, monkeypatch):
    monkeypatch.setattr("quotas.advice._enqueue", lambda run_id, index: None)
    url = as_alice.post("/advice/", {"weeks": "1"})["Location"]
    r = hx(as_alice, url)
    assert r.status_code == 200
    body = r.content.decode()
    assert (
        'data-testid="advice-progress"' in body
        and "0 of at least" in body
        and 'hx-trigger="every 1s"' in body
    )
    r = as_alice.post(url + "cancel/")
    assert r.status_code == 302
    assert "Cancelled after 0 replays" in as_alice.get(url).content.decode()
