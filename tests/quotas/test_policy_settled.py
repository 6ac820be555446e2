"""Passes not made (issue 38.4). Plan.settled: a pass made right after a settled plan's admissions started,
at the same instant, decides nothing (no admission, no pre-emption, no job waiting for protection); the
simulator, which passes again until nothing new is decided, does not make that pass (42k of the ITP
replay's 165k passes). Engine.quiet(now): while only jobs that can neither start nor pre-empt joined
the queue since a settled pass, and no head started to starve, a pass decides nothing; the simulator
does not make it (11k more). Both claims are checked here on random states, along random histories,
on a table of the cases that are not settled or not quiet (each needed one of the conditions), and on
whole replays made with and without the passes."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.engine import scenario as sc
from quotas.engine import tracegen
from quotas.engine.policy import Engine, NodeView, QueuedView, RunningView, ShareView, Snapshot, plan
from quotas.engine.simulate import PolicyError, simulate
from quotas.engine.views import LEND, LEND_AND_BORROW, RESERVE, GroupSpec

from .test_engine_incremental import _apply, _event
from .test_policy_properties import SETTINGS, after, snapshots

NOW = 5000.0


def _decides_nothing(p) -> bool:
    return not (p.admissions or p.preemptions or p.protected) and p.recheck_at is None


@SETTINGS
@given(snapshots(queued=(1, 12)), st.booleans())
def test_the_pass_after_a_settled_plan_decides_nothing(snapshot, fresh_only):
    if fresh_only:  # nobody starving: more plans admit and nothing else
        snapshot = Snapshot(
            now=snapshot.now,
            nodes=snapshot.nodes,
            shares=snapshot.shares,
            running=snapshot.running,
            queued=tuple(q for q in snapshot.queued if snapshot.now - q.submitted_at < 3600),
        )
    p = plan(snapshot)
    if p.settled:
        assert not p.preemptions
        assert _decides_nothing(plan(after(snapshot, p)))


def _history(snapshot, seed: int, submissions: float) -> None:
    """40 events from the snapshot, a pass after each (and the passes at one instant until one decides
    nothing): after every settled plan the next pass, and every pass the engine calls quiet, must
    decide nothing. `submissions`: how often the event is one to three jobs joining the queue (what
    keeps an engine quiet) rather than any event of the incremental engine's test."""
    rng = random.Random(seed)
    engine = Engine.from_snapshot(snapshot)
    now = snapshot.now
    types = sorted({n.gpu_type for n in engine.nodes}) or ["a10g"]
    shares = [s.name for s in engine.shares]
    for serial in range(40):
        quiet = engine.quiet(now)
        p = engine.plan(now)
        if quiet:
            assert _decides_nothing(p), f"event {serial}: the engine said it was quiet"
        if p.admissions or p.preemptions:
            _apply(engine, p, now, rng)
            if p.settled:
                assert _decides_nothing(engine.plan(now)), f"event {serial}: after a settled plan"
                continue
            if rng.random() < submissions:
                continue  # the passes at this instant go on
        now += rng.choice((0, 0, 1, 30, 600, 4000))
        if rng.random() < submissions:
            for i in range(rng.randint(1, 3)):
                engine.add_queued(
                    QueuedView(
                        job_id=f"s{serial}-{i}",
                        share=rng.choice(shares),
                        gpu_type=rng.choice(types),
                        gpus=rng.choice((1, 1, 2, 4, 8, 16)),
                        priority=rng.randint(0, 3),
                        submitted_at=now - rng.choice((0, 0, 100, 5000)),
                        beneficiary=rng.random() < 0.05,
                    )
                )
        else:
            _event(engine, now, rng, serial)


@SETTINGS
@given(snapshots(queued=(0, 12)), st.integers(0, 2**32 - 1))
def test_along_random_histories_every_settled_plan_is_followed_by_a_pass_that_decides_nothing(snapshot, seed):
    _history(snapshot, seed, submissions=0.0)


# -- table: the plans that are not settled, each for the reason run_pass gives ---------------------


