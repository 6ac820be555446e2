"""Forecast ranges and the track record in a browser: a queued job's page gives its estimate's likely
range beside the ETA (and keeps it through the state part's polls), and the team page gives its share's
track record in words and draws its picture (no JavaScript error)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.services import job_submit
from quotas.models import QueueForecast
from tests.browser.conftest import login
from tests.forecast_words import likely_between
from tests.track_history import record_start

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def submit(user, share):
    return job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["python", "train.py"])


def test_the_job_page_shows_the_likely_range_beside_the_eta(page, bob, vision_share, nodes):
    now = timezone.now()
    job = submit(bob, vision_share)
    # Far enough ahead that the stored forecast stays in the future for the whole test.
    low, eta, high = now + timedelta(minutes=50), now + timedelta(minutes=80), now + timedelta(minutes=140)
    QueueForecast.objects.create(
        job=job,
        position_in_share=1,
        position_overall=1,
        eta=eta,
        eta_low=low,
        eta_high=high,
        kind="estimate",
        basis="estimate: 1 job without a max runtime ends before it",
        computed_at=now,
    )
    login(page, bob)
    page.goto(f"/jobs/{job.pk}/")
    shown = page.get_by_test_id("eta-range")
    expect(shown).to_contain_text(likely_between(low, high))
    expect(page.locator('[data-testid="eta"]')).to_contain_text("estimate")
    # The state part polls every 3 s: the range is still there after a swap.
    with page.expect_response(lambda r: "part=state" in r.url):
        pass
    expect(page.get_by_test_id("eta-range")).to_contain_text(likely_between(low, high))


def history(bob, share):
    """Three starts in the last day: two within their range (20..40 min), one late; errors 5, 8, 60 min."""
    now = timezone.now()
    for hours_ago, started_min in ((30, 35), (26, 22), (20, 90)):
        record_start(submit(bob, share), share, now - timedelta(hours=hours_ago), started_min)


def test_the_team_page_gives_the_track_record_in_words_and_draws_it(page, bob, vision_share, nodes):
    history(bob, vision_share)
    login(page, bob)
    page.goto("/teams/vision/")
    section = page.get_by_role("region", name="Track record (last 7 days)")
    expect(section.get_by_test_id("track-summary")).to_have_text(
        "2 of 3 jobs started within their range (67%), median error 8 min."
    )
    expect(section.locator('[data-plot="track_record"][data-drawn="1"] .js-plotly-plot')).to_be_visible()
    # The picture: the diagonal and the two groups of starts.
    legend = section.locator(".legend")
    expect(legend).to_contain_text("started within its range")
    expect(legend).to_contain_text("outside its range")


def test_the_share_page_gives_its_track_record_too(page, alice, bob, vision_share, nodes):
    history(bob, vision_share)
    login(page, alice)
    page.goto("/shares/vision-main/")
    section = page.get_by_role("region", name="Track record (last 7 days)")
    expect(section.get_by_test_id("track-summary")).to_contain_text(
        "2 of 3 jobs started within their range (67%)"
    )
    expect(section.locator('[data-plot="track_record"][data-drawn="1"] .js-plotly-plot')).to_be_visible()
