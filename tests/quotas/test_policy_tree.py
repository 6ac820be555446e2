"""The organisation tree in the rules (SEMANTICS "Groups: the organisation tree", rules 3, 5, 9, 10): the
worked example step by step, a table test per sentence of the contract, and properties on random trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quotas.engine import policy
from quotas.engine import scenario as sc
from quotas.engine.simulate import simulate
from quotas.engine.tree import GroupSpec, Tree, nets
from quotas.engine.views import (
    LEND,
    LEND_AND_BORROW,
    RECLAIM,
    RESERVE,
    NodeView,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
    borrowed_attempts,
    usage,
)

FIXTURES = Path(__file__).resolve().parent / "scenarios"


def attempts(result, job_id):
    return [
        (a.start, a.end, a.outcome, a.borrowed, a.preempted_by, a.preemption_reason)
        for a in result.jobs[job_id].attempts
    ]


# -- the worked example ------------------------------------------------------------------------------------


def test_two_departments_with_a_lend_limit_go_as_the_readme_says():
    scenario = sc.load(FIXTURES / "two-departments-lend-limit.json")
    steps: dict[int, object] = {}
    result = simulate(scenario, on_pass=lambda t: steps.setdefault(t, None))
    run = {j: attempts(result, j) for j in result.jobs}
    # t=0: w1, w2 own; w3-w5 borrow (research offers min(6, 3)); w6 waits: research's lend limit.
    assert run["w1"] == run["w2"] == [(0, 1000, "SUCCEEDED", False, None, None)]
    assert run["w3"] == [(0, 1000, "SUCCEEDED", True, None, None)]
    # t=100: l1, l2 own; l3 borrows the last free GPU from vision inside research (value 0 < 1.5).
    assert run["l1"] == run["l2"] == [(100, 1100, "SUCCEEDED", False, None, None)]
    assert run["l3"] == [(100, 1100, "SUCCEEDED", True, None, None)]
    # t=200: v1, v2 reclaim from web (another department) before language: w5 for v1, w4 for v2.
    assert run["w5"] == [
        (0, 200, "PREEMPTED", True, "v1", "RECLAIM"),
        (1000, 2000, "SUCCEEDED", False, None, None),
    ]
    assert run["w4"] == [
        (0, 200, "PREEMPTED", True, "v2", "RECLAIM"),
        (1000, 2000, "SUCCEEDED", False, None, None),
    ]
    assert run["v1"] == run["v2"] == [(200, 1200, "SUCCEEDED", False, None, None)]
    # t=1000: w6 borrows the 1 GPU research now offers.
    assert run["w6"] == [(1000, 2000, "SUCCEEDED", True, None, None)]
    # product took 3 (0-200), 1 (200-1000), 1 (1000-2000) from outside; research lent it all.
    assert result.groups == {
        "product": {"gpu_seconds_from_outside": 2400, "gpu_seconds_lent_outside": 0},
        "research": {"gpu_seconds_from_outside": 0, "gpu_seconds_lent_outside": 2400},
    }
    assert result.shares["web"]["lost_gpu_seconds"]["reclaim"] == 2 * 200


def test_at_t0_w6_waits_naming_the_lend_limit_that_binds():
    data = json.loads((FIXTURES / "two-departments-lend-limit.json").read_text())
    data["settings"]["until_s"] = 50
    result = simulate(data)
    assert result.jobs["w6"].final == "QUEUED"
    assert "only 0 idle lendable a10g" in result.waiting["w6"] or "nothing idle" in result.waiting["w6"]


def test_the_fixture_is_the_shared_one():
    shared = Path(__file__).resolve().parents[2].parent / "shared" / "scenarios"
    if not (shared / "two-departments-lend-limit.json").exists():
        pytest.skip("shared/ is not here")
    assert json.loads((shared / "two-departments-lend-limit.json").read_text()) == json.loads(
        (FIXTURES / "two-departments-lend-limit.json").read_text()
    )


# -- table tests: one per sentence -------------------------------------------------------------------------


def nodes(n, gpus=1, gpu_type="a10g"):
    return tuple(NodeView(f"n{i}", gpu_type, gpus) for i in range(1, n + 1))


def share(name, cap, strategy=LEND_AND_BORROW, group=None, weight=1, **kw):
    return ShareView(name=name, capacity={"a10g": cap}, strategy=strategy, group=group, weight=weight, **kw)


def run(attempt, share_name, node, *, borrowed=False, started=0.0, priority=0):
    return RunningView(
        attempt, attempt, share_name, "a10g", priority, started, started, ((node, (0,)),), borrowed
    )


def queued(job_id, share_name, gpus=1, submitted=10.0, priority=0):
    return QueuedView(job_id, share_name, "a10g", gpus, priority, submitted)


def admitted(p):
    return {a.job_id: a.borrowed for a in p.admissions}


def test_a_group_borrow_limit_stops_its_subtree_and_says_so():
    # research (capacity 2) may take 50% = 1 GPU from outside; its share a borrows 1 already.
    snap = Snapshot(
        now=10,
        nodes=nodes(4),
        shares=(share("a", 2, group="research"), share("b", 2, LEND)),
        groups=(GroupSpec("research", borrow_limit=50),),
        running=(run("a1", "a", "n1"), run("a2", "a", "n2"), run("a3", "a", "n3", borrowed=True)),
        queued=(queued("a4", "a"),),
    )
    p = policy.plan(snap)
    assert admitted(p) == {}
    assert p.waiting["a4"].endswith("group research may take 1 a10g from outside: 1 taken")


def test_without_a_limit_the_same_job_borrows():
    snap = Snapshot(
        now=10,
        nodes=nodes(4),
        shares=(share("a", 2, group="research"), share("b", 2, LEND)),
        groups=(GroupSpec("research"),),
        running=(run("a1", "a", "n1"), run("a2", "a", "n2"), run("a3", "a", "n3", borrowed=True)),
        queued=(queued("a4", "a"),),
    )
    assert admitted(policy.plan(snap)) == {"a4": True}


def test_a_sibling_borrows_inside_a_department_whose_lend_limit_is_used_up():
    # research lends at most 0 outside: product cannot borrow its idle GPU, language (inside) can.
    groups = (GroupSpec("research", lend_limit=0), GroupSpec("product"))
    shares = (
        share("vision", 2, LEND, "research"),
        share("language", 0, group="research"),
        share("web", 0, group="product"),
    )
    snap = Snapshot(now=10, nodes=nodes(2), shares=shares, groups=groups, queued=(queued("w1", "web"),))
    assert admitted(policy.plan(snap)) == {}
    snap = Snapshot(now=10, nodes=nodes(2), shares=shares, groups=groups, queued=(queued("l1", "language"),))
    assert admitted(policy.plan(snap)) == {"l1": True}


def test_borrowers_are_chosen_top_down_by_fair_share_value():
    # One GPU to borrow. dept-a (capacity 4) takes 1 from outside: value 1/4; dept-b (capacity 1) takes
    # 1: value 1. Inside dept-b, b-small takes nothing (value 0, the lowest of any share): flat, it would
    # go first; top-down, dept-a goes first and b-small waits.
    groups = (GroupSpec("dept-a"), GroupSpec("dept-b"))
    shares = (
        share("a", 4, group="dept-a"),
        share("b", 1, group="dept-b"),
        share("b-small", 0, group="dept-b"),
        share("lender", 2, LEND),
    )
    running = tuple(run(f"a{i}", "a", f"n{i}", borrowed=i == 5) for i in range(1, 6))
    running += (run("b1", "b", "n6"), run("b2", "b", "n7", borrowed=True))
    jobs = (queued("x", "b-small"), queued("y", "a"))
    snap = Snapshot(now=10, nodes=nodes(8), shares=shares, groups=groups, running=running, queued=jobs)
    p = policy.plan(snap)
    assert admitted(p) == {"y": True}
    assert "nothing idle to borrow" in p.waiting["x"]
    flat = Snapshot(now=10, nodes=nodes(8), shares=shares, running=running, queued=jobs)
    assert admitted(policy.plan(flat)) == {"x": True}


def test_weights_split_idle_capacity_two_to_one():
    # Six idle GPUs of a lender; heavy (weight 2) and light (weight 1), both capacity 1, wait with many
    # 1-GPU jobs: they borrow alternately by value (taken / weight), ending 4 to 2.
    shares = (share("heavy", 1, weight=2), share("light", 1), share("lender", 6, LEND))
    jobs = [queued(f"h{i}", "heavy", submitted=i) for i in range(8)] + [
        queued(f"l{i}", "light", submitted=i) for i in range(8)
    ]
    running = (run("h-own", "heavy", "n1"), run("l-own", "light", "n2"))
    snap = Snapshot(now=10, nodes=nodes(8), shares=shares, running=running, queued=tuple(jobs))
    got = admitted(policy.plan(snap))
    assert sum(1 for j in got if j.startswith("h")) == 4 and sum(1 for j in got if j.startswith("l")) == 2


DAY = 86400


def busy_and_idle_after_a_week(busy_waited_s: float) -> tuple[dict, dict]:
    """Half-life 1 day: "busy" borrowed 4 a10g steadily all week, "idle" nothing. Both (capacity 2, equal
    weights) use their own 2 GPUs and queue 6 more 1-GPU jobs; idle's were submitted 50 s ago, busy's
    `busy_waited_s` ago; a lender has 4 idle GPUs. Returns the history's values at the week's end and
    the snapshot's fields without the history."""
    from quotas.engine.tree import FairShareHistory

    history = FairShareHistory(half_life_s=DAY, at=0)
    for t in range(3600, 7 * DAY, 3600):
        history.advance(t, {("busy", "a10g"): 4})
    values = history.advance(7 * DAY, {})
    shares = (share("busy", 2), share("idle", 2), share("lender", 4, LEND))
    jobs = [queued(f"b{i}", "busy", submitted=7 * DAY - busy_waited_s + i) for i in range(6)] + [
        queued(f"i{i}", "idle", submitted=7 * DAY - 50 + i) for i in range(6)
    ]
    running = (
        run("b-1", "busy", "n1"),
        run("b-2", "busy", "n2"),
        run("i-1", "idle", "n3"),
        run("i-2", "idle", "n4"),
    )
    return values, dict(now=7 * DAY, nodes=nodes(8), shares=shares, running=running, queued=tuple(jobs))


