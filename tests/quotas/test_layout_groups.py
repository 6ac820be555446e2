"""The organisation tree in the layout document (issue 37, item 1): groups, a share's group and weight,
the fair-sharing settings; every bad tree a problem under its path with nothing applied; a layout
without groups reads, exports and hashes exactly as before; plan, apply, rollback and `until:` with
groups; a plan names the borrowed jobs a new limit leaves uncovered."""

from datetime import UTC, datetime

import pytest
import yaml

from quotas import layout, layoutdoc
from quotas.models import FairSharing, Group, LayoutVersion, Share
from tests.conftest import make_share

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)

FLAT = {
    "format": 1,
    "teams": [{"slug": "vision", "name": "Vision", "members": []}],
    "shares": [
        {"name": "vision-main", "team": "vision", "capacity": {"a10g": 4}},
        {"name": "vision-extra", "team": "vision", "capacity": {"a10g": 2}},
    ],
}


def tree_doc(groups=(), shares=None, settings=None) -> dict:
    data = {"format": 1, "teams": FLAT["teams"], "groups": list(groups)}
    data["shares"] = shares if shares is not None else [dict(s) for s in FLAT["shares"]]
    if settings is not None:
        data["settings"] = settings
    return data


def problems(data) -> dict:
    return layoutdoc.parse(data, now=NOW)[1]


def test_a_layout_without_groups_writes_and_hashes_exactly_as_before():
    flat, errors = layoutdoc.parse(FLAT, now=NOW)
    assert errors == {}
    data = flat.to_data()
    assert list(data) == ["format", "teams", "shares"]
    assert all("group" not in s and "weight" not in s for s in data["shares"])
    # the hash as it was computed before groups existed: the three keys only
    import hashlib
    import json

    old = {k: data[k] for k in ("format", "teams", "shares")}
    text = json.dumps(old, sort_keys=True, separators=(",", ":"), default=str)
    assert flat.hash() == hashlib.sha256(text.encode()).hexdigest()
    text = layoutdoc.render_yaml(data)
    assert "\ngroups:" not in text and "\nsettings:" not in text and "weight" not in text


def test_groups_weights_and_settings_read_write_and_read_back_the_same():
    shares = [dict(FLAT["shares"][0], group="vision-team", weight=2), dict(FLAT["shares"][1], weight=1.5)]
    data = tree_doc(
        groups=[
            {"name": "research", "lend_limit": 50},
            {"name": "vision-team", "parent": "research", "weight": 2, "borrow_limit": 100},
        ],
        shares=shares,
        settings={"fair_share_half_life_s": 86400, "fair_reclaim": True},
    )
    parsed, errors = layoutdoc.parse(data, now=NOW)
    assert errors == {}
    out = parsed.to_data()
    assert out["groups"] == [
        {"name": "research", "lend_limit": 50},
        {"name": "vision-team", "parent": "research", "weight": 2, "borrow_limit": 100},
    ]
    assert out["settings"] == {"fair_share_half_life_s": 86400, "fair_reclaim": True}
    assert out["shares"][1]["group"] == "vision-team" and out["shares"][1]["weight"] == 2
    assert out["shares"][0]["weight"] == 1.5 and "group" not in out["shares"][0]
    text = layoutdoc.render_yaml(out)
    assert yaml.safe_load(text) == out  # 1.5 stays a number, not the text "1.5"
    again, errors = layoutdoc.parse(yaml.safe_load(text), now=NOW)
    assert errors == {} and again.hash() == parsed.hash()


