"""/teams/ shows each team's shares with their usage now, and its members (it was a bare list of
names)."""

import pytest

from quotas.choices import Role
from quotas.models import Membership
from tests.api.conftest import run
from tests.web.conftest import submit


@pytest.mark.django_db
def test_teams_page_shows_shares_usage_and_members(
    as_alice, alice, bob, charlie, vision_share, language_share, nodes
):
    Membership.objects.filter(user=bob).update(role=Role.MANAGER)
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    submit(bob, vision_share, gpus=4)
    body = as_alice.get("/teams/").content.decode()
    vision_row = body.split('data-team="vision"', 1)[1].split("</tr>", 1)[0]
    assert "vision-main: <b>2</b> of 4" in vision_row
    assert "<div>1</div>" in vision_row  # one running, one queued
    assert "bob" in vision_row and "(manager)" in vision_row
    language_row = body.split('data-team="language"', 1)[1].split("</tr>", 1)[0]
    assert "language-main: <b>0</b> of 2" in language_row and "charlie" in language_row
