"""Sign-in with the directory in Chromium: the login page's button, the test provider's own sign-in page
(django-oauth-toolkit in its own process, tests/oidc_provider/), and back, signed in, a member of the
team the directory group maps to."""

import pytest

from directory.models import TeamDirectory
from tests.browser.conftest import close_and_settle, screenshot
from tests.directory.conftest import directory, oidc_provider  # noqa: F401 (fixtures)
from tests.directory.provider import PASSWORD

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_signs_in_through_the_directory(chromium, live_server, directory, vision):  # noqa: F811
    TeamDirectory.objects.create(team=vision, members_from=["oidc:vision-researchers"])
    directory.set_groups("dana", ["vision-researchers"])
    # 127.0.0.1, not localhost: the provider takes a loopback redirect address on any port (RFC 8252).
    context = chromium.new_context(base_url=live_server.url.replace("localhost", "127.0.0.1"))
    page = context.new_page()
    try:
        page.goto("/login/")
        page.get_by_test_id("directory-login").click()
        expect(page.get_by_role("heading", name="Test directory")).to_be_visible()
        page.get_by_label("Username").fill("dana")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("header .who")).to_contain_text("dana")
        page.goto("/teams/vision/")
        expect(page.locator("main h1")).to_contain_text("Vision")
        screenshot(page, "directory-sign-in")
    finally:
        close_and_settle(context)
