"""The simulator: small scenarios replayed with the real policy, the CLI, and properties of random runs."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotas.engine import policy
from quotas.engine import scenario as sc
from quotas.engine.simulate import PolicyError, main, simulate


def scenario(jobs, *, nodes=None, shares=None, events=(), **setting):
    """A scenario dict: by default one 1-GPU a10g node and share p (capacity 1, in-share pre-emption)."""
    return {
        "settings": {"preemption_grace_s": 0, **setting},
        "nodes": nodes or [{"name": "n1", "gpu_type": "a10g", "gpus": 1}],
        "shares": shares or [{"name": "p", "capacity": {"a10g": 1}, "in_share_preemption": True}],
        "jobs": [{"share": "p", "submit_at": 0, "gpus": 1, "gpu_type": "a10g", **job} for job in jobs],
        "events": list(events),
    }


def attempts(result, job_id):
    return [(a["start"], a["end"], a["outcome"]) for a in result["jobs"][job_id]["attempts"]]


def run(data):
    return simulate(data).to_dict()


# -- checkpoints, grace, max_preemptions: a low-priority job pre-empted by a high one at t=700 ----------

LOW = {"id": "low", "duration_s": 1000, "priority": 0}
HIGH = {"id": "high", "submit_at": 700, "duration_s": 100, "priority": 9}


@pytest.mark.parametrize(
    ("low", "setting", "low_attempts", "high_start", "lost"),
    [
        # No checkpoint: restarts from zero.
        ({}, {}, [(0, 700, "PREEMPTED"), (800, 1800, "SUCCEEDED")], 700, 700),
        # Checkpoint every 300 s: keeps 600 s of work, loses 100.
        ({"checkpoint_every_s": 300}, {}, [(0, 700, "PREEMPTED"), (800, 1200, "SUCCEEDED")], 700, 100),
        # 50 s grace: runs to 750 (still checkpointing), the high job starts when it stops.
        (
            {"checkpoint_every_s": 300},
            {"preemption_grace_s": 50},
            [(0, 750, "PREEMPTED"), (850, 1250, "SUCCEEDED")],
            750,
            150,
        ),
        # The job's own grace overrides the settings.
        (
            {"preemption_grace_s": 0},
            {"preemption_grace_s": 50},
            [(0, 700, "PREEMPTED"), (800, 1800, "SUCCEEDED")],
            700,
            700,
        ),
        ({"preemption_grace_s": 20}, {}, [(0, 720, "PREEMPTED"), (820, 1820, "SUCCEEDED")], 720, 720),
    ],
)
def test_preempted_work_is_lost_since_the_last_checkpoint(low, setting, low_attempts, high_start, lost):
    result = run(scenario([{**LOW, **low}, HIGH], **setting))
    assert attempts(result, "low") == low_attempts
    assert attempts(result, "high") == [(high_start, high_start + 100, "SUCCEEDED")]
    assert result["cluster"]["lost_gpu_seconds"] == lost
    first = result["jobs"]["low"]["attempts"][0]
    assert (first["preempted_by"], first["preemption_reason"]) == ("high", "PRIORITY")
    assert result["jobs"]["low"]["preemptions"] == 1
    assert result["jobs"]["low"]["wait_s"] == 0  # a re-queue does not add to the wait


def test_a_victim_that_finishes_within_its_grace_succeeds():
    result = run(scenario([{**LOW, "duration_s": 720}, HIGH], preemption_grace_s=50))
    assert attempts(result, "low") == [(0, 720, "SUCCEEDED")]
    assert result["jobs"]["low"]["attempts"][0]["preempted_by"] is None
    assert "preemption_reason" not in result["jobs"]["low"]["attempts"][0]
    assert result["jobs"]["low"]["preemptions"] == 0
    assert attempts(result, "high") == [(720, 820, "SUCCEEDED")]


@pytest.mark.parametrize(
    ("max_preemptions", "final", "outcomes"),
    [
        (0, "FAILED", ["FAILED"]),
        (1, "FAILED", ["PREEMPTED", "FAILED"]),
        (2, "SUCCEEDED", ["PREEMPTED", "PREEMPTED", "SUCCEEDED"]),
        (-1, "SUCCEEDED", ["PREEMPTED", "PREEMPTED", "SUCCEEDED"]),
    ],
)
def test_the_preemption_beyond_max_preemptions_fails_the_job(max_preemptions, final, outcomes):
    high2 = {**HIGH, "id": "high2", "submit_at": 900}
    result = run(scenario([{**LOW, "max_preemptions": max_preemptions}, HIGH, high2]))
    job = result["jobs"]["low"]
    assert job["final"] == final
    assert [a["outcome"] for a in job["attempts"]] == outcomes
    assert job["preemptions"] == min(len(outcomes), 2)
    if final == "FAILED":
        assert job["end"] == job["attempts"][-1]["end"]
        assert job["attempts"][-1]["preemption_reason"] == "PRIORITY"


def test_an_attempt_past_max_runtime_fails_the_job():
    result = run(
        scenario([{"id": "a", "duration_s": 1000, "max_runtime_s": 300}, {"id": "b", "duration_s": 10}])
    )
    assert attempts(result, "a") == [(0, 300, "FAILED")]
    assert result["jobs"]["a"]["final"] == "FAILED"
    assert attempts(result, "b") == [(300, 310, "SUCCEEDED")]


# -- cancel, update_share, update_job ------------------------------------------------------------------


def test_cancel_a_queued_job():
    result = run(
        scenario(
            [{"id": "a", "duration_s": 100}, {"id": "b", "duration_s": 100}],
            events=[{"at": 50, "kind": "cancel", "job": "b"}],
        )
    )
    assert result["jobs"]["b"] == {
        "final": "CANCELLED",
        "submit_at": 0,
        "first_start": None,
        "end": 50,
        "wait_s": None,
        "preemptions": 0,
        "attempts": [],
    }
    assert result["shares"]["p"]["mean_wait_s"] == 0  # only jobs that started count


def test_cancel_a_running_job_frees_its_gpus():
    result = run(
        scenario(
            [{"id": "a", "duration_s": 100}, {"id": "b", "duration_s": 100}],
            events=[{"at": 30, "kind": "cancel", "job": "a"}],
        )
    )
    assert attempts(result, "a") == [(0, 30, "CANCELLED")]
    assert result["jobs"]["a"]["final"] == "CANCELLED"
    assert attempts(result, "b") == [(30, 130, "SUCCEEDED")]
    assert result["cluster"]["lost_gpu_seconds"] == 0


TWO_GPUS = [{"name": "n1", "gpu_type": "a10g", "gpus": 2}]


@pytest.mark.parametrize(
    ("share", "change", "second"),
    [
        # RESERVE never borrows; as LEND_AND_BORROW it may take the unassigned GPU.
        ({"strategy": "RESERVE"}, {"strategy": "LEND_AND_BORROW"}, (100, 200, True, "ADMITTED_BORROWED")),
        # A larger capacity admits it as own.
        ({"strategy": "RESERVE"}, {"capacity": {"a10g": 2}}, (100, 200, False, "ADMITTED_OWN")),
        # A borrow limit of 0 blocks borrowing until it is lifted.
        ({"borrow_limit": 0}, {"borrow_limit": -1}, (100, 200, True, "ADMITTED_BORROWED")),
    ],
)
def test_update_share_takes_effect_at_once(share, change, second):
    data = scenario(
        [{"id": "a", "duration_s": 1000}, {"id": "b", "duration_s": 100}],
        nodes=TWO_GPUS,
        shares=[{"name": "p", "capacity": {"a10g": 1}, **share}],
        events=[{"at": 100, "kind": "update_share", "share": "p", "set": change}],
    )
    b = run(data)["jobs"]["b"]["attempts"]
    assert [(a["start"], a["end"], a["borrowed"], a["reason"]) for a in b] == [second]


def test_a_disabled_share_refuses_new_jobs_but_keeps_the_old():
    data = scenario(
        [{"id": "a", "duration_s": 1000}, {"id": "b", "submit_at": 60, "duration_s": 100}],
        events=[{"at": 50, "kind": "update_share", "share": "p", "set": {"state": "DISABLED"}}],
    )
    result = simulate(data)
    assert result.to_dict()["jobs"]["a"]["final"] == "SUCCEEDED"
    b = result.to_dict()["jobs"]["b"]
    assert (b["final"], b["attempts"], b["end"]) == ("FAILED", [], 60)
    assert "disabled" in result.rejected["b"]


def test_raising_a_queued_priority_preempts_in_share():
    data = scenario(
        [{"id": "a", "duration_s": 1000}, {"id": "b", "submit_at": 10, "duration_s": 100}],
        events=[{"at": 100, "kind": "update_job", "job": "b", "set": {"priority": 5}}],
    )
    result = run(data)
    assert attempts(result, "a") == [(0, 100, "PREEMPTED"), (200, 1200, "SUCCEEDED")]
    assert result["jobs"]["a"]["attempts"][0]["preemption_reason"] == "PRIORITY"
    assert attempts(result, "b") == [(100, 200, "SUCCEEDED")]


def test_lowering_a_running_priority_exposes_it():
    data = scenario(
        [
            {"id": "a", "duration_s": 1000, "priority": 5},
            {"id": "b", "submit_at": 10, "duration_s": 100, "priority": 3},
        ],
        events=[{"at": 100, "kind": "update_job", "job": "a", "set": {"priority": 1}}],
    )
    assert attempts(run(data), "b") == [(100, 200, "SUCCEEDED")]


# -- nodes ---------------------------------------------------------------------------------------------


def test_a_lost_node_requeues_its_job_with_its_submit_time():
    data = scenario(
        [{"id": "a", "submit_at": 5, "duration_s": 1000, "gpus": 2, "checkpoint_every_s": 120}],
        nodes=[
            {"name": "n1", "gpu_type": "a10g", "gpus": 2, "lost_at": 305},
            {"name": "n2", "gpu_type": "a10g", "gpus": 2, "ready_at": 400},
        ],
        shares=[{"name": "p", "capacity": {"a10g": 2}}],
    )
    result = simulate(data)
    job = result.to_dict()["jobs"]["a"]
    assert [(a["start"], a["end"], a["outcome"], a["nodes"]) for a in job["attempts"]] == [
        (5, 305, "NODE_LOST", ["n1"]),
        (400, 400 + 1000 - 240, "SUCCEEDED", ["n2"]),
    ]
    assert (job["submit_at"], job["wait_s"], job["preemptions"]) == (5, 0, 0)
    assert result.cluster["lost_gpu_seconds"] == 2 * 60  # 300 s run, checkpoint at 240
    # Capacity: n1 over [0, 305), n2 over [400, 1160).
    assert result.cluster["utilisation"] == pytest.approx((2 * 300 + 2 * 760) / (2 * 305 + 2 * 760), abs=1e-6)


def test_a_node_that_comes_later_takes_work_when_it_is_ready():
    data = scenario(
        [{"id": "a", "duration_s": 1000}, {"id": "b", "duration_s": 100}],
        nodes=[
            {"name": "n1", "gpu_type": "a10g", "gpus": 1},
            {"name": "n2", "gpu_type": "a10g", "gpus": 1, "ready_at": 500},
        ],
        shares=[{"name": "p", "capacity": {"a10g": 2}}],
    )
    result = run(data)
    assert [(a["start"], a["nodes"]) for a in result["jobs"]["b"]["attempts"]] == [(500, ["n2"])]
    assert result["jobs"]["b"]["wait_s"] == 500


def test_a_gang_waits_for_whole_nodes():
    data = scenario(
        [{"id": "small", "duration_s": 100}, {"id": "gang", "submit_at": 10, "duration_s": 50, "gpus": 8}],
        nodes=[{"name": f"n{i}", "gpu_type": "a10g", "gpus": 4} for i in (1, 2)],
        shares=[{"name": "p", "capacity": {"a10g": 8}}],
    )
    gang = run(data)["jobs"]["gang"]["attempts"]
    assert [(a["start"], a["end"], sorted(a["nodes"])) for a in gang] == [(100, 150, ["n1", "n2"])]


# -- time ----------------------------------------------------------------------------------------------


def test_until_s_cuts_the_run():
    result = run(scenario([{"id": "a", "duration_s": 1000}, {"id": "b", "duration_s": 10}], until_s=150))
    assert result["jobs"]["a"]["final"] == "RUNNING"
    assert result["jobs"]["a"]["attempts"] == [
        {
            "start": 0,
            "end": None,
            "nodes": ["n1"],
            "borrowed": False,
            "outcome": None,
            "preempted_by": None,
            "reason": "ADMITTED_OWN",
        }
    ]
    assert (result["jobs"]["a"]["end"], result["jobs"]["b"]["final"]) == (None, "QUEUED")
    assert result["cluster"]["makespan_s"] == 150
    assert result["cluster"]["utilisation"] == 1.0
    assert result["shares"]["p"]["gpu_seconds_own"] == 150


def test_passes_run_only_at_ticks():
    result = run(
        scenario(
            [{"id": "a", "submit_at": 5, "duration_s": 12}, {"id": "b", "submit_at": 6, "duration_s": 10}],
            tick_s=10,
        )
    )
    assert attempts(result, "a") == [(10, 22, "SUCCEEDED")]
    assert attempts(result, "b") == [(30, 40, "SUCCEEDED")]  # a ends at 22, the next tick is 30


def test_idle_time_is_skipped_not_ticked():
    calls = []

    def planner(snapshot):
        calls.append(snapshot.now)
        return policy.plan(snapshot)

    far = 10**9
    result = simulate(scenario([{"id": "a", "submit_at": far, "duration_s": 10**6}]), planner=planner)
    assert attempts(result.to_dict(), "a") == [(far, far + 10**6, "SUCCEEDED")]
    # The pass that admits; the one after it, which would find nothing new, is counted but not made
    # (the first plan is settled: Plan.settled).
    assert calls == [far] and result.cluster["passes"] == 2


def test_a_decision_that_cannot_be_applied_raises():
    def double_booking(snapshot):
        placement = (("n1", (0,)),)
        return policy.Plan(
            admissions=tuple(
                policy.Admission(q.job_id, q.share, placement, False, policy.ADMITTED_OWN)
                for q in snapshot.queued
            )
        )

    with pytest.raises(PolicyError, match="n1:0"):
        simulate(
            scenario([{"id": "a", "duration_s": 10}, {"id": "b", "duration_s": 10}]), planner=double_booking
        )


# -- CLI -----------------------------------------------------------------------------------------------

GOOD = scenario([{"id": "a1", "duration_s": 100}, {"id": "a2", "duration_s": 100}])


def _with(path_value_pairs):
    data = json.loads(json.dumps(GOOD))
    for path, value in path_value_pairs:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return data


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ([(("jobs", 1, "share"), "nope")], 'jobs[1] (id "a2"): share "nope" is not defined'),
        (
            [(("shares", 0, "strategy"), "HOARD")],
            "shares[0] (p): strategy must be one of RESERVE, LEND, LEND_AND_BORROW",
        ),
        ([(("jobs", 0, "gpus"), -2)], 'jobs[0] (id "a1"): gpus must be at least 1'),
        (
            [(("shares", 0, "capacity"), {"a10g": -1})],
            "shares[0] (p): capacity a10g must be a non-negative integer",
        ),
        ([(("jobs", 0, "gpus"), 3)], 'jobs[0] (id "a1"): gpus 3 is larger than the largest a10g node'),
        ([(("jobs", 1, "id"), "a1")], 'jobs[1] (id "a1"): duplicate job id "a1"'),
        ([(("jobs", 0, "gpu"), 1)], 'jobs[0] (id "a1"): unknown field "gpu" (did you mean "gpus"?)'),
        ([(("shares", 0, "name"), "Project_A")], "shares[0] (Project_A): name must match [a-z0-9-]{1,63}"),
        ([(("jobs", 0, "priority"), 10000)], 'jobs[0] (id "a1"): priority must be at most 9999'),
        ([(("jobs", 0, "priority"), -1)], 'jobs[0] (id "a1"): priority must be at least 0'),
        ([(("jobs", 0, "gpu_type"), "h100")], 'jobs[0] (id "a1"): no node has gpu_type "h100"'),
        ([(("events",), [{"at": 5, "kind": "explode", "job": "a1"}])], "events[0]: kind must be one of"),
        (
            [(("events",), [{"at": 5, "kind": "cancel", "job": "zz"}])],
            'events[0] (cancel "zz"): job "zz" is not defined',
        ),
        (
            [(("events",), [{"at": 5, "kind": "update_share", "share": "p", "set": {"strategy": "X"}}])],
            'events[0] (update_share "p") set: strategy must be one of',
        ),
        ([(("settings", "tick_s"), 0)], "settings: tick_s must be at least 1"),
        ([(("jobs", 0, "duration_s"), 1.5)], 'jobs[0] (id "a1"): duration_s must be an integer'),
    ],
)
def test_an_invalid_scenario_exits_2_naming_field_and_owner(tmp_path, capsys, change, expected):
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(_with(change)))
    assert main([str(path), "--out", str(tmp_path / "result.json")]) == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "result.json").exists()


def test_unreadable_input_exits_2(tmp_path, capsys):
    path = tmp_path / "scenario.json"
    path.write_text("{not json")
    assert main([str(path)]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2


def test_all_errors_are_reported_at_once():
    with pytest.raises(sc.ScenarioError) as exc:
        sc.parse(_with([(("jobs", 0, "share"), "x"), (("jobs", 1, "gpus"), 0)]))
    assert len(exc.value.errors) == 2


def test_a_run_with_out_says_what_happened_in_a_line(tmp_path, capsys):
    """`manage.py simulate S --out R` printed nothing on success (issue 42.6)."""
    path, out = tmp_path / "s.json", tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    assert main([str(path), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert printed.startswith(f"simulated {len(result['jobs'])} jobs over ")
    assert f"utilisation {100 * result['cluster']['utilisation']:.1f}%; result in {out}\n" in printed
    assert printed.count("\n") == 1


def test_the_manage_py_command_says_it_too(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    path, out = tmp_path / "s.json", tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    done = subprocess.run(
        [sys.executable, "manage.py", "simulate", str(path), "--out", str(out)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("simulated ") and f"result in {out}" in done.stdout


def test_the_result_file_has_sorted_keys_and_integer_times(tmp_path):
    path, out = tmp_path / "s.json", tmp_path / "r.json"
    path.write_text(json.dumps(GOOD))
    assert main([str(path), "--out", str(out)]) == 0
    text = out.read_text()
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=1) + "\n"
    result = json.loads(text)
    assert set(result) == {"jobs", "shares", "cluster"}
    assert set(result["cluster"]) == {"makespan_s", "utilisation", "lost_gpu_seconds", "passes"}
    assert set(result["shares"]["p"]) == {
        "gpu_seconds_own",
        "gpu_seconds_borrowed",
        "gpu_seconds_lent",
        "mean_wait_s",
        "p95_wait_s",
        "preempted_jobs",
        "lost_gpu_seconds",
    }
    assert result["shares"]["p"]["lost_gpu_seconds"] == {
        "reclaim": 0,
        "priority": 0,
        "fair_share": 0,
        "node_lost": 0,
    }
    times = [a[k] for j in result["jobs"].values() for a in j["attempts"] for k in ("start", "end")]
    assert all(isinstance(t, int) for t in times)


def test_it_is_deterministic():
    data = scenario(
        [
            {"id": f"j{i}", "submit_at": i * 7 % 50, "duration_s": 30 + i * 13 % 90, "priority": i % 3}
            for i in range(30)
        ],
        nodes=[{"name": f"n{i}", "gpu_type": "a10g", "gpus": 2} for i in range(3)],
        shares=[
            {"name": "p", "capacity": {"a10g": 3}, "in_share_preemption": True},
            {"name": "q", "capacity": {"a10g": 2}},
        ],
        preemption_grace_s=5,
    )
    for i, job in enumerate(data["jobs"]):
        job["share"] = "pq"[i % 2]
    assert simulate(data).to_json() == simulate(data).to_json()


def test_compare_and_variant_print_a_table(tmp_path, capsys):
    path, a, b = tmp_path / "s.json", tmp_path / "a.json", tmp_path / "b.json"
    data = scenario(
        [{"id": "a1", "duration_s": 100}, {"id": "a2", "duration_s": 100}],
        nodes=TWO_GPUS,
        shares=[{"name": "p", "capacity": {"a10g": 1}}],
    )
    path.write_text(json.dumps(data))
    assert main([str(path), "--out", str(a)]) == 0
    data["shares"][0]["strategy"] = "RESERVE"
    path.write_text(json.dumps(data))
    assert main([str(path), "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["--compare", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    for row in (
        "utilisation",
        "makespan_s",
        "lost_gpu_seconds",
        "pre-emptions",
        "p mean wait_s",
        "p p95 wait_s",
        "lost to reclaim",
        "lost to node lost",
        "p lost GPU-s",
    ):
        assert row in table
    assert table.split("p mean wait_s")[1].split()[:3] == ["0", "50", "+50"]  # a2 waits 100 s when p reserves
    assert "a.json" in table.splitlines()[0]
    # A result written before lost work was split by cause compares too (its share rows say "-").
    old = json.loads(a.read_text())
    for share in old["shares"].values():
        del share["lost_gpu_seconds"]
    a.write_text(json.dumps(old))
    assert main(["--compare", str(a), str(b)]) == 0
    assert capsys.readouterr().out.split("p lost GPU-s")[1].split()[:2] == ["-", "0"]

    path.write_text(json.dumps({**data, "shares": [{"name": "p", "capacity": {"a10g": 1}}]}))
    assert main([str(path), "--variant", "RESERVE:p"]) == 0
    assert "as given" in capsys.readouterr().out
    assert main([str(path), "--variant", "RESERVE:nope"]) == 2


# -- properties on random small scenarios -------------------------------------------------------------


@st.composite
def random_scenarios(draw):
    size = draw(st.sampled_from([1, 2, 4]))
    nodes = [{"name": f"n{i}", "gpu_type": "a", "gpus": size} for i in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        nodes[-1]["lost_at"] = draw(st.integers(1, 200))
    total = sum(n["gpus"] for n in nodes)
    shares = [
        {
            "name": f"s{i}",
            "capacity": {"a": draw(st.integers(0, total))},
            "strategy": draw(st.sampled_from(policy.STRATEGIES)),
            "borrow_limit": draw(st.sampled_from([-1, 0, 50, 100])),
            "in_share_preemption": draw(st.booleans()),
            "min_runtime_s": draw(st.sampled_from([0, 0, 20, 60])),
        }
        for i in range(draw(st.integers(1, 3)))
    ]
    jobs = [
        {
            "id": f"j{k}",
            "share": draw(st.sampled_from([s["name"] for s in shares])),
            "submit_at": draw(st.integers(0, 150)),
            "duration_s": draw(st.integers(1, 200)),
            # Single-node jobs, and gangs of whole nodes.
            "gpus": draw(
                st.sampled_from(
                    [g for g in (1, 2, 4) if g <= size] + [size * k for k in range(2, len(nodes) + 1)]
                )
            ),
            "gpu_type": "a",
            "priority": draw(st.integers(0, 3)),
            "max_preemptions": draw(st.sampled_from([-1, -1, 0, 1])),
            "checkpoint_every_s": draw(st.sampled_from([None, 10, 50])),
            "checkpoint_on_stop": draw(st.booleans()),
        }
        for k in range(draw(st.integers(1, 8)))
    ]
    events = []
    if draw(st.booleans()):
        events.append(
            {"at": draw(st.integers(0, 300)), "kind": "cancel", "job": draw(st.sampled_from(jobs))["id"]}
        )
        events[-1]["at"] = max(
            events[-1]["at"], next(j["submit_at"] for j in jobs if j["id"] == events[-1]["job"])
        )
    grace = draw(st.sampled_from([0, 0, 5, 30]))
    until = draw(st.sampled_from([None, None, 250]))
    return {
        "settings": {"preemption_grace_s": grace, "until_s": until},
        "nodes": nodes,
        "shares": shares,
        "jobs": jobs,
        "events": events,
    }


class Checked:
    """The real policy, with each pre-emption checked against the snapshot it was decided on."""

    def __init__(self):
        self.problems = []

    def __call__(self, snapshot):
        decided = policy.plan(snapshot)
        borrowed = policy.borrowed_attempts(snapshot)
        running = {r.attempt_id: r for r in snapshot.running}
        queued = {q.job_id: q for q in snapshot.queued}
        for p in decided.preemptions:
            victim = running[p.attempt_id]
            if p.reason == policy.RECLAIM and p.attempt_id not in borrowed:
                self.problems.append(f"t={snapshot.now}: reclaimed {p.attempt_id}, which is not borrowing")
            if p.reason == policy.PRIORITY:
                winner = queued.get(p.beneficiary_job_id)
                if winner is None or winner.share != victim.share or winner.priority <= victim.priority:
                    self.problems.append(
                        f"t={snapshot.now}: {p.attempt_id} pre-empted for PRIORITY by {winner}"
                    )
        return decided


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_scenarios())
def test_random_runs_keep_the_invariants(data):
    checked = Checked()
    result = simulate(data, planner=checked)
    out = result.to_dict()
    cut = data["settings"]["until_s"] is not None
    assert checked.problems == []
    assert result.warnings == []

    # Every job is there once, in one final state; only a cut leaves work running.
    assert set(out["jobs"]) == {j["id"] for j in data["jobs"]}
    for job in out["jobs"].values():
        assert job["final"] in (
            {"SUCCEEDED", "FAILED", "CANCELLED", "QUEUED"} | ({"RUNNING"} if cut else set())
        )
        assert (job["end"] is None) == (job["final"] in ("QUEUED", "RUNNING"))
        terminal = [a for a in job["attempts"] if a["outcome"] in ("SUCCEEDED", "FAILED", "CANCELLED")]
        assert len(terminal) <= 1 and (not terminal or terminal[0] is job["attempts"][-1])
        # Attempts of one job never overlap.
        for a, b in zip(job["attempts"], job["attempts"][1:], strict=False):
            assert a["end"] is not None and a["end"] <= b["start"]

    # No GPU is held by two attempts at once.
    horizon = out["cluster"]["makespan_s"]
    held = {}
    for attempt in result.attempts():
        end = horizon if attempt.end is None else attempt.end
        for node, idx in attempt.placement:
            for i in idx:
                held.setdefault((node, i), []).append((attempt.start, end))
    for spans in held.values():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert end <= start

    # Usage stays within capacity + borrow cap; RESERVE and LEND never borrow.
    for share in data["shares"]:
        cap = share["capacity"]["a"]
        times, values = result.timeline.series.get((share["name"], "a", "borrowed"), ([], []))
        most = max(values, default=0)
        if share["strategy"] != policy.LEND_AND_BORROW:
            assert most == 0
        elif share["borrow_limit"] != -1:
            assert most <= cap * share["borrow_limit"] // 100


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 50), st.floats(0, 64, allow_nan=False, width=32)), min_size=0, max_size=30
    ),
    until=st.one_of(st.none(), st.integers(0, 2000)),
)
def test_timeline_integral_is_each_value_times_how_long_it_held(steps, until):
    from quotas.engine.timeline import Timeline

    timeline, t = Timeline(), 0
    for gap, value in steps:
        t += gap
        timeline.set_value(("a", "x", "own"), t, value)
    timeline.end = t + 7
    times, values = timeline.series.get(("a", "x", "own"), ([], []))
    end = timeline.end if until is None else until
    expected = 0.0  # summed in time order, as the result's figures have always been
    for i, (at, v) in enumerate(zip(times, values, strict=True)):
        if at >= end:
            break
        expected += v * (min(times[i + 1] if i + 1 < len(times) else end, end) - at)
    assert timeline.integral(("a", "x", "own"), until=until) == expected
