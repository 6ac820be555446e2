"""The organisation tree's pure parts (quotas/engine/tree.py): validation, nets and the cover per level,
the decayed history, and the organisation view (SEMANTICS "Groups: the organisation tree")."""

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.engine import policy
from quotas.engine.tree import (
    BORROWING,
    LENDING,
    STARVED,
    FairShareHistory,
    GroupSpec,
    Tree,
    fair_share_value,
    nets,
    organisation_view,
    taken_from_outside,
    validate_tree,
)
from quotas.engine.views import LEND, LEND_AND_BORROW, NodeView, QueuedView, RunningView, ShareView, Snapshot


def share(name, cap, strategy=LEND_AND_BORROW, group=None, weight=1):
    return ShareView(name=name, capacity={"a10g": cap}, strategy=strategy, group=group, weight=weight)


def paths(groups, shares=()):
    return [p for p, _ in validate_tree(groups, shares)]


# -- validation ----------------------------------------------------------------------------------------


def test_it_accepts_a_valid_tree():
    groups = [GroupSpec("dept"), GroupSpec("team", "dept", weight=2, borrow_limit=50, lend_limit=100)]
    assert validate_tree(groups, [share("p", 1, group="team")]) == []


def test_it_names_an_unknown_parent():
    assert paths([GroupSpec("team", "nope")]) == ["groups[0].parent"]


def test_it_names_a_cycle_once():
    errors = validate_tree([GroupSpec("a", "b"), GroupSpec("b", "a")], [])
    assert len(errors) == 1 and errors[0][0] == "groups[0].parent" and "cycle" in errors[0][1]


def test_it_refuses_a_fifth_level():
    four = [GroupSpec("l1"), GroupSpec("l2", "l1"), GroupSpec("l3", "l2"), GroupSpec("l4", "l3")]
    assert validate_tree(four, []) == []
    errors = validate_tree([*four, GroupSpec("l5", "l4")], [])
    assert [p for p, _ in errors] == ["groups[4].parent"] and "at most 4 levels" in errors[0][1]


@pytest.mark.parametrize("weight", [0, -1, math.nan, math.inf, "2", True])
def test_it_refuses_a_weight_that_is_not_positive(weight):
    assert paths([GroupSpec("g", weight=weight)]) == ["groups[0].weight"]
    assert paths([], [share("p", 1, weight=weight)]) == ["shares[0].weight"]


@pytest.mark.parametrize(
    "field,value,ok",
    [
        ("borrow_limit", -1, True),
        ("borrow_limit", 0, True),
        ("borrow_limit", 300, True),
        ("borrow_limit", -2, False),
        ("borrow_limit", 1.5, False),
        ("lend_limit", 100, True),
        ("lend_limit", 101, False),
        ("lend_limit", -5, False),
    ],
)
def test_it_checks_the_limits_range(field, value, ok):
    assert paths([GroupSpec("g", **{field: value})]) == ([] if ok else [f"groups[0].{field}"])


def test_it_refuses_a_name_a_share_has_and_duplicates_and_bad_names():
    assert paths([GroupSpec("p")], [share("p", 1)]) == ["groups[0].name"]
    assert paths([GroupSpec("g"), GroupSpec("g")]) == ["groups[1].name"]
    assert paths([GroupSpec("Bad Name")]) == ["groups[0].name"]


def test_it_names_a_share_in_an_unknown_group():
    assert paths([], [share("p", 1, group="nope")]) == ["shares[0].group"]


# -- nets and the cover ----------------------------------------------------------------------------------


def two_departments():
    groups = (GroupSpec("research", lend_limit=50), GroupSpec("product"))
    shares = (
        share("vision", 4, LEND, "research"),
        share("language", 2, group="research"),
        share("web", 2, group="product"),
    )
    return groups, shares


def test_a_lend_limit_caps_what_a_department_offers():
    # The worked example at t=0: web holds 5 (2 own, 3 borrowed), research is idle (6) but offers 3.
    groups, shares = two_departments()
    n = nets(Tree.build(groups, shares), "a10g", {"web": 5}, pool=0)
    assert n.net["research"] == 6 and n.offer["research"] == 3
    assert n.taken["product"] == 3 and n.top == 0 and n.shortfall[None] == 0
    assert n.lent["research"] == 3
    # What research lends outside comes from its children in proportion to their offers (4 and 2 idle).
    assert (n.lent["vision"], n.lent["language"], n.lent["web"]) == (2, 1, 0)
    # One more borrowed GPU for web would be a shortfall of 1 at the top.
    assert nets(Tree.build(groups, shares), "a10g", {"web": 6}, pool=0).shortfall[None] == 1


