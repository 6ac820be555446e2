"""Bad input and server errors are visible in the page: a Max runtime too large for the database is
refused before it is sent (it was a silent 500), and any 5xx answered to an htmx request is shown."""

import pytest

from jobs.models import Job
from tests.browser.conftest import login, screenshot

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def fill_submit_form(page, max_runtime="600"):
    page.goto("/teams/vision/")
    page.get_by_label("Name").fill("too-long")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("Max runtime (s)").fill(max_runtime)


def test_a_huge_max_runtime_is_refused_in_the_page_not_a_silent_500(page, bob, vision_share, nodes):
    login(page, bob)
    fill_submit_form(page, max_runtime="99999999999999999999")
    answers = []
    page.on("response", lambda r: answers.append(r.status) if "/submit/" in r.url else None)
    page.get_by_role("button", name="Submit").click()
    field = page.get_by_label("Max runtime (s)")
    assert "2147483647" in field.evaluate("e => e.validationMessage")
    page.wait_for_timeout(300)
    assert answers == [] and not Job.objects.filter(name="too-long").exists()


def test_a_server_error_to_an_htmx_request_is_shown_in_the_page(page, bob, vision_share, nodes, monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("the database went away")

    monkeypatch.setattr("jobs.services.job_submit", broken)
    login(page, bob)
    fill_submit_form(page)
    page.get_by_role("button", name="Submit").click()
    alert = page.locator("#request-error[role=alert]")
    expect(alert).to_contain_text("The server failed to answer (500")
    screenshot(page, "request-error")
