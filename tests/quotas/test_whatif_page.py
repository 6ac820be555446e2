"""The what-if page: a preview or a sweep answers with its run's progress, which polls the run's partial
until the answer (HTTP 286) shows the result; bad sweep input comes back beside the field."""

import io

import pytest
from django.core.management import call_command

from quotas import whatif
from quotas.services import duration_words
from tests.web.conftest import logged_in

pytestmark = pytest.mark.django_db

SHARE = "hist-team-1"


@pytest.fixture
def history(no_messages, db):
    call_command("seed_history", jobs=120, stdout=io.StringIO())
    return SHARE


@pytest.fixture
def as_alice(alice):
    return logged_in(alice)


@pytest.fixture
def held(monkeypatch):
    """No worker yet: the replays are asked for, not run."""
    asked = []
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: asked.append((run_id, index)))
    return asked


def preview_data(**changes):
    from quotas.models import Share

    share = Share.objects.select_related("team").get(name=SHARE)
    data = {
        "name": share.name,
        "team": share.team.slug,
        "strategy": share.strategy,
        "borrow_limit": share.borrow_limit,
        "state": share.state,
        "cap_v100": share.capacity_map()["v100"],
    }
    return {**data, **changes}


def test_a_preview_shows_progress_then_the_result_with_286(as_alice, history, held):
    response = as_alice.post(
        f"/shares/{SHARE}/whatif/",
        preview_data(strategy="RESERVE", borrow_limit="-1"),
        HTTP_HX_REQUEST="true",
    )
    body = response.content.decode()
    assert (
        response.status_code == 200
        and 'data-testid="whatif-progress"' in body
        and 'hx-trigger="every 1s"' in body
    )
    run_id = held[0][0]
    assert f'hx-get="/whatif/{run_id}/"' in body and "waiting for a worker" in body

    whatif.run_part(run_id, 0, isolated=False)
    poll = as_alice.get(f"/whatif/{run_id}/", HTTP_HX_REQUEST="true")
    assert poll.status_code == 200 and "Replayed 120 jobs (50 %)" in poll.content.decode()

    whatif.run_part(run_id, 1, isolated=False)
    done = as_alice.get(f"/whatif/{run_id}/", HTTP_HX_REQUEST="true")
    body = done.content.decode()
    assert done.status_code == 286  # htmx stops polling
    assert 'data-testid="whatif-shares"' in body and 'data-plot="whatif"' in body and "hx-trigger" not in body
    assert "Replayed 120 submissions" in body
    # The window's own length, not "the week" (a young cluster's window was 30 minutes: issue 42.6).
    length = whatif.status(run_id).window["length_s"]
    assert f"Every figure is over the replayed {duration_words(length)};" in body and "week" not in body

    page = as_alice.get(f"/whatif/{run_id}/")  # without htmx: a page of its own
    assert page.status_code == 200 and 'data-testid="whatif-shares"' in page.content.decode()


def test_the_same_preview_asked_again_while_running_shows_the_same_run(as_alice, history, held):
    for _ in range(2):
        as_alice.post(f"/shares/{SHARE}/whatif/", preview_data(borrow_limit="50"), HTTP_HX_REQUEST="true")
    assert len({run_id for run_id, _ in held}) == 1 and len(held) == 2  # one run, its two replays asked once


def test_a_run_that_is_gone_is_404_and_only_admins_poll(as_alice, bob, history, held):
    assert as_alice.get("/whatif/0123abcd/", HTTP_HX_REQUEST="true").status_code == 404
    as_alice.post(f"/shares/{SHARE}/whatif/", preview_data(), HTTP_HX_REQUEST="true")
    assert logged_in(bob).get(f"/whatif/{held[0][0]}/", HTTP_HX_REQUEST="true").status_code == 403


def test_the_share_page_offers_the_sweep(as_alice, history):
    body = as_alice.get(f"/shares/{SHARE}/").content.decode()
    assert 'id="sweep-form"' in body and 'value="capacity:v100"' in body and "js/whatif.js" in body
    assert 'id="sweep-form"' not in as_alice.get("/shares/new/").content.decode()


def test_a_sweep_answers_progress_then_the_trade_off(as_alice, history, held):
    from quotas.models import Share

    Share.objects.filter(name=SHARE).update(strategy="LEND_AND_BORROW")
    response = as_alice.post(
        f"/shares/{SHARE}/sweep/",
        {"setting": "borrow_limit", "values": "0, 50, 100, 200"},
        HTTP_HX_REQUEST="true",
    )
    body = response.content.decode()
    assert response.status_code == 200 and 'data-testid="sweep-run"' in body and len(held) == 4
    run_id = held[0][0]
    for index in range(4):
        whatif.run_part(run_id, index, isolated=False)
    done = as_alice.get(f"/whatif/{run_id}/", HTTP_HX_REQUEST="true")
    body = done.content.decode()
    assert done.status_code == 286 and 'data-plot="sweep"' in body and 'data-testid="sweep-table"' in body
    assert all(label in body for label in ("0 %", "50 %", "100 %", "200 %"))


@pytest.mark.parametrize(
    "data,field,message",
    [
        ({"setting": "borrow_limit", "values": "50"}, "values", "Give 2 to 8 values"),
        ({"setting": "borrow_limit", "values": "0, x"}, "values", "whole numbers"),
        ({"setting": "borrow_limit", "values": "0, -5"}, "values", "-1 or more"),
        ({"setting": "capacity:v100", "values": "8, 8"}, "values", "Each value once"),
        ({"setting": "strategy", "values": "RESERVE, HOARD"}, "values", "Not a strategy: HOARD"),
        ({"setting": "nonsense", "values": "1, 2"}, "setting", "Select a valid choice"),
    ],
)
def test_bad_sweep_input_comes_back_beside_the_field(as_alice, history, held, data, field, message):
    response = as_alice.post(f"/shares/{SHARE}/sweep/", data, HTTP_HX_REQUEST="true")
    body = response.content.decode()
    assert response.status_code == 400 and response["HX-Retarget"] == "#sweep-form" and not held
    assert f'id="id_{field}-error"' in body and message in body


def test_a_borrow_limit_sweep_of_a_share_that_cannot_borrow_is_refused(as_alice, history, held):
    from quotas.models import Share

    Share.objects.filter(name=SHARE).update(strategy="RESERVE", borrow_limit=-1)
    response = as_alice.post(
        f"/shares/{SHARE}/sweep/", {"setting": "borrow_limit", "values": "0, 100"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 400 and "Only a LEND_AND_BORROW share borrows" in response.content.decode()
    assert not held


def test_a_failed_sweep_says_which_value_failed(as_alice, history, held, monkeypatch):
    response = as_alice.post(
        f"/shares/{SHARE}/sweep/", {"setting": "strategy", "values": "RESERVE, LEND"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 200
    monkeypatch.setattr(whatif, "BUDGET_S", -1.0)
    for run_id, index in held:
        whatif.run_part(run_id, index, isolated=False)
    done = as_alice.get(f"/whatif/{held[0][0]}/", HTTP_HX_REQUEST="true")
    assert (
        done.status_code == 286
        and "No sweep: RESERVE: the replay took longer than -1 s" in done.content.decode()
    )
