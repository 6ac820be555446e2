"""Victim choice (SEMANTICS rules 3, 4 and 9): one small scenario per sentence, with the victims, the
node and the restart times written out, then hypothesis properties for minimality and order.

Scenarios set `started` and `prio` on every candidate so that the order under test is visible; the
comments give the cover arithmetic (B = GPUs borrowed in all, L = idle lendable, capped by the hardware).
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import find, given, settings
from hypothesis import strategies as st

from quotas.engine.policy import (
    LEND,
    LEND_AND_BORROW,
    PRIORITY,
    RECLAIM,
    RESERVE,
    UNLIMITED,
    NodeView,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
    plan,
)
from tests.quotas.test_policy import T, admitted, job, node, on, running, settle, share, snap
from tests.quotas.test_policy_properties import SETTINGS, deficit, snapshots

# One-job snapshots lead to a pre-emption in about one draw in seven (contended()): more examples.
VICTIM_SETTINGS = settings(SETTINGS, max_examples=600)


def victims(p) -> list[tuple[str, str]]:
    return [(x.attempt_id, x.reason) for x in p.preemptions]


# --------------------------------------------------------------------------------------------------
# rule 3: the order of reclaim victims


def test_reclaim_takes_first_from_the_share_that_borrows_the_most():
    # a borrows 2, b borrows 1; c's 4-GPU job breaks the cover by 1 (RESERVE d's 3 idle GPUs are not
    # lendable): B 3 > L 2. The victim is a's, although b's is alone on its node.
    s = snap(
        [node("n1", 4), node("n2", 4), node("n3", 4)],
        [share("a", 1), share("b", 1), share("c", 6), share("d", 4, RESERVE)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-1", "a", on("n1", 1), started=1, borrowed=True),
            running("a-2", "a", on("n1", 2), started=2, borrowed=True),
            running("b-own", "b", on("n1", 3)),
            running("b-1", "b", on("n2", 0), started=3, borrowed=True),
        ],
        queued=[job("c1", "c", 4, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-2", RECLAIM)]  # a's most recently started
    # n3 is free, but taking it would leave 3 GPUs free for d's 4 idle ones: c1 waits for a-2's GPU
    # (rule 9's last paragraph), holding none of the free ones.
    assert not p.admissions and "c1" not in p.reserved


def test_reclaim_order_beats_a_smaller_loss_on_another_share():
    # a borrows 2 (one 2-GPU attempt on n1), b borrows 1 (on n2, next to a free GPU). c's 2-GPU job
    # needs a node; the cover holds (B 3 <= L 3: the unassigned pool). a's attempt goes: a borrows more.
    s = snap(
        [node("n1", 2), node("n2", 2), node("n3", 1), node("n4", 1), node("n5", 1)],
        [share("a", 1), share("b", 1), share("c", 2)],
        runs=[
            running("a-own", "a", on("n3", 0)),
            running("a-x", "a", on("n1", 0, 1), started=1, borrowed=True),
            running("b-own", "b", on("n4", 0)),
            running("b-y", "b", on("n2", 0), started=2, borrowed=True),
        ],
        queued=[job("c1", "c", 2, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-x", RECLAIM)]
    assert p.reserved["c1"] == (("n1", 2),)


def test_shares_that_borrow_the_same_are_taken_in_name_order():
    # a and b both borrow 1; the cover needs 1 GPU back. a comes first by name, although its
    # candidate has the higher priority: the share order comes before priority.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("b", 1), share("a", 1), share("c", 3), share("d", 3, RESERVE)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-1", "a", on("n1", 1), prio=5, started=1, borrowed=True),
            running("b-own", "b", on("n1", 2)),
            running("b-1", "b", on("n1", 3), prio=0, started=2, borrowed=True),
        ],
        # B 2; L = c's 3 idle, capped by the hardware at 8 - 2 own - 3 RESERVE idle = 3. c takes 2 of
        # its own: L = 1 < B 2, one GPU must come back.
        queued=[job("c1", "c", 2, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-1", RECLAIM)]
    assert not p.admissions  # n2's free GPUs are d's idle ones: c1 waits for a-1's (rule 9)


def test_inside_a_share_the_lowest_priority_goes_first_even_if_a_higher_one_loses_less():
    # a borrows 3: a priority-9 attempt of 1 GPU on n1 (next to a free GPU) and a priority-1 attempt
    # of 2 GPUs alone on n2. c's 2-GPU job needs a node (the cover holds: B 3 <= L 3). The priority-1
    # job goes; the priority-9 job runs on.
    s = snap(
        [node("n1", 2), node("n2", 2), node("n3", 2), node("n4", 1)],
        [share("a", 2), share("c", 2)],
        runs=[
            running("a-own", "a", on("n3", 0, 1)),
            running("a-p9", "a", on("n1", 0), prio=9, started=1, borrowed=True),
            running("a-p1", "a", on("n2", 0, 1), prio=1, started=2, borrowed=True),
        ],
        queued=[job("c1", "c", 2, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-p1", RECLAIM)]
    assert p.reserved["c1"] == (("n2", 2),)


def test_at_equal_priority_the_most_recently_started_goes_first():
    # a borrows 3: an attempt started at t=10 (1 GPU on n2, next to a free GPU) and one started at
    # t=50 (2 GPUs alone on n1). The one started at t=50 goes.
    s = snap(
        [node("n1", 2), node("n2", 2), node("n3", 1), node("n5", 1)],
        [share("a", 1), share("c", 2)],
        runs=[
            running("a-own", "a", on("n3", 0)),
            running("a-50", "a", on("n1", 0, 1), started=50, borrowed=True),
            running("a-10", "a", on("n2", 0), started=10, borrowed=True),
        ],
        queued=[job("c1", "c", 2, submitted=60)],
        now=60,
    )
    p = plan(s)
    assert victims(p) == [("a-50", RECLAIM)]
    assert p.reserved["c1"] == (("n1", 2),)


def test_equal_candidates_fall_to_the_one_later_in_queue_order():
    # Same priority, same start: the later submission (rule 8) is the victim.
    s = snap(
        [node("n1", 3)],
        [share("a", 1), share("c", 2)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-early", "a", on("n1", 1), started=5, submitted=1, borrowed=True),
            running("a-late", "a", on("n1", 2), started=5, submitted=2, borrowed=True),
        ],
        queued=[job("c1", "c", 1, submitted=6)],
        now=6,
    )
    assert victims(plan(s)) == [("a-late", RECLAIM)]


def test_gpus_already_in_grace_count_as_freed_and_are_not_taken_again():
    # a-1 is stopping for c1 already: c2 needs one more GPU and takes a-2, not a-1 again.
    s = snap(
        [node("n1", 4)],
        [share("a", 1), share("c", 3)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-1", "a", on("n1", 1), started=2, borrowed=True, preempting=True, beneficiary="c1"),
            running("a-2", "a", on("n1", 2), started=1, borrowed=True),
            running("a-3", "a", on("n1", 3), started=0, borrowed=True),
        ],
        queued=[job("c1", "c", 1, submitted=5, beneficiary=True), job("c2", "c", 1, submitted=6)],
        now=7,
    )
    p = plan(s)
    assert victims(p) == [("a-2", RECLAIM)]
    assert p.reserved == {"c1": (("n1", 1),), "c2": (("n1", 1),)}


# --------------------------------------------------------------------------------------------------
# rule 9: a minimal set, the order first


def test_a_victim_is_given_back_when_a_later_larger_one_made_it_unneeded():
    # Order: a-small (priority 0) then a-large (priority 1). Taking a-small leaves n1 short (d's own
    # work holds its other GPU); a-large frees n2 whole. Walking back, a-small is not needed: it runs on.
    s = snap(
        [node("n1", 2), node("n2", 2), node("n3", 1), node("n4", 1)],
        [share("a", 1), share("c", 2), share("d", 1)],
        runs=[
            running("a-own", "a", on("n3", 0)),
            running("a-small", "a", on("n1", 0), prio=0, started=1, borrowed=True),
            running("a-large", "a", on("n2", 0, 1), prio=1, started=2, borrowed=True),
            running("d-own", "d", on("n1", 1)),
        ],
        queued=[job("c1", "c", 2, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-large", RECLAIM)]
    assert p.reserved["c1"] == (("n2", 2),)


def test_a_gang_reclaim_takes_whole_nodes_in_order_not_the_cheapest_pair():
    # c's 8-GPU gang needs two whole 4-GPU nodes. a's borrowed work: a-lo2 (priority 0, started 2) on
    # n3, a-lo1 (priority 0, started 1) on n1, a-hi (priority 9) on n2 next to 2 free GPUs. Freeing n2
    # and n1 would lose 6 GPUs, n1 and n3 lose 8; the order says a-lo2, a-lo1, and a-hi runs on.
    s = snap(
        [node(f"n{i}", 4) for i in (1, 2, 3, 4)],
        [share("a", 4), share("c", 8)],
        runs=[
            running("a-own", "a", on("n4", 0, 1, 2, 3)),
            running("a-lo1", "a", on("n1", 0, 1, 2, 3), prio=0, started=1, borrowed=True),
            running("a-hi", "a", on("n2", 0, 1), prio=9, started=3, borrowed=True),
            running("a-lo2", "a", on("n3", 0, 1, 2, 3), prio=0, started=2, borrowed=True),
        ],
        queued=[job("c1", "c", 8, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("a-lo2", RECLAIM), ("a-lo1", RECLAIM)]
    assert p.reserved["c1"] == (("n1", 4), ("n3", 4))


def test_when_the_whole_list_cannot_make_the_job_run_nothing_is_preempted():
    # c1 needs 2 GPUs on one node; a's borrowed attempt on n2 sits next to d's own work, n1 is a's
    # own: no set of candidates frees a node, so a-b keeps running.
    s = snap(
        [node("n1", 2), node("n2", 2)],
        [share("a", 2), share("c", 2), share("d", 1)],
        runs=[
            running("a-own", "a", on("n1", 0, 1)),
            running("a-b", "a", on("n2", 0), borrowed=True),
            running("d-own", "d", on("n2", 1)),
        ],
        queued=[job("c1", "c", 2)],
    )
    assert not plan(s).preemptions


def test_the_job_waits_on_its_victims_node_rather_than_take_reserve_idle_gpus():
    # The cover needs a-b back (c takes 2 of its own: L 1 < B 2), and a-b's node would fit c1 exactly.
    # n2 has 4 free GPUs now, but 3 of them are RESERVE d's idle capacity: c1 started there would leave
    # 2 free for them, so it waits for a-b's GPUs on n1 instead (rule 9's last paragraph; where the free
    # GPUs cover the RESERVE idle ones it starts at once: tests/quotas/test_policy_reserve_grace.py).
    s = snap(
        [node("n1", 3), node("n2", 4)],
        [share("a", 1), share("c", 2), share("d", 3, RESERVE)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-b", "a", on("n1", 1, 2), borrowed=True),
        ],
        queued=[job("c1", "c", 2)],
    )
    p = plan(s)
    assert victims(p) == [("a-b", RECLAIM)]
    assert not p.admissions and p.reserved["c1"] == (("n1", 2),)


def test_among_nodes_being_freed_the_best_fit_then_the_node_name_wins():
    # GPUs being freed (grace): 3 on n1, 2 on n2, 2 on n3. c1 (2 GPUs) waits on n2: it leaves no GPU
    # idle there (n1 would leave 1), and n2 comes before n3 by name.
    s = snap(
        [node("n1", 4), node("n2", 2), node("n3", 2)],
        [share("a", 1), share("c", 4)],
        runs=[
            running("a-own", "a", on("n1", 3)),
            running("a-x", "a", on("n1", 0, 1, 2), preempting=True),
            running("a-y", "a", on("n3", 0, 1), preempting=True),
            running("a-z", "a", on("n2", 0, 1), preempting=True),
        ],
        queued=[job("c1", "c", 2)],
    )
    p = plan(s)
    assert not p.preemptions
    assert p.reserved["c1"] == (("n2", 2),)


def test_one_victim_where_the_order_needs_one_across_passes():
    # Zero grace, passes repeated at one instant: c's job takes exactly one attempt of a, the first in
    # order, and nothing is stopped and re-admitted in the same second.
    s = snap(
        [node("n1", 2), node("n2", 2)],
        [share("a", 1), share("c", 2)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-1", "a", on("n1", 1), started=1, borrowed=True),
            running("a-2", "a", on("n2", 0, 1), started=2, borrowed=True),
        ],
        queued=[job("c1", "c", 2, submitted=5)],
        now=5,
    )
    _, plans = settle(s)
    stopped = [x.attempt_id for p in plans for x in p.preemptions]
    assert stopped == ["a-2"]
    started = [a.job_id for p in plans for a in p.admissions]
    assert started == ["c1"]


# --------------------------------------------------------------------------------------------------
# rule 4 with rule 9


def test_an_in_share_victim_on_another_node_than_the_jobs_is_given_back():
    # p (capacity 3) runs L2 (1 GPU on n2, started 20) and L1 (2 GPUs on n1, started 10), both priority
    # 1. H (priority 9, 2 GPUs) walks L2 then L1: with both gone it fits p's capacity and n1. Walking
    # back, L1 is needed (capacity and node) but L2 is not: L2, on n2, runs on.
    s = snap(
        [node("n1", 2), node("n2", 4)],
        [share("p", 3, LEND, isp=True), share("o", 3, LEND)],
        runs=[
            running("L1", "p", on("n1", 0, 1), prio=1, started=10),
            running("L2", "p", on("n2", 0), prio=1, started=20),
            running("o-own", "o", on("n2", 1, 2, 3)),
        ],
        queued=[job("H", "p", 2, prio=9, submitted=30)],
        now=30,
    )
    p = plan(s)
    assert victims(p) == [("L1", PRIORITY)]
    assert p.reserved["H"] == (("n1", 2),)


def test_in_share_candidates_come_first_then_borrowed_work_of_other_shares():
    # H needs 2 GPUs of p's own 2: L (priority 1, 1 GPU on n1) must go for capacity, and q's borrowed
    # attempt next to it for the node. One list: L first (PRIORITY), then q-b (RECLAIM).
    s = snap(
        [node("n1", 2)],
        [share("p", 2, isp=True), share("q", 0)],
        runs=[
            running("L", "p", on("n1", 0), prio=1, started=1),
            running("q-b", "q", on("n1", 1), started=2, borrowed=True),
        ],
        queued=[job("H", "p", 2, prio=9, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert victims(p) == [("L", PRIORITY), ("q-b", RECLAIM)]
    assert p.reserved["H"] == (("n1", 2),)


def test_in_share_victims_are_the_lowest_priority_then_the_most_recent():
    s = snap(
        [node("n1", 4)],
        [share("p", 4, RESERVE, isp=True)],
        runs=[
            running("p2-old", "p", on("n1", 0), prio=2, started=1),
            running("p1-old", "p", on("n1", 1), prio=1, started=1),
            running("p1-new", "p", on("n1", 2), prio=1, started=9),
            running("p5", "p", on("n1", 3), prio=5, started=9),
        ],
        queued=[job("H", "p", 2, prio=9, submitted=10)],
        now=10,
    )
    assert victims(plan(s)) == [("p1-new", PRIORITY), ("p1-old", PRIORITY)]


def test_a_job_that_can_borrow_right_now_borrows_and_preempts_nothing():
    s = snap(
        [node("n1", 4)],
        [share("p", 2, isp=True), share("q", 2)],
        runs=[running("L", "p", on("n1", 0, 1), prio=1)],
        queued=[job("H", "p", 2, prio=9)],
    )
    p = plan(s)
    assert not p.preemptions
    assert admitted(p)["H"].borrowed


def test_a_gang_frees_a_node_of_its_own_shares_borrowed_lower_priority_work():
    # p (capacity 4) runs 5 GPUs of priority 1 and borrows 1 (q lends its idle GPU): L3, admitted
    # borrowed, is its borrowed part. H (priority 9) needs two whole 2-GPU nodes and all 5 GPUs back
    # for capacity. n2 and n3 are then free: H runs as own. (L3's GPUs were counted twice, as borrowed
    # and as in-share, and n3 looked over-full: no pre-emption at all.)
    s = snap(
        [node("n1", 2), node("n2", 2), node("n3", 2)],
        [share("p", 4, isp=True), share("o", 1, RESERVE), share("q", 1, LEND)],
        runs=[
            running("L1", "p", on("n1", 0), prio=1, started=1),
            running("L2", "p", on("n2", 0, 1), prio=1, started=2),
            running("L3", "p", on("n3", 0, 1), prio=1, started=3, borrowed=True),
            running("o-own", "o", on("n1", 1)),
        ],
        queued=[job("H", "p", 4, prio=9, submitted=5)],
        now=5,
    )
    p = plan(s)
    assert sorted(victims(p)) == [("L1", PRIORITY), ("L2", PRIORITY), ("L3", PRIORITY)]
    assert p.reserved["H"] == (("n2", 2), ("n3", 2))


def test_in_share_preemption_that_cannot_make_the_job_run_preempts_nothing():
    # Shedding L would bring p within its capacity for H's 3 GPUs, but no node could then hold 3:
    # o's own work keeps 2 of n1's GPUs and all of n2's. L runs on.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("p", 3, RESERVE, isp=True), share("o", 6, RESERVE)],
        runs=[
            running("L", "p", on("n1", 0, 1), prio=1),
            running("o-1", "o", on("n1", 2, 3)),
            running("o-2", "o", on("n2", 0, 1, 2, 3)),
        ],
        queued=[job("H", "p", 3, prio=9)],
    )
    p = plan(s)
    assert not p.preemptions
    assert "H" not in p.reserved


# --------------------------------------------------------------------------------------------------
# properties: an independent reading of rule 9 on one-job snapshots


def _held(snapshot: Snapshot, gone: set) -> list[RunningView]:
    return [r for r in snapshot.running if not r.preempting and r.attempt_id not in gone]


def _borrowed_part(snapshot: Snapshot, name: str, gpu_type: str, cap: int) -> list[RunningView]:
    """The pass's borrowed attempts of one share (GPUs in grace counted as freed): over capacity,
    taken admitted-as-borrowed first, then the most recently started, then later in queue order."""
    runs = [r for r in _held(snapshot, set()) if r.share == name and r.gpu_type == gpu_type]
    over = sum(r.gpus for r in runs) - cap
    out = []
    key = lambda r: (r.borrowed, r.started_at, r.submitted_at, r.job_id, r.attempt_id)  # noqa: E731
    for r in sorted(runs, key=key, reverse=True):
        if over <= 0:
            break
        out.append(r)
        over -= r.gpus
    return out


def _open(snapshot: Snapshot, runs: list[RunningView]) -> list[RunningView]:
    """Rule 10: protected attempts (not yet run their share's min_runtime_s) are no candidates."""
    window = {s.name: s.min_runtime_s for s in snapshot.shares}
    return [r for r in runs if snapshot.now >= r.started_at + window.get(r.share, 0)]


def _candidates(snapshot: Snapshot, q: QueuedView, in_share: bool) -> list[RunningView]:
    shares = {s.name: s for s in snapshot.shares}
    t = q.gpu_type
    names = sorted(shares.keys() | {r.share for r in snapshot.running})
    cap = {n: shares[n].capacity.get(t, 0) if n in shares else 0 for n in names}
    held = {n: sum(r.gpus for r in _held(snapshot, set()) if r.share == n and r.gpu_type == t) for n in names}
    out: list[RunningView] = []
    if in_share:
        mine = [r for r in _held(snapshot, set()) if r.share == q.share and r.gpu_type == t]
        out += _tie_sorted(_open(snapshot, [r for r in mine if r.priority < q.priority]))
    lenders = [n for n in names if n != q.share and held[n] > cap[n]]
    for n in sorted(lenders, key=lambda n: (-(held[n] - cap[n]), n)):
        out += _tie_sorted(_open(snapshot, _borrowed_part(snapshot, n, t, cap[n])))
    return out


def _safe_point(r: RunningView) -> float:
    """The later of the start and the last checkpoint (SEMANTICS "Checkpoints and safe points")."""
    return max(r.started_at, r.started_at if r.last_checkpoint_at is None else r.last_checkpoint_at)


def _tie_sorted(runs: list[RunningView]) -> list[RunningView]:
    # Rules 3 and 4 inside a share: lowest priority, then the most recent safe point, then rule 8.
    key = lambda r: (-r.priority, _safe_point(r), r.submitted_at, r.job_id, r.attempt_id)  # noqa: E731
    return sorted(runs, key=key, reverse=True)


def _can_run(snapshot: Snapshot, q: QueuedView, taken: set, in_share: bool) -> bool:
    """Rule 9's "the job can run" with these victims: own capacity (rule 4), the cover, a node."""
    t, g = q.gpu_type, q.gpus
    shares = {s.name: s for s in snapshot.shares}
    held = _held(snapshot, taken)
    if in_share:
        mine = sum(r.gpus for r in held if r.share == q.share and r.gpu_type == t)
        if mine + g > shares[q.share].capacity.get(t, 0):
            return False
    after = dataclasses.replace(
        snapshot,
        running=tuple(
            dataclasses.replace(r, preempting=True) if r.attempt_id in taken else r for r in snapshot.running
        ),
    )
    if deficit(after, t, {(q.share, t): g}) > max(0, deficit(snapshot, t)):
        return False
    busy: dict[str, int] = {}
    for r in held:
        for name, idx in r.placement:
            busy[name] = busy.get(name, 0) + len(idx)
    nodes = [n for n in snapshot.nodes if n.gpu_type == t]
    size = max(n.gpus for n in nodes)
    if g <= size:
        return any(n.schedulable and n.gpus - busy.get(n.name, 0) >= g for n in nodes)
    whole = [n for n in nodes if n.schedulable and n.gpus == size and not busy.get(n.name)]
    return g % size == 0 and len(whole) >= g // size


@st.composite
def contended(draw) -> Snapshot:
    """A full cluster of one type where shares borrow, and one queued job that may reclaim or pre-empt
    in its share: most draws lead to pre-emptions (the general generator rarely does)."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    nodes = [
        NodeView(f"n{i}", T, rng.choice((1, 2, 4, 4, 8)), schedulable=rng.random() < 0.9)
        for i in range(rng.randint(2, 6))
    ]
    total = sum(n.gpus for n in nodes)
    shares = [
        ShareView(
            name=f"s{i}",
            capacity={T: rng.randint(0, max(1, total // 2))},
            strategy=rng.choice((LEND_AND_BORROW, LEND_AND_BORROW, LEND, RESERVE)),
            borrow_limit=rng.choice((UNLIMITED, UNLIMITED, 50, 200)),
            in_share_preemption=rng.random() < 0.6,
            min_runtime_s=rng.choice((0, 0, 0, 50, 150)),  # rule 10 (now=200, starts 0..100)
        )
        for i in range(rng.randint(2, 4))
    ]
    runs = []
    for n in nodes:
        free = list(range(n.gpus))
        while free and rng.random() < 0.9:
            g = rng.choice([x for x in (1, 2, 4) if x <= len(free)])
            idx = tuple(sorted(rng.sample(free, g)))
            free = [x for x in free if x not in idx]
            k = len(runs)
            started = float(rng.randint(0, 100))
            preempting = rng.random() < 0.1
            runs.append(
                RunningView(
                    attempt_id=f"r{k}",
                    job_id=f"j{k}",
                    share=rng.choice(shares).name,
                    gpu_type=T,
                    priority=rng.randint(0, 5),
                    submitted_at=started - rng.randint(0, 50),
                    started_at=started,
                    placement=((n.name, idx),),
                    borrowed=rng.random() < 0.5,
                    preempting=preempting,
                    beneficiary_job_id="q" if preempting and rng.random() < 0.3 else None,
                    last_checkpoint_at=float(rng.randint(0, 200)) if rng.random() < 0.4 else None,
                )
            )
    q = QueuedView(
        job_id="q",
        share=rng.choice(shares).name,
        gpu_type=T,
        gpus=rng.choice((1, 1, 2, 2, 4, 8, 16)),
        priority=rng.randint(0, 9),
        submitted_at=150.0,
        beneficiary=rng.random() < 0.1,
    )
    return Snapshot(now=200.0, nodes=tuple(nodes), shares=tuple(shares), running=tuple(runs), queued=(q,))


def _one_job(snapshot: Snapshot) -> tuple[QueuedView, bool] | None:
    p = plan(snapshot)
    if not p.preemptions:
        return None
    (q,) = snapshot.queued
    return q, any(x.reason == PRIORITY for x in p.preemptions)


@VICTIM_SETTINGS
@given(st.one_of(contended(), contended(), snapshots(queued=(1, 1))))
def test_property_victims_are_a_minimal_set(snapshot):
    """Giving back any one victim leaves the beneficiary unable to run (and with all of them it can)."""
    found = _one_job(snapshot)
    if found is None:
        return
    q, in_share = found
    taken = {x.attempt_id for x in plan(snapshot).preemptions}
    assert _can_run(snapshot, q, taken, in_share)
    for v in taken:
        assert not _can_run(snapshot, q, taken - {v}, in_share), f"{v} was not needed"


@VICTIM_SETTINGS
@given(st.one_of(contended(), contended(), snapshots(queued=(1, 1))))
def test_property_victims_come_from_the_shortest_prefix_of_the_ordered_candidates(snapshot):
    """With k the shortest prefix of the ordered candidate list that lets the job run, every victim is
    among those k candidates; and if no prefix does, nothing is pre-empted."""
    p = plan(snapshot)
    (q,) = snapshot.queued or (None,)
    if q is None:
        return
    for in_share in (False, True) if p.preemptions else ():
        if in_share != any(x.reason == PRIORITY for x in p.preemptions):
            continue
        cands = _candidates(snapshot, q, in_share)
        prefix = None
        for k in range(len(cands) + 1):
            if _can_run(snapshot, q, {r.attempt_id for r in cands[:k]}, in_share):
                prefix = {r.attempt_id for r in cands[:k]}
                break
        assert prefix is not None, "pre-empted although no prefix of the candidates lets the job run"
        assert {x.attempt_id for x in p.preemptions} <= prefix


def test_property_generator_reaches_plans_with_preemptions():
    """Guards the two properties above against being vacuous."""
    found = find(
        contended(),
        lambda s: any(x.reason == PRIORITY for x in plan(s).preemptions),
        settings=settings(max_examples=5000, database=None),
    )
    assert plan(found).preemptions
    found = find(
        contended(),
        lambda s: len(plan(s).preemptions) >= 2,
        settings=settings(max_examples=5000, database=None),
    )
    assert len(plan(found).preemptions) >= 2
