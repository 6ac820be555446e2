"""quotas.engine.forecast replays the planner's own decisions forward in virtual time (pure, no database)."""

from quotas.engine import forecast, policy
from quotas.engine.policy import (
    Admission,
    NodeView,
    Plan,
    Preemption,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
)

NODE = NodeView("n1", "a10g", 4)
SHARE = ShareView("s", {"a10g": 4})


def fifo(snapshot: Snapshot) -> Plan:
    """A stand-in planner: beneficiaries first, then queued jobs by id, first fit on the one node."""
    used = {i for r in snapshot.running for _, idx in r.placement for i in idx}
    free = [i for i in range(NODE.gpus) if i not in used]
    admissions = []
    for q in sorted(snapshot.queued, key=lambda q: (not q.beneficiary, q.job_id)):
        if q.gpus > len(free):
            break
        take, free = free[: q.gpus], free[q.gpus :]
        admissions.append(Admission(q.job_id, q.share, (("n1", tuple(take)),), False, policy.ADMITTED_OWN))
    waiting = {
        q.job_id: "needs free GPUs" for q in snapshot.queued if q.job_id not in {a.job_id for a in admissions}
    }
    return Plan(admissions=tuple(admissions), waiting=waiting)


def running(job_id, gpus, started_at, attempt_id=None):
    return RunningView(
        attempt_id or f"a{job_id}",
        job_id,
        "s",
        "a10g",
        0,
        started_at,
        started_at,
        (("n1", tuple(gpus)),),
        False,
    )


def queued(job_id, gpus, priority=0, submitted_at=0.0):
    return QueuedView(job_id, "s", "a10g", gpus, priority, submitted_at)


def snap(running_=(), queued_=(), now=1000.0):
    return Snapshot(now=now, nodes=(NODE,), shares=(SHARE,), running=tuple(running_), queued=tuple(queued_))


def test_a_job_starts_when_the_running_one_is_expected_to_end():
    s = snap([running(1, [0, 1, 2, 3], started_at=400.0)], [queued(2, 4)])
    f = forecast.forecast(s, runtime_s={1: 1000, 2: 50}, planner=fifo)
    assert f.eta == {2: 1400.0}
    assert f.positions == {2: {"in_share": 1, "overall": 1}}
    assert f.waiting == {2: "needs free GPUs"}


def test_each_job_waits_for_the_expected_end_of_the_one_before():
    s = snap([running(1, [0, 1, 2, 3], started_at=1000.0)], [queued(2, 4), queued(3, 2), queued(4, 2)])
    f = forecast.forecast(s, runtime_s={1: 100, 2: 300, 3: 10, 4: 20}, planner=fifo)
    assert f.eta == {2: 1100.0, 3: 1400.0, 4: 1400.0}


def test_a_job_without_a_runtime_uses_the_default():
    s = snap([running(1, [0, 1, 2, 3], started_at=1000.0)], [queued(2, 1)])
    assert forecast.forecast(s, runtime_s={}, default_runtime_s=60, planner=fifo).eta == {2: 1060.0}


def test_an_overdue_job_is_expected_to_end_now():
    s = snap([running(1, [0, 1, 2, 3], started_at=0.0)], [queued(2, 1)])
    assert forecast.forecast(s, runtime_s={1: 10}, planner=fifo).eta == {2: 1000.0}


def test_a_job_that_can_never_start_has_no_eta_and_comes_last():
    s = snap([], [queued(2, 8), queued(3, 1)])
    f = forecast.forecast(s, runtime_s={}, planner=lambda snap_: Plan(waiting={2: "too big"}))
    assert f.eta == {}
    assert [f.positions[j]["overall"] for j in (2, 3)] == [1, 2]


def test_targets_stop_the_replay_early():
    calls = []

    def counting(s):
        calls.append(s.now)
        return fifo(s)

    s = snap([running(1, [0, 1, 2, 3], started_at=1000.0)], [queued(j, 4) for j in range(2, 12)])
    f = forecast.forecast(s, runtime_s={}, default_runtime_s=10, planner=counting, targets=[2])
    assert f.eta == {2: 1010.0}
    assert len(calls) <= 3


def test_a_preempted_victim_frees_its_gpus_after_its_grace_and_is_queued_again():
    victim = running(1, [0, 1, 2, 3], started_at=900.0)

    def reclaim_then_fifo(s):
        if any(r.attempt_id == victim.attempt_id and not r.preempting for r in s.running):
            return Plan(preemptions=(Preemption(victim.attempt_id, 1, "s", policy.RECLAIM, 2, "s"),))
        return fifo(s)

    s = snap([victim], [queued(2, 4)])
    f = forecast.forecast(s, runtime_s={1: 10_000, 2: 100}, grace_s={1: 30}, planner=reclaim_then_fifo)
    assert f.eta == {2: 1030.0}


def test_a_failing_planner_gives_plain_queue_order():
    def broken(s):
        raise RuntimeError("a planner bug")

    s = snap(
        [],
        [
            queued(2, 1, priority=1, submitted_at=5),
            queued(3, 1, priority=9, submitted_at=9),
            queued(4, 1, priority=1, submitted_at=1),
        ],
    )
    f = forecast.forecast(s, runtime_s={}, planner=broken)
    assert f.planned is False and f.eta == {}
    assert [j for j, _ in sorted(f.positions.items(), key=lambda kv: kv[1]["overall"])] == [3, 4, 2]


def test_a_failing_planner_does_not_raise():
    def broken(s):
        raise ZeroDivisionError

    f = forecast.forecast(snap([], [queued(2, 1)]), runtime_s={}, planner=broken)
    assert f.planned is False and f.positions == {2: {"in_share": 1, "overall": 1}}


def test_the_replay_with_the_real_policy_admits_in_queue_order():
    s = snap(
        [running(1, [0, 1, 2, 3], started_at=1000.0)],
        [
            queued(2, 2, submitted_at=1),
            queued(3, 2, priority=5, submitted_at=2),
            queued(4, 4, submitted_at=3),
        ],
    )
    f = forecast.forecast(s, runtime_s={1: 100, 2: 50, 3: 70, 4: 10})
    assert f.planned
    assert f.eta == {3: 1100.0, 2: 1100.0, 4: 1170.0}
    assert [f.positions[j]["in_share"] for j in (3, 2, 4)] == [1, 2, 3]