def _node(name: str, gpus: int = 8) -> NodeView:
    return NodeView(name=name, gpu_type="a100", gpus=gpus)


def _job(job_id: str, share: str, gpus: int, submitted_at: float = NOW - 10, priority: int = 0) -> QueuedView:
    return QueuedView(job_id, share, "a100", gpus, priority, submitted_at)


def _run(attempt_id: str, share: str, node: str, idx: tuple, *, borrowed: bool = False, priority: int = 0):
    return RunningView(
        attempt_id=attempt_id,
        job_id="j-" + attempt_id,
        share=share,
        gpu_type="a100",
        priority=priority,
        submitted_at=0.0,
        started_at=100.0,
        placement=((node, idx),),
        borrowed=borrowed,
    )


def _snap(nodes, shares, running=(), queued=(), **kw) -> Snapshot:
    return Snapshot(
        now=NOW, nodes=tuple(nodes), shares=tuple(shares), running=tuple(running), queued=tuple(queued), **kw
    )


def test_admissions_and_nothing_else_settle_the_plan():
    snapshot = _snap(
        [_node("n1"), _node("n2")],
        [ShareView("a", {"a100": 8}, LEND_AND_BORROW), ShareView("b", {"a100": 8}, LEND)],
        queued=[_job("a1", "a", 4), _job("a2", "a", 8), _job("b1", "b", 2), _job("b2", "b", 8)],
    )
    p = plan(snapshot)
    assert {a.job_id for a in p.admissions} == {"a1", "a2", "b1"} and p.settled
    assert _decides_nothing(plan(after(snapshot, p)))


def test_a_reclaim_does_not_settle_the_plan():
    snapshot = _snap(
        [_node("n1")],
        [ShareView("owner", {"a100": 8}, LEND), ShareView("other", {}, LEND_AND_BORROW)],
        running=[_run("b", "other", "n1", tuple(range(8)), borrowed=True)],
        queued=[_job("o1", "owner", 8)],
    )
    p = plan(snapshot)
    assert p.preemptions and not p.settled