def test_a_borrow_limit_is_a_shortfall_of_the_group():
    groups = (GroupSpec("research", borrow_limit=50),)
    shares = (share("a", 2, group="research"), share("b", 4, LEND))
    n = nets(Tree.build(groups, shares), "a10g", {"a": 4}, pool=0)
    assert n.taken["research"] == 2 and n.shortfall["research"] == 1 and n.shortfall[None] == 0


def test_a_sibling_lends_inside_its_department_first():
    # language borrows 1 from vision: the department takes nothing from outside.
    groups, shares = two_departments()
    n = nets(Tree.build(groups, shares), "a10g", {"language": 3, "web": 5}, pool=0)
    assert n.taken["research"] == 0 and n.net["research"] == 3 and n.offer["research"] == 3
    assert n.taken["language"] == 1


def test_without_groups_the_cover_is_borrowed_against_idle_lendable():
    shares = (share("a", 2), share("b", 2, LEND), share("r", 2, "RESERVE"))
    n = nets(Tree.build((), shares), "a10g", {"a": 5}, pool=1)
    # borrowed 3, idle lendable 2 (b) + 1 (pool): the cover holds exactly.
    assert n.top == 0 and n.shortfall == {None: 0}


# -- history --------------------------------------------------------------------------------------------


def test_steady_borrowing_of_n_gives_a_history_of_n():
    h = FairShareHistory(half_life_s=3600, at=0)
    for t in range(600, 30 * 3600, 600):
        h.advance(t, {("a", "a10g"): 5})
    assert h.values[("a", "a10g")] == pytest.approx(5, rel=1e-3)


def test_history_halves_in_one_half_life():
    h = FairShareHistory(half_life_s=86400, at=0, values={("a", "a10g"): 4.0})
    h.advance(86400, {})
    assert h.values[("a", "a10g")] == pytest.approx(2.0)


@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 8)), min_size=1, max_size=20))
def test_history_is_the_integral_however_the_steps_fall(steps):
    # One call per step equals the formula: sum of x_i (2^-(T-t_i+1)/H - 2^-(T-t_i)/H)... computed
    # in one go with the closed form of each interval.
    half = 1000.0
    h = FairShareHistory(half_life_s=half, at=0)
    t, expected = 0, 0.0
    for dt, x in steps:
        h.advance(t + dt, {("a", "t"): x} if x else {})
        expected = expected * 2 ** (-dt / half) + x * (1 - 2 ** (-dt / half))
        t += dt
    assert h.values.get(("a", "t"), 0.0) == pytest.approx(expected, abs=1e-5)


def test_history_round_trips_as_plain_data():
    h = FairShareHistory(half_life_s=60, at=10, values={("a", "a10g"): 1.5, ("dept", "h100"): 0.25})
    again = FairShareHistory.from_dict(h.to_dict())
    assert again.values == h.values and again.at == 10 and again.half_life_s == 60


def test_no_half_life_keeps_no_history():
    h = FairShareHistory(half_life_s=0)
    assert h.advance(100, {("a", "a10g"): 3}) == {}


def test_fair_share_value_divides_by_weight_and_capacity():
    assert fair_share_value(3, 0, 1, 2) == 1.5  # product in the worked example
    assert fair_share_value(3, 1, 2, 0) == 2.0  # capacity 0 counts as 1


# -- the organisation view ---------------------------------------------------------------------------------


def example_snapshot(history=None):
    groups, shares = two_departments()
    nodes = tuple(NodeView(f"n{i}", "a10g", 1) for i in range(1, 9))
    running = tuple(
        RunningView(f"w{i}#1", f"w{i}", "web", "a10g", 0, 0, 0, ((f"n{i}", (0,)),), i > 2)
        for i in range(1, 6)
    )
    queued = (
        QueuedView("w6", "web", "a10g", 1, 0, 0),
        QueuedView("l1", "language", "a10g", 3, 0, 100),
    )
    return Snapshot(now=100, nodes=nodes, shares=shares, running=running, queued=queued, groups=groups)