BAD = [
    (
        "a cycle",
        [{"name": "a", "parent": "b"}, {"name": "b", "parent": "a"}],
        {},
        "groups[0].parent",
        "cycle",
    ),
    ("an unknown parent", [{"name": "a", "parent": "nowhere"}], {}, "groups[0].parent", "unknown group"),
    (
        "a fifth level",
        [
            {"name": "l1"},
            {"name": "l2", "parent": "l1"},
            {"name": "l3", "parent": "l2"},
            {"name": "l4", "parent": "l3"},
            {"name": "l5", "parent": "l4"},
        ],
        {},
        "groups[4].parent",
        "at most 4 levels",
    ),
    ("a negative weight", [{"name": "a", "weight": -1}], {}, "groups[0].weight", "positive"),
    ("a zero weight", [{"name": "a", "weight": 0}], {}, "groups[0].weight", "positive"),
    ("a weight as text", [{"name": "a", "weight": "2"}], {}, "groups[0].weight", "positive"),
    ("a lend limit over 100", [{"name": "a", "lend_limit": 101}], {}, "groups[0].lend_limit", "0..100"),
    ("a borrow limit under -1", [{"name": "a", "borrow_limit": -2}], {}, "groups[0].borrow_limit", "-1"),
    ("a group named like a share", [{"name": "vision-main"}], {}, "groups[0].name", "share"),
    ("a group twice", [{"name": "a"}, {"name": "a"}], {}, "groups[1].name", "duplicate"),
    ("a bad group name", [{"name": "Research"}], {}, "groups[0].name", "must match"),
    ("an unknown key", [{"name": "a", "wieght": 2}], {}, "groups[0].wieght", "unknown field"),
    ("a share in no such group", [], {"group": "nowhere"}, "shares[1].group", "unknown group"),
    ("a share's negative weight", [], {"weight": -2}, "shares[1].weight", "positive"),
    ("a share's weight true", [], {"weight": True}, "shares[1].weight", "positive"),
]


