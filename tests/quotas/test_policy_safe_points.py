"""Victims by safe point (SEMANTICS "Checkpoints and safe points", rules 3, 4 and 9): an attempt's
safe point is the later of its start and its last reported checkpoint, and inside a share (and
priority) the most recent safe point goes first, the least work lost. With no checkpoints that is
the most recently started, so plans equal the old order's exactly.

The reclaim scenarios share one cluster: a and b borrow (a 2 GPUs, b 1), c's 4-GPU job breaks the cover
by one GPU (RESERVE d's 3 idle GPUs are not lendable: B 3 > L 2), so one of a's two borrowed attempts
goes (a borrows the most)."""

from __future__ import annotations

import dataclasses

from hypothesis import given

from quotas.engine import state
from quotas.engine.policy import PRIORITY, RECLAIM, RESERVE, Engine, RunningView, plan
from tests.quotas.test_policy import job, node, on, running, share, snap
from tests.quotas.test_policy_properties import SETTINGS, snapshots
from tests.quotas.test_policy_victims import VICTIM_SETTINGS, contended


def victims(p) -> list[tuple[str, str]]:
    return [(x.attempt_id, x.reason) for x in p.preemptions]


def ckpt(run: RunningView, at: float | None) -> RunningView:
    return dataclasses.replace(run, last_checkpoint_at=at)


def _reclaim(a1_checkpoint: float | None = None, a1_prio: int = 0, a1_submitted: float = 1, a2_prio: int = 0):
    return snap(
        [node("n1", 4), node("n2", 4), node("n3", 4)],
        [share("a", 1), share("b", 1), share("c", 6), share("d", 4, RESERVE)],
        runs=[
            running("a-own", "a", on("n1", 0)),
            ckpt(
                running(
                    "a-1", "a", on("n1", 1), prio=a1_prio, started=1, submitted=a1_submitted, borrowed=True
                ),
                a1_checkpoint,
            ),
            running("a-2", "a", on("n1", 2), prio=a2_prio, started=2, borrowed=True),
            running("b-own", "b", on("n1", 3)),
            running("b-1", "b", on("n2", 0), started=3, borrowed=True),
        ],
        queued=[job("c1", "c", 4, submitted=5)],
        now=5,
    )


def test_without_checkpoints_the_most_recently_started_goes():
    assert victims(plan(_reclaim())) == [("a-2", RECLAIM)]


def test_reclaim_takes_the_attempt_with_the_most_recent_safe_point_first():
    # a-1 started first but saved its state at t=4: stopping it loses 1 s of work, a-2 would lose 3 s.
    assert victims(plan(_reclaim(a1_checkpoint=4))) == [("a-1", RECLAIM)]


def test_a_checkpoint_before_the_start_counts_as_none():
    # A report older than the attempt (its previous attempt's): a-1's safe point is its start, t=1.
    assert victims(plan(_reclaim(a1_checkpoint=0.5))) == [("a-2", RECLAIM)]
    assert running("x", "a", on("n1", 0), started=7).safe_point == 7
    assert ckpt(running("x", "a", on("n1", 0), started=7), 3).safe_point == 7
    assert ckpt(running("x", "a", on("n1", 0), started=7), 9).safe_point == 9


def test_equal_safe_points_fall_to_the_one_later_in_queue_order():
    # a-1 checkpointed at t=2, when a-2 started: equal safe points. Rule 8: the later submission goes,
    # whichever started later.
    assert victims(plan(_reclaim(a1_checkpoint=2, a1_submitted=1))) == [("a-2", RECLAIM)]
    assert victims(plan(_reclaim(a1_checkpoint=2, a1_submitted=3))) == [("a-1", RECLAIM)]


def test_the_lowest_priority_still_goes_first_whatever_it_loses():
    # a-1 (priority 0) saved nothing since t=1; a-2 (priority 1) checkpointed more recently... and
    # still a-1 goes: priority comes before the safe point.
    assert victims(plan(_reclaim(a2_prio=1))) == [("a-1", RECLAIM)]
    assert victims(plan(_reclaim(a1_checkpoint=4, a1_prio=1))) == [("a-2", RECLAIM)]


def test_the_share_order_comes_before_safe_points():
    # b's attempt checkpointed just now (it would lose nothing) but a borrows the most: a's goes.
    s = _reclaim()
    s = dataclasses.replace(s, running=tuple(ckpt(r, 5) if r.attempt_id == "b-1" else r for r in s.running))
    assert victims(plan(s)) == [("a-2", RECLAIM)]


