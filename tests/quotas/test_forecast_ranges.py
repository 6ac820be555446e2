"""Forecast ranges and runtime estimates that learn (SEMANTICS "Forecast": Ranges, Runtime estimates):
the pure estimator (quotas.engine.runtimes) and the ranges the forecast's quantile replays give, checked
through `simulate --forecast` against what really happens."""

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quotas.engine import runtimes as rt
from quotas.engine.simulate import simulate
from tests.quotas.test_simulate import scenario

# -- the estimator -------------------------------------------------------------------------------------

HEAVY = [600] * 50 + [3600] * 30 + [36000] * 20  # half the jobs 10 min, a fifth 10 h


def test_a_queued_job_is_guessed_from_its_shares_runtimes_with_their_spread():
    g = rt.Runtimes({"vision": HEAVY}).guess("vision")
    assert (g.low, g.seconds, g.high) == (600, 600 + (3600 - 600) * 0.5, 36000)
    assert g.source == "vision" and not g.conditional


def test_a_running_job_is_guessed_from_how_long_it_has_already_run():
    model = rt.Runtimes({"vision": HEAVY})
    # It has run 20 min: it is not one of the 10-minute jobs; of those that ran that long, half ran 1 h
    # in all and a fifth 10 h, so its median remaining time is 40 min, not "due now".
    g = model.guess("vision", elapsed=1200)
    assert g.conditional and g.seconds == 3600 and g.low == 3600 and g.high == 36000
    # Past 1 h only the 10-hour jobs are left.
    assert model.guess("vision", elapsed=4000).seconds == 36000


def test_a_job_that_ran_longer_than_anything_seen_is_expected_to_run_as_long_again():
    g = rt.Runtimes({"vision": HEAVY}).guess("vision", elapsed=50000)
    assert g.seconds == 100000 and g.low < g.seconds < g.high


def test_the_same_users_job_name_is_preferred_once_there_are_enough_of_them():
    by_group = {("vision", "bob", "train"): [7200] * rt.GROUP_MIN_SAMPLES}
    model = rt.Runtimes({"vision": HEAVY}, by_group)
    assert model.guess("vision", "bob", "train").seconds == 7200
    assert model.guess("vision", "bob", "train").source == "bob's 'train' jobs"
    assert model.guess("vision", "ann", "train").source == "vision"
    few = rt.Runtimes({"vision": HEAVY}, {("vision", "bob", "train"): [7200] * (rt.GROUP_MIN_SAMPLES - 1)})
    assert few.guess("vision", "bob", "train").source == "vision"


def test_without_history_the_default_is_given_with_a_wide_spread():
    g = rt.Runtimes({"vision": [60] * (rt.SHARE_MIN_SAMPLES - 1)}, default_s=3600).guess("vision")
    assert (g.low, g.seconds, g.high, g.source) == (900, 3600, 14400, None)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 10**6), min_size=0, max_size=60),
    st.one_of(st.none(), st.integers(0, 2 * 10**6)),
    st.integers(1, 10**6),
)
@example([], 3541, 3601)  # no history, a minute before the default: the point was below the low end
def test_property_the_estimate_never_exceeds_a_declared_max_runtime(samples, elapsed, max_runtime):
    g = rt.Runtimes({"s": samples}).guess("s", elapsed=elapsed, max_runtime_s=max_runtime)
    assert g.low <= g.seconds <= g.high <= max_runtime


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 10**6), min_size=rt.SHARE_MIN_SAMPLES, max_size=60), st.integers(1, 2 * 10**6))
def test_property_a_running_attempts_remaining_time_is_ordered_and_never_in_the_past(samples, elapsed):
    g = rt.Runtimes({"s": samples}).guess("s", elapsed=elapsed)
    assert elapsed + rt.MIN_REMAINING_S <= g.low <= g.seconds <= g.high


# -- ranges through the simulator ----------------------------------------------------------------------


def forecasts(data):
    result = simulate(data, forecast=True).to_dict()
    return result, [(job, job["forecast_at_submit"]) for job in result["jobs"].values()]


def jobs_submitted(at):
    return st.lists(
        st.tuples(
            at,  # submit
            st.integers(1, 900),  # duration
            st.one_of(st.none(), st.integers(0, 300)),  # max runtime: duration + this, or none
            st.integers(1, 2),  # gpus
            st.sampled_from("pq"),
            st.integers(0, 2),  # priority
        ),
        min_size=1,
        max_size=14,
    )


