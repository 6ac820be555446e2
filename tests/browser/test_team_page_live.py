"""The team page in a browser: right after a submit the share card and the queue agree (the card said
"0 queued" beside "Queue 5 queued" until its next 3 s poll)."""

import time

import pytest

from tests.browser.conftest import login

sync_api = pytest.importorskip("playwright.sync_api")
expect = sync_api.expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_card_follows_an_array_submit_at_once_not_at_its_next_poll(page, bob, vision_share, nodes):
    login(page, bob)
    page.goto("/teams/vision/")
    card = page.locator('#cards [data-share="vision-main"]')
    expect(card).to_contain_text("0 queued")
    sent = []
    page.on("request", lambda r: sent.append((time.monotonic(), r.method, r.url)))
    page.get_by_label("Command").fill("python sweep.py")
    page.get_by_label("Array tasks").fill("5")
    with page.expect_response(lambda r: r.request.method == "POST" and "/submit/" in r.url):
        page.get_by_role("button", name="Submit").click()
    answered = time.monotonic()
    expect(page.locator('[data-testid="queued-count"]')).to_have_text("5 queued")
    expect(card).to_contain_text("5 queued", timeout=2_000)
    # Asked for by the submit's queue-changed, not by the card's own poll (every 3 s).
    cards_after = [t for t, method, url in sent if method == "GET" and "part=cards" in url and t >= answered]
    assert cards_after and cards_after[0] - answered < 0.5, sent
