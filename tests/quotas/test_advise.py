"""The pure advisor (quotas.advise): its search, frontier, recommendation and command line (issue 38)."""

import json
from pathlib import Path

from quotas import advise
from quotas.engine import policy
from quotas.engine import scenario as sc

FIXTURES = Path(__file__).resolve().parent / "scenarios"


def small() -> sc.Scenario:
    """Two shares of 2 GPUs each: `train` floods the cluster, `serve` comes back at 300 s and must reclaim."""
    jobs = [
        {"id": f"t{i}", "share": "train", "submit_at": 0, "duration_s": 1200, "gpus": 1, "gpu_type": "a10g"}
        for i in range(4)
    ] + [
        {
            "id": f"s{i}",
            "share": "serve",
            "submit_at": 300 + 60 * i,
            "duration_s": 600,
            "gpus": 1,
            "gpu_type": "a10g",
        }
        for i in range(2)
    ]
    return sc.parse(
        {
            "settings": {"tick_s": 1, "preemption_grace_s": 30},
            "nodes": [{"name": f"n{i}", "gpu_type": "a10g", "gpus": 2} for i in range(2)],
            "shares": [
                {"name": "train", "team": "ml", "capacity": {"a10g": 2}, "strategy": "LEND_AND_BORROW"},
                {"name": "serve", "team": "web", "capacity": {"a10g": 2}, "strategy": "LEND"},
            ],
            "jobs": jobs,
        }
    )


def counting(scenario, window_s):
    calls = []
    inner = advise.local_replayer(scenario, window_s=window_s)

    def many(variants):
        calls.extend(variants)
        return inner(variants)

    return many, calls


def test_the_frontier_is_non_dominated_and_today_is_in_the_answer():
    scenario = small()
    window = 3600
    many, calls = counting(scenario, window)
    advice = advise.search(scenario, window_s=window, replay_many=many)

    assert advice["replays"] == len(calls)
    assert calls[0] == []  # today first
    front = advice["frontier"]
    assert front
    for a in front:
        for b in front:
            assert not advise.dominates(a, b)
    # Today is in the answer, and on the frontier unless a point beats it.
    assert advice["today"]["changes"] == [] and advice["today"]["today"]
    assert advice["points"][0]["changes"] == []
    today_beaten = any(advise.dominates(p, advice["today"]) for p in advice["points"])
    assert any(f["today"] for f in front) != today_beaten
    # Every point not on the frontier is dominated by one that is (or equals one).
    for p in advice["points"]:
        if not p["frontier"]:
            assert any(
                advise.dominates(f, p)
                or (f["utilisation"], f["owners_p95_wait_s"], f["lost_gpu_seconds"])
                == (p["utilisation"], p["owners_p95_wait_s"], p["lost_gpu_seconds"])
                for f in front
            )


def test_replays_are_far_fewer_than_every_combination():
    scenario = small()
    many, calls = counting(scenario, 3600)
    advice = advise.search(scenario, window_s=3600, replay_many=many)
    single = advise.moves(scenario)
    # train: 2 strategies, a borrow limit, min_runtime; serve: 2 strategies, min_runtime; 2 settings.
    assert len(single) == 9
    stage2 = advice["replays"] - 1 - len(single)
    assert 0 <= stage2 <= len(single)
    every = 3 * 2 * 2 * 3 * 2 * 2 * 2  # the same values in every combination
    assert advice["replays"] < every / 10


def test_the_recommendation_follows_its_rule():
    advice = advise.search(small(), window_s=3600, replay_many=advise.local_replayer(small(), window_s=3600))
    today = advice["today"]

    def allowed(f):
        return f["today"] or (
            (f["owners_p95_wait_s"] or 0) <= (today["owners_p95_wait_s"] or 0)
            and f["useful_utilisation"] >= today["useful_utilisation"]
            and f["utilisation"] >= today["utilisation"] + advise.MARGIN_UTILISATION
        )

    if advice["recommended"] is None:  # keep today's layout: nothing on the frontier clears the rule
        assert not any(allowed(f) for f in advice["frontier"])
        return
    chosen = advice["frontier"][advice["recommended"]]
    assert allowed(chosen)
    for f in advice["frontier"]:
        if allowed(f):
            assert f["utilisation"] <= chosen["utilisation"]


