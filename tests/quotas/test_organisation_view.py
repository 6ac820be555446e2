"""What the organisation page, the API, the CLI and /metrics say (issue 37, item 3). What a node lends
outside (quotas.organisation.view): what its capacity lends beyond its own subtree, at every level, from
the engine's nets (SEMANTICS "Groups: the organisation tree": net per node), checked step by step on the
worked example ../shared/scenarios/two-departments-lend-limit.json and on a nested tree. Why a share
waits to borrow (quotas.organisation.why_it_waits), the one function behind all of them."""

import pytest

from quotas import organisation
from quotas.engine.tree import LENDING, Tree, nets
from quotas.engine.views import (
    LEND,
    LEND_AND_BORROW,
    GroupSpec,
    NodeView,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
)


def share(name, cap, strategy=LEND_AND_BORROW, group=None):
    return ShareView(name=name, capacity={"a10g": cap}, strategy=strategy, group=group)


def running(job, share_name, node, borrowed=False):
    return RunningView(f"{job}#1", job, share_name, "a10g", 0, 0, 0, ((node, (0,)),), borrowed)


def two_departments():
    groups = (GroupSpec("research", lend_limit=50), GroupSpec("product"))
    shares = (
        share("vision", 4, LEND, "research"),
        share("language", 2, group="research"),
        share("web", 2, group="product"),
    )
    return groups, shares


def snapshot(runs, queued=(), *, groups=None, shares=None, node_count=8):
    if groups is None:
        groups, shares = two_departments()
    nodes = tuple(NodeView(f"n{i}", "a10g", 1) for i in range(1, node_count + 1))
    placed = tuple(running(job, s, f"n{i}", borrowed) for i, (job, s, borrowed) in enumerate(runs, 1))
    return Snapshot(now=0, nodes=nodes, shares=shares, running=placed, queued=tuple(queued), groups=groups)


# The example's steps (its README entry), as (job, share, borrowed) running after each.
STEP_0 = [("w1", "web", False), ("w2", "web", False)] + [(f"w{i}", "web", True) for i in (3, 4, 5)]
STEP_100 = [*STEP_0, ("l1", "language", False), ("l2", "language", False), ("l3", "language", True)]
STEP_200 = [
    ("w1", "web", False),
    ("w2", "web", False),
    ("w3", "web", True),
    ("l1", "language", False),
    ("l2", "language", False),
    ("l3", "language", True),
    ("v1", "vision", False),
    ("v2", "vision", False),
]
STEP_1000 = [
    ("w4", "web", False),
    ("w5", "web", False),
    ("w6", "web", True),
    *STEP_200[3:],
]


def by_name(rows):
    return {r.name: r for r in rows}


@pytest.mark.parametrize(
    ("step", "taken", "lent"),
    [
        # t=0: web borrows 3, all of research's offer (min(6 idle, 50% of 6)); research's 6 idle GPUs
        # serve them in proportion: vision 4 x 3/6, language 2 x 3/6.
        (STEP_0, {"web": 3, "product": 3}, {"research": 3, "vision": 2, "language": 1}),
        # t=100: l3 borrows vision's GPU inside research, web still holds research's 3: all 4 of vision's
        # idle GPUs are used outside vision (it said 1: language's need alone).
        (STEP_100, {"web": 3, "product": 3, "language": 1}, {"research": 3, "vision": 4, "language": 0}),
        # t=200 (v1, v2 in, w4 and w5 reclaimed) and t=1000 (w6 borrows the 1 research offers): vision's
        # 2 idle GPUs go to l3 and to product.
        (STEP_200, {"web": 1, "product": 1, "language": 1}, {"research": 1, "vision": 2, "language": 0}),
        (STEP_1000, {"web": 1, "product": 1, "language": 1}, {"research": 1, "vision": 2, "language": 0}),
    ],
    ids=["t=0", "t=100", "t=200", "t=1000"],
)
def test_the_worked_examples_steps(step, taken, lent):
    snap = snapshot(step)
    rows = by_name(organisation.view(snap))
    for name in ("research", "product", "vision", "language", "web"):
        assert rows[name].taken_from_outside == taken.get(name, 0), name
    for name, gpus in lent.items():
        assert rows[name].lent_outside == pytest.approx(gpus), name
    # The engine's own figures: what each node takes from outside, and what the top level lends.
    groups, shares = two_departments()
    tree = Tree.build(groups, shares)
    used = {s: sum(1 for _, who, _ in step if who == s) for s in ("vision", "language", "web")}
    n = nets(tree, "a10g", used, 0)
    assert {name: rows[name].taken_from_outside for name in n.taken} == dict(n.taken)
    assert rows["research"].lent_outside == pytest.approx(n.lent["research"])
    assert rows["product"].lent_outside == pytest.approx(n.lent["product"])
    # Every borrowed GPU is lent by some share (nothing unassigned here).
    borrowed = sum(1 for _, _, b in step if b)
    assert sum(rows[s].lent_outside for s in ("vision", "language", "web")) == pytest.approx(borrowed)


def test_a_share_whose_department_lends_outside_is_lending():
    rows = by_name(organisation.view(snapshot(STEP_0)))
    assert rows["vision"].state == LENDING and rows["vision"].lent_outside == 2
    assert rows["research"].state == LENDING


def nested():
    # lab > (team-a: idle-a LEND 4, busy-a 2; team-b: b 2), lab lends at most 50% (4 of 8);
    # shop > store borrows.
    groups = (
        GroupSpec("lab", lend_limit=50),
        GroupSpec("team-a", "lab"),
        GroupSpec("team-b", "lab"),
        GroupSpec("shop"),
    )
    shares = (
        share("idle-a", 4, LEND, "team-a"),
        share("busy-a", 2, group="team-a"),
        share("b", 2, group="team-b"),
        share("store", 2, group="shop"),
    )
    return groups, shares


