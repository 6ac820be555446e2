"""The Content-Security-Policy (issue 18) breaks nothing and is not violated: in headless Chromium the
dashboard pages (charts, live refresh, htmx), the audit filter and Swagger UI load with no CSP
violation reported on the console. Skipped without Playwright or Chromium, like tests/browser."""

import pytest

from quotas import usage
from tests.api.conftest import run
from tests.browser.conftest import chromium, close_and_settle, login  # noqa: F401 - the browser fixture
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser_page(chromium, live_server, monkeypatch, settings):  # noqa: F811 - chromium is the fixture
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": False)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    context = chromium.new_context(base_url=live_server.url)
    context.set_default_timeout(10_000)
    page = context.new_page()
    console = []
    page.on("console", lambda m: console.append(m.text))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    yield page, console
    close_and_settle(context)


def test_pages_load_without_csp_violations(browser_page, alice, bob, vision_share, language_share, nodes):
    page, console = browser_page
    job = submit(bob, vision_share, gpus=2)
    run(job, nodes[0], [0, 1])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    usage.sample()
    login(page, alice)
    expect(page.locator('[data-plot="history"] .js-plotly-plot')).to_be_visible()
    for path in ("/nodes/", f"/jobs/{job.pk}/", "/shares/", "/audit/", "/api/docs/"):
        page.goto(path)
        page.wait_for_load_state("networkidle")
    expect(page.locator(".swagger-ui")).to_be_visible()
    page.goto("/audit/")
    page.select_option("#type", index=1)  # the filter submits itself (a data-autosubmit handler)
    page.wait_for_url("**/audit/?*")
    violations = [m for m in console if "Content Security Policy" in m or m.startswith("pageerror")]
    assert not violations, violations