def test_memory_a_share_idle_for_days_goes_ahead_of_one_that_borrowed_all_week():
    # Steady borrowing of 4 a10g all week leaves a history of about 4; the share that was idle has none.
    # Both wait with equal weights and capacities: the idle one gets its weighted part of the 4 GPUs that
    # free (2 each would be the split without history; with it, the idle one first). Busy's jobs were
    # submitted just now: no starving head (rule 6).
    values, base = busy_and_idle_after_a_week(busy_waited_s=100)
    assert values[("busy", "a10g")] == pytest.approx(3.86, rel=0.01)  # 4 x (1 - 2^-7), an hour idle
    without = admitted(policy.plan(Snapshot(**base)))
    assert sorted(without) == ["b0", "b1", "i0", "i1"]  # no memory: 2 and 2, busy first on ties by name
    with_history = admitted(policy.plan(Snapshot(**base, fair_share_half_life_s=DAY, history=values)))
    # busy's value starts at 3.86/2: idle borrows until its value passes that (4 GPUs); busy gets none.
    assert sorted(with_history) == ["i0", "i1", "i2", "i3"]


def test_memory_holds_when_the_busy_shares_head_is_starving():
    # The same week, but busy's jobs have waited two hours (starvation_s is 3,600 s): rule 6 makes its
    # head hold a node against backfill, not jump rule 5's order. With history the idle share still
    # borrows first, and busy's head hears why when its turn comes.
    values, base = busy_and_idle_after_a_week(busy_waited_s=7200)
    p = policy.plan(Snapshot(**base, fair_share_half_life_s=DAY, history=values))
    assert sorted(admitted(p)) == ["i0", "i1", "i2", "i3"]
    assert p.waiting["b0"].endswith("nothing idle to borrow")
    # Flat (no history, no groups, no weights) decides as before the tree: the starving head first,
    # in queue order, then rule 5 by fewest borrowed per capacity.
    flat = admitted(policy.plan(Snapshot(**base)))
    assert "b0" in flat and sorted(flat) == ["b0", "b1", "i0", "i1"]


