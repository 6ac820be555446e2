"""The organisation page in a real browser: the tree drawn as a sunburst (no JavaScript error), each
group's and share's state in words, the reader's fair part, and a change in the cluster shown by the
next htmx poll without a reload."""

import pytest

from tests import org_world
from tests.api.conftest import run
from tests.browser.conftest import login, screenshot

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_organisation_page_draws_the_tree_and_follows_the_cluster(
    page, alice, bob, charlie, vision_share, language_share, nodes
):
    world = org_world.build(alice, bob, vision_share, language_share, nodes)
    login(page, bob)
    page.get_by_role("link", name="Organisation").click()
    page.wait_for_url("**/organisation/")
    expect(page.locator('[data-plot="sunburst"][data-drawn="1"] .js-plotly-plot')).to_be_visible()
    research = page.locator('#org-tree tr[data-name="research"]')
    expect(research).to_contain_text("starved")
    expect(page.locator('#org-tree tr[data-name="lang"]')).to_contain_text("lending")
    mine = page.locator("#org-mine")
    expect(mine).to_contain_text("your fair part of idle a10g now is")
    expect(mine).to_contain_text("group research may take 2 a10g from outside: 2 taken")
    screenshot(page, "organisation")
    # The waiting job borrows one more GPU: the next poll shows research taking 3 from outside.
    run(world["waiting"], nodes[1], [2], borrowed=True)
    expect(research.locator("td").nth(4)).to_have_text("3", timeout=15_000)
    expect(research).to_contain_text("borrowing")
    assert not [r for r in page.context.pages if r.url.endswith("/login/")]
