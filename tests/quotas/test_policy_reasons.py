"""Why a job waits: the actual blocker, with its numbers (SEMANTICS "Forecast")."""

import dataclasses

import pytest

from quotas.engine.policy import LEND, LEND_AND_BORROW, RESERVE, plan
from tests.quotas.test_policy import job, node, on, running, share, snap


def test_a_job_at_its_borrow_limit_hears_both_numbers():
    s = snap(
        [node("n1", 8)],
        [share("a", 3, LEND_AND_BORROW, limit=100), share("b", 5)],
        runs=[
            running("a1", "a", on("n1", 0, 1, 2)),
            running("a2", "a", on("n1", 3, 4, 5), borrowed=True),
        ],
        queued=[job("a3", "a", 2)],
    )
    assert (
        plan(s).waiting["a3"]
        == "needs 2 h100: share at its own capacity (3 of 3), borrow limit reached (3 of 3)"
    )


@pytest.mark.parametrize(
    ("own_used", "borrowed", "limit", "gpus", "reason"),
    [
        # The report: a 4-GPU job of a share borrowing 1 of 3 heard "borrow limit reached (1 of 3)".
        (3, 1, 100, 4, "share at its own capacity (3 of 3), would borrow 5 (1 already borrowed), limit 3"),
        (3, 0, 100, 4, "share at its own capacity (3 of 3), would borrow 4, limit 3"),
        (2, 0, 100, 5, "its share has 1 of 3 own left, would borrow 4, limit 3"),
        (3, 3, 100, 2, "share at its own capacity (3 of 3), borrow limit reached (3 of 3)"),
        (3, 0, 0, 1, "share at its own capacity (3 of 3); its borrow limit allows no borrowing"),
    ],
)
def test_a_job_past_its_borrow_limit_hears_what_it_would_borrow(own_used, borrowed, limit, gpus, reason):
    # a (3 own, borrow limit `limit`%: 3 GPUs at 100) runs `own_used` own and `borrowed` borrowed
    # GPUs; the lender has 13 idle, so only the borrow limit stops the job.
    s = snap(
        [node("n1", 8), node("n2", 8)],
        [share("a", 3, LEND_AND_BORROW, limit=limit), share("lender", 13, LEND)],
        runs=[running("own", "a", on("n1", *range(own_used)))]
        + ([running("lent", "a", on("n2", *range(borrowed)), borrowed=True)] if borrowed else []),
        queued=[job("next", "a", gpus)],
    )
    p = plan(s)
    assert not p.admissions
    assert p.waiting["next"] == f"needs {gpus} h100: {reason}"


def test_a_share_below_its_capacity_says_how_much_own_is_left():
    # a uses 2 of its 3; the 2-GPU job needs more than the 1 left and can borrow only 1.
    s = snap(
        [node("n1", 4)],
        [share("a", 3), share("r", 1, RESERVE)],
        runs=[running("a1", "a", on("n1", 0, 1))],
        queued=[job("a2", "a", 2)],
    )
    assert plan(s).waiting["a2"] == "needs 2 h100: its share has 1 of 3 own left; nothing idle to borrow"


def test_the_largest_free_block_is_named_when_no_node_has_room():
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("a", 8), share("b", 0)],
        runs=[running("a1", "a", on("n1", 0, 1, 2)), running("a2", "a", on("n2", 0, 1))],
        queued=[job("a3", "a", 3)],
    )
    assert plan(s).waiting["a3"] == "needs 3 h100 on one node; the largest free block is 2"


def test_a_queued_job_its_share_can_no_longer_hold_says_so():
    s = snap([node("n1", 4)], [share("prod", 4, RESERVE)], queued=[job("p1", "prod", 3)])
    assert not plan(s).waiting
    lowered = dataclasses.replace(s, shares=(share("prod", 2, RESERVE),))
    p = plan(lowered)
    assert not p.admissions
    assert p.waiting["p1"] == "prod is RESERVE with 2 h100: a 3-GPU job can never start there"


def test_jobs_behind_others_of_a_reserve_share_count_them():
    s = snap(
        [node("n1", 4)],
        [share("prod", 2, RESERVE), share("x", 2)],
        queued=[job("p1", "prod", 2, submitted=1), job("p2", "prod", 1, submitted=2)],
    )
    assert plan(s).waiting["p2"] == "behind 1 job ahead of it in its share's queue"


def test_bigger_borrowers_behind_one_that_finds_no_node_each_name_their_own_blocker():
    # b lends 4 idle GPUs, in blocks of 2. a borrows: its 3-GPU job finds no node; the 4-GPU job behind
    # it finds none either, the 8-GPU one would need more than is idle, and the 1-GPU one starts.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("a", 0), share("b", 8, "LEND")],
        runs=[running("b1", "b", on("n1", 0, 1)), running("b2", "b", on("n2", 0, 1))],
        queued=[
            job("a1", "a", 3, submitted=1),
            job("a2", "a", 4, submitted=2),
            job("a3", "a", 8, submitted=3),
            job("a4", "a", 1, submitted=4),
        ],
    )
    p = plan(s)
    assert [a.job_id for a in p.admissions] == ["a4"]
    assert dict(p.waiting) == {
        "a1": "needs 3 h100 on one node; the largest free block is 2",
        "a2": "needs 4 h100 on one node; the largest free block is 2",
        "a3": "needs 8 h100: share at its own capacity (0 of 0); only 4 idle lendable h100 to borrow",
    }


def test_own_jobs_behind_one_that_finds_no_node_each_wait_for_a_node_and_a_smaller_one_starts():
    # a has 2 of its 8 own left, and each node 1 free GPU. b1 (2 GPUs) finds no node; b2 and b3, as
    # big or bigger and within a's room, are passed over at once with the same blocker (rules 2-3);
    # c (3 GPUs) is beyond a's room; d (1 GPU) starts on n1.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("a", 8, RESERVE)],
        runs=[running("a1", "a", on("n1", 0, 1, 2)), running("a2", "a", on("n2", 0, 1, 2))],
        queued=[
            job("b1", "a", 2, submitted=1),
            job("b2", "a", 2, submitted=2),
            job("c", "a", 3, submitted=3),
            job("b3", "a", 2, submitted=4),
            job("d", "a", 1, submitted=5),
        ],
    )
    p = plan(s)
    assert [(x.job_id, x.placement) for x in p.admissions] == [("d", (("n1", (3,)),))]
    no_node = "needs 2 h100 on one node; the largest free block is 1"
    assert {j: p.waiting[j] for j in ("b1", "b2", "b3")} == dict.fromkeys(("b1", "b2", "b3"), no_node)
    assert p.waiting["c"] != no_node