def test_the_view_says_who_borrows_lends_and_waits():
    rows = {(r.name, r.gpu_type): r for r in organisation_view(example_snapshot())}
    web, product, research = rows[("web", "a10g")], rows[("product", "a10g")], rows[("research", "a10g")]
    assert (web.capacity, web.in_use, web.taken_from_outside) == (2, 5, 3)
    assert product.fair_share_value == 1.5
    assert research.lent_outside == 3
    # research's 3 lent outside come from its children's 6 idle in proportion to their offers: vision
    # lends 2 of its 4 beyond itself (its sibling needs none), language 1 of its 2.
    assert rows[("vision", "a10g")].lent_outside == 2 and rows[("vision", "a10g")].state == LENDING
    assert rows[("language", "a10g")].lent_outside == 1
    # Both departments wait to borrow (l1 needs 3 of language's 2). Of the 3 that borrowers may hold now
    # (research's offer, all lent) each gets its weight x capacity's fraction, as rule 5 evens out
    # taken / (weight x capacity): research 1 x 6 = 6 of 8, product 1 x 2 = 2 of 8. Research takes
    # nothing yet: starved; product takes 3, above its 0.75.
    assert research.waiting_to_borrow and research.fair_part == 2.25
    assert (research.fair_weight, research.competing_total_fair_weight) == (6, 8)
    assert research.competing_total_weight == 2  # the plain weights, as before
    assert product.fair_part == 0.75 and product.fair_weight == 2
    assert research.state == STARVED
    assert product.state == BORROWING
    assert rows[("language", "a10g")].depth == 1 and rows[("language", "a10g")].parent == "research"


def test_a_department_that_only_lends_is_lending():
    snapshot = example_snapshot()
    snapshot = dataclasses.replace(snapshot, queued=())
    rows = {r.name: r for r in organisation_view(snapshot)}
    assert rows["research"].state == LENDING and rows["research"].fair_part is None
    assert rows["web"].state == BORROWING and rows["web"].fair_part == 3  # alone among borrowers
    assert rows["web"].competing_total_fair_weight == rows["web"].fair_weight == 2


def borrowed_by_rule_5(borrowers, lender_idle, groups=()):
    """Borrowers (name, capacity, weight, group) each at their own capacity with many 1-GPU jobs waiting,
    a lender with `lender_idle` idle GPUs: the snapshot after one pass, with what rule 5 admitted running
    and the rest still queued."""
    shares = [share(name, cap, group=group, weight=w) for name, cap, w, group in borrowers]
    shares.append(share("lender", lender_idle, LEND))
    size = sum(cap for _, cap, _, _ in borrowers) + lender_idle
    nodes = tuple(NodeView(f"n{i}", "a10g", 1) for i in range(size))
    free = iter(range(size))

    def on_node(job, name, borrowed):
        return RunningView(f"{job}#1", job, name, "a10g", 0, 0, 0, ((f"n{next(free)}", (0,)),), borrowed)

    running = [on_node(f"{name}-own{i}", name, False) for name, cap, _, _ in borrowers for i in range(cap)]
    queued = [QueuedView(f"{name}-{i}", name, "a10g", 1, 0, i) for name, *_ in borrowers for i in range(12)]
    snap = Snapshot(now=10, nodes=nodes, shares=tuple(shares), running=tuple(running), queued=tuple(queued))
    snap = dataclasses.replace(snap, groups=tuple(groups))
    admitted = {a.job_id for a in policy.plan(snap).admissions}
    running += [on_node(j.job_id, j.share, True) for j in queued if j.job_id in admitted]
    queued = [j for j in queued if j.job_id not in admitted]
    return dataclasses.replace(snap, running=tuple(running), queued=tuple(queued))


