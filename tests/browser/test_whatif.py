"""The what-if preview on a share's page: each click replaces the previous preview (the second click
did nothing: the button inherited the form's outerHTML swap), and editing the form takes a preview of
other values away."""

import pytest

from tests.browser.conftest import login
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_preview_twice_each_preview_replaces_the_previous_one(page, alice, bob, vision_share, nodes):
    for _ in range(3):
        submit(bob, vision_share, gpus=2, max_runtime_s=600)
    console_errors = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    login(page, alice)
    page.goto(f"/shares/{vision_share.name}/")
    preview = page.get_by_role("button", name="Preview what if")
    shares_table = page.locator('[data-testid="whatif-shares"]')

    preview.click()
    expect(shares_table).to_contain_text("vision-main", timeout=20_000)
    page.get_by_label("a10g GPUs").fill("1")
    expect(shares_table).to_have_count(0)  # a preview of the old values is not left under the new ones

    preview.click()
    expect(shares_table).to_have_count(1, timeout=20_000)
    expect(page.locator('[data-testid="whatif-cluster"]')).to_have_count(1)
    preview.click()  # and a third time: still one preview, still there
    expect(shares_table).to_have_count(1, timeout=20_000)
    page.wait_for_load_state("networkidle")
    expect(shares_table).to_have_count(1)
    assert not [e for e in console_errors if "targetError" in e], console_errors