def test_in_share_victims_are_the_lowest_priority_then_the_most_recent_safe_point():
    # Share a (in-share pre-emption) holds its capacity of 3 with priority-0 work; its priority-5 job
    # needs one GPU. lo-1 started first but checkpointed at t=8: it loses the least and goes.
    def in_share(lo1_checkpoint):
        return snap(
            [node("n1", 3)],
            [share("a", 3, isp=True)],
            runs=[
                ckpt(running("lo-1", "a", on("n1", 0), started=1), lo1_checkpoint),
                running("lo-2", "a", on("n1", 1), started=5),
                running("mid", "a", on("n1", 2), prio=3, started=0),
            ],
            queued=[job("hi", "a", 1, prio=5, submitted=9)],
            now=10,
        )

    assert victims(plan(in_share(None))) == [("lo-2", PRIORITY)]
    assert victims(plan(in_share(8))) == [("lo-1", PRIORITY)]


def test_a_reported_checkpoint_moves_the_attempt_in_the_engines_kept_order():
    engine = Engine.from_snapshot(_reclaim())
    assert victims(engine.plan(5)) == [("a-2", RECLAIM)]
    before = engine.running["a-1"]
    view = engine.checkpoint("a-1", 4)
    assert view == dataclasses.replace(before, last_checkpoint_at=4)  # every other field kept
    assert view.safe_point == 4 and engine.running["a-1"] is view
    assert victims(engine.plan(5)) == [("a-1", RECLAIM)]
    assert engine.plan(5).preemptions == plan(engine.snapshot(5)).preemptions
    # An older report changes nothing; a later one moves it again.
    assert engine.checkpoint("a-1", 3).last_checkpoint_at == 4
    engine.checkpoint("a-2", 4.5)
    assert victims(engine.plan(5)) == [("a-2", RECLAIM)]


def test_a_checkpoint_told_for_later_moves_the_attempt_before_the_pass_chooses_a_victim():
    # The simulator's way (Engine.checkpoint_later): nothing is applied until a pass reads a victim
    # order, and then all of it; a view asked of current() has it; an attempt that ends drops it.
    engine = Engine.from_snapshot(_reclaim())
    assert victims(engine.plan(5)) == [("a-2", RECLAIM)]  # (its kept state built: no rebuild applies them)
    engine.checkpoint_later("a-1", 3)
    engine.checkpoint_later("a-1", 4)
    engine.checkpoint_later("a-1", 2)  # older than the one told: changes nothing
    assert engine.running["a-1"].last_checkpoint_at is None  # not applied yet
    assert victims(engine.plan(5)) == [("a-1", RECLAIM)]
    assert engine.running["a-1"].last_checkpoint_at == 4
    engine.checkpoint_later("a-2", 4.5)
    assert engine.current("a-2").safe_point == 4.5
    assert victims(engine.plan(5)) == [("a-2", RECLAIM)]
    engine.checkpoint_later("b-1", 5)
    engine.remove_running("b-1")
    assert "b-1" not in {r.attempt_id for r in engine.snapshot(5).running}


def _old_victim_key(run: RunningView) -> tuple:
    # The order before safe points (issue 26): lowest priority, most recently started, rule 8.
    return (-run.priority, run.started_at, run.submitted_at, run.job_id, run.attempt_id)


def _without_checkpoints(snapshot):
    return dataclasses.replace(snapshot, running=tuple(ckpt(r, None) for r in snapshot.running))


@VICTIM_SETTINGS
@given(contended())
def test_property_without_checkpoints_victims_are_the_old_orders(snapshot):
    snapshot = _without_checkpoints(snapshot)
    now = plan(snapshot)
    original = state.victim_key
    state.victim_key = _old_victim_key
    try:
        before = plan(snapshot)
    finally:
        state.victim_key = original
    assert now.preemptions == before.preemptions
    assert now.admissions == before.admissions
    assert now.reserved == before.reserved


@SETTINGS
@given(snapshots())
def test_property_without_checkpoints_whole_plans_are_the_old_orders(snapshot):
    snapshot = _without_checkpoints(snapshot)
    now = plan(snapshot)
    original = state.victim_key
    state.victim_key = _old_victim_key
    try:
        before = plan(snapshot)
    finally:
        state.victim_key = original
    assert (now.admissions, now.preemptions, now.reserved) == (
        before.admissions,
        before.preemptions,
        before.reserved,
    )
    assert dict(now.waiting) == dict(before.waiting)
