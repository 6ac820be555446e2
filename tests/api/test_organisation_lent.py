"""What a share lends outside, through the API, the page and /metrics (issue 37, item 3): counted beyond
its own subtree (quotas.organisation.view), so a share whose group lends outside lends too."""

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from quotas import layout
from quotas.metrics import render
from tests import org_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(no_messages, alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes)


def test_a_share_in_a_group_that_lends_outside_lends(as_charlie, charlie, client, world):
    # vision-main borrows 2; lang (language-main's 2 idle) and the unassigned pool (2 idle) offer 4:
    # lang lends 1 outside, and that 1 is language-main's (it said 0: lang has no other child).
    lang = as_charlie.get("/api/v1/groups/lang/").json()["types"][0]
    assert lang["lent_outside"] == 1
    share = as_charlie.get("/api/v1/shares/language-main/").json()["fair_share"]["a10g"]
    assert (share["lent_outside"], share["state"]) == (1, "lending")
    client.force_login(charlie)
    html = client.get("/organisation/").content.decode()
    row = re.search(r'<tr data-name="language-main".*?</tr>', html, re.S).group(0)
    assert "lending" in row


def test_a_nested_group_lends_what_its_parent_lends_outside(no_messages, alice, world):
    # lang moves under a new top group, dept: dept lends 1 outside; so do lang and language-main.
    data = layout.load_live().layout.to_data()
    data["groups"] = [
        {"name": "dept"},
        {"name": "lang", "parent": "dept"},
        {"name": "research", "borrow_limit": 50},
    ]
    planned = layout.plan(source=data, actor=alice, run_whatif=False)
    layout.apply(plan_id=planned.pk, actor=alice)
    lent = {
        s.labels["group"]: s.value
        for family in text_string_to_metric_families(render().decode())
        for s in family.samples
        if s.name == "gpuquota_group_lent_outside_gpus"
    }
    assert lent == {"dept": 1, "lang": 1, "research": 0}