def test_a_gain_below_the_margin_is_not_recommended():
    scenario = small()
    base = dict(
        owners_jobs=1, never_started=0, never_started_words=[], weeks=[], shares={}, lost_gpu_seconds=0
    )
    today = {"utilisation": 50.0, "useful_utilisation": 50.0, "owners_p95_wait_s": 30, **base}
    small_gain = {"utilisation": 50.4, "useful_utilisation": 50.4, "owners_p95_wait_s": 30, **base}
    real_gain = {"utilisation": 51.0, "useful_utilisation": 51.0, "owners_p95_wait_s": 30, **base}
    m = advise.move("train", "min_runtime_s", 0, 600)
    advice = advise.answer(scenario, today, [([m], small_gain)], replays=2, window_s=3600)
    assert advice["recommended"] is None  # today is dominated, yet keeping it is the advice
    advice = advise.answer(scenario, today, [([m], real_gain)], replays=2, window_s=3600)
    assert advice["frontier"][advice["recommended"]]["utilisation"] == 51.0


def test_more_utilisation_bought_with_lost_work_is_not_recommended():
    """The held-out ITP test's lesson: a point that adds utilisation by re-running pre-empted work (its
    useful utilisation lower than today's) stays on the frontier but is not recommended."""
    scenario = small()
    today = {"utilisation": 50.0, "useful_utilisation": 50.0, "owners_p95_wait_s": 30, "lost_gpu_seconds": 0}
    busier = {
        "utilisation": 50.1,
        "useful_utilisation": 45.0,
        "owners_p95_wait_s": 30,
        "lost_gpu_seconds": 900,
    }
    for point in (today, busier):
        point.update(owners_jobs=1, never_started=0, never_started_words=[], weeks=[], shares={})
    m = advise.move(advise.SETTINGS_TARGET, "fair_reclaim", False, True)
    advice = advise.answer(scenario, today, [([m], busier)], replays=2, window_s=3600)
    assert len(advice["frontier"]) == 2
    assert advice["frontier"][advice["recommended"]]["today"]


def test_a_point_says_what_changes_for_whom_and_its_layout_drops_into_a_scenario():
    scenario = small()
    advice = advise.search(
        scenario, window_s=3600, replay_many=advise.local_replayer(scenario, window_s=3600)
    )
    changed = [p for p in advice["frontier"] if p["changes"]] or [
        {"layout": advise.layout_of(scenario), "changes": []}
    ]
    for point in advice["frontier"]:
        data = scenario.to_dict() | point["layout"]
        rebuilt = sc.parse(
            {**data, "settings": {**scenario.to_dict()["settings"], **point["layout"]["settings"]}}
        )
        for m in point["changes"]:
            if m["target"] != advise.SETTINGS_TARGET:
                share = next(s for s in rebuilt.shares if s.name == m["target"])
                assert getattr(share, m["field"]) == m["to"]
                assert m["words"].startswith(f"{m['target']}: ")
                assert "utilisation" in m["words"] and f"{m['target']}'s owners' p95 wait" in m["words"]
    assert changed


def test_a_strategy_change_words_it_as_the_issue_does():
    today = {"utilisation": 70.0, "owners_p95_wait_s": 40, "shares": {"vision": {"owners_p95_wait_s": 40}}}
    point = {"utilisation": 79.0, "owners_p95_wait_s": 180, "shares": {"vision": {"owners_p95_wait_s": 180}}}
    m = advise.move("vision", "strategy", policy.RESERVE, policy.LEND)
    assert advise.change_words(m, point, today) == (
        "vision: RESERVE → LEND: +9.0% utilisation, vision's owners' p95 wait 40 s → 3 min"
    )