def test_a_nested_tree_counts_every_level_beyond_its_subtree():
    groups, shares = nested()
    # store runs 2 own and borrows 3; b borrows 1 (inside lab, from team-a); busy-a runs its 2 own.
    runs = [
        ("s1", "store", False),
        ("s2", "store", False),
        ("s3", "store", True),
        ("s4", "store", True),
        ("s5", "store", True),
        ("b1", "b", False),
        ("b2", "b", False),
        ("b3", "b", True),
        ("a1", "busy-a", False),
        ("a2", "busy-a", False),
    ]
    rows = by_name(organisation.view(snapshot(runs, groups=groups, shares=shares, node_count=10)))
    # lab: idle-a offers 4, b needs 1: net 3, all of it taken by shop (its lend limit 4 does not bind).
    assert rows["lab"].lent_outside == 3 and rows["shop"].taken_from_outside == 3
    # team-a lends 1 to team-b and 3 outside lab: 4, all of idle-a's idle GPUs.
    assert rows["team-a"].lent_outside == 4 and rows["idle-a"].lent_outside == 4
    assert rows["team-b"].taken_from_outside == 1 and rows["b"].taken_from_outside == 1
    assert rows["busy-a"].lent_outside == 0
    assert rows["idle-a"].state == LENDING


def test_a_lend_limit_keeps_the_rest_of_a_subtree_idle():
    groups, shares = nested()
    # store borrows 4, all that lab may lend (50% of 8) of its 8 idle: idle-a 4 and busy-a 2 in team-a,
    # b 2 in team-b. Each level shares what goes out in proportion to its children's offers.
    runs = [("s1", "store", False), ("s2", "store", False)] + [(f"s{i}", "store", True) for i in range(3, 7)]
    rows = by_name(organisation.view(snapshot(runs, groups=groups, shares=shares, node_count=10)))
    assert rows["lab"].lent_outside == 4
    assert rows["team-a"].lent_outside + rows["team-b"].lent_outside == pytest.approx(4)
    assert rows["idle-a"].lent_outside + rows["busy-a"].lent_outside == pytest.approx(
        rows["team-a"].lent_outside
    )
    assert rows["idle-a"].lent_outside == pytest.approx(2 * rows["busy-a"].lent_outside)  # 4:2 offers


def test_without_groups_the_view_is_the_engines():
    shares = (share("lender", 4, LEND), share("borrower", 2))
    runs = [("x1", "borrower", False), ("x2", "borrower", False), ("x3", "borrower", True)]
    snap = snapshot(
        runs, [QueuedView("x4", "borrower", "a10g", 1, 0, 0)], groups=(), shares=shares, node_count=6
    )
    from quotas.engine.tree import organisation_view

    assert organisation.view(snap) == organisation_view(snap)
    assert by_name(organisation.view(snap))["lender"].lent_outside == 1


# -- why it waits (quotas.organisation.why_it_waits: the page, the API and the CLI) --------------------


def organisation_of(snap):
    from datetime import UTC, datetime

    nodes = [organisation.Node(row=r) for r in organisation.view(snap)]
    org = organisation.Organisation(
        at=datetime.now(UTC), nodes=nodes, gpu_types=["a10g"], groups={g.name: g for g in snap.groups}
    )
    for node in org.nodes:  # the limits in GPUs, as organisation.load sets them
        g = org.groups.get(node.row.name)
        if g is not None and g.borrow_limit != -1:
            node.may_take = g.borrow_limit * node.row.capacity // 100
    return org


def test_a_job_that_fits_what_is_left_of_its_own_capacity_does_not_wait_to_borrow():
    groups = (GroupSpec("research", borrow_limit=0),)
    shares = (
        share("roomy", 4, group="research"),
        share("other", 2, group="research"),
        share("lender", 2, LEND),
    )
    queued = [QueuedView("small", "roomy", "a10g", 1, 0, 0), QueuedView("big", "roomy", "a10g", 3, 0, 0)]
    snap = snapshot([("r1", "roomy", False), ("r2", "roomy", False)], queued, groups=groups, shares=shares)
    org = organisation_of(snap)
    words = ["group research may take 0 a10g from outside: 0 taken"]
    assert organisation.why_it_waits(org, "roomy", "a10g") == words  # the share: its big job waits
    assert organisation.why_it_waits(org, "roomy", "a10g", gpus=3) == words
    assert organisation.why_it_waits(org, "roomy", "a10g", gpus=1) == []  # 2 + 1 of 4: own capacity
    assert organisation.why_it_waits(org, "other", "a10g") == []  # nothing queued
    assert organisation.why_it_waits(org, "research", "a10g") == []  # a group: its shares say it
    assert organisation.why_it_waits(org, "nowhere", "a10g") == []
    assert organisation.why_it_waits(org, "roomy", "h100") == []


def test_behind_the_shares_with_a_lower_value_under_the_same_group():
    shares = (share("busy", 2), share("quiet", 2), share("lender", 4, LEND))
    runs = [("b1", "busy", False), ("b2", "busy", False), ("b3", "busy", True), ("q1", "quiet", False)]
    runs.append(("q2", "quiet", False))
    queued = [QueuedView("bw", "busy", "a10g", 1, 0, 0), QueuedView("qw", "quiet", "a10g", 1, 0, 0)]
    org = organisation_of(snapshot(runs, queued, groups=(), shares=shares))
    assert organisation.why_it_waits(org, "busy", "a10g") == ["behind 1 share with a lower fair-share value"]
    assert organisation.why_it_waits(org, "quiet", "a10g") == []
