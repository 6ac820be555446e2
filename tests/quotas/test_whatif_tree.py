"""The what-if replays the organisation tree (issue 37, item 2's wiring): last week's scenario has the
live groups, the shares' groups (by name) and weights and the fair-sharing settings; a plan's replay has
the planned tree; two trees never share a cached result."""

import dataclasses

import pytest

from quotas import layout, whatif
from tests import org_world

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(no_messages, alice, bob, charlie, vision_share, language_share, nodes):
    return org_world.build(alice, bob, vision_share, language_share, nodes, half_life_s=86400)


def test_last_weeks_scenario_has_the_live_tree(world):
    scenario, _, _ = whatif.build_scenario()
    assert [(g.name, g.borrow_limit) for g in scenario.groups] == [("lang", -1), ("research", 50)]
    vision = next(s for s in scenario.shares if s.name == "vision-main")
    assert (vision.group, vision.weight) == ("research", 2)
    assert scenario.settings.fair_share_half_life_s == 86400


def test_a_plans_replay_has_the_planned_tree_and_digests_apart(world, alice):
    data = layout.load_live().layout.to_data()
    next(g for g in data["groups"] if g["name"] == "research")["borrow_limit"] = 0
    data["settings"] = {"fair_share_half_life_s": 3600, "fair_reclaim": True}
    target, live = layout.check(data, now=layout.timezone.now())
    variant = layout.whatif_variant(live, target, [], layout.timezone.now())
    scenario, _, _ = whatif.build_scenario()
    planned, dropped = whatif.with_layout(scenario, variant)
    assert dropped == 0
    assert next(g for g in planned.groups if g.name == "research").borrow_limit == 0
    assert (planned.settings.fair_share_half_life_s, planned.settings.fair_reclaim) == (3600, True)
    assert next(s for s in planned.shares if s.name == "vision-main").group == "research"
    flat = dataclasses.replace(scenario, groups=())
    digests = {whatif.scenario_digest(s, 3600.0) for s in (scenario, planned, flat)}
    assert len(digests) == 3


def test_a_replay_of_the_planned_tree_runs(world, alice):
    from quotas.engine import simulate

    data = layout.load_live().layout.to_data()
    next(g for g in data["groups"] if g["name"] == "research")["borrow_limit"] = 0
    target, live = layout.check(data, now=layout.timezone.now())
    scenario, _, _ = whatif.build_scenario()
    planned, _ = whatif.with_layout(scenario, layout.whatif_variant(live, target, [], layout.timezone.now()))
    result = simulate.simulate(planned)
    assert set(result.jobs) >= {str(world["own"].pk), str(world["waiting"].pk)}
    assert set(result.groups) == {"lang", "research"}  # the replay reports per group


def test_the_whatif_reports_per_group_before_and_after(world, alice):
    data = layout.load_live().layout.to_data()
    next(g for g in data["groups"] if g["name"] == "research")["borrow_limit"] = 0
    target, live = layout.check(data, now=layout.timezone.now())
    scenario, _, _ = whatif.build_scenario()
    planned, _ = whatif.with_layout(scenario, layout.whatif_variant(live, target, [], layout.timezone.now()))
    before = whatif.replay(scenario, window_s=3600.0)
    after = whatif.replay(planned, window_s=3600.0)
    assert set(before["groups"]) == {"lang", "research"}
    table = whatif.compare(before, after, ["vision-main"])
    research = next(g for g in table["groups"] if g["group"] == "research")
    taken_before, taken_after, _ = research["gpu_hours_from_outside"]
    assert taken_after <= taken_before  # a limit of 0: research takes nothing more from outside
    flat = whatif.compare({"shares": {}, "cluster": {}}, {"shares": {}, "cluster": {}})
    assert flat["groups"] == []