JOBS = st.lists(
    st.tuples(
        st.integers(0, 400),  # submit
        st.integers(1, 900),  # duration
        st.one_of(st.none(), st.integers(0, 300)),  # max runtime: duration + this, or none
        st.integers(1, 2),  # gpus
        st.sampled_from("pq"),
        st.integers(0, 2),  # priority
    ),
    min_size=1,
    max_size=14,
)


def two_shares(jobs, strategy="LEND_AND_BORROW", all_bounded=False):
    specs = []
    for i, (submit, duration, extra, gpus, share, priority) in enumerate(jobs):
        spec = {"id": f"j{i}", "submit_at": submit, "duration_s": duration, "gpus": gpus, "share": share}
        if extra is not None or all_bounded:
            spec["max_runtime_s"] = duration + (extra or 0)
        specs.append({**spec, "priority": priority, "name": f"n{i % 3}"})
    return scenario(
        specs,
        preemption_grace_s=5,
        nodes=[{"name": n, "gpu_type": "a10g", "gpus": 2} for n in ("n1", "n2")],
        shares=[
            {"name": "p", "capacity": {"a10g": 2}, "strategy": "LEND_AND_BORROW"},
            {"name": "q", "capacity": {"a10g": 2}, "strategy": strategy},
        ],
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JOBS, st.sampled_from(["RESERVE", "LEND", "LEND_AND_BORROW"]))
def test_property_a_range_holds_its_eta_and_a_bounds_range_ends_at_the_bound(jobs, strategy):
    _, told = forecasts(two_shares(jobs, strategy))
    for _, f in told:
        if f["eta"] is None:
            assert f["low"] is None and f["high"] is None
            continue
        if f["low"] is None:  # an estimate its replays all start at one instant: no range of no width
            assert f["kind"] == "estimate" and f["high"] is None, f
            continue
        assert f["low"] <= f["eta"] <= f["high"], f
        if f["kind"] == "bound":
            assert f["high"] == f["eta"], f
        else:
            assert f["low"] < f["high"], f


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_submitted(st.just(0)), st.sampled_from(["RESERVE", "LEND", "LEND_AND_BORROW"]))
def test_property_a_bound_is_still_never_missed_beside_guessed_work(jobs, strategy):
    """A bound holds against the queue as it is (work that arrives later may still outrank it), so
    everything is submitted at once here; some jobs declare their runtime, some do not."""
    result, told = forecasts(two_shares(jobs, strategy))
    for job, f in told:
        if f["kind"] == "bound":
            assert job["first_start"] <= f["eta"], (job, f)
    assert result["cluster"]["forecast_error"]["bound_started_late"] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(JOBS, st.sampled_from(["RESERVE", "LEND", "LEND_AND_BORROW"]))
def test_property_with_every_runtime_a_max_runtime_a_range_ends_at_a_bound_and_an_estimates_has_width(
    jobs, strategy
):
    """Max runtimes are enforced, but jobs end sooner: a range reaches back to the early ends, a bound's
    ends at the bound, and an estimate's (backfill, borrowing) is never of zero width (issue 42)."""
    _, told = forecasts(two_shares(jobs, strategy, all_bounded=True))
    for _, f in told:
        if f["kind"] == "bound":
            assert f["low"] <= f["eta"] == f["high"], f
        elif f["kind"] == "estimate" and f["low"] is not None:
            assert f["low"] <= f["eta"] <= f["high"] and f["low"] < f["high"], f


