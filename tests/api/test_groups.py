"""/api/v1/groups/ and the tree's fields on shares (issue 37, item 3); the tree through the layout API:
each bad tree a 400 under its path, nothing applied; a share changed through the share API keeps its
place in the tree."""

import pytest

from quotas.models import Group, LayoutVersion, Share
from tests import org_world
from tests.api.conftest import client_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes)


def test_the_groups_list_has_each_group_with_its_children_and_numbers(as_bob, world):
    r = as_bob.get("/api/v1/groups/")
    assert r.status_code == 200, r.content
    body = r.json()
    assert [g["name"] for g in body] == ["lang", "research"]
    research = body[1]
    assert (research["parent"], research["borrow_limit"], research["shares"], research["groups"]) == (
        None,
        50,
        ["vision-main"],
        [],
    )
    [a10g] = research["types"]
    assert a10g["gpu_type"] == "a10g"
    assert (a10g["capacity"], a10g["in_use"], a10g["taken_from_outside"], a10g["may_take"]) == (4, 6, 2, 2)
    assert a10g["fair_share_value"] == pytest.approx(0.5) and a10g["state"] == "starved"
    assert body[0]["types"][0]["state"] == "lending"


def test_a_group_by_name_and_an_unknown_one(as_charlie, world):
    assert as_charlie.get("/api/v1/groups/research/").json()["name"] == "research"
    assert as_charlie.get("/api/v1/groups/nowhere/").status_code == 404


def test_groups_are_read_only_here_and_need_a_login(as_alice, world):
    assert as_alice.post("/api/v1/groups/", {"name": "x"}, format="json").status_code == 405
    assert client_for().get("/api/v1/groups/").status_code in (401, 403)


def test_a_share_has_its_group_weight_and_fair_share(as_charlie, world):
    body = as_charlie.get("/api/v1/shares/vision-main/").json()
    assert (body["group"], body["weight"]) == ("research", 2)
    a10g = body["fair_share"]["a10g"]
    assert a10g["taken_from_outside"] == 2 and a10g["waiting_to_borrow"] is True
    # (2 taken + 0 history) / (weight 2 x 4 capacity)
    assert a10g["fair_share_value"] == pytest.approx(0.25)
    # its fair part is in proportion to weight 2 x capacity 4; the plain weights' total stays as it was
    assert (a10g["fair_weight"], a10g["competing_total_fair_weight"], a10g["competing_total_weight"]) == (
        8,
        8,
        2,
    )
    assert "jobs" not in body and "own-run" not in str(body)


def test_a_share_changed_through_the_share_api_stays_in_its_group(as_alice, world):
    r = as_alice.patch("/api/v1/shares/vision-main/", {"description": "renamed nothing"}, format="json")
    assert r.status_code == 200, r.content
    share = Share.objects.get(name="vision-main")
    assert (share.group.name, share.weight, share.description) == ("research", 2, "renamed nothing")


@pytest.mark.parametrize(
    "edit, path",
    [
        (
            lambda d: d["groups"][0].update(parent="research") or d["groups"][1].update(parent="lang"),
            "groups[0].parent",
        ),
        (lambda d: d["groups"][0].update(parent="nowhere"), "groups[0].parent"),
        (lambda d: d["groups"][0].update(weight=-1), "groups[0].weight"),
        (lambda d: d["groups"][0].update(lend_limit=150), "groups[0].lend_limit"),
        (lambda d: d["groups"][1].update(borrow_limit=-5), "groups[1].borrow_limit"),
        (lambda d: d["shares"][1].update(group="nowhere"), "shares[1].group"),
        (lambda d: d["shares"][1].update(weight=0), "shares[1].weight"),
        (
            lambda d: (
                d["groups"].extend(
                    [
                        {"name": "l1"},
                        {"name": "l2", "parent": "l1"},
                        {"name": "l3", "parent": "l2"},
                        {"name": "l4", "parent": "l3"},
                    ]
                )
                or d["groups"][0].update(parent="l4")
            ),
            "groups[0].parent",
        ),
    ],
    ids=[
        "cycle",
        "unknown-parent",
        "negative-weight",
        "lend-limit-over-100",
        "borrow-limit-under-1",
        "unknown-group",
        "zero-weight",
        "fifth-level",
    ],
)
def test_each_bad_tree_is_a_400_under_its_path_and_nothing_is_applied(as_alice, world, edit, path):
    data = as_alice.get("/api/v1/layout/", {"format": "json"}).json()
    edit(data)
    r = as_alice.post("/api/v1/layout/plan/", {"document": data, "whatif": False}, format="json")
    assert r.status_code == 400, r.content
    assert path in r.json(), r.json()
    assert LayoutVersion.objects.count() == 1 and Group.objects.count() == 2


def test_the_plan_shows_the_trees_diff_and_what_it_leaves_uncovered(as_alice, world):
    data = as_alice.get("/api/v1/layout/", {"format": "json"}).json()
    data["groups"][1]["borrow_limit"] = 0
    r = as_alice.post("/api/v1/layout/plan/", {"document": data, "whatif": False}, format="json")
    assert r.status_code == 201, r.content
    body = r.json()
    [change] = [c for c in body["changes"] if c["kind"] == "group"]
    assert change["words"] == "group research changed: borrow_limit 50 → 0"
    [uncovered] = body["now"]["uncovered"]
    assert uncovered["jobs"] == [world["borrowed"].pk]