def test_jobs_that_never_start_are_counted_as_waiting_owners():
    scenario = sc.parse(
        {
            "settings": {"tick_s": 1, "until_s": 5000},
            "nodes": [{"name": "n1", "gpu_type": "a10g", "gpus": 2}],
            "shares": [
                {"name": "a", "team": "a", "capacity": {"a10g": 2}, "strategy": "RESERVE"},
                {"name": "b", "team": "b", "capacity": {"a10g": 0}, "strategy": "LEND_AND_BORROW"},
            ],
            "jobs": [
                {
                    "id": "big",
                    "share": "a",
                    "submit_at": 0,
                    "duration_s": 10_000,
                    "gpus": 2,
                    "gpu_type": "a10g",
                },
                {
                    "id": "next",
                    "share": "a",
                    "submit_at": 10,
                    "duration_s": 100,
                    "gpus": 1,
                    "gpu_type": "a10g",
                },
                {
                    "id": "other",
                    "share": "b",
                    "submit_at": 0,
                    "duration_s": 100,
                    "gpus": 1,
                    "gpu_type": "a10g",
                },
            ],
        }
    )
    point = advise.evaluate(scenario, window_s=5000)
    assert point["never_started"] == 2  # "next" (behind "big") and "other" (b has nothing to borrow)
    # "next" is an owner's job that waited until the cut; "other" could never be an owner's.
    assert point["owners_jobs"] == 2
    assert point["owners_p95_wait_s"] == 5000 - 10
    assert point["never_started_words"]


def test_the_combination_takes_one_move_per_share_and_only_improving_ones():
    today = {"utilisation": 50.0, "owners_p95_wait_s": 100, "lost_gpu_seconds": 0}
    pts = {
        "a1": {"utilisation": 60.0, "owners_p95_wait_s": 100, "lost_gpu_seconds": 0},
        "a2": {"utilisation": 55.0, "owners_p95_wait_s": 100, "lost_gpu_seconds": 0},
        "b": {"utilisation": 52.0, "owners_p95_wait_s": 200, "lost_gpu_seconds": 0},
        "worse": {"utilisation": 40.0, "owners_p95_wait_s": 300, "lost_gpu_seconds": 10},
    }
    singles = [
        (advise.move("a", "strategy", "LEND", "RESERVE"), pts["a1"]),
        (advise.move("a", "min_runtime_s", 0, 600), pts["a2"]),
        (advise.move("b", "strategy", "LEND", "RESERVE"), pts["b"]),
        (advise.move("c", "strategy", "LEND", "RESERVE"), pts["worse"]),
    ]
    variants = advise.combined(today, singles)
    targets = [sorted(m["target"] for m in v) for v in variants]
    assert targets == [["a", "b"]]  # a's best move with b's; the "all that keep the wait" set is a's alone
    assert variants[0][0]["field"] == "strategy"


def test_a_pool_of_workers_answers_the_same(tmp_path):
    path = FIXTURES / "two-departments-lend-limit.json"
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert advise.main([str(path), "--out", str(one)]) == 0
    assert advise.main([str(path), "--out", str(two), "--jobs", "2"]) == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    a.pop("seconds"), b.pop("seconds")
    assert a == b
    assert a["replays"] > 1 and {"today", "frontier", "recommended"} <= set(a)
    assert {"shares", "groups", "settings"} <= set(a["frontier"][0]["layout"])
    # The tree exists there: a share's weight is one of the moves.
    assert any(p["changes"] and p["changes"][0]["field"] == "weight" for p in a["points"])


def test_a_bad_scenario_exits_2_naming_the_field(tmp_path, capsys):
    data = json.loads((FIXTURES / "three-projects-borrow-reclaim.json").read_text())
    data["shares"][1]["strategy"] = "HOARD"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    code = advise.main([str(path), "--out", str(tmp_path / "out.json")])
    assert code == 2
    err = capsys.readouterr().err
    assert "shares[1]" in err and "strategy" in err
    assert not (tmp_path / "out.json").exists()
    path.write_text("{not json")
    assert advise.main([str(path)]) == 2


def test_a_groups_weight_is_a_move_where_the_tree_exists():
    scenario = sc.load(FIXTURES / "two-departments-lend-limit.json")
    group_moves = [m for m in advise.moves(scenario) if m["target"] in {g.name for g in scenario.groups}]
    assert group_moves and {m["field"] for m in group_moves} == {"weight"}
    m = group_moves[0]
    changed = advise.apply(scenario, [m])
    assert next(g for g in changed.groups if g.name == m["target"]).weight == m["to"]
    assert next(g for g in scenario.groups if g.name == m["target"]).weight == m["from"]  # today's untouched
    assert advise.layout_of(changed)["groups"] != advise.layout_of(scenario)["groups"]
