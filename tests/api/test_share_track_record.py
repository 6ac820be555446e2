"""GET /api/v1/shares/{name}/track-record/: the share's forecast track record (quotas.track_record), for
everyone who may read the share (everyone logged in); ?days= is 1 to 90."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.api.conftest import submit
from tests.track_history import record_start

URL = "/api/v1/shares/vision-main/track-record/"


@pytest.fixture
def history(bob, vision_share, nodes):
    """Two starts in the last week (one within its range, one late) and one 20 days ago (within)."""
    now = timezone.now()

    for days_ago, started_after_min in ((1, 35), (2, 90), (20, 25)):
        record_start(
            submit(bob, vision_share), vision_share, now - timedelta(days=days_ago), started_after_min
        )


def test_a_member_reads_the_track_record_of_the_last_week(as_bob, history):
    r = as_bob.get(URL)
    assert r.status_code == 200
    data = r.json()
    assert data["share"] == "vision-main" and data["days"] == 7
    assert (data["started"], data["with_range"], data["within_range"], data["late"]) == (2, 2, 1, 1)
    assert data["within_fraction"] == 0.5
    assert data["median_error_s"] == (5 * 60 + 60 * 60) / 2
    assert data["by_kind"]["estimate"] == {"started": 2, "with_range": 2, "within_range": 1}
    assert [p["actual_s"] for p in data["points"]] == [5400.0, 2100.0]  # earliest start first
    assert data["points"][0] == {
        "job": data["points"][0]["job"],
        "kind": "estimate",
        "forecast_s": 1800.0,
        "low_s": 1200.0,
        "high_s": 2400.0,
        "actual_s": 5400.0,
        "within": False,
    }


def test_days_widens_the_window(as_bob, history):
    data = as_bob.get(URL, {"days": 30}).json()
    assert data["days"] == 30 and data["started"] == 3 and data["within_range"] == 2


@pytest.mark.parametrize("days", ["0", "91", "-3", "a week", "1.5"])
def test_days_outside_1_to_90_is_a_400_with_a_field_message(as_bob, vision_share, days):
    r = as_bob.get(URL, {"days": days})
    assert r.status_code == 400
    assert r.json() == {"days": ["Give a whole number of days, 1 to 90."]}


def test_another_teams_member_reads_the_aggregates_but_not_the_jobs(as_charlie, history):
    # The points name the share's jobs and their waits: other teams' jobs do not exist for charlie.
    r = as_charlie.get(URL)
    assert r.status_code == 200
    data = r.json()
    assert (data["started"], data["within_range"], data["late"]) == (2, 1, 1)
    assert data["points"] == []


def test_an_admin_reads_the_points_of_any_share(as_alice, history):
    assert len(as_alice.get(URL).json()["points"]) == 2


def test_without_a_login_it_is_refused(anon, history):
    r = anon.get(URL)
    assert r.status_code in (401, 403)
    assert "points" not in r.json()


def test_an_unknown_share_is_a_404(as_bob, vision_share):
    assert as_bob.get("/api/v1/shares/nope/track-record/").status_code == 404


def test_a_share_without_history_answers_empty_numbers(as_bob, vision_share):
    data = as_bob.get(URL).json()
    assert (data["started"], data["n"], data["points"]) == (0, 0, [])
    assert data["median_error_s"] is None and data["within_fraction"] is None


def test_it_is_only_read(as_alice, vision_share):
    assert as_alice.post(URL, {}).status_code == 405