def test_a_starving_head_held_for_while_another_job_starts_does_not_settle_the_plan():
    # The ITP replay's case: the head of `a` has waited past starvation_s and holds the node closest
    # to fitting it while a job of `b` borrows elsewhere; when a head like it later starts, the job
    # behind it is the starving head of the next pass, and goes first there.
    snapshot = _snap(
        [_node("n1"), _node("n2")],
        [ShareView("a", {"a100": 4}, LEND_AND_BORROW), ShareView("b", {"a100": 10}, LEND_AND_BORROW)],
        running=[_run("r1", "b", "n1", (0, 1, 2, 3, 4)), _run("r2", "b", "n2", (0, 1, 2, 3, 4))],
        queued=[_job("a1", "a", 4, submitted_at=0.0), _job("b1", "b", 2)],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["b1"] and "a1" in p.reserved and not p.settled


def test_jobs_started_before_a_starving_head_is_held_for_settle_the_plan():
    # b1 starts on its own capacity (rules 2-4) before the starving a1, which must borrow, holds the node
    # closest to fitting it (rule 6, phase C): the next pass looks at a1 at the same point, with the
    # same GPUs free, and holds the same node.
    snapshot = _snap(
        [_node("n1"), _node("n2")],
        [ShareView("a", {"a100": 2}, LEND_AND_BORROW), ShareView("b", {"a100": 12}, LEND_AND_BORROW)],
        running=[_run("r1", "b", "n1", (0, 1, 2, 3, 4)), _run("r2", "b", "n2", (0, 1, 2, 3, 4))],
        queued=[_job("a1", "a", 4, submitted_at=0.0), _job("b1", "b", 2)],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["b1"] and "a1" in p.reserved and p.settled
    nxt = plan(after(snapshot, p))
    assert _decides_nothing(nxt) and nxt.reserved == p.reserved


def test_a_share_that_started_its_head_and_has_another_starving_one_does_not_settle_the_plan():
    # c1 (starving) borrows n1; d1 (starving, two whole nodes) then holds n2, the only node wholly free,
    # and its GPUs count as d's; c2 comes after both in rule 5's order and the cover stops it. In the
    # next pass c2 is its share's starving head, ahead of d1 (queue order), and borrows n2 (the ITP
    # replay's case, where a gang's held node went to the next head of a share that had just started one).
    snapshot = _snap(
        [_node("n1"), _node("n2"), _node("n3"), _node("n4")],
        [
            ShareView("c", {"a100": 1}, LEND_AND_BORROW),
            ShareView("d", {"a100": 1}, LEND_AND_BORROW),
            ShareView("e", {"a100": 8}, LEND),
        ],
        running=[_run("e1", "e", "n3", (0, 1, 2, 3)), _run("e2", "e", "n4", (0, 1, 2, 3))],
        queued=[
            _job("c1", "c", 8, submitted_at=0.0),
            _job("c2", "c", 8, submitted_at=1.0),
            _job("d1", "d", 16, submitted_at=2.0),
        ],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["c1"] and "d1" in p.reserved and not p.settled
    assert [a.job_id for a in plan(after(snapshot, p)).admissions] == ["c2"]


def test_a_job_earmarking_gpus_being_freed_does_not_settle_the_plan():
    # o1's victim is in its grace period on the only node o1 fits: o1 waits for its GPUs (rule 7)
    # while a job of `other` borrows the unassigned GPUs of n2.
    victim = dataclasses.replace(
        _run("v", "other", "n1", (0, 1, 2, 3), borrowed=True), preempting=True, beneficiary_job_id="o1"
    )
    snapshot = _snap(
        [_node("n1", 4), _node("n2", 2)],
        [ShareView("owner", {"a100": 4}, RESERVE), ShareView("other", {}, LEND_AND_BORROW)],
        running=[victim],
        queued=[dataclasses.replace(_job("o1", "owner", 4), beneficiary=True), _job("x", "other", 2)],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["x"] and not p.preemptions and "o1" in p.reserved
    assert p.waiting["o1"] == "waiting for pre-empted jobs to stop" and not p.settled


def test_a_beneficiary_started_does_not_settle_the_plan():
    # It borrows ahead of everything (rule 7), the owner's job looked at after it finds nothing free
    # and nothing to reclaim; the next pass reclaims the beneficiary for it.
    snapshot = _snap(
        [_node("n1", 1)],
        [ShareView("owner", {"a100": 1}, LEND), ShareView("other", {}, LEND_AND_BORROW)],
        queued=[dataclasses.replace(_job("ben", "other", 1), beneficiary=True), _job("o", "owner", 1)],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["ben"] and not p.settled
    assert [x.job_id for x in plan(after(snapshot, p)).preemptions] == ["ben"]


def test_a_waiting_job_of_higher_priority_than_an_attempt_of_its_share_does_not_settle_the_plan():
    # vision's job could borrow n2 when rules 2-4 looked at it, so rule 4 was not tried; audio
    # borrowed n2 first in rule 5's order. The next pass finds nothing to borrow and pre-empts a0.
    snapshot = _snap(
        [_node("n1", 4), _node("n2", 4)],
        [
            ShareView("audio", {"a100": 1}, LEND_AND_BORROW),
            ShareView("lender", {"a100": 3}, LEND),
            ShareView("vision", {"a100": 4}, LEND_AND_BORROW, in_share_preemption=True),
        ],
        running=[_run("a0", "vision", "n1", (0, 1, 2, 3))],
        queued=[_job("hp", "vision", 4, priority=5), _job("au", "audio", 4)],
    )
    p = plan(snapshot)
    assert [a.job_id for a in p.admissions] == ["au"] and not p.settled
    assert [(x.attempt_id, x.reason) for x in plan(after(snapshot, p)).preemptions] == [("a0", "PRIORITY")]


def test_fair_sharing_does_not_settle_the_plan():
    snapshot = _snap(
        [_node("n1")],
        [
            ShareView("a", {"a100": 4}, LEND_AND_BORROW, group="g"),
            ShareView("b", {"a100": 4}, LEND_AND_BORROW, group="g"),
        ],
        queued=[_job("a1", "a", 2)],
        groups=(GroupSpec("g"),),
    )
    p = plan(snapshot)
    assert p.admissions and not p.settled


# -- whole replays: the pass not made would have decided nothing, and the results are the same -----


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_replays_check_every_settled_plan_and_give_the_same_result_without_the_pass(seed):
    scenario = sc.parse(tracegen.generate(teams=4, gpus=96, jobs=1500, seed=seed))
    made = simulate(scenario, check_skipped=True)  # raises PolicyError if the claim fails once
    skipped = simulate(scenario)
    assert skipped.to_json() == made.to_json()


def test_a_replay_cut_after_a_settled_plan_gives_the_reasons_of_the_pass_not_made():
    data = {
        "nodes": [{"name": "n1", "gpu_type": "a100", "gpus": 8}],
        "shares": [{"name": "a", "capacity": {"a100": 8}, "strategy": "RESERVE"}],
        "jobs": [
            {"id": "j1", "share": "a", "submit_at": 100, "duration_s": 600, "gpus": 4, "gpu_type": "a100"},
            {"id": "j2", "share": "a", "submit_at": 100, "duration_s": 600, "gpus": 2, "gpu_type": "a100"},
            {"id": "j3", "share": "a", "submit_at": 100, "duration_s": 600, "gpus": 4, "gpu_type": "a100"},
        ],
        "settings": {"until_s": 100},
    }
    skipped = simulate(data)
    made = simulate(data, check_skipped=True)
    assert skipped.waiting == made.waiting and set(skipped.waiting) == {"j3"}
    assert skipped.to_json() == made.to_json()


@pytest.mark.engine_as_python  # patches the engine (tests/conftest.py)
def test_check_skipped_raises_when_the_pass_after_a_settled_plan_decides_something(monkeypatch):
    from quotas.engine import rules

    monkeypatch.setattr(rules, "_settled", lambda out: bool(out.admissions))  # claims too much
    # P1 reclaims b for o (grace 0: b stops as the plan is applied) and starts o2 on n2; only the
    # pass after it starts o.
    data = {
        "nodes": [
            {"name": "n1", "gpu_type": "a100", "gpus": 8},
            {"name": "n2", "gpu_type": "a100", "gpus": 1},
        ],
        "shares": [
            {"name": "owner", "capacity": {"a100": 9}, "strategy": "LEND"},
            {"name": "other", "capacity": {}, "strategy": "LEND_AND_BORROW"},
        ],
        "jobs": [
            {"id": "b", "share": "other", "submit_at": 0, "duration_s": 6000, "gpus": 8, "gpu_type": "a100"},
            {"id": "o", "share": "owner", "submit_at": 100, "duration_s": 60, "gpus": 8, "gpu_type": "a100"},
            {"id": "o2", "share": "owner", "submit_at": 100, "duration_s": 60, "gpus": 1, "gpu_type": "a100"},
        ],
        "settings": {"preemption_grace_s": 0},
    }
    simulate(data)  # without the check the wrong claim goes unnoticed here
    with pytest.raises(PolicyError, match="a pass the simulator would not make"):
        simulate(data, check_skipped=True)


# -- Engine.quiet: a pass would decide nothing -------------------------------------------------------


@SETTINGS
@given(snapshots(queued=(0, 12)), st.integers(0, 2**32 - 1))
def test_along_histories_of_submissions_a_quiet_engine_plans_nothing(snapshot, seed):
    _history(snapshot, seed, submissions=0.7)


def _quiet_engine(shares, running, queued, nodes=None):
    engine = Engine(nodes=nodes or [_node("n1"), _node("n2")], shares=shares, running=running, queued=queued)
    assert _decides_nothing(engine.plan(NOW)) and engine.quiet(NOW)
    return engine


# Two 8-GPU nodes; `full` holds n1 and 6 GPUs of n2 (its own capacity); `lender` lends 2, idle.
SHARES = [
    ShareView("full", {"a100": 14}, LEND_AND_BORROW, in_share_preemption=True),
    ShareView("lender", {"a100": 2}, LEND),
]
RUNNING = [
    _run("f1", "full", "n1", tuple(range(8)), priority=1),
    _run("f2", "full", "n2", tuple(range(6)), priority=1),
]


def test_a_job_that_can_neither_start_nor_pre_empt_keeps_the_engine_quiet():
    engine = _quiet_engine(SHARES, RUNNING, [_job("w", "full", 4)])
    engine.add_queued(_job("x", "full", 4, submitted_at=NOW))  # no own room, 2 free GPUs: too few
    assert engine.quiet(NOW + 60) and _decides_nothing(engine.plan(NOW + 60))


@pytest.mark.parametrize(
    "job, why",
    [
        (_job("x", "lender", 2, submitted_at=NOW), "its share has room for it"),
        (_job("x", "full", 2, submitted_at=NOW), "free GPUs hold it as a borrower"),
        (
            _job("x", "full", 4, submitted_at=NOW, priority=2),
            "rule 4: an attempt of its share has lower priority",
        ),
        (_job("x", "full", 4, submitted_at=NOW - 20), "it goes ahead of the head of its share"),
        (dataclasses.replace(_job("x", "full", 4, submitted_at=NOW), beneficiary=True), "a beneficiary"),
    ],
)
def test_a_job_that_might_start_or_pre_empt_ends_the_quiet(job, why):
    engine = _quiet_engine(SHARES, RUNNING, [_job("w", "full", 4)])
    engine.add_queued(job)
    assert not engine.quiet(NOW), why


def test_any_other_change_ends_the_quiet():
    engine = _quiet_engine(SHARES, RUNNING, [_job("w", "full", 4)])
    engine.remove_running("f2")
    assert not engine.quiet(NOW)
    assert [a.job_id for a in engine.plan(NOW).admissions] == ["w"]


def test_a_head_that_starts_to_starve_ends_the_quiet():
    # s2's head waits for a node, another job of s2 fits its own room behind it; once the head has
    # waited past starvation_s its node hold counts in s2's accounting, the job behind no longer fits
    # its own room and rule 4 pre-empts for it (the random histories' case).
    nodes = [_node("n1", 2), _node("n2", 8), _node("n3", 1)]
    shares = [
        ShareView("s2", {"a100": 4}, LEND_AND_BORROW, in_share_preemption=True),
        ShareView("other", {"a100": 7}, RESERVE),
    ]
    running = [
        _run("low", "s2", "n1", (0, 1), priority=1),
        _run("o", "other", "n2", (0, 1, 2, 3, 4, 5, 6)),
    ]
    queued = [
        _job("head", "s2", 2, submitted_at=NOW - 10, priority=3),
        _job("next", "s2", 2, submitted_at=NOW, priority=3),
    ]
    engine = _quiet_engine(shares, running, queued, nodes=nodes)
    later = NOW - 10 + 3600 + 1
    assert engine.quiet(later - 1) and not engine.quiet(later)
    assert [x.attempt_id for x in engine.plan(later).preemptions] == ["low"]


def test_a_pass_that_earmarks_gpus_being_freed_leaves_the_engine_not_quiet():
    # The job waiting for its victims' GPUs is passed over by rule 6's head pointer; a job behind it
    # may become the head that starves, later, without anything else changing.
    victim = dataclasses.replace(
        _run("v", "other", "n1", (0, 1, 2, 3), borrowed=True), preempting=True, beneficiary_job_id="o1"
    )
    engine = Engine(
        nodes=[_node("n1", 4)],
        shares=[ShareView("owner", {"a100": 4}, RESERVE), ShareView("other", {}, LEND_AND_BORROW)],
        running=[victim],
        queued=[dataclasses.replace(_job("o1", "owner", 4), beneficiary=True)],
    )
    p = engine.plan(NOW)
    assert _decides_nothing(p) and p.waiting["o1"] == "waiting for pre-empted jobs to stop"
    assert not p.settled and not engine.quiet(NOW)