@pytest.mark.parametrize("groups, share_extra, path, words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_bad_tree_is_a_problem_under_its_path(groups, share_extra, path, words):
    shares = [dict(FLAT["shares"][0]), dict(FLAT["shares"][1], **share_extra)]
    found = problems(tree_doc(groups=groups, shares=shares))
    assert path in found, found
    assert any(words in m for m in found[path]), found[path]


@pytest.mark.parametrize(
    "settings, path",
    [
        ({"fair_share_half_life_s": -1}, "settings.fair_share_half_life_s"),
        ({"fair_share_half_life_s": "1d"}, "settings.fair_share_half_life_s"),
        ({"fair_reclaim": "yes"}, "settings.fair_reclaim"),
        ({"half_life": 3600}, "settings.half_life"),
        ([1], "settings"),
    ],
)
def test_bad_settings_are_problems_under_their_path(settings, path):
    assert path in problems(tree_doc(settings=settings))


def test_the_diff_names_groups_and_settings_field_by_field():
    current, _ = layoutdoc.parse(tree_doc(groups=[{"name": "research", "borrow_limit": 50}]), now=NOW)
    shares = [dict(FLAT["shares"][0], group="research", weight=2), dict(FLAT["shares"][1])]
    target, _ = layoutdoc.parse(
        tree_doc(
            groups=[{"name": "research", "borrow_limit": 25}, {"name": "audio"}],
            shares=shares,
            settings={"fair_share_half_life_s": 3600},
        ),
        now=NOW,
    )
    changes = layoutdoc.diff(current, target)
    words = [layoutdoc.describe(c) for c in changes]
    assert "share vision-main changed: group – → research, weight 1 → 2" in words
    assert "group research changed: borrow_limit 50 → 25" in words
    assert "group audio added: parent –, weight 1, borrow_limit -1, lend_limit -1" in words
    assert "settings fair-sharing changed: fair_share_half_life_s 0 → 3600" in words
    assert layoutdoc.summary(changes) == (
        "1 share: 1 changed (vision-main); 2 groups: 1 added (audio), 1 changed (research); "
        "the fair-sharing settings changed"
    )


# --- with the database -------------------------------------------------------------------------------


@pytest.fixture
def two_shares(vision):
    make_share(vision, "vision-main", capacity={"a10g": 4})
    make_share(vision, "vision-extra", capacity={"a10g": 2})


def with_tree(**settings) -> dict:
    data = layout.load_live().layout.to_data()
    data["groups"] = [
        {"name": "research", "lend_limit": 50},
        {"name": "vision-team", "parent": "research", "weight": 2},
    ]
    for s in data["shares"]:
        s["group"] = "vision-team"
    data["shares"][0]["weight"] = 3
    if settings:
        data["settings"] = settings
    return data


@pytest.mark.django_db
def test_apply_writes_the_tree_and_a_rollback_takes_it_back(no_messages, two_shares, alice):
    before = layout.load_live().layout.to_data()
    planned = layout.plan(source=with_tree(fair_share_half_life_s=86400), actor=alice, run_whatif=False)
    applied = layout.apply(plan_id=planned.pk, actor=alice)
    assert applied.version.number == 1
    research = Group.objects.get(name="research")
    assert (research.parent, research.lend_limit, research.borrow_limit) == (None, 50, -1)
    team = Group.objects.get(name="vision-team")
    assert (team.parent, team.weight) == (research, 2)
    assert dict(Share.objects.values_list("name", "weight")) == {"vision-extra": 3, "vision-main": 1}
    assert set(Share.objects.values_list("group__name", flat=True)) == {"vision-team"}
    assert FairSharing.current().fair_share_half_life_s == 86400
    exported = layout.export_data(user=alice)
    assert exported["groups"][1] == {"name": "vision-team", "parent": "research", "weight": 2}
    assert exported["settings"]["fair_share_half_life_s"] == 86400

    back = layout.plan_rollback(number=0, actor=alice, run_whatif=False)
    layout.apply(plan_id=back.pk, actor=alice)
    assert not Group.objects.exists()
    assert layout.load_live().layout.to_data() == before
    assert FairSharing.current().fair_share_half_life_s == 0
    assert LayoutVersion.objects.get(number=2).kind == "rollback"


@pytest.mark.django_db
def test_a_bad_tree_applies_nothing(no_messages, two_shares, alice):
    data = with_tree()
    data["groups"][0]["parent"] = "vision-team"  # a cycle
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as e:
        layout.plan(source=data, actor=alice, run_whatif=False)
    assert "groups[0].parent" in e.value.message_dict
    assert not Group.objects.exists() and not LayoutVersion.objects.exists()


@pytest.mark.django_db
def test_a_group_removed_moves_its_shares_out_first(no_messages, two_shares, alice):
    layout.apply(plan_id=layout.plan(source=with_tree(), actor=alice, run_whatif=False).pk, actor=alice)
    data = layout.load_live().layout.to_data()
    data.pop("groups")
    for s in data["shares"]:
        s.pop("group")
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    assert not Group.objects.exists()
    assert set(Share.objects.values_list("group", flat=True)) == {None}


@pytest.mark.django_db
def test_a_weight_until_a_time_goes_back_by_itself(no_messages, two_shares, alice):
    from datetime import timedelta

    from django.utils import timezone

    data = layout.load_live().layout.to_data()
    data["shares"][1]["weight"] = 4
    data["shares"][1]["until"] = "2h"
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    assert Share.objects.get(name="vision-main").weight == 4
    layout.revert_due(now=timezone.now() + timedelta(hours=3))
    assert Share.objects.get(name="vision-main").weight == 1
    assert "weight" not in layout.load_live().layout.to_data()["shares"][1]


@pytest.mark.django_db
def test_a_manager_reads_the_groups_above_its_own_shares_only(
    no_messages, two_shares, alice, language, django_user_model
):
    from quotas.choices import Role
    from quotas.models import Membership

    make_share(language, "language-main", capacity={"a10g": 2})
    data = with_tree()
    data["groups"].append({"name": "nlp"})
    next(s for s in data["shares"] if s["name"] == "language-main")["group"] = "nlp"
    layout.apply(plan_id=layout.plan(source=data, actor=alice, run_whatif=False).pk, actor=alice)
    dana = django_user_model.objects.create_user("dana", password="pw")
    Membership.objects.create(team=language, user=dana, role=Role.MANAGER)
    part = layout.export_data(user=dana)
    assert [g["name"] for g in part["groups"]] == ["nlp"]
    assert [s["name"] for s in part["shares"]] == ["language-main"]