def test_reclaim_takes_from_the_furthest_share_first_then_most_borrowed_per_weight():
    # owner (research) needs its GPU back; sibling (research) borrows 2, far (product) borrows 1: the
    # far one goes first although the sibling borrows more.
    groups = (GroupSpec("research"), GroupSpec("product"))
    shares = (
        share("owner", 2, LEND, "research"),
        share("sibling", 0, group="research"),
        share("far", 0, group="product"),
    )
    running = (
        run("s1", "sibling", "n1", borrowed=True),
        run("s2", "sibling", "n2", borrowed=True),
    )
    running_far = (run("f1", "far", "n3", borrowed=True),)
    snap = Snapshot(
        now=10,
        nodes=nodes(3),
        shares=shares,
        groups=groups,
        running=running + running_far,
        queued=(queued("o1", "owner"),),
        # the pool: 1 unassigned GPU (3 nodes, capacity 2) lends to far
    )
    p = policy.plan(snap)
    assert [(x.attempt_id, x.reason) for x in p.preemptions] == [("f1", RECLAIM)]


def test_without_groups_weights_order_reclaim_by_borrowed_per_weight():
    shares = (share("owner", 3, LEND), share("heavy", 0, weight=4), share("light", 0))
    running = (
        run("h1", "heavy", "n1", borrowed=True),
        run("h2", "heavy", "n2", borrowed=True),
        run("l1", "light", "n3", borrowed=True),
    )
    snap = Snapshot(now=10, nodes=nodes(3), shares=shares, running=running, queued=(queued("o1", "owner"),))
    # heavy borrows 2 / weight 4 = 0.5 < light 1 / 1: light goes first (flat: heavy, the most borrowed).
    assert [x.attempt_id for x in policy.plan(snap).preemptions] == ["l1"]
    flat = Snapshot(
        now=10,
        nodes=nodes(3),
        shares=(share("owner", 3, LEND), share("heavy", 0), share("light", 0)),
        running=running,
        queued=(queued("o1", "owner"),),
    )
    assert [x.attempt_id for x in policy.plan(flat).preemptions] == ["h2"]


def test_a_lowered_lend_limit_stops_nothing_but_owners_take_back_first():
    # The broken cover: research lent 3 to product, then its lend limit drops to 0. Nothing is stopped,
    # no new borrowing of product starts, and vision's own job reclaims only what its admission adds.
    data = json.loads((FIXTURES / "two-departments-lend-limit.json").read_text())
    data["jobs"] = [j for j in data["jobs"] if j["share"] == "web"] + [
        {"id": "v1", "share": "vision", "submit_at": 300, "duration_s": 1000, "gpus": 1, "gpu_type": "a10g"}
    ]
    for j in data["jobs"]:
        if j["id"] == "w6":
            j["submit_at"] = 200
    data["events"] = [{"at": 100, "kind": "update_group", "group": "research", "set": {"lend_limit": 0}}]
    result = simulate(data)
    assert [a.outcome for a in result.jobs["w3"].attempts] == ["SUCCEEDED"]  # not stopped at 100
    assert result.jobs["w6"].first_start >= 1000  # no new borrowing on the shortfall
    # v1: research offers 0 but product takes 3: admitting v1 adds nothing to that shortfall (its GPU
    # was idle and not lendable any more), so it starts at once with no victim.
    assert attempts(result, "v1") == [(300, 1300, "SUCCEEDED", False, None, None)]
    assert all(a.preemption_reason is None for j in result.jobs.values() for a in j.attempts)


def test_an_invalid_tree_is_an_invalid_scenario_naming_the_field(tmp_path):
    from quotas.engine.simulate import main

    data = json.loads((FIXTURES / "two-departments-lend-limit.json").read_text())
    data["groups"][0]["parent"] = "nope"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    assert main([str(path), "--out", str(tmp_path / "r.json")]) == 2
    with pytest.raises(sc.ScenarioError, match=r"groups\[0\] \(research\): parent: unknown group"):
        sc.parse(data)


# -- properties on random trees ------------------------------------------------------------------------------


