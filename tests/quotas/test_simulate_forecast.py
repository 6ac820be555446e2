"""`simulate --forecast` (SCENARIO.md): the production forecast at each submit, checked against the
actual start; a bound ETA is one the simulator confirms."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotas.engine.simulate import Profile, main, simulate
from tests.quotas.test_simulate import scenario


def test_a_job_whose_blockers_all_have_max_runtimes_gets_a_bound_eta_it_meets():
    # n1 is busy until t=100 at the latest (max_runtime 100; it really ends at 80): "b" is told
    # "by t=100", bound, and starts at t=80. Its range reaches back to a minute after its submit (a has
    # run 10 s, and nothing seen says how early it ends: runtimes.Runtimes.bounded).
    data = scenario(
        [
            {"id": "a", "duration_s": 80, "max_runtime_s": 100},
            {"id": "b", "submit_at": 10, "duration_s": 50, "max_runtime_s": 60},
        ]
    )
    result = simulate(data, forecast=True).to_dict()
    b = result["jobs"]["b"]
    assert b["forecast_at_submit"] == {"eta": 100, "low": 70, "high": 100, "kind": "bound"}
    assert b["first_start"] == 80 <= b["forecast_at_submit"]["eta"]
    err = result["cluster"]["forecast_error"]
    assert err["n"] == 2 and err["bound_started_late"] == 0


def test_a_guessed_runtime_makes_an_estimate():
    data = scenario([{"id": "a", "duration_s": 80}, {"id": "b", "submit_at": 10, "duration_s": 50}])
    b = simulate(data, forecast=True).to_dict()["jobs"]["b"]
    # The default guess: 1 h, a factor 4 either way; "a" has run 10 s of it when "b" is submitted.
    assert b["forecast_at_submit"] == {"eta": 3600, "low": 907, "high": 14400, "kind": "estimate"}
    assert b["first_start"] == 80


def test_the_error_is_reported_as_the_spec_says():
    data = scenario([{"id": "a", "duration_s": 80}, {"id": "b", "submit_at": 10, "duration_s": 50}])
    err = simulate(data, forecast=True).to_dict()["cluster"]["forecast_error"]
    # a: told "now", started at 0 (error 0); b: told 3600, started at 80 (error 3520, not within 25%).
    assert (err["n"], err["median_abs_s"], err["p90_abs_s"], err["within_25pct"]) == (2, 0, 3520, 0.5)
    # b waited 70 s (> 1 min): the `waited` block is b alone; a's range held its start, b's did not.
    assert err["waited"] == {
        "n": 1,
        "median_abs_s": 3520,
        "p90_abs_s": 3520,
        "within_25pct": 0.0,
        "range_coverage": 0.0,
        "range_width_median_s": 14400 - 907,
    }
    assert (err["range_coverage"], err["range_width_median_s"]) == (0.5, 0)  # a: "now", 0 wide


def test_without_forecast_the_result_keeps_its_format():
    data = scenario([{"id": "a", "duration_s": 80}])
    result = simulate(data).to_dict()
    assert "forecast_at_submit" not in result["jobs"]["a"] and "forecast_error" not in result["cluster"]


def test_the_command_line_option(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(scenario([{"id": "a", "duration_s": 80, "max_runtime_s": 90}])))
    out = tmp_path / "r.json"
    assert main([str(path), "--forecast", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["jobs"]["a"]["forecast_at_submit"] == {
        "eta": 0,
        "low": 0,
        "high": 0,
        "kind": "bound",
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 300), st.integers(1, 200), st.integers(0, 3), st.integers(1, 2)),
        min_size=1,
        max_size=12,
    )
)
def test_property_a_bound_eta_is_met_when_every_job_declares_its_runtime(jobs):
    """Every job has max_runtime_s >= its duration and nothing else arrives to jump the queue ahead:
    the jobs submitted at t=0 are told a bound they meet (later arrivals may be outranked)."""
    specs = [
        {"id": f"j{i}", "submit_at": 0, "duration_s": d, "max_runtime_s": d + extra, "priority": p, "gpus": g}
        for i, (extra, d, p, g) in enumerate(jobs)
    ]
    data = scenario(
        specs,
        nodes=[{"name": "n1", "gpu_type": "a10g", "gpus": 2}],
        shares=[{"name": "p", "capacity": {"a10g": 2}}],
    )
    result = simulate(data, forecast=True).to_dict()
    one_gpu_each = all(spec["gpus"] == 1 for spec in specs)
    for spec in specs:
        job = result["jobs"][spec["id"]]
        f = job["forecast_at_submit"]
        # Backfill (rule 6) can break a later ETA of a 2-GPU job, or of one the replay starts ahead of
        # its order: those are estimates. Without them nothing backfills, and every ETA is a bound.
        assert f["kind"] in ("bound", "estimate")
        if one_gpu_each or f["eta"] == 0:
            assert f["kind"] == "bound", (job, f)
        if f["kind"] == "bound":
            assert job["first_start"] <= f["eta"], (job, f)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3), st.integers(1, 5), st.integers(0, 3), st.integers(1, 2), st.sampled_from("pq")
        ),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from(["RESERVE", "LEND", "LEND_AND_BORROW"]),
    st.booleans(),
)
def test_property_a_bound_eta_is_met_with_two_shares_that_lend_and_borrow(jobs, strategy, in_share):
    specs = [
        {"id": f"j{i}", "duration_s": d, "max_runtime_s": d + extra, "priority": p, "gpus": g, "share": share}
        for i, (extra, d, p, g, share) in enumerate(jobs)
    ]
    data = scenario(
        specs,
        nodes=[{"name": n, "gpu_type": "a10g", "gpus": 2} for n in ("n1", "n2")],
        shares=[
            {
                "name": "p",
                "capacity": {"a10g": 2},
                "strategy": "LEND_AND_BORROW",
                "in_share_preemption": in_share,
            },
            {"name": "q", "capacity": {"a10g": 2}, "strategy": strategy},
        ],
    )
    for job in simulate(data, forecast=True).to_dict()["jobs"].values():
        f = job["forecast_at_submit"]
        if f["kind"] == "bound":
            assert job["first_start"] <= f["eta"], (job, f)


def test_a_bigger_job_that_backfill_can_overtake_gets_an_estimate():
    """Found by the property above: b (2 GPUs) would be told 4 as a bound (a and c end by then), but a
    ends at 2, and d (1 GPU, lower priority) backfills into that GPU until 6."""
    data = scenario(
        [
            {"id": "b", "duration_s": 3, "max_runtime_s": 4, "priority": 2, "gpus": 2},
            {"id": "a", "duration_s": 2, "max_runtime_s": 4, "priority": 3},
            {"id": "c", "duration_s": 4, "max_runtime_s": 4, "priority": 1},
            {"id": "d", "duration_s": 4, "max_runtime_s": 6, "priority": 1},
            {"id": "e", "duration_s": 4, "max_runtime_s": 7, "priority": 2, "gpus": 2},
        ],
        nodes=[{"name": "n1", "gpu_type": "a10g", "gpus": 2}],
        shares=[{"name": "p", "capacity": {"a10g": 2}}],
    )
    jobs = simulate(data, forecast=True).to_dict()["jobs"]
    # Its range has the width of what is not known: a and c may end early (low 0: a tiny share of 4 s).
    assert jobs["b"]["forecast_at_submit"] == {"eta": 4, "low": 0, "high": 4, "kind": "estimate"}
    assert (jobs["a"]["first_start"], jobs["d"]["first_start"], jobs["b"]["first_start"]) == (0, 2, 6)


def test_the_report_shows_the_error_distribution():
    from quotas.engine import scenario as sc
    from quotas.engine.report import render_report

    data = scenario([{"id": "a", "duration_s": 80}, {"id": "b", "submit_at": 10, "duration_s": 50}])
    result = simulate(data, forecast=True)
    page = render_report(sc.parse(data), result, result.timeline)
    assert "ETA at submit against the actual start" in page
    assert "<tr><th>estimate</th>" in page and "median error" in page
    # a: started at once, in its range; b: told 3,600 s (907-14,400), started at 80, waited 70 s.
    assert "50.0% started within their likely range" in page
    assert "1 waited more than a minute: median error 58.7 min" in page
    plain = simulate(data)
    assert "ETA at submit" not in render_report(sc.parse(data), plain, plain.timeline)


def test_tracegen_can_give_jobs_a_max_runtime_as_users_do():
    from quotas.engine.tracegen import generate

    jobs = generate(teams=2, gpus=16, jobs=50, seed=3, max_runtime=1.5)["jobs"]
    for job in jobs:
        assert job["max_runtime_s"] % 3600 == 0
        assert job["duration_s"] * 1.5 <= job["max_runtime_s"] < job["duration_s"] * 1.5 + 3600
    assert "max_runtime_s" not in generate(teams=2, gpus=16, jobs=5, seed=3)["jobs"][0]


@pytest.mark.engine_as_python  # its reasons line patches the engine (tests/conftest.py)
def test_profile_says_where_the_time_goes_and_keeps_the_result(tmp_path, capsys):
    path = tmp_path / "s.json"
    # b fits its share's own room (2 on a 1-GPU node) but no node: a reason written in a pass
    shares = [{"name": "p", "capacity": {"a10g": 2}}]
    jobs = [{"id": "a", "duration_s": 80}, {"id": "b", "duration_s": 50}]
    path.write_text(json.dumps(scenario(jobs, shares=shares)))
    plain, profiled = tmp_path / "plain.json", tmp_path / "profiled.json"
    assert main([str(path), "--out", str(plain)]) == 0
    capsys.readouterr()
    assert main([str(path), "--profile", "--out", str(profiled)]) == 0
    table = capsys.readouterr().err
    for part in ("passes", "reasons (in passes)", "events: submit", "accounting", "total (wall)"):
        assert part in table
    assert plain.read_text() == profiled.read_text()


def test_profile_tells_passes_that_decided_from_those_that_decided_nothing():
    # a starts at 0; b waits for a's GPU (no node fits two): the pass at its submit decides nothing,
    # the one at a's end starts it; the settled pass after each start is counted, not made
    shares = [{"name": "p", "capacity": {"a10g": 2}}]
    jobs = [{"id": "a", "duration_s": 80}, {"id": "b", "submit_at": 10, "duration_s": 50}]
    profile = Profile()
    simulate(scenario(jobs, shares=shares), profile=profile)
    parts = {p.strip(): n for p, n in profile.calls.items() if p.startswith(" ")}
    assert parts == {"first at instant, decided": 2, "first at instant, nothing": 1}
    assert sum(parts.values()) == profile.calls["passes"]
    table = profile.table(1.0).splitlines()
    at = next(i for i, line in enumerate(table) if line.startswith("passes "))
    assert all(table[at + 1 + i].startswith("  ") for i in range(len(parts)))
