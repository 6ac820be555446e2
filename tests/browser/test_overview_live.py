"""The overview in a browser: one request per refresh carries every live part, and the cluster total
and the share cards change together."""

import pytest

from tests.api.conftest import run
from tests.browser.conftest import login
from tests.web.conftest import submit

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_one_poll_refreshes_totals_and_cards_together(page, alice, bob, vision_share, nodes):
    login(page, alice)
    polls = []
    page.on("request", lambda r: polls.append(r.url.split("?", 1)[1]) if "?part=" in r.url else None)
    used = page.locator('[data-testid="used-a10g"]')
    card = page.locator('#cards [data-share="vision-main"] .bar-head')
    expect(used).to_have_text("0")

    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    run(submit(bob, vision_share, gpus=2), nodes[0], [2, 3])
    expect(used).to_have_text("4", timeout=10_000)
    # The same swap brought the cards: no moment where the total and the cards disagree.
    expect(card).to_contain_text("4 used of 4 own", timeout=1)
    assert polls and set(polls) <= {"part=live", "part=history"}, polls
