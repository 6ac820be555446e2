"""A RESERVE share's idle GPUs during another share's reclaim grace (SEMANTICS rule 9, last paragraph):
a beneficiary starts at once on free GPUs only where the GPUs still free afterwards (not counting GPUs
being freed) cover every RESERVE share's idle capacity of the type; otherwise it waits for its
victims' GPUs. So a RESERVE share's next job starts at once even while another share's victims are
in grace.

The cluster: n1 (4 GPUs) runs a's work, two GPUs own and two borrowed from c; n2 is free. RESERVE d's
idle GPUs are not lendable, so c's job breaks the cover and a's borrowed job goes."""

from __future__ import annotations

import pytest

from quotas.engine.policy import RECLAIM, RESERVE, plan
from quotas.engine.simulate import simulate
from tests.quotas.test_policy import admitted, job, node, on, running, share, snap


def test_a_beneficiary_does_not_start_on_a_reserve_shares_idle_gpus_it_waits_for_its_victims():
    # c1 (2 GPUs) breaks the cover (a borrows 2, nothing else is lendable): a-b goes. n2's 2 free
    # GPUs are d's idle capacity: c1 started there would leave 0 free for d's 2, so it waits for a-b's
    # GPUs on n1 and holds nothing of n2.
    s = snap(
        [node("n1", 4), node("n2", 2)],
        [share("a", 2), share("c", 2), share("d", 2, RESERVE)],
        runs=[running("a-own", "a", on("n1", 0, 1)), running("a-b", "a", on("n1", 2, 3), borrowed=True)],
        queued=[job("c1", "c", 2)],
    )
    p = plan(s)
    assert [(x.attempt_id, x.reason) for x in p.preemptions] == [("a-b", RECLAIM)]
    assert not p.admissions
    assert p.reserved == {"c1": (("n1", 2),)}
    assert p.waiting["c1"] == "waiting for reclaim from share a"


def test_the_reserve_shares_job_arriving_in_that_grace_starts_at_once():
    # The same instant a moment later: a-b is in its grace for c1, and d's job arrives.
    s = snap(
        [node("n1", 4), node("n2", 2)],
        [share("a", 2), share("c", 2), share("d", 2, RESERVE)],
        runs=[
            running("a-own", "a", on("n1", 0, 1)),
            running("a-b", "a", on("n1", 2, 3), borrowed=True, preempting=True, beneficiary="c1"),
        ],
        queued=[job("c1", "c", 2, beneficiary=True), job("d1", "d", 2, submitted=10)],
        now=10,
    )
    p = plan(s)
    assert admitted(p)["d1"].placement == (("n2", (0, 1)),)
    assert "c1" not in admitted(p) and p.reserved["c1"] == (("n1", 2),)


@pytest.mark.parametrize(
    ("d_capacity", "starts_now"),
    [
        (0, True),  # no RESERVE share: as before, it starts on free GPUs while its victims stop
        (2, True),  # 4 free - 2 = 2 still free: d's 2 idle GPUs are covered
        (3, False),  # 2 left for d's 3: it waits for a-b's GPUs
    ],
)
def test_an_earlier_beneficiary_starts_on_free_gpus_only_if_those_left_cover_reserve_idle(
    d_capacity, starts_now
):
    # a-b is already stopping for c1 when n2's 4 GPUs come free (a job there ended).
    shares = [share("a", 2), share("c", 2)] + ([share("d", d_capacity, RESERVE)] if d_capacity else [])
    s = snap(
        [node("n1", 4), node("n2", 4)],
        shares,
        runs=[
            running("a-own", "a", on("n1", 0, 1)),
            running("a-b", "a", on("n1", 2, 3), borrowed=True, preempting=True, beneficiary="c1"),
        ],
        queued=[job("c1", "c", 2, beneficiary=True)],
        now=10,
    )
    p = plan(s)
    if starts_now:
        assert admitted(p)["c1"].placement == (("n2", (0, 1)),)
    else:
        assert not p.admissions and p.reserved["c1"] == (("n1", 2),)


def test_a_reserve_shares_job_submitted_during_a_reclaim_grace_starts_at_once_in_the_simulator():
    # a takes its 2 GPUs and borrows c's 2 at t=0; c's job at t=100 reclaims them (grace 30 s); d's job
    # at t=110 starts at once on d's idle GPUs, and c's starts at 130 on the GPUs a's jobs freed.
    # (Before rule 9's last paragraph, c1 took the free GPUs at 100 and d1 waited until 130.)
    data = {
        "settings": {"preemption_grace_s": 30},
        "nodes": [
            {"name": "n1", "gpu_type": "a10g", "gpus": 4},
            {"name": "n2", "gpu_type": "a10g", "gpus": 2},
        ],
        "shares": [
            {"name": "a", "capacity": {"a10g": 2}},
            {"name": "c", "capacity": {"a10g": 2}},
            {"name": "d", "capacity": {"a10g": 2}, "strategy": "RESERVE"},
        ],
        "jobs": [
            {"id": f"a{i}", "share": "a", "submit_at": 0, "duration_s": 10_000, "gpus": 1, "gpu_type": "a10g"}
            for i in range(4)
        ]
        + [
            {"id": "c1", "share": "c", "submit_at": 100, "duration_s": 500, "gpus": 2, "gpu_type": "a10g"},
            {"id": "d1", "share": "d", "submit_at": 110, "duration_s": 500, "gpus": 2, "gpu_type": "a10g"},
        ],
    }
    result = simulate(data)
    d1, c1 = result.jobs["d1"].attempts[0], result.jobs["c1"].attempts[0]
    assert (d1.start, c1.start) == (110, 130)
    assert len([j for j, r in result.jobs.items() if r.preemptions]) == 2