@pytest.mark.parametrize(
    "borrowers, lender_idle, groups, parts",
    [
        # equal weights, capacities 8 and 2: parts 4:1 (by weight alone they would be 5 and 5)
        ((("a", 8, 1, None), ("b", 2, 1, None)), 10, (), {"a": 8, "b": 2}),
        # weight 4 x capacity 2 = weight 1 x capacity 8: even parts
        ((("a", 8, 1, None), ("b", 2, 4, None)), 10, (), {"a": 5, "b": 5}),
        # weight 2 x capacity 2 against 1 x 2 (the README's product): 2:1
        ((("a", 2, 2, None), ("b", 2, 1, None)), 6, (), {"a": 4, "b": 2}),
        # groups by their subtree's capacity: dept-a (6) against dept-b (2), then a1 (4) and a2 (2)
        (
            (("a1", 4, 1, "dept-a"), ("a2", 2, 1, "dept-a"), ("b1", 2, 1, "dept-b")),
            8,
            (GroupSpec("dept-a"), GroupSpec("dept-b")),
            {"dept-a": 6, "dept-b": 2, "a1": 4, "a2": 2, "b1": 2},
        ),
    ],
)
def test_the_fair_part_is_what_rule_5_gives_and_a_share_at_it_is_not_starved(
    borrowers, lender_idle, groups, parts
):
    rows = {r.name: r for r in organisation_view(borrowed_by_rule_5(borrowers, lender_idle, groups))}
    assert {name: rows[name].fair_part for name in parts} == pytest.approx(parts)
    # Rule 5 took the idle GPUs to exactly those parts; each still waits to borrow, and holding its part
    # it is borrowing, not starved.
    assert {name: rows[name].taken_from_outside for name in parts} == parts
    for name in parts:
        r = rows[name]
        assert r.waiting_to_borrow and r.state == BORROWING
        assert r.fair_weight == r.weight * max(1, r.capacity)
    top = [rows[name] for name in parts if rows[name].parent is None]
    assert sum(r.fair_part for r in top) == pytest.approx(lender_idle)
    assert {r.competing_total_fair_weight for r in top} == {sum(r.fair_weight for r in top)}


def test_a_share_waiting_below_its_weight_times_capacity_part_is_starved():
    # b (capacity 2) holds 4 of the 10 lent, a (capacity 8, same weight) 6: a's part is 8, b's 2.
    snap = borrowed_by_rule_5((("a", 8, 1, None), ("b", 2, 1, None)), 10)
    running = [r for r in snap.running if not (r.borrowed and r.share == "a" and r.job_id in {"a-6", "a-7"})]
    free = [r.placement for r in snap.running if r not in running]
    running += [
        RunningView(f"b-x{i}#1", f"b-x{i}", "b", "a10g", 0, 0, 0, placement, True)
        for i, placement in enumerate(free)
    ]
    snap = dataclasses.replace(snap, running=tuple(running))
    rows = {r.name: r for r in organisation_view(snap)}
    assert (rows["a"].taken_from_outside, rows["b"].taken_from_outside) == (6, 4)
    assert (rows["a"].fair_part, rows["b"].fair_part) == (8, 2)
    assert rows["a"].state == STARVED and rows["b"].state == BORROWING


def test_the_simulator_counts_a_nested_groups_lent_outside_as_the_view_does():
    # The worked example with vision in its own group under research: what research lends outside
    # comes, in proportion to their offers, from vision-team and language, and vision-team also lends
    # to language. Per interval, vision-team's lent: 0-100 2 (of research's 3), 100-200 4 (3 out, 1 to
    # language), 200-1100 2, 1100-1200 0.5 (1 out of 4 offered), 1200-2000 4/6 (1 out of 6).
    import json
    from pathlib import Path

    from quotas.engine import scenario as sc
    from quotas.engine.simulate import simulate

    data = json.loads((Path(__file__).parent / "scenarios" / "two-departments-lend-limit.json").read_text())
    data["groups"].append({"name": "vision-team", "parent": "research"})
    next(s for s in data["shares"] if s["name"] == "vision")["group"] = "vision-team"
    result = simulate(sc.parse(data))
    lent_s = 2 * 100 + 4 * 100 + 2 * 900 + 0.5 * 100 + 4 / 6 * 800
    assert result.groups["vision-team"] == {
        "gpu_seconds_from_outside": 0,
        "gpu_seconds_lent_outside": round(lent_s),
    }
    assert result.groups["research"]["gpu_seconds_lent_outside"] == 2400  # the top level as before


def test_the_view_reads_the_history_given():
    rows = organisation_view(example_snapshot(), {("product", "a10g"): 1.0})
    product = next(r for r in rows if r.name == "product")
    assert product.history == 1.0 and product.fair_share_value == 2.0


def test_taken_from_outside_feeds_the_history():
    assert taken_from_outside(example_snapshot()) == {("web", "a10g"): 3, ("product", "a10g"): 3}
