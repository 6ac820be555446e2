"""Saving a share whose capacity names a GPU type no node has (or over-commits): the form says so
first, and "Save anyway" saves it."""

import pytest

from quotas.models import Share
from tests.browser.conftest import login

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_gpu_type_no_node_has_is_warned_in_the_form_then_saved_anyway(page, alice, vision, nodes):
    login(page, alice)
    page.goto("/shares/new/")
    page.get_by_label("Name").fill("vision-h100")
    page.get_by_label("Team").select_option("vision")
    page.get_by_label("Strategy").select_option("LEND")
    page.locator("#id_new_gpu_type").fill("h100")
    page.locator("#id_new_gpu_count").fill("8")
    page.get_by_role("button", name="Save").click()
    expect(page.locator('[data-testid="share-warnings"]')).to_contain_text("No node has GPU type h100")
    assert not Share.objects.filter(name="vision-h100").exists()
    page.get_by_role("button", name="Save anyway").click()
    page.wait_for_url("**/shares/")
    assert Share.objects.get(name="vision-h100").capacity_map() == {"h100": 8}