@st.composite
def tree_scenarios(draw):
    """A random tree of depth 1-4 with limits and weights, shares under it, 1-GPU and 2-GPU nodes, and
    jobs; no layout change and no node lost, so the cover must hold before every pass."""
    n_groups = draw(st.integers(1, 6))
    groups = []
    depth = {}
    for i in range(n_groups):
        options = [None] + [g["name"] for g in groups if depth[g["name"]] < 4]
        parent = draw(st.sampled_from(options))
        name = f"g{i}"
        depth[name] = 1 if parent is None else depth[parent] + 1
        groups.append(
            {
                "name": name,
                "parent": parent,
                "weight": draw(st.sampled_from([1, 2, 0.5, 3])),
                "borrow_limit": draw(st.sampled_from([-1, 0, 50, 100, 200])),
                "lend_limit": draw(st.sampled_from([-1, 0, 50, 100])),
            }
        )
    n_shares = draw(st.integers(2, 6))
    shares = []
    for i in range(n_shares):
        shares.append(
            {
                "name": f"s{i}",
                "capacity": {"a10g": draw(st.integers(0, 4))},
                "strategy": draw(st.sampled_from([LEND_AND_BORROW, LEND_AND_BORROW, LEND, RESERVE])),
                "group": draw(st.sampled_from([None] + [g["name"] for g in groups])),
                "weight": draw(st.sampled_from([1, 2, 0.5])),
                "in_share_preemption": draw(st.booleans()),
                "min_runtime_s": draw(st.sampled_from([0, 0, 200])),
            }
        )
    n_nodes = draw(st.integers(2, 6))
    node_list = [
        {"name": f"n{i}", "gpu_type": "a10g", "gpus": draw(st.sampled_from([1, 2]))} for i in range(n_nodes)
    ]
    largest = max(n["gpus"] for n in node_list)
    jobs = []
    for i in range(draw(st.integers(1, 18))):
        jobs.append(
            {
                "id": f"j{i}",
                "share": draw(st.sampled_from([s["name"] for s in shares])),
                "submit_at": draw(st.integers(0, 600)),
                "duration_s": draw(st.integers(50, 900)),
                "gpus": draw(st.integers(1, largest)),
                "gpu_type": "a10g",
                "priority": draw(st.integers(0, 2)),
            }
        )
    return {
        "settings": {
            "preemption_grace_s": draw(st.sampled_from([0, 30])),
            "fair_share_half_life_s": draw(st.sampled_from([0, 600])),
            "fair_reclaim": draw(st.booleans()),
        },
        "nodes": node_list,
        "groups": groups,
        "shares": shares,
        "jobs": jobs,
    }


def shortfalls(snapshot: Snapshot) -> dict:
    """Per level: the cover's shortfall (grace counted as freed), from the tree's own accounting."""
    u = usage(snapshot, count_preempting=False)
    tree = Tree.build(snapshot.groups, snapshot.shares)
    used = {name: by_type["a10g"].used for name, by_type in u.items() if "a10g" in by_type}
    used.pop("(unassigned)", None)
    pool = u.get("(unassigned)", {}).get("a10g")
    n = nets(tree, "a10g", used, pool.capacity if pool else 0)
    return {k: v for k, v in n.shortfall.items() if v}


def share_limits_hold(snapshot: Snapshot) -> bool:
    u = usage(snapshot)
    for s in snapshot.shares:
        row = u.get(s.name, {}).get("a10g")
        if row is None:
            continue
        cap = policy.borrow_cap_gpus(s, row.capacity)
        if cap is not None and row.used > row.capacity + cap:
            return False
    return True


PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(tree_scenarios())
def test_property_no_group_takes_or_lends_beyond_its_limits_after_any_pass(data):
    checked = []

    def planner(snapshot):
        # The state every pass starts from is what the passes before it left (plus ends and submits).
        assert shortfalls(snapshot) == {}, snapshot.now
        assert share_limits_hold(snapshot)
        p = policy.plan(snapshot)
        gone = {x.attempt_id for x in p.preemptions}
        borrowed = borrowed_attempts(snapshot)
        for x in p.preemptions:
            run_view = next(r for r in snapshot.running if r.attempt_id == x.attempt_id)
            if x.reason == RECLAIM:
                assert x.attempt_id in borrowed and run_view.share != x.beneficiary_share
            share_view = next(s for s in snapshot.shares if s.name == run_view.share)
            assert snapshot.now >= run_view.started_at + share_view.min_runtime_s  # rule 10
        checked.append(len(gone))
        return p

    simulate(data, planner=planner)
    assert checked


@PROPERTY
@given(tree_scenarios())
def test_property_the_kept_engine_decides_as_a_fresh_plan_with_the_tree(data):
    kept = simulate(data).to_dict()
    fresh = simulate(data, planner=policy.plan).to_dict()
    assert kept == fresh


@st.composite
def one_reclaim(draw):
    """A snapshot where one owner job (within its own room) may need victims: random tree, borrowed
    attempts of other shares on 1-GPU nodes, nothing free."""
    scenario = draw(tree_scenarios())
    spec = sc.parse(scenario)
    shares = tuple(
        ShareView(
            name=s.name,
            capacity=dict(s.capacity),
            strategy=s.strategy,
            group=s.group,
            weight=s.weight,
        )
        for s in spec.shares
    )
    groups = tuple(g.spec() for g in spec.groups)
    owners = [s for s in shares if s.capacity["a10g"] > 0]
    if not owners:
        owner = ShareView(name="owner", capacity={"a10g": 1}, strategy=LEND)
        shares += (owner,)
        owners = [owner]
    owner = draw(st.sampled_from(owners))
    borrowers = [s for s in shares if s.strategy == LEND_AND_BORROW and s.name != owner.name]
    n = draw(st.integers(1, 8))
    node_views = nodes(n)
    running = []
    for i in range(n):
        if borrowers and draw(st.booleans()):
            b = draw(st.sampled_from(borrowers))
            running.append(run(f"r{i}", b.name, f"n{i + 1}", borrowed=True, started=draw(st.integers(0, 5))))
    return Snapshot(
        now=10,
        nodes=node_views,
        shares=shares,
        groups=groups,
        running=tuple(running),
        queued=(queued("o", owner.name),),
    )


