"""The layout page in a browser: edit the layout in place, plan it (problems beside their paths; the
diff, what happens now, the what-if polled to its result with its charts), apply it, and plan a
rollback from the versions. The what-if's replays run as tasks, a thread each standing in for the
worker."""

import pytest

from quotas.models import LayoutVersion, Share
from tests.browser.conftest import login, screenshot
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def worker(whatif_worker):
    return whatif_worker


def test_edit_plan_apply_and_plan_a_rollback(page, alice, bob, vision_share, language_share, nodes):
    for _ in range(3):
        submit(bob, vision_share, gpus=2, max_runtime_s=600)
    login(page, alice)
    page.goto("/shares/")
    page.get_by_role("link", name="Change the layout").click()
    document = page.get_by_label("Layout (YAML or JSON)")
    text = document.input_value()
    assert "  - name: vision-main\n" in text

    document.fill(text.replace("capacity: {a10g: 4}", "capacity: {a10g: -4}"))
    page.get_by_role("button", name="Plan").click()
    errors = page.locator('[data-testid="layout-errors"]')
    expect(errors).to_contain_text("shares[1].capacity.a10g: must be a whole number of GPUs, 0 or more")

    document.fill(text.replace("capacity: {a10g: 4}", "capacity: {a10g: 2}\n    until: 3d"))
    expect(errors).to_have_count(0)  # editing takes the old answer away
    page.get_by_role("button", name="Plan").click()
    plan = page.locator("#layout-plan")
    expect(page.locator('[data-testid="layout-diff"]')).to_contain_text("capacity.a10g")
    expect(page.locator('[data-testid="layout-summary"]')).to_contain_text("1 share: 1 changed (vision-main)")
    expect(page.locator('[data-testid="layout-temporary"]')).to_contain_text("goes back to 4")
    expect(page.locator('[data-testid="whatif-shares"]')).to_contain_text("vision-main", timeout=20_000)
    expect(page.locator('[data-plot="whatif"] .js-plotly-plot')).to_have_count(2)
    screenshot(page, "layout-plan")

    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Apply this plan").click()
    expect(page.locator('[data-testid="layout-applied"]')).to_contain_text("Applied as version 1")
    assert Share.objects.get(name="vision-main").capacity_map() == {"a10g": 2}

    page.goto("/layout/")
    versions = page.locator('[data-testid="layout-versions"]')
    expect(versions).to_contain_text("vision-main (changed)")
    expect(page.locator('[data-testid="temporary-changes"]')).to_contain_text("capacity.a10g goes back to 4")
    # version 1's row (the row below it plans a rollback to the layout before version 1)
    versions.locator("tr", has_text="vision-main (changed)").get_by_role(
        "button", name="Plan a rollback to this"
    ).click()
    expect(plan).to_contain_text("(a rollback to version 1)")  # version 1 itself: nothing to change
    expect(plan).to_contain_text("Nothing to apply: this is the layout as it is.")
    assert LayoutVersion.objects.count() == 1
    screenshot(page, "layout-versions")
