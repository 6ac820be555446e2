"""A share keeps its colour when another is added (colours were indexes in alphabetical order, so a
new share named "a..." recoloured every other one), on the cards, the nodes page and the Sankey."""

import re

import pytest

from quotas import usage
from tests.api.conftest import run
from tests.conftest import make_share
from tests.web.conftest import submit


def card_colours(body: str) -> dict[str, str]:
    return dict(
        (name, colour)
        for colour, name in re.findall(r'<article class="card share s(\d+)" data-share="([^"]+)"', body)
    )


def sankey_colours() -> dict[str, int]:
    sankey = usage.cluster_picture().sankey
    return dict(zip(sankey["labels"], sankey["colours"], strict=True))


def tile_colours(body: str) -> set[str]:
    return set(re.findall(r'<li class="gpu s(\d+)', body))


@pytest.mark.django_db
def test_a_share_keeps_its_colour_when_another_is_added(
    as_bob, bob, vision, vision_share, language_share, nodes
):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=2), nodes[1], [0, 1], borrowed=True)
    before_cards = card_colours(as_bob.get("/").content.decode())
    before_tiles = tile_colours(as_bob.get("/nodes/").content.decode())
    before_sankey = sankey_colours()

    make_share(vision, "aaa-first-by-name", capacity={"a10g": 1})

    after_cards = card_colours(as_bob.get("/").content.decode())
    assert {k: after_cards[k] for k in before_cards} == before_cards
    assert tile_colours(as_bob.get("/nodes/").content.decode()) == before_tiles
    after_sankey = sankey_colours()
    assert {k: after_sankey[k] for k in before_sankey} == before_sankey
    assert len(set(after_cards.values())) == len(after_cards)  # three shares, three colours