def _can_run(snapshot: Snapshot, taken: set, share_name: str) -> bool:
    """Rule 9's "can run" for a 1-GPU owner job on 1-GPU nodes, from the tree's accounting: with the
    job admitted and the victims gone, no shortfall on its path (the hardware's, the top's, its groups')
    is larger than before it, and a node is free or being freed."""
    tree = Tree.build(snapshot.groups, snapshot.shares)
    caps = {s.name: s.capacity["a10g"] for s in snapshot.shares}
    strategies = {s.name: s.strategy for s in snapshot.shares}
    hardware = len(snapshot.nodes)
    pool = max(0, hardware - sum(caps.values()))
    path = tree.path(share_name)[:-1]

    def levels(used):
        n = nets(tree, "a10g", used, pool)
        own = sum(min(used.get(k, 0), c) for k, c in caps.items())
        borrowed = sum(max(0, used.get(k, 0) - c) for k, c in caps.items())
        reserve_idle = sum(c - min(used.get(k, 0), c) for k, c in caps.items() if strategies[k] == RESERVE)
        hw = max(0, borrowed - max(0, hardware - own - reserve_idle))
        return [hw, n.shortfall[None], *(n.shortfall[g] for g in path)]

    used: dict[str, int] = {}
    for r in snapshot.running:
        used[r.share] = used.get(r.share, 0) + 1
    before = levels(used)
    after_used = dict(used)
    for r in snapshot.running:
        if r.attempt_id in taken:
            after_used[r.share] -= 1
    after_used[share_name] = after_used.get(share_name, 0) + 1
    after = levels(after_used)
    busy = {r.placement[0][0] for r in snapshot.running if r.attempt_id not in taken}
    return len(busy) < hardware and all(a <= b for a, b in zip(after, before, strict=True))


@PROPERTY
@given(one_reclaim())
def test_property_victims_are_a_minimal_set_with_the_tree(snapshot):
    p = policy.plan(snapshot)
    victims = {x.attempt_id for x in p.preemptions}
    share_name = snapshot.queued[0].share
    if victims:
        assert _can_run(snapshot, victims, share_name)
        for v in victims:
            assert not _can_run(snapshot, victims - {v}, share_name), v
    elif not any(a.job_id == "o" for a in p.admissions):
        # Nothing pre-empted and not admitted: even all borrowed attempts of other shares cannot help.
        borrowed = borrowed_attempts(snapshot)
        others = {
            r.attempt_id for r in snapshot.running if r.share != share_name and r.attempt_id in borrowed
        }
        assert not _can_run(snapshot, others, share_name)


# -- rule 11: fair reclaim ------------------------------------------------------------------------------------


def fair_scenario(fair, grace=0):
    """a borrows all 4 GPUs of a lender at t=0; b, as entitled (same weight), starts waiting at t=100."""
    jobs = [
        {"id": f"{x}{i}", "share": x, "submit_at": at, "duration_s": 10000, "gpus": 1, "gpu_type": "a10g"}
        for x, at in (("a", 0), ("b", 100))
        for i in range(4)
    ]
    return {
        "settings": {"preemption_grace_s": grace, "fair_reclaim": fair, "until_s": 5000},
        "nodes": [{"name": f"n{i}", "gpu_type": "a10g", "gpus": 1} for i in range(4)],
        "shares": [
            {"name": "lender", "capacity": {"a10g": 4}, "strategy": "LEND"},
            {"name": "a", "capacity": {"a10g": 0}},
            {"name": "b", "capacity": {"a10g": 0}},
        ],
        "jobs": jobs,
    }


def running_at(result, share_name, t):
    return sum(
        1
        for job in result.jobs.values()
        if job.spec.share == share_name
        for a in job.attempts
        if a.start <= t and (a.end is None or a.end > t)
    )


def test_fair_reclaim_off_shares_borrowed_capacity_out_only_as_jobs_end():
    result = simulate(fair_scenario(False))
    assert running_at(result, "b", 4000) == 0
    assert all(a.preemption_reason is None for j in result.jobs.values() for a in j.attempts)


def test_fair_reclaim_on_brings_a_waiting_borrower_to_its_weighted_part_and_no_further():
    result = simulate(fair_scenario(True))
    assert running_at(result, "a", 4000) == running_at(result, "b", 4000) == 2
    reasons = [(j, a.preemption_reason, a.preempted_by) for j, r in result.jobs.items() for a in r.attempts]
    fair = [(j, by) for j, why, by in reasons if why == "FAIR_SHARE"]
    assert sorted(fair) == [("a2", "b1"), ("a3", "b0")]  # the most recent first (rule 3's order)
    assert result.shares["a"]["lost_gpu_seconds"]["fair_share"] == 2 * 100
    assert "waiting for fair reclaim" not in " ".join(result.waiting.values())


