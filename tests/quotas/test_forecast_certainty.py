"""Forecasts that promise no more certainty than they have (issue 42, item 4): a range has the width of
what is not known (none of zero width unless the ETA is a bound), an ETA is never before a time its reason
names, and a forecast from too little history says so. Pure: quotas.engine.forecast and runtimes."""

import dataclasses

from quotas.engine import forecast
from quotas.engine import runtimes as rt
from quotas.engine.policy import LEND, LEND_AND_BORROW, plan
from tests.quotas.test_policy import job, node, on, running, share, snap


def protect(s, seconds):
    return dataclasses.replace(s, min_runtime_s=seconds)


def _owner_waits_for_protection():
    """o (LEND, 2 GPUs of its own) lends both to x, whose jobs are protected for 600 s; o1 (1 GPU) comes
    at 300 and must reclaim x-2, protected until 800."""
    return snap(
        [node("n1", 2)],
        [share("o", 2, LEND), protect(share("x", 0, LEND_AND_BORROW), 600)],
        runs=[
            running("x-1", "x", on("n1", 0), started=100, borrowed=True),
            running("x-2", "x", on("n1", 1), started=200, borrowed=True),
        ],
        queued=[job("o1", "o", 1, submitted=300)],
        now=300,
    )


def test_an_owner_waiting_for_protection_is_told_a_bound_not_that_borrowed_gpus_come_and_go():
    s = _owner_waits_for_protection()
    assert plan(s).waiting["o1"] == "waits for 1 protected job of share x, until t=800 s"
    f = forecast.forecast(s, runtime_s={"x-1": 5000, "x-2": 5000}, default_grace_s=30)
    # x-2's window ends at 800 and its grace period is 30 s: both enforced, and no new borrowing of the
    # type starts while o1 waits (rule 10).
    assert f.eta["o1"] == 830 and f.kind["o1"] == forecast.BOUND
    assert f.basis["o1"] != forecast.BORROWING_BASIS
    assert f.waiting["o1"] == "waits for 1 protected job of share x, until t=800 s"


def test_an_eta_before_the_window_its_reason_names_comes_with_the_reason_why():
    # x-1 ends by its max runtime at 500: o1 starts then, before x-2's window ends at 800.
    f = forecast.forecast(
        _owner_waits_for_protection(), runtime_s={"x-1": 400, "x-2": 5000}, default_grace_s=30
    )
    assert f.eta["o1"] == 500
    assert f.waiting["o1"] == (
        "waits for 1 protected job of share x, until t=800 s, or as soon as GPUs free before then (t=500 s)"
    )


def _backfill_estimate():
    """b (2 GPUs) would start at 4 when a and c end by their max runtimes; but a may end at 2 and d
    (1 GPU) backfill there: an estimate resting on max runtimes alone (test_simulate_forecast)."""
    return snap(
        [node("n1", 2)],
        [share("p", 2)],
        runs=[running("a", "p", on("n1", 0)), running("c", "p", on("n1", 1))],
        queued=[job("b", "p", 2, prio=2), job("d", "p", 1, prio=1, submitted=1)],
        now=0,
    )


def test_an_estimate_gets_no_range_of_zero_width():
    s = _backfill_estimate()
    runtimes = {"a": 4, "c": 4, "b": 3, "d": 6}
    f = forecast.forecast(s, runtime_s=runtimes, spread={})
    assert f.kind["b"] == forecast.ESTIMATE and f.eta["b"] == 4
    # Nothing says how early a and c may end: no range rather than "likely between 4 and 4".
    assert "b" not in f.ranges
    # The same replays with what is known of how early max-runtime jobs end: a range with a width.
    spread = {job_id: (seconds / 4, seconds) for job_id, seconds in runtimes.items()}
    low, high = forecast.forecast(s, runtime_s=runtimes, spread=spread).ranges["b"]
    assert low < 4 <= high


def test_a_bound_may_keep_a_range_that_ends_at_it():
    s = snap([node("n1", 1)], [share("p", 1)], runs=[running("a", "p", on("n1", 0))], queued=[job("b", "p")])
    f = forecast.forecast(s, runtime_s={"a": 100, "b": 100}, spread={})
    assert f.kind["b"] == forecast.BOUND and f.ranges["b"] == (100, 100)
    f = forecast.forecast(s, runtime_s={"a": 100, "b": 100}, spread={"a": (25, 100)})
    assert f.ranges["b"] == (25, 100)


def test_a_max_runtime_job_may_end_sooner_in_the_range_replays():
    model = rt.Runtimes({"p": [60] * 10})
    assert model.bounded("p", max_runtime_s=600) == (60, 600)
    # Nothing seen of the share: the default's spread below the limit, not the limit itself.
    assert rt.Runtimes().bounded("p", max_runtime_s=600) == (600 / rt.DEFAULT_SPREAD**2, 600)
    # A running job: never before it has run a minute more.
    low, high = rt.Runtimes().bounded("p", max_runtime_s=600, elapsed=500)
    assert (low, high) == (560, 600)


def test_a_forecast_from_too_little_history_says_so():
    s = snap([node("n1", 1)], [share("p", 1)], runs=[running("a", "p", on("n1", 0))], queued=[job("b", "p")])
    f = forecast.forecast(s, runtime_s={}, default_runtime_s=3600)
    assert f.kind["b"] == forecast.ESTIMATE
    assert f.basis["b"] == (
        "estimate: 1 job without a max runtime end before it (too little history yet: a default 60 min assumed)"
    )
    # Named even where guesses from history are more numerous (the basis names three sources at most).
    counts = {
        "runtimes seen in a": 5,
        "runtimes seen in b": 4,
        "runtimes seen in c": 3,
        rt.default_words(3600): 1,
    }
    assert rt.TOO_LITTLE_HISTORY in forecast._basis(counts)
