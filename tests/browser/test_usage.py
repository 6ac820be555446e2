"""The usage page in a real browser: its picture of GPU-hours used, borrowed, lent and lost by cause is
drawn (no JavaScript error), its share selector and CSV link work."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import AttemptState, LostCause, Outcome
from jobs.models import Attempt
from jobs.services import job_submit
from quotas.models import UsageSample
from tests.browser.conftest import login, screenshot

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_usage_page_draws_what_sharing_gained_and_lost(
    page, alice, bob, vision_share, language_share, nodes
):
    now = timezone.now()
    for minute in range(30):
        at = now - timedelta(minutes=90 - minute)
        UsageSample.objects.create(at=at, share=vision_share, gpu_type="a10g", own=4, borrowed=2, capacity=4)
        UsageSample.objects.create(at=at, share=language_share, gpu_type="a10g", lent=2, capacity=2)
    job = job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["true"])
    Attempt.objects.create(
        job=job,
        number=1,
        state=AttemptState.ENDED,
        outcome=Outcome.PREEMPTED,
        placement=[{"node": "node-1", "gpus": [0, 1]}],
        started_at=now - timedelta(minutes=50),
        ended_at=now - timedelta(minutes=40),
        lost_cause=LostCause.RECLAIM,
        gpu_seconds_lost=720,
        gpu_seconds_run=1200,
    )
    login(page, alice)
    page.get_by_role("link", name="Usage").click()
    page.wait_for_url("**/usage/")
    expect(page.locator('[data-plot="usage"][data-drawn="1"] .js-plotly-plot')).to_be_visible()
    expect(page.locator('[data-testid="usage-summary"]')).to_contain_text(
        "1.0 GPU-hours run on borrowed GPUs"
    )
    expect(page.locator('[data-testid="usage-summary"]')).to_contain_text("0.2 reclaim")
    screenshot(page, "usage")
    page.locator("#id_share").select_option("vision-main")
    page.get_by_role("button", name="Show").click()
    page.wait_for_url("**/usage/?days=7&share=vision-main")
    expect(page.locator('[data-plot="usage"][data-drawn="1"] .js-plotly-plot')).to_be_visible()
    with page.expect_download() as download:
        page.get_by_test_id("usage-csv").click()
    assert download.value.suggested_filename == "gpuquota-usage-7d-vision-main.csv"