def test_fair_reclaim_with_weights_stops_where_the_values_would_cross():
    data = fair_scenario(True)
    data["shares"][1]["weight"] = 3  # a: weight 3, b: weight 1 -> a keeps 3, b gets 1
    result = simulate(data)
    assert (running_at(result, "a", 4000), running_at(result, "b", 4000)) == (3, 1)


def test_fair_reclaim_names_its_victims_and_waits_for_their_grace():
    shares = (share("lender", 4, LEND), share("a", 0), share("b", 0))
    running = tuple(run(f"a{i}", "a", f"n{i}", borrowed=True, started=i) for i in range(1, 5))
    snap = Snapshot(
        now=100,
        nodes=nodes(4),
        shares=shares,
        running=running,
        queued=(queued("b0", "b"),),
        fair_reclaim=True,
    )
    p = policy.plan(snap)
    assert [(x.attempt_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [
        ("a4", "FAIR_SHARE", "b0")
    ]
    assert p.waiting["b0"] == "waiting for fair reclaim from share a"
    off = policy.plan(
        Snapshot(now=100, nodes=nodes(4), shares=shares, running=running, queued=(queued("b0", "b"),))
    )
    assert off.preemptions == ()
    data = fair_scenario(True, grace=30)
    data["settings"]["until_s"] = 110
    result = simulate(data)
    assert [a.end for a in result.jobs["a3"].attempts] == [None]  # still in its grace at the cut
    assert result.jobs["a3"].attempts[0].preempted_by == "b0"
    assert simulate(fair_scenario(True, grace=30)).jobs["b0"].first_start == 130


def test_fair_reclaim_never_takes_an_attempt_larger_than_its_job():
    """a borrows 6 of the lender's GPUs: a 4-GPU job (the most recent: first in rule 3's order) and two
    1-GPU jobs; b waits with a 1-GPU job. Taking the 4-GPU job would pass the values' test (b 1, a 2)
    but frees 3 GPUs that make no side fairer: b takes the most recent 1-GPU job instead."""
    big = RunningView("a-big", "a-big", "a", "a10g", 0, 5.0, 5.0, (("n1", (0, 1, 2, 3)),), True)
    snap = Snapshot(
        now=100,
        nodes=(NodeView("n1", "a10g", 4), NodeView("n2", "a10g", 1), NodeView("n3", "a10g", 1)),
        shares=(share("lender", 6, LEND), share("a", 0), share("b", 0)),
        running=(
            big,
            run("a1", "a", "n2", borrowed=True, started=1),
            run("a2", "a", "n3", borrowed=True, started=2),
        ),
        queued=(queued("b0", "b"),),
        fair_reclaim=True,
    )
    p = policy.plan(snap)
    assert [(x.attempt_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [
        ("a2", "FAIR_SHARE", "b0")
    ]
    # A job as large as the attempt may take it: b with weight 4 and a 4-GPU job (b's value 4 / 4 = 1
    # afterwards, a's 2).
    snap4 = Snapshot(
        now=100,
        nodes=snap.nodes,
        shares=(share("lender", 6, LEND), share("a", 0), share("b", 0, weight=4)),
        running=snap.running,
        queued=(queued("b0", "b", gpus=4),),
        fair_reclaim=True,
    )
    assert [(x.attempt_id, x.reason) for x in policy.plan(snap4).preemptions] == [("a-big", "FAIR_SHARE")]


def test_fair_reclaim_passes_over_attempts_with_more_than_half_an_hour_unsaved():
    """a and c each borrow 2 of the lender's GPUs (a first by name at equal values); a's attempts have run
    4,000 s without a checkpoint, c's checkpointed 100 and 50 s ago: b takes c's most recent safe point,
    not 4,000 s of a's work."""
    from quotas.engine.fairshare import FAIR_RECLAIM_MAX_UNSAVED_S

    def saved(attempt, share_name, node, started, checkpoint):
        return RunningView(
            attempt, attempt, share_name, "a10g", 0, started, started, ((node, (0,)),), True,
            last_checkpoint_at=checkpoint,
        )  # fmt: skip

    running = (
        saved("a1", "a", "n1", 0.0, None),
        saved("a2", "a", "n2", 10.0, None),
        saved("c1", "c", "n3", 5.0, 3900.0),
        saved("c2", "c", "n4", 6.0, 3950.0),
    )
    snap = Snapshot(
        now=4000,
        nodes=nodes(4),
        shares=(share("lender", 4, LEND), share("a", 0), share("b", 0), share("c", 0)),
        running=running,
        queued=(queued("b0", "b"),),
        fair_reclaim=True,
    )
    assert FAIR_RECLAIM_MAX_UNSAVED_S < 4000 - 10  # a2 has more unsaved than the bound
    assert [(x.attempt_id, x.reason) for x in policy.plan(snap).preemptions] == [("c2", "FAIR_SHARE")]
    # Within the bound, a's side (first by name) gives: its most recent start.
    early = Snapshot(
        now=1000,
        nodes=snap.nodes,
        shares=snap.shares,
        running=running[:2] + tuple(saved(f"c{i}", "c", f"n{i + 2}", 5.0 + i, None) for i in (1, 2)),
        queued=snap.queued,
        fair_reclaim=True,
    )
    assert [(x.attempt_id, x.reason) for x in policy.plan(early).preemptions] == [("a2", "FAIR_SHARE")]


def test_fair_reclaim_passes_over_a_job_it_took_max_per_job_times():
    """a and c each borrow 2 of the lender's GPUs (a first by name at equal values, a2 its most recent
    start): b takes a2 while a2's job was fair-reclaimed fewer than FAIR_RECLAIM_MAX_PER_JOB times before,
    then a1 (the next of a's side), then c's most recent start once both of a's jobs reached the bound."""
    from quotas.engine.fairshare import FAIR_RECLAIM_MAX_PER_JOB

    def taken_before(attempt, share_name, node, started, times):
        return RunningView(
            attempt, attempt, share_name, "a10g", 0, started, started, ((node, (0,)),), True,
            fair_reclaims=times,
        )  # fmt: skip

    def first_victim(a1_times, a2_times):
        snap = Snapshot(
            now=1000,
            nodes=nodes(4),
            shares=(share("lender", 4, LEND), share("a", 0), share("b", 0), share("c", 0)),
            running=(
                taken_before("a1", "a", "n1", 0.0, a1_times),
                taken_before("a2", "a", "n2", 10.0, a2_times),
                taken_before("c1", "c", "n3", 6.0, 0),
                taken_before("c2", "c", "n4", 7.0, 0),
            ),
            queued=(queued("b0", "b"),),
            fair_reclaim=True,
        )
        return [(x.attempt_id, x.reason) for x in policy.plan(snap).preemptions]

    bound = FAIR_RECLAIM_MAX_PER_JOB
    assert first_victim(0, bound - 1) == [("a2", "FAIR_SHARE")]
    assert first_victim(0, bound) == [("a1", "FAIR_SHARE")]
    assert first_victim(bound, bound + 5) == [("c2", "FAIR_SHARE")]
    # An owner's reclaim is not bounded: the lender takes its GPU back from a job taken any number of times.
    owner = Snapshot(
        now=1000,
        nodes=nodes(2),
        shares=(share("lender", 2, LEND_AND_BORROW), share("a", 0)),
        running=(run("l1", "lender", "n1"), taken_before("a1", "a", "n2", 0.0, bound)),
        queued=(queued("l2", "lender"),),
        fair_reclaim=True,
    )
    assert [(x.attempt_id, x.reason) for x in policy.plan(owner).preemptions] == [("a1", "RECLAIM")]


def test_fair_reclaim_passes_over_protected_attempts():
    data = fair_scenario(True)
    data["shares"][1]["min_runtime_s"] = 1000
    result = simulate(data)
    # b waits until a's attempts are 1000 s old, then takes its part.
    first = min(
        j.first_start for n, j in result.jobs.items() if n.startswith("b") and j.first_start is not None
    )
    assert first == 1000 and running_at(result, "b", 4000) == 2


def tie_scenario():
    """The shrunk case hypothesis found (a loop at t=0: more than 1,000 passes): two departments, each with
    a lender, over-committed hardware (2 GPUs for capacity 3). a0 runs own, a1 borrows l0's GPU inside g0,
    b0 would borrow l1's inside g1: neither department takes anything from outside, so both values are 0
    with or without a move, and "not above" alone let b0 take a1's GPU and a1 take it back, forever."""
    job = {"submit_at": 0, "duration_s": 10**6, "gpus": 1, "gpu_type": "a10g"}
    return {
        "settings": {"preemption_grace_s": 0, "fair_reclaim": True, "until_s": 3000},
        "nodes": [{"name": f"n{i}", "gpu_type": "a10g", "gpus": 1} for i in range(2)],
        "groups": [{"name": "g0"}, {"name": "g1"}],
        "shares": [
            {"name": "a", "capacity": {"a10g": 1}, "group": "g0"},
            {"name": "l0", "capacity": {"a10g": 1}, "strategy": "LEND", "group": "g0"},
            {"name": "b", "capacity": {"a10g": 0}, "group": "g1"},
            {"name": "l1", "capacity": {"a10g": 1}, "strategy": "LEND", "group": "g1"},
        ],
        "jobs": [
            {"id": "a0", "share": "a", **job},
            {"id": "a1", "share": "a", **job},
            {"id": "b0", "share": "b", **job},
        ],
    }


def test_fair_reclaim_takes_only_from_a_side_above_and_so_settles_where_the_values_tie():
    result = simulate(tie_scenario())  # (before the fix: PolicyError, more than 1000 passes at t=0)
    assert attempts(result, "a1") == [(0, None, None, True, None, None)]
    assert result.jobs["b0"].attempts == []
    shares = (
        share("a", 1, group="g0"),
        share("l0", 1, LEND, group="g0"),
        share("b", 0, group="g1"),
        share("l1", 1, LEND, group="g1"),
    )
    snap = Snapshot(
        now=100,
        nodes=nodes(2),
        shares=shares,
        groups=(GroupSpec("g0"), GroupSpec("g1")),
        running=(run("a0", "a", "n1"), run("a1", "a", "n2", borrowed=True, started=1)),
        queued=(queued("b0", "b"),),
        fair_reclaim=True,
    )
    p = policy.plan(snap)
    assert p.preemptions == () and p.admissions == ()
    # The same move where b's side is below a's now: l0 lends outside, so g0 takes 1 from outside.
    lent = (share("a", 1, group="g0"), share("l0", 1, LEND, group="g1"), share("b", 0, group="g1"))
    snap = Snapshot(
        now=100,
        nodes=nodes(2),
        shares=lent,
        groups=(GroupSpec("g0"), GroupSpec("g1")),
        running=(run("a0", "a", "n1"), run("a1", "a", "n2", borrowed=True, started=1)),
        queued=(queued("b0", "b"),),
        fair_reclaim=True,
    )
    assert [(x.attempt_id, x.reason) for x in policy.plan(snap).preemptions] == [("a1", "FAIR_SHARE")]


@st.composite
def settled_tree_scenarios(draw):
    """Fair reclaim on, every job submitted at 0 and running past the end, no history: after t=0 nothing
    changes but what the passes decide."""
    data = draw(tree_scenarios())
    data["settings"].update(fair_reclaim=True, fair_share_half_life_s=0, until_s=3000)
    for job in data["jobs"]:
        job["submit_at"] = 0
        job["duration_s"] = 10**6
    return data


@st.composite
def lending_departments(draw):
    """The family of the shrunk case, which random trees reach about once in several thousand draws:
    departments (some with a team below) that each hold a lender and borrowers, on fewer GPUs than the
    shares' capacity, so that sides can contend for nodes while taking little or nothing from outside."""
    groups, shares = [], []
    for d in range(draw(st.integers(2, 3))):
        groups.append({"name": f"d{d}", "weight": draw(st.sampled_from([1, 2]))})
        inner = f"d{d}"
        if draw(st.booleans()):
            groups.append({"name": f"t{d}", "parent": f"d{d}"})
            inner = f"t{d}"
        shares.append(
            {
                "name": f"l{d}",
                "capacity": {"a10g": draw(st.integers(1, 2))},
                "strategy": LEND,
                "group": f"d{d}",
            }
        )
        for b in range(draw(st.integers(1, 2))):
            shares.append(
                {
                    "name": f"b{d}{b}",
                    "capacity": {"a10g": draw(st.integers(0, 2))},
                    "group": draw(st.sampled_from([f"d{d}", inner])),
                    "weight": draw(st.sampled_from([1, 2])),
                }
            )
    capacity = sum(x["capacity"]["a10g"] for x in shares)
    gpus = max(2, capacity - draw(st.integers(0, 2)))  # (a 2-GPU job spans two 1-GPU nodes)
    node_list = [{"name": f"n{i}", "gpu_type": "a10g", "gpus": 1} for i in range(gpus)]
    borrowers = [x["name"] for x in shares if x.get("strategy") != LEND]
    jobs = [
        {
            "id": f"j{i}",
            "share": draw(st.sampled_from(borrowers)),
            "submit_at": 0,
            "duration_s": 10**6,
            "gpus": draw(st.sampled_from([1, 1, 2])),
            "gpu_type": "a10g",
        }
        for i in range(draw(st.integers(2, 8)))
    ]
    return {
        "settings": {
            "preemption_grace_s": draw(st.sampled_from([0, 30])),
            "fair_reclaim": True,
            "until_s": 3000,
        },
        "nodes": node_list,
        "groups": groups,
        "shares": shares,
        "jobs": jobs,
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(tie_scenario())
@given(st.one_of(settled_tree_scenarios(), lending_departments()))
def test_property_with_fair_reclaim_no_two_sides_take_gpus_back_from_each_other(data):
    result = simulate(data)
    spec = sc.parse(data)
    tree = Tree.build(
        [g.spec() for g in spec.groups],
        [policy.ShareView(s.name, dict(s.capacity), group=s.group) for s in spec.shares],
    )
    share_of = {j.id: j.share for j in spec.jobs}
    moves = []  # (time, taker side, giver side)
    for job_id, record in result.jobs.items():
        for a in record.attempts:
            if a.preemption_reason == "FAIR_SHARE":
                taker, giver = share_of[a.preempted_by], share_of[job_id]
                side_taker, side_giver, _ = tree.sides(taker, giver)
                # (an attempt still in its grace at the cut has no end yet: its move is at the cut)
                end = a.end if a.end is not None else data["settings"]["until_s"]
                moves.append((end, side_taker, side_giver))
    for t1, taker, giver in moves:
        assert not any(t2 >= t1 and (x, y) == (giver, taker) for t2, x, y in moves), moves


def test_the_report_shows_each_group_and_the_work_lost_to_fair_share():
    from quotas.engine.report import render_report

    scenario = sc.load(FIXTURES / "two-departments-lend-limit.json")
    result = simulate(scenario)
    page = render_report(scenario, result, result.timeline)
    assert '<table id="groups-table">' in page
    assert (
        "<th>research</th><td>(cluster)</td><td>1</td><td>none</td><td>50%</td><td>0.0</td><td>0.7</td>"
        in page
    )
    assert "GPU-h lost: fair share" not in page  # off, and nothing lost to it
    fair = sc.parse(fair_scenario(True))
    fair_result = simulate(fair)
    assert "GPU-h lost: fair share" in render_report(fair, fair_result, fair_result.timeline)


@PROPERTY
@given(tree_scenarios(), st.lists(st.integers(0, 8), min_size=6, max_size=6), st.integers(0, 3))
def test_property_the_simulators_list_accounting_equals_the_trees(data, uses, pool):
    from quotas.engine.simulate import _NetCalc

    spec = sc.parse(data)
    shares = [policy.ShareView(s.name, dict(s.capacity), s.strategy, group=s.group) for s in spec.shares]
    tree = Tree.build([g.spec() for g in spec.groups], shares)
    used = {s.name: u for s, u in zip(shares, uses, strict=False)}  # (up to 6 shares)
    n = nets(tree, "a10g", used, pool)
    taken: dict = {}
    lent: dict = {}
    _NetCalc(tree, "a10g").run(used, pool, "a10g", taken, lent)
    assert taken == {(k, "a10g"): v for k, v in n.taken.items() if v}
    assert lent == pytest.approx({(k, "a10g"): v for k, v in n.lent.items() if v})
