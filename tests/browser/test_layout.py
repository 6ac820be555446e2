"""Layout seen in a real browser, asserted on boxes and text (no screenshots): what a reader sees must
not overlap or vanish."""

import pytest

from tests.browser.conftest import login

sync_api = pytest.importorskip("playwright.sync_api")

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The badge's box, its text's box, and the line boxes of the words on either side of it.
BADGE_BOXES = """badge => {
  const box = r => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  const range = node => { const r = document.createRange(); r.selectNodeContents(node); return r; };
  const around = [badge.previousSibling, badge.nextSibling].filter(n => n && n.nodeType === Node.TEXT_NODE);
  return {
    badge: box(badge.getBoundingClientRect()),
    text: box(range(badge).getBoundingClientRect()),
    neighbours: around.flatMap(n => [...range(n).getClientRects()].map(box)),
  };
}"""


def _overlap(a, b) -> bool:
    return (
        a["left"] < b["right"] - 1
        and b["left"] < a["right"] - 1
        and a["top"] < b["bottom"] - 1
        and (b["top"] < a["bottom"] - 1)
    )


def test_borrowed_legend_badge_holds_its_word_beside_its_sentence(page, alice, vision_share, nodes):
    login(page, alice)
    badge = page.locator('[data-testid="borrowed-legend"] .badge.borrowed')
    boxes = badge.evaluate(BADGE_BOXES)
    b, t = boxes["badge"], boxes["text"]
    assert b["left"] <= t["left"] + 1 and t["right"] <= b["right"] + 1, boxes  # the word inside its badge
    assert boxes["neighbours"], boxes
    assert not [n for n in boxes["neighbours"] if _overlap(n, b)], boxes
