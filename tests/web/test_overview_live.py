"""The overview's live parts come from one poll: one answer with the totals, the share cards, the
lending and the feed, all from one snapshot, each swapped out of band (separate timers showed
`8 / 8 GPUs in use` beside cards adding up to 6)."""

import re

import pytest

from tests.api.conftest import run
from tests.web.conftest import hx, submit

LIVE_PARTS = ("totals", "cards", "sankey", "feed")


@pytest.mark.django_db
def test_the_page_has_one_poller_and_its_parts_do_not_poll_on_their_own(as_bob, vision_share, nodes):
    body = as_bob.get("/").content.decode()
    pollers = re.findall(r'hx-get="([^"]+)"[^>]*hx-trigger="every', body)
    assert pollers == ["/?part=live", "/?part=history"]


@pytest.mark.django_db
def test_one_answer_carries_every_live_part_out_of_band(as_bob, bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    run(submit(bob, vision_share, gpus=2), nodes[0], [2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    body = hx(as_bob, "/?part=live").content.decode()
    for part in LIVE_PARTS:
        assert re.search(rf'<section id="{part}" hx-swap-oob="true"', body), part
    assert 'hx-trigger="every' not in body  # the swapped parts do not start timers of their own
    total = int(re.search(r'data-testid="used-a10g">(\d+)<', body).group(1))
    assert total == 6
    assert "vision-main" in body and "language-main" in body
