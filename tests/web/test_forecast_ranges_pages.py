"""Pages show an estimate's likely range beside its ETA (job page, team queue), and each share's track
record in words with its picture (team page, share page), or in words that there is none yet."""

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from quotas.models import QueueForecast
from tests.forecast_words import likely_between
from tests.track_history import record_start
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def ranged(bob, vision_share, nodes):
    """A queued job with a stored estimate and range, on one local day when the clock allows."""
    now = timezone.now()
    job = submit(bob, vision_share, name="ranged")
    QueueForecast.objects.create(
        job=job,
        position_in_share=1,
        position_overall=1,
        eta=now + timedelta(minutes=40),
        eta_low=now + timedelta(minutes=20),
        eta_high=now + timedelta(minutes=70),
        kind="estimate",
        basis="estimate: 1 job without a max runtime ends before it",
        computed_at=now,
    )
    return job, now


def test_the_job_page_and_the_team_queue_show_an_estimates_range(as_bob, ranged):
    job, now = ranged
    words = likely_between(now + timedelta(minutes=20), now + timedelta(minutes=70))
    page = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="eta-range"' in page and words.search(page)
    queue = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert words.search(queue)


def test_an_eta_with_a_range_is_a_clock_time_beside_clock_times(as_bob, ranged):
    """ "in 59 minutes likely between 01:55 and 05:40" mixed a span with clock times (issue 42.6)."""
    from quotas.services import clock_words

    job, now = ranged
    eta = clock_words(now + timedelta(minutes=40), now)
    words = likely_between(now + timedelta(minutes=20), now + timedelta(minutes=70)).pattern
    for page in (as_bob.get(f"/jobs/{job.pk}/"), hx(as_bob, "/teams/vision/?part=queue")):
        text = re.sub(r"<[^>]+>", "", page.content.decode())
        assert re.search(rf"at {eta}, {words} \(in 3\d\xa0minutes\)", text), text


def test_the_command_is_shown_with_its_quoting(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share, command=["python", "train.py", "--name", "my run", "--lr=1e-3;echo"])
    page = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert "<code>python train.py --name &#x27;my run&#x27; &#x27;--lr=1e-3;echo&#x27;</code>" in page


def test_a_bound_shows_no_range_in_words(as_bob, ranged):
    job, _ = ranged
    QueueForecast.objects.filter(job=job).update(kind="bound")
    assert "likely between" not in as_bob.get(f"/jobs/{job.pk}/").content.decode()


def test_a_passed_eta_is_due_now_without_a_range(as_bob, ranged):
    job, now = ranged
    QueueForecast.objects.filter(job=job).update(eta=now - timedelta(seconds=30))
    page = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert "due now" in page and "likely between" not in page


@pytest.fixture
def history(bob, vision_share, nodes):
    """Two starts in the last week: one within its range (error 5 min), one late (error 60 min)."""
    now = timezone.now()
    for hours_ago, started_min in ((30, 35), (20, 90)):
        record_start(submit(bob, vision_share), vision_share, now - timedelta(hours=hours_ago), started_min)


def test_the_team_page_gives_each_shares_track_record_in_words_with_its_picture(as_bob, history):
    page = as_bob.get("/teams/vision/").content.decode()
    assert "Track record (last 7 days)" in page
    assert "<b>1 of 2</b> jobs started within their range (50%), median error <b>32 min</b>." in page
    assert 'data-plot="track_record"' in page and "vendor/plotly.min.js" in page


def test_a_share_without_history_says_so_in_words(as_bob, vision_share, nodes):
    page = as_bob.get("/teams/vision/").content.decode()
    assert "No job of vision-main that waited for a forecast started in the last 7 days" in page
    assert 'data-plot="track_record"' not in page and "vendor/plotly.min.js" not in page


def test_the_share_page_shows_its_track_record(as_alice, history):
    page = as_alice.get("/shares/vision-main/").content.decode()
    assert "<b>1 of 2</b> jobs started within their range (50%)" in page
    assert 'data-plot="track_record"' in page


def test_the_team_pages_track_records_take_the_same_queries_for_more_shares(
    as_bob, bob, vision, history, constant_queries
):
    """Bench 5's team has 50 shares: a query or two per share's track record cost 190 ms a view."""
    from tests.conftest import make_share

    def grow():
        now = timezone.now()
        for i in range(3):
            share = make_share(vision, f"vision-extra-{i}", capacity={"a10g": 1})
            record_start(submit(bob, share), share, now - timedelta(hours=5), 25)
            record_start(submit(bob, share), share, now - timedelta(hours=1), None)  # still waiting

    constant_queries(as_bob, "/teams/vision/", grow)
    page = as_bob.get("/teams/vision/").content.decode()
    assert page.count('data-plot="track_record"') == 4
