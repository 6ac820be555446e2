"""The scheduling policy, one small snapshot per rule of SEMANTICS "One scheduling pass" and per edge
case. Pure: no Django, no database. The helpers at the top are shared with test_policy_properties.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from quotas.engine.policy import (
    ADMITTED_BORROWED,
    ADMITTED_OWN,
    LEND,
    LEND_AND_BORROW,
    PRIORITY,
    RECLAIM,
    RESERVE,
    UNASSIGNED,
    UNLIMITED,
    NodeView,
    Plan,
    QueuedView,
    RunningView,
    ShareUsage,
    ShareView,
    Snapshot,
    borrowed_attempts,
    lending,
    plan,
    usage,
)

T = "h100"
SCENARIOS = Path(__file__).resolve().parents[3] / "shared" / "scenarios"


# --------------------------------------------------------------------------------------------------
# helpers


def node(name: str, gpus: int = 8, gpu_type: str = T, schedulable: bool = True) -> NodeView:
    return NodeView(name=name, gpu_type=gpu_type, gpus=gpus, schedulable=schedulable)


def share(
    name: str,
    cap: int | dict[str, int],
    strategy: str = LEND_AND_BORROW,
    limit: int = UNLIMITED,
    isp: bool = False,
) -> ShareView:
    capacity = cap if isinstance(cap, dict) else {T: cap}
    return ShareView(
        name=name, capacity=capacity, strategy=strategy, borrow_limit=limit, in_share_preemption=isp
    )


def on(node_name: str, *gpus: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return ((node_name, tuple(gpus)),)


def running(
    attempt_id: str,
    share_name: str,
    placement,
    prio: int = 0,
    started: float = 0,
    submitted: float | None = None,
    borrowed: bool = False,
    preempting: bool = False,
    beneficiary: str | None = None,
    gpu_type: str = T,
    job_id: str | None = None,
) -> RunningView:
    return RunningView(
        attempt_id=attempt_id,
        job_id=job_id or attempt_id,
        share=share_name,
        gpu_type=gpu_type,
        priority=prio,
        submitted_at=started if submitted is None else submitted,
        started_at=started,
        placement=placement,
        borrowed=borrowed,
        preempting=preempting,
        beneficiary_job_id=beneficiary,
    )


def job(
    job_id: str,
    share_name: str,
    gpus: int = 1,
    prio: int = 0,
    submitted: float = 0,
    beneficiary: bool = False,
    gpu_type: str = T,
) -> QueuedView:
    return QueuedView(
        job_id=job_id,
        share=share_name,
        gpu_type=gpu_type,
        gpus=gpus,
        priority=prio,
        submitted_at=submitted,
        beneficiary=beneficiary,
    )


def snap(nodes, shares, runs=(), queued=(), now: float = 0, starvation_s: float = 3600) -> Snapshot:
    return Snapshot(
        now=now,
        nodes=tuple(nodes),
        shares=tuple(shares),
        running=tuple(runs),
        queued=tuple(queued),
        starvation_s=starvation_s,
    )


def admitted(p: Plan) -> dict:
    return {a.job_id: a for a in p.admissions}


def preempted(p: Plan) -> dict:
    return {x.attempt_id: x for x in p.preemptions}


def apply(snapshot: Snapshot, p: Plan, *, stop_preempted: bool, now: float | None = None) -> Snapshot:
    """The snapshot after a plan: admissions become attempts started now; pre-empted attempts are
    marked pre-empting (grace) or, with stop_preempted (zero grace), gone and their jobs re-queued
    with their original submit time. Beneficiaries not yet admitted are flagged as such."""
    now = snapshot.now if now is None else now
    queue = {q.job_id: q for q in snapshot.queued}
    victims = {x.attempt_id: x for x in p.preemptions}
    runs = []
    for r in snapshot.running:
        x = victims.get(r.attempt_id)
        if x is None:
            runs.append(r)
        elif stop_preempted:
            queue[r.job_id] = QueuedView(r.job_id, r.share, r.gpu_type, r.gpus, r.priority, r.submitted_at)
        else:
            runs.append(dataclasses.replace(r, preempting=True, beneficiary_job_id=x.beneficiary_job_id))
    for a in p.admissions:
        q = queue.pop(a.job_id)
        n = sum(1 for r in snapshot.running if r.job_id == a.job_id) + 1
        runs.append(
            RunningView(
                attempt_id=f"{a.job_id}#{now:g}#{n}",
                job_id=a.job_id,
                share=a.share,
                gpu_type=q.gpu_type,
                priority=q.priority,
                submitted_at=q.submitted_at,
                started_at=now,
                placement=a.placement,
                borrowed=a.borrowed,
            )
        )
    for x in p.preemptions:
        if x.beneficiary_job_id in queue:
            queue[x.beneficiary_job_id] = dataclasses.replace(queue[x.beneficiary_job_id], beneficiary=True)
    return dataclasses.replace(snapshot, now=now, running=tuple(runs), queued=tuple(queue.values()))


def settle(snapshot: Snapshot, max_passes: int = 50) -> tuple[Snapshot, list[Plan]]:
    """Zero grace: repeat passes at one instant until a pass decides nothing new (rule 7)."""
    plans = []
    for _ in range(max_passes):
        p = plan(snapshot)
        plans.append(p)
        if not p.admissions and not p.preemptions:
            return snapshot, plans
        snapshot = apply(snapshot, p, stop_preempted=True)
    raise AssertionError(f"no fixed point after {max_passes} passes")


def replay(path: Path) -> dict[str, list[tuple[int, int, str, str | None]]]:
    """A minimal zero-grace replay of a SCENARIO.md file with plan() at every instant where
    something changed: job -> [(start, end, outcome, preempted_by)] per attempt."""
    sc = json.loads(path.read_text())
    nodes = [node(n["name"], n["gpus"], n["gpu_type"]) for n in sc["nodes"]]
    shares = [
        share(
            s["name"],
            s["capacity"],
            s.get("strategy", LEND_AND_BORROW),
            s.get("borrow_limit", UNLIMITED),
            s.get("in_share_preemption", False),
        )
        for s in sc["shares"]
    ]
    spec = {j["id"]: j for j in sc["jobs"]}
    attempts: dict[str, list[list]] = {j: [] for j in spec}
    state = snap(nodes, shares)
    ends: dict[str, int] = {}  # attempt id -> end time
    times = sorted({j["submit_at"] for j in spec.values()})
    done_at = 0
    while times:
        t = times.pop(0)
        runs = []
        for r in state.running:
            if ends[r.attempt_id] <= t:
                attempts[r.job_id][-1][1:3] = [t, "SUCCEEDED"]
            else:
                runs.append(r)
        queued = list(state.queued) + [
            job(j, s["share"], s["gpus"], s.get("priority", 0), s["submit_at"], gpu_type=s["gpu_type"])
            for j, s in spec.items()
            if s["submit_at"] == t
        ]
        state = dataclasses.replace(state, now=t, running=tuple(runs), queued=tuple(queued))
        for _ in range(50):
            p = plan(state)
            if not p.admissions and not p.preemptions:
                break
            for x in p.preemptions:
                attempts[x.job_id][-1][1:4] = [t, "PREEMPTED", x.beneficiary_job_id]
            state = apply(state, p, stop_preempted=True)
            for a in p.admissions:
                attempts[a.job_id].append([t, None, None, None])
        for r in state.running:
            if r.attempt_id not in ends:
                ends[r.attempt_id] = t + spec[r.job_id]["duration_s"]
                times.append(ends[r.attempt_id])
        times = sorted(set(times))
        done_at = t
    assert not state.queued and not state.running, f"stuck at t={done_at}"
    return {j: [tuple(a) for a in v] for j, v in attempts.items()}


# --------------------------------------------------------------------------------------------------
# rule 1-2: queue order, own capacity first, share order


def test_queue_order_is_priority_then_submit_time_then_id():
    s = snap(
        [node("n1", 1)],
        [share("a", 1)],
        queued=[
            job("j3", "a", submitted=5),
            job("j2", "a", prio=1, submitted=9),
            job("j1", "a", submitted=5),
        ],
    )
    assert list(admitted(plan(s))) == ["j2"]
    s = snap(
        [node("n1", 1)], [share("a", 1)], queued=[job("j3", "a", submitted=5), job("j1", "a", submitted=5)]
    )
    assert list(admitted(plan(s))) == ["j1"]  # tie rule: the earlier in queue order is admitted


def test_own_capacity_is_used_before_anything_is_borrowed():
    s = snap([node("n1", 2)], [share("a", 1), share("b", 1)], queued=[job("a1", "a"), job("a2", "a")])
    p = plan(s)
    got = admitted(p)
    assert got["a1"].reason == ADMITTED_OWN and not got["a1"].borrowed
    assert got["a2"].reason == ADMITTED_BORROWED and got["a2"].borrowed
    assert got["a2"].lenders == ("b",)


def test_share_furthest_below_its_guarantee_is_visited_first():
    # Over-committed (4 + 4 on 4 GPUs): a uses 2 of 4, b none; one GPU left. b goes first.
    s = snap(
        [node("n1", 4)],
        [share("a", 4), share("b", 4)],
        runs=[running("r1", "a", on("n1", 0, 1)), running("r2", "b", on("n1", 2))],
        queued=[job("a1", "a"), job("b1", "b")],
    )
    # b: 1/4 = 0.25 < a: 2/4 = 0.5
    assert list(admitted(plan(s))) == ["b1"]


def test_equal_own_use_ratio_is_broken_by_share_name():
    s = snap(
        [node("n1", 1)], [share("zeta", 2), share("alpha", 2)], queued=[job("z1", "zeta"), job("a1", "alpha")]
    )
    p = plan(s)
    assert list(admitted(p)) == ["a1"]


# --------------------------------------------------------------------------------------------------
# strategies and borrowing (rule 5)


def test_reserve_idle_capacity_stays_idle():
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("prod", 4, RESERVE), share("research", 4, LEND_AND_BORROW, 100)],
        runs=[running("r1", "research", on("n1", 0, 1, 2, 3))],
        queued=[job("r2", "research", 4)],
    )
    p = plan(s)
    assert not p.admissions
    assert p.waiting["r2"] == "needs 4 h100: share at its own capacity (4 of 4); nothing idle to borrow"


def test_reserve_share_job_starts_at_once_on_its_idle_capacity():
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("prod", 4, RESERVE), share("research", 4)],
        runs=[running("r1", "research", on("n1", 0, 1, 2, 3))],
        queued=[job("p1", "prod", 4)],
    )
    assert admitted(plan(s))["p1"].placement == (("n2", (0, 1, 2, 3)),)


@pytest.mark.parametrize("strategy", [RESERVE, LEND])
def test_reserve_and_lend_shares_never_borrow(strategy):
    s = snap(
        [node("n1", 2)],
        [share("a", 1, strategy), share("b", 1)],
        runs=[running("r1", "a", on("n1", 0))],
        queued=[job("a2", "a")],
    )
    p = plan(s)
    assert not p.admissions
    assert (
        p.waiting["a2"]
        == f"needs 1 h100: share at its own capacity (1 of 1); a {strategy} share does not borrow"
    )


def test_lend_share_lends_its_idle_capacity():
    s = snap([node("n1", 2)], [share("a", 1), share("b", 1, LEND)], queued=[job("a1", "a"), job("a2", "a")])
    assert admitted(plan(s))["a2"].lenders == ("b",)


@pytest.mark.parametrize(
    ("cap", "limit", "expected_borrowed"),
    [
        (4, 50, 2),  # 50% of 4
        (4, 0, 0),
        (4, UNLIMITED, 12),
        (0, 100, 0),  # no own capacity of the type and a limit: may borrow 0 of it
        (0, UNLIMITED, 16),
        (3, 50, 1),  # floor(1.5)
    ],
)
def test_borrow_limit_is_honoured(cap, limit, expected_borrowed):
    s = snap(
        [node("n1", 8), node("n2", 8)],
        [share("a", cap, LEND_AND_BORROW, limit), share("lender", 16 - cap, LEND)],
        queued=[job(f"a{i}", "a", submitted=i) for i in range(16)],
    )
    p = plan(s)
    got = admitted(p)
    assert sum(1 for a in got.values() if a.borrowed) == expected_borrowed
    assert len(got) == cap + expected_borrowed
    if cap > 0 and limit == 0:
        assert p.waiting[f"a{cap}"] == (
            f"needs 1 h100: share at its own capacity ({cap} of {cap}); its borrow limit allows no borrowing"
        )


def test_borrowed_admission_names_the_unassigned_pool_as_lender():
    s = snap([node("n1", 4)], [share("a", 1), share("b", 1)], queued=[job("a1", "a"), job("a2", "a")])
    # 2 GPUs are in no share: the pool lends most, then b.
    assert admitted(plan(s))["a2"].lenders == (UNASSIGNED, "b")


def test_borrowers_are_visited_fewest_borrowed_relative_to_capacity_first():
    s = snap(
        [node("n1", 8), node("n2", 1)],
        [share("a", 2), share("b", 4), share("l", 3, LEND)],
        runs=[
            running("ra", "a", on("n1", 0, 1, 2)),  # a: 1 borrowed of 2 -> 0.5
            running("rb", "b", on("n1", 3, 4, 5, 6)),  # b: 0 borrowed -> 0
        ],
        queued=[job("a2", "a", submitted=0), job("b2", "b", submitted=5)],
    )
    p = plan(s)
    # Lendable: l's 3 + pool 0 = 3, borrowed 1: slack 2, two free GPUs (n1:7, n2:0): both borrow,
    # b first (fewest borrowed), so b takes the best fit.
    assert [a.job_id for a in p.admissions] == ["b2", "a2"]


def test_borrowing_never_preempts():
    s = snap(
        [node("n1", 2)],
        [share("a", 1), share("b", 1)],
        runs=[running("r1", "a", on("n1", 0)), running("r2", "b", on("n1", 1))],
        queued=[job("a2", "a")],
    )
    p = plan(s)
    assert not p.preemptions and not p.admissions


# --------------------------------------------------------------------------------------------------
# rule 3: reclaim


def test_reclaim_takes_newest_borrowed_attempt_of_most_borrowing_share():
    s = snap(
        [node("n1", 4)],
        [share("a", 1), share("b", 1), share("c", 2)],
        runs=[
            running("a-own", "a", on("n1", 0), started=0),
            running("a-old", "a", on("n1", 1), started=10, borrowed=True),
            running("a-new", "a", on("n1", 2), started=20, borrowed=True),
            running("b-own", "b", on("n1", 3), started=0),
        ],
        queued=[job("c1", "c", 1, submitted=30)],
    )
    p = plan(s)
    assert [(x.attempt_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [
        ("a-new", RECLAIM, "c1")
    ]
    assert p.waiting["c1"] == "waiting for reclaim from share a"
    assert p.reserved["c1"] == (("n1", 1),)


def test_reclaim_takes_lowest_priority_first_inside_the_share():
    s = snap(
        [node("n1", 3)],
        [share("a", 1), share("b", 2)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            running("a-hi", "a", on("n1", 1), prio=5, started=20, borrowed=True),
            running("a-lo", "a", on("n1", 2), prio=1, started=10, borrowed=True),
        ],
        queued=[job("b1", "b")],
    )
    assert list(preempted(plan(s))) == ["a-lo"]


def test_reclaim_never_takes_own_capacity():
    # Every GPU is held by own work of other shares: b's job waits, nothing is pre-empted.
    s = snap(
        [node("n1", 2)],
        [share("a", 2), share("b", 2)],  # over-committed: 4 owned on 2 GPUs
        runs=[running("a1", "a", on("n1", 0, 1))],
        queued=[job("b1", "b")],
    )
    p = plan(s)
    assert not p.preemptions and not p.admissions
    assert p.waiting["b1"] == "needs 1 h100; none is free"


def test_reclaim_victim_comes_from_another_share_and_is_borrowed():
    s = snap(
        [node("n1", 2)],
        [share("a", 1), share("b", 1)],
        runs=[running("a1", "a", on("n1", 0)), running("a2", "a", on("n1", 1), started=5, borrowed=True)],
        queued=[job("b1", "b")],
    )
    p = plan(s)
    assert list(preempted(p)) == ["a2"]
    assert "a2" in borrowed_attempts(s)


def test_reclaim_takes_victims_in_order_even_when_a_smaller_one_would_do():
    # b needs 2 GPUs on one node. a's borrowed work: a 4-GPU attempt alone on n1 (first in victim
    # order: lowest priority) and a 1-GPU attempt on n2 next to a free GPU. Rule 9: the order comes
    # first, so the 4-GPU attempt goes although the 1-GPU one would lose less.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("a", 2), share("b", 6)],
        runs=[
            running("a-own", "a", on("n2", 0, 1)),
            running("a-big", "a", on("n1", 0, 1, 2, 3), prio=0, borrowed=True),
            running("a-one", "a", on("n2", 2), prio=3, borrowed=True),
        ],
        queued=[job("b1", "b", 2)],
    )
    p = plan(s)
    assert list(preempted(p)) == ["a-big"]
    assert p.reserved["b1"] == (("n1", 2),)


def test_reclaim_for_a_gang_frees_whole_nodes():
    s = snap(
        [node("n1", 4), node("n2", 4), node("n3", 4)],
        [share("a", 4), share("b", 8)],
        runs=[
            running("a-own", "a", on("n1", 0, 1, 2, 3)),
            running("a-b1", "a", on("n2", 0, 1, 2, 3), borrowed=True, started=1),
            running("a-b2", "a", on("n3", 0, 1), borrowed=True, started=2),
        ],
        queued=[job("g", "b", 8)],
    )
    p = plan(s)
    assert set(preempted(p)) == {"a-b1", "a-b2"}
    assert p.reserved["g"] == (("n2", 4), ("n3", 4))


def test_a_gang_victim_spanning_the_freed_nodes_is_preempted_once():
    gang = (("n2", (0, 1, 2, 3)), ("n3", (0, 1, 2, 3)))
    s = snap(
        [node("n1", 4), node("n2", 4), node("n3", 4)],
        [share("a", 4), share("b", 8)],
        runs=[running("a-own", "a", on("n1", 0, 1, 2, 3)), running("a-gang", "a", gang, borrowed=True)],
        queued=[job("g", "b", 8)],
    )
    p = plan(s)
    assert [x.attempt_id for x in p.preemptions] == ["a-gang"]
    assert p.reserved["g"] == (("n2", 4), ("n3", 4))


def test_reclaim_restores_the_cover_when_the_lender_takes_back_its_capacity():
    # A GPU is free, but a's borrowed work uses b's lent capacity: the borrowed attempt must go. The
    # free GPU is RESERVE c's idle one, so b's job does not start on it at once (rule 9's last
    # paragraph, tests/quotas/test_policy_reserve_grace.py): it waits for a2's GPU.
    s = snap(
        [node("n1", 3)],
        [share("a", 1), share("b", 1), share("c", 1, RESERVE)],
        runs=[running("a1", "a", on("n1", 0)), running("a2", "a", on("n1", 1), borrowed=True)],
        queued=[job("b1", "b")],
    )
    p = plan(s)
    assert list(preempted(p)) == ["a2"]
    assert "b1" not in admitted(p) and p.reserved["b1"] == (("n1", 1),)


def test_a_4_gpu_victim_of_a_share_borrowing_2_may_go_but_no_second_victim_after_it():
    # a owns 2, holds 6: borrowed 2 = part of the 4-GPU attempt (the newest). Taking it leaves a 2
    # below its capacity; its 1-GPU attempts are own and stay.
    s = snap(
        [node("n1", 4), node("n2", 4)],
        [share("a", 4), share("b", 4, RESERVE)],
        runs=[
            running("a-1", "a", on("n2", 0), started=0),
            running("a-2", "a", on("n2", 1), started=1),
            running("a-4", "a", on("n1", 0, 1, 2, 3), started=5),
        ],
        queued=[job("b1", "b", 4), job("b2", "b", 2)],
    )
    assert borrowed_attempts(s) == frozenset({"a-4"})
    p = plan(s)
    assert list(preempted(p)) == ["a-4"]
    assert p.waiting["b2"] == "behind 1 job ahead of it in its share's queue"


def test_capacity_lowered_below_usage_makes_newest_work_borrowed_but_stops_nothing_alone():
    s = snap(
        [node("n1", 4)],
        [share("a", 2)],
        runs=[running(f"a{i}", "a", on("n1", i), started=i) for i in range(4)],
    )
    assert borrowed_attempts(s) == frozenset({"a2", "a3"})
    assert plan(s) == Plan()


def test_own_job_ending_turns_borrowed_attempts_back_into_own():
    runs = [
        running("a1", "a", on("n1", 0), started=0),
        running("a2", "a", on("n1", 1), started=5, borrowed=True),
        running("a3", "a", on("n1", 2), started=5, borrowed=True),
    ]
    s = snap([node("n1", 3)], [share("a", 1), share("b", 2)], runs=runs)
    assert borrowed_attempts(s) == frozenset({"a2", "a3"})
    s = dataclasses.replace(s, running=tuple(runs[1:]))
    assert borrowed_attempts(s) == frozenset({"a3"})  # tie rule: the later in queue order stays borrowed


# --------------------------------------------------------------------------------------------------
# rule 4: in-share pre-emption


def _prod(isp: bool = True, running_prio: int = 1, queued_prio: int = 9, queued_gpus: int = 4):
    return snap(
        [node("n1", 4), node("n2", 4)],
        [share("prod", 4, RESERVE, isp=isp), share("research", 4)],
        runs=[
            running("r1", "research", on("n1", 0, 1, 2, 3)),
            running("p-low", "prod", on("n2", 0, 1, 2, 3), prio=running_prio, started=10),
        ],
        queued=[job("p-high", "prod", queued_gpus, prio=queued_prio, submitted=20)],
        now=20,
    )


def test_in_share_preemption_takes_strictly_lower_priority_work():
    p = plan(_prod())
    assert [(x.attempt_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [
        ("p-low", PRIORITY, "p-high")
    ]
    assert p.waiting["p-high"] == "waiting for lower-priority jobs of its share to stop"


def test_in_share_preemption_never_takes_equal_priority_work():
    p = plan(_prod(running_prio=9))
    assert not p.preemptions
    assert (
        p.waiting["p-high"]
        == "needs 4 h100: share at its own capacity (4 of 4); a RESERVE share does not borrow"
    )


def test_in_share_preemption_needs_the_share_to_allow_it():
    assert not plan(_prod(isp=False)).preemptions


def test_in_share_preemption_only_when_it_makes_the_job_fit():
    # 5 GPUs can never fit prod's 4: nothing is pre-empted.
    s = snap(
        [node("n1", 8)],
        [share("prod", 4, RESERVE, isp=True)],
        runs=[running("p-low", "prod", on("n1", 0, 1, 2), prio=1)],
        queued=[job("p-high", "prod", 5, prio=9)],
    )
    assert not plan(s).preemptions
    # 2 GPUs would fit once 1 GPU of lower priority goes, but only equal-priority work is there.
    s = snap(
        [node("n1", 4)],
        [share("prod", 4, RESERVE, isp=True)],
        runs=[running("p1", "prod", on("n1", 0, 1), prio=9), running("p2", "prod", on("n1", 2, 3), prio=9)],
        queued=[job("p-high", "prod", 2, prio=9)],
    )
    assert not plan(s).preemptions


def test_raising_a_queued_jobs_priority_triggers_in_share_preemption():
    low = _prod(queued_prio=1)
    assert not plan(low).preemptions
    raised = dataclasses.replace(low, queued=(dataclasses.replace(low.queued[0], priority=5),))
    assert list(preempted(plan(raised))) == ["p-low"]


# --------------------------------------------------------------------------------------------------
# rule 7: pre-empting attempts and beneficiaries


def _three_projects_after_reclaim(beneficiary_flag: bool):
    nodes = [node(f"g5-{i}", 1, "a10g") for i in (1, 2, 3)]
    shares = [share(f"project-{x}", {"a10g": 1}) for x in "abc"]
    runs = [
        running("a1", "project-a", on("g5-1", 0), gpu_type="a10g"),
        running("a2", "project-a", on("g5-2", 0), gpu_type="a10g", borrowed=True),
        running(
            "a3",
            "project-a",
            on("g5-3", 0),
            gpu_type="a10g",
            borrowed=True,
            preempting=True,
            beneficiary="b1",
        ),
    ]
    queued = [job("b1", "project-b", 1, submitted=100, gpu_type="a10g", beneficiary=beneficiary_flag)]
    return snap(nodes, shares, runs, queued, now=105)


@pytest.mark.parametrize("flag", [True, False])
def test_preempting_attempts_count_as_freed_and_are_not_taken_twice(flag):
    p = plan(_three_projects_after_reclaim(flag))
    assert not p.preemptions and not p.admissions
    assert p.waiting["b1"] == "waiting for pre-empted jobs to stop"
    assert p.reserved["b1"] == (("g5-3", 1),)


def test_gpus_being_freed_are_earmarked_for_the_beneficiary():
    s = _three_projects_after_reclaim(True)
    # c arrives in the grace period: c is below its capacity too, but the GPU being freed is b1's and
    # the cover is already tight, so c reclaims a2 rather than taking b1's GPU.
    s = dataclasses.replace(s, queued=s.queued + (job("c1", "project-c", 1, submitted=104, gpu_type="a10g"),))
    p = plan(s)
    assert p.reserved["b1"] == (("g5-3", 1),)
    assert list(preempted(p)) == ["a2"]
    assert p.reserved["c1"] == (("g5-2", 1),)


def test_beneficiary_goes_ahead_of_everything_once_the_gpus_are_free():
    nodes = [node("n1", 1)]
    shares = [share("a", 1), share("b", 1, isp=True)]
    # b1 was the beneficiary; a higher-priority job of b and a job of a (lower own-use ratio) arrived.
    queued = [
        job("b1", "b", prio=1, submitted=50, beneficiary=True),
        job("b-hi", "b", prio=9, submitted=60),
        job("a1", "a", submitted=0),
    ]
    p = plan(snap(nodes, shares, queued=queued, now=100))
    assert list(admitted(p)) == ["b1"]


def test_a_beneficiary_that_fits_its_own_capacity_goes_before_one_that_borrows():
    """Rule 7 puts beneficiaries ahead of everything, and rule 2 own capacity first among them too. b8
    (share b, no capacity: it borrows) waits for a 1-GPU victim in grace; o3 (share o owns 3) needs 3
    GPUs on one node: o3 reclaims b8 after b8 borrowed n1, and then, both beneficiaries, o3 takes n1
    as own and b8 waits, where b8 used to borrow n1 back and be reclaimed again, pass after pass at
    one instant (zero grace). Found by the fixed-point property (test_policy_properties)."""
    nodes = [node("n1", 8), node("n2", 1)]
    shares = [share("b", 0, "LEND_AND_BORROW"), share("o", 3, "LEND")]
    runs = [running("v", "b", on("n2", 0), started=10, preempting=True, beneficiary="b8", borrowed=True)]
    queued = [job("b8", "b", 8, submitted=0, beneficiary=True), job("o3", "o", 3, submitted=50)]
    settled, plans = settle(snap(nodes, shares, runs, queued, now=100))
    assert [list(admitted(p)) for p in plans] == [["b8"], [], ["o3"], []]
    assert list(preempted(plans[1])) == ["b8#100#1"]
    assert {q.job_id for q in settled.queued} == {"b8"}


# --------------------------------------------------------------------------------------------------
# placement: gangs, best fit, indexes, unschedulable nodes, backfill, starvation


def test_gang_is_placed_all_or_nothing_on_whole_free_nodes():
    nodes = [node("n1"), node("n2"), node("n3")]
    p = plan(snap(nodes, [share("a", 24)], runs=[running("r", "a", on("n2", 0))], queued=[job("g", "a", 16)]))
    assert admitted(p)["g"].placement == (("n1", tuple(range(8))), ("n3", tuple(range(8))))
    p = plan(
        snap(
            nodes,
            [share("a", 24)],
            runs=[running("r", "a", on("n2", 0)), running("r2", "a", on("n3", 7))],
            queued=[job("g", "a", 16)],
        )
    )
    assert not p.admissions
    assert p.waiting["g"] == "needs 2 whole 8-GPU h100 nodes; 1 is free"


def test_gang_request_that_is_not_whole_nodes_waits_with_a_reason():
    p = plan(snap([node("n1"), node("n2")], [share("a", 16)], queued=[job("g", "a", 12)]))
    assert p.waiting["g"] == "12 GPUs is more than one 8-GPU node and not a multiple of it"
    p = plan(snap([node("n1"), node("n2")], [share("a", 16)], queued=[job("g", "a", 24)]))
    assert p.waiting["g"] == "needs 3 whole 8-GPU nodes; the cluster has 2"
    # Enough nodes, but not all take work: it says how many and why ("only 1 are schedulable" did not).
    cordoned = [node("n1"), node("n2", schedulable=False), node("n3", schedulable=False)]
    p = plan(snap(cordoned, [share("a", 16)], queued=[job("g", "a", 16)]))
    assert p.waiting["g"] == (
        "needs 2 whole 8-GPU nodes; only 1 of its 3 is schedulable (the others are cordoned, draining or lost)"
    )
    p = plan(snap(cordoned[:2], [share("a", 16)], queued=[job("g", "a", 24)]))
    assert p.waiting["g"] == "needs 3 whole 8-GPU nodes; the cluster has 2, 1 of them schedulable"


def test_single_node_job_takes_the_best_fit_and_the_lowest_free_indexes():
    nodes = [node("a-big", 8), node("b-small", 4), node("c-tight", 4)]
    runs = [running("x", "s", on("c-tight", 0, 2))]  # c-tight has 1 and 3 free
    p = plan(snap(nodes, [share("s", 16)], runs, [job("j", "s", 2)]))
    assert admitted(p)["j"].placement == (("c-tight", (1, 3)),)
    p = plan(snap(nodes, [share("s", 16)], runs, [job("j", "s", 3)]))
    assert admitted(p)["j"].placement == (("b-small", (0, 1, 2)),)


def test_best_fit_keeps_whole_nodes_for_large_jobs():
    nodes = [node("n1", 8), node("n2", 8)]
    runs = [running("x", "s", on("n2", 0, 1, 2, 3))]
    queued = [job("small", "s", 4, submitted=0), job("big", "s", 8, submitted=1)]
    got = admitted(plan(snap(nodes, [share("s", 16)], runs, queued)))
    assert got["small"].placement[0][0] == "n2" and got["big"].placement[0][0] == "n1"


def test_unschedulable_nodes_take_no_work_but_their_attempts_count():
    nodes = [node("cordoned", 4, schedulable=False), node("n1", 4)]
    runs = [running("x", "a", on("cordoned", 0, 1, 2, 3))]
    queued = [job("a1", "a", 1), job("b1", "b", 4)]
    p = plan(snap(nodes, [share("a", 4), share("b", 4)], runs, queued))
    assert admitted(p).keys() == {"b1"}
    assert admitted(p)["b1"].placement == (("n1", (0, 1, 2, 3)),)
    # a is at its capacity with the attempt on the cordoned node; nothing idle to borrow.
    assert p.waiting["a1"] == "needs 1 h100: share at its own capacity (4 of 4); nothing idle to borrow"
    p = plan(snap([node("cordoned", 4, schedulable=False)], [share("a", 4)], queued=[job("a1", "a")]))
    assert p.waiting["a1"] == "no schedulable h100 nodes"


def test_backfill_lets_smaller_jobs_use_what_the_blocked_head_cannot():
    nodes = [node("n1", 4)]
    runs = [running("x", "other", on("n1", 0, 1))]
    queued = [job("head", "a", 4, prio=5), job("small", "a", 2)]
    p = plan(snap(nodes, [share("a", 4), share("other", 2, RESERVE)], runs, queued, now=10))
    assert admitted(p).keys() == {"small"}
    assert p.waiting["head"] == "needs 4 h100 on one node; the largest free block is 2"


def test_starving_head_reserves_its_node_so_backfill_cannot_take_it():
    nodes = [node("n1", 4), node("n2", 4)]
    runs = [running("x", "other", on("n1", 0, 1)), running("y", "other", on("n2", 0, 1, 2))]
    queued = [job("head", "a", 4, prio=5, submitted=0), job("small", "a", 2, submitted=10)]
    shares = [share("a", 4), share("other", 5, RESERVE)]
    fresh = plan(snap(nodes, shares, runs, queued, now=100))
    assert admitted(fresh).keys() == {"small"}  # backfill while the head is not starving
    starving = plan(snap(nodes, shares, runs, queued, now=5000))
    assert not starving.admissions
    assert starving.reserved["head"] == (("n1", 2),)
    assert starving.waiting["head"] == (
        "needs 4 h100 on one node; the largest free block is 1; holding n1 for it (waited over 3600s)"
    )


def test_gpu_types_are_independent():
    nodes = [node("h1", 1, "h100"), node("a1", 1, "a10g")]
    shares = [share("s", {"h100": 1, "a10g": 0}), share("t", {"a10g": 1})]
    runs = [running("h", "s", on("h1", 0), gpu_type="h100")]
    queued = [
        job("s-h", "s", gpu_type="h100"),
        job("s-a", "s", gpu_type="a10g"),
        job("t-h", "t", gpu_type="h100"),
    ]
    p = plan(snap(nodes, shares, runs, queued))
    # a10g: s owns none but may borrow t's idle a10g; h100: full, nothing to borrow for t.
    assert admitted(p)["s-a"].borrowed
    assert set(p.waiting) == {"s-h", "t-h"}


def test_every_queued_job_is_admitted_or_told_why_it_waits():
    nodes = [node("n1", 2)]
    queued = [
        job("ok", "a"),
        job("none", "a", 0),
        job("ghost", "missing-share"),
        job("other-type", "a", gpu_type="a10g"),
        job("too-big", "a", 3),
    ]
    p = plan(snap(nodes, [share("a", 2)], queued=queued))
    assert admitted(p).keys() == {"ok"}
    assert p.waiting == {
        "none": "asks for no GPUs",
        "ghost": "unknown share missing-share",
        "other-type": "no a10g nodes in the cluster",
        "too-big": "3 GPUs is more than one 2-GPU node and not a multiple of it",
    }


def test_overcommitted_guarantee_holds_only_as_far_as_the_hardware_exists():
    # a and b each own 8 of 8 GPUs; a holds 4 own and borrows nothing. b's 8-GPU job cannot fit and
    # nothing is reclaimable; a's next job fits its own capacity and the 4 free GPUs.
    s = snap(
        [node("n1", 8)],
        [share("a", 8), share("b", 8)],
        runs=[running("x", "a", on("n1", 0, 1, 2, 3))],
        queued=[job("b1", "b", 8), job("a2", "a", 4)],
    )
    p = plan(s)
    assert admitted(p).keys() == {"a2"} and not p.preemptions


def test_cover_is_clamped_to_the_hardware_under_overcommit():
    # b lends 8 on paper, but the node has 8 GPUs and a owns 4 of them: only 4 can be lent.
    s = snap(
        [node("n1", 8)], [share("a", 4), share("b", 8, LEND)], queued=[job(f"a{i}", "a") for i in range(8)]
    )
    p = plan(s)
    assert len(p.admissions) == 8
    s = snap(
        [node("n1", 8)], [share("a", 4), share("b", 8, LEND)], queued=[job(f"a{i}", "a") for i in range(8)]
    )
    after = apply(s, p, stop_preempted=True)
    p2 = plan(dataclasses.replace(after, queued=(job("b1", "b", 4),)))
    assert len(p2.preemptions) == 4  # b's own job takes back all of its lent GPUs


# --------------------------------------------------------------------------------------------------
# accounting helpers


def test_usage_and_lending_follow_the_proportional_rule():
    s = snap(
        [node("n1", 6)],
        [share("a", 1), share("b", 2), share("c", 1, RESERVE)],
        runs=[running("a1", "a", on("n1", 0)), running("a2", "a", on("n1", 1, 2), borrowed=True)],
    )
    u = usage(s)
    assert u["a"][T] == ShareUsage(capacity=1, used=3, own=1, borrowed=2, idle=0, lent=0.0)
    # Lendable: b's 2 + the pool's 2 = 4; 2 borrowed: each lends half of its idle GPUs.
    assert u["b"][T] == ShareUsage(capacity=2, used=0, own=0, borrowed=0, idle=2, lent=1.0)
    assert u[UNASSIGNED][T] == ShareUsage(capacity=2, used=0, own=0, borrowed=0, idle=2, lent=1.0)
    assert u["c"][T].lent == 0.0 and u["c"][T].idle == 1
    assert lending(s) == {T: {("b", "a"): 1.0, (UNASSIGNED, "a"): 1.0}}


def test_usage_can_count_grace_as_freed():
    s = _three_projects_after_reclaim(True)
    assert usage(s)["project-a"]["a10g"].borrowed == 2
    assert usage(s, count_preempting=False)["project-a"]["a10g"].borrowed == 1


def test_plan_is_deterministic_and_ignores_input_order():
    s = _prod()
    reordered = dataclasses.replace(
        s, nodes=s.nodes[::-1], shares=s.shares[::-1], running=s.running[::-1], queued=s.queued[::-1]
    )
    assert plan(s) == plan(s) == plan(reordered)


# --------------------------------------------------------------------------------------------------
# the example scenarios (../shared/scenarios)


def _three_projects(now: float, runs=(), queued=()) -> Snapshot:
    nodes = [node(f"g5-{i}", 1, "a10g") for i in (1, 2, 3)]
    return snap(nodes, [share(f"project-{x}", {"a10g": 1}) for x in "abc"], runs, queued, now=now)


def test_three_projects_t0_a1_own_a2_a3_borrowed():
    queued = [job(f"a{i}", "project-a", gpu_type="a10g") for i in (1, 2, 3)]
    p = plan(_three_projects(0, queued=queued))
    got = admitted(p)
    assert [(j, a.borrowed, a.placement[0][0]) for j, a in got.items()] == [
        ("a1", False, "g5-1"),
        ("a2", True, "g5-2"),
        ("a3", True, "g5-3"),
    ]
    assert got["a2"].lenders == ("project-b", "project-c")


def test_three_projects_t100_b1_reclaims_a3():
    s0 = _three_projects(0, queued=[job(f"a{i}", "project-a", gpu_type="a10g") for i in (1, 2, 3)])
    s = apply(s0, plan(s0), stop_preempted=True, now=100)
    s = dataclasses.replace(s, queued=(job("b1", "project-b", submitted=100, gpu_type="a10g"),))
    p = plan(s)
    assert [(x.job_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [("a3", RECLAIM, "b1")]
    settled, plans = settle(s)
    assert admitted(plans[1])["b1"].reason == ADMITTED_OWN
    assert (
        plans[-1].waiting["a3"] == "needs 1 a10g: share at its own capacity (1 of 1); nothing idle to borrow"
    )


def test_reserve_and_priority_t0_and_t20():
    nodes = [node("n1", 4), node("n2", 4)]
    shares = [share("prod", 4, RESERVE, isp=True), share("research", 4, LEND_AND_BORROW, 100)]
    s = snap(nodes, shares, queued=[job("r1", "research", 4), job("r2", "research", 4)])
    p = plan(s)
    assert admitted(p)["r1"].placement == (("n1", (0, 1, 2, 3)),)
    assert p.waiting["r2"] == "needs 4 h100: share at its own capacity (4 of 4); nothing idle to borrow"
    s = apply(s, p, stop_preempted=True, now=10)
    s = dataclasses.replace(s, queued=s.queued + (job("p-low", "prod", 4, prio=1, submitted=10),))
    s, _ = settle(s)
    s = dataclasses.replace(s, now=20, queued=s.queued + (job("p-high", "prod", 4, prio=9, submitted=20),))
    p = plan(s)
    assert [(x.job_id, x.reason, x.beneficiary_job_id) for x in p.preemptions] == [
        ("p-low", PRIORITY, "p-high")
    ]
    _, plans = settle(s)
    assert admitted(plans[1])["p-high"].placement == (("n2", (0, 1, 2, 3)),)
    assert plans[1].waiting["p-low"] == "behind 1 job ahead of it in its share's queue"
    assert plans[-1].waiting["p-low"] == (
        "needs 4 h100: share at its own capacity (4 of 4); a RESERVE share does not borrow"
    )


def _scenario(name: str) -> Path:
    path = SCENARIOS / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    return path


def test_three_projects_scenario_replays_as_documented():
    got = replay(_scenario("three-projects-borrow-reclaim.json"))
    assert got == {
        "a1": [(0, 1000, "SUCCEEDED", None)],
        "a2": [(0, 1000, "SUCCEEDED", None)],
        "a3": [(0, 100, "PREEMPTED", "b1"), (1000, 2000, "SUCCEEDED", None)],
        "b1": [(100, 1100, "SUCCEEDED", None)],
    }


def test_reserve_and_priority_scenario_replays_as_documented():
    got = replay(_scenario("reserve-and-priority.json"))
    assert got == {
        "r1": [(0, 500, "SUCCEEDED", None)],
        "r2": [(500, 1000, "SUCCEEDED", None)],
        "p-low": [(10, 20, "PREEMPTED", "p-high"), (120, 420, "SUCCEEDED", None)],
        "p-high": [(20, 120, "SUCCEEDED", None)],
    }