def test_a_reserve_shares_job_behind_its_own_bounded_work_is_a_bound_whatever_others_run():
    """Found by a new user: a RESERVE share whose team sets max runtimes on everything was told
    "estimate: ... jobs without a max runtime end before it (... in language-research)", another team's
    work it does not wait on."""
    data = scenario(
        [
            {"id": "other", "share": "p", "duration_s": 500},  # no max runtime, ends first
            {"id": "mine", "share": "q", "duration_s": 800, "max_runtime_s": 900},
            {"id": "next", "share": "q", "submit_at": 10, "duration_s": 100, "max_runtime_s": 100},
        ],
        nodes=[{"name": "n1", "gpu_type": "a10g", "gpus": 2}],
        shares=[
            {"name": "p", "capacity": {"a10g": 1}, "strategy": "LEND_AND_BORROW"},
            {"name": "q", "capacity": {"a10g": 1}, "strategy": "RESERVE"},
        ],
    )
    result = simulate(data, forecast=True).to_dict()
    f = result["jobs"]["next"]["forecast_at_submit"]
    # "mine" has run 10 s: it may end a minute from then (runtimes.Runtimes.bounded), 900 at the latest.
    assert f == {"eta": 900, "low": 70, "high": 900, "kind": "bound"}
    assert result["jobs"]["next"]["first_start"] == 800


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 300), st.integers(1, 600), st.integers(0, 200), st.sampled_from("pq")),
        min_size=1,
        max_size=12,
    )
)
def test_property_a_reserve_shares_one_gpu_bound_is_met_beside_unbounded_work(jobs):
    """q (RESERVE) declares every runtime, p (LEND_AND_BORROW) none: q's one-GPU ETAs are bounds that
    hold, whatever p's work does."""
    specs = []
    for i, (submit, duration, extra, share) in enumerate(jobs):
        spec = {"id": f"j{i}", "submit_at": submit, "duration_s": duration, "share": share}
        if share == "q":
            spec["max_runtime_s"] = duration + extra
        specs.append(spec)
    data = scenario(
        specs,
        preemption_grace_s=5,
        nodes=[{"name": n, "gpu_type": "a10g", "gpus": 2} for n in ("n1", "n2")],
        shares=[
            {"name": "p", "capacity": {"a10g": 2}, "strategy": "LEND_AND_BORROW"},
            {"name": "q", "capacity": {"a10g": 2}, "strategy": "RESERVE"},
        ],
    )
    result = simulate(data, forecast=True).to_dict()
    for spec in specs:
        job = result["jobs"][spec["id"]]
        f = job["forecast_at_submit"]
        if spec["share"] == "q" and f["eta"] is not None:
            assert f["kind"] == "bound", (job, f)
        if f["kind"] == "bound":
            assert job["first_start"] <= f["eta"], (job, f)


def test_an_estimate_allows_for_the_work_expected_to_arrive_and_a_bound_does_not_move():
    """Work that came in over the last day comes in again: a higher-priority job expected at t=1050 takes
    the GPU the waiting job was told of at t=1100, so its estimate is that job's end; a bound holds
    against the queue as it is and stays."""
    from quotas.engine import forecast as fc
    from quotas.engine.policy import NodeView, QueuedView, RunningView, ShareView, Snapshot

    snap = Snapshot(
        now=1000.0,
        nodes=(NodeView("n1", "a10g", 1),),
        shares=(ShareView("s", {"a10g": 1}),),
        running=(RunningView(1, 1, "s", "a10g", 0, 900.0, 900.0, (("n1", (0,)),), False),),
        queued=(QueuedView(2, "s", "a10g", 1, 0, 950.0),),
    )
    arrivals = [QueuedView(-1, "s", "a10g", 1, 5, 1050.0)]
    runtime = {1: 200.0, 2: 50.0, -1: 300.0}
    spread = {1: (150.0, 400.0), 2: (50.0, 50.0), -1: (100.0, 600.0)}
    est = {1: rt.Guess(200.0, 150.0, 400.0, "s"), 2: rt.Guess(50.0, 50.0, 50.0, "s")}
    f = fc.forecast(snap, runtime_s=runtime, estimates=est, spread=spread, arrivals=arrivals)
    assert f.eta == {2: 1400.0} and f.kind == {2: "estimate"}
    assert f.basis[2].endswith(fc.ARRIVALS_BASIS)
    assert f.ranges[2] == (1050.0, 1400.0)  # low: job 1 ends at its 10th percentile, nothing arrives
    assert fc.forecast(snap, runtime_s=runtime, estimates=est, spread=spread).eta == {2: 1100.0}
    bounded = fc.forecast(
        snap, runtime_s=runtime, estimates={}, spread={-1: (100.0, 600.0)}, arrivals=arrivals
    )
    assert (
        bounded.eta == {2: 1100.0} and bounded.kind == {2: "bound"} and bounded.ranges[2] == (1100.0, 1100.0)
    )
