"""Rule 11's bound per job (FAIR_RECLAIM_MAX_PER_JOB) in the forecast's replay: the count of earlier
attempts a fair reclaim pre-empted goes with the job through the replay, so the forecast does not expect a
fair reclaim to take a job the engine will leave alone."""

from __future__ import annotations

from quotas.engine import forecast as fc
from quotas.engine.views import (
    ADMITTED_OWN,
    FAIR_SHARE,
    LEND_AND_BORROW,
    Admission,
    NodeView,
    Plan,
    Preemption,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
)


def _snapshot(running=(), queued=()):
    return Snapshot(
        now=100.0,
        nodes=(NodeView("n1", "a10g", 1),),
        shares=(ShareView("a", {"a10g": 1}, LEND_AND_BORROW), ShareView("b", {"a10g": 0}, LEND_AND_BORROW)),
        running=tuple(running),
        queued=tuple(queued),
    )


class Recorder:
    """A stand-in planner: admits the first queued job on n1 whenever n1 is free, pre-empts for fair
    share where told, and keeps every snapshot it was shown."""

    def __init__(self, preempt_at: float | None = None) -> None:
        self.seen: list[Snapshot] = []
        self.preempt_at = preempt_at

    def __call__(self, snap: Snapshot) -> Plan:
        self.seen.append(snap)
        if self.preempt_at == snap.now and snap.running and not snap.running[0].preempting:
            r = snap.running[0]
            return Plan(preemptions=(Preemption(r.attempt_id, r.job_id, r.share, FAIR_SHARE, "b1", "b"),))
        if snap.running or not snap.queued:
            return Plan()
        q = min(snap.queued, key=lambda q: (q.share != "a", q.job_id))
        return Plan(admissions=(Admission(q.job_id, q.share, (("n1", (0,)),), False, ADMITTED_OWN),))


def test_a_queued_jobs_count_goes_to_the_attempt_the_replay_gives_it():
    planner = Recorder()
    snap = _snapshot(
        queued=(
            QueuedView("a1", "a", "a10g", 1, 0, 10.0, fair_reclaims=5),
            QueuedView("b1", "b", "a10g", 1, 0, 20.0),
        )
    )
    result = fc.forecast(snap, runtime_s={"a1": 60.0, "b1": 60.0}, planner=planner)
    assert result.eta == {"a1": 100.0, "b1": 160.0}
    replayed = [r for s in planner.seen for r in s.running if r.job_id == "a1"]
    assert replayed and {r.fair_reclaims for r in replayed} == {5}


def test_a_fair_reclaim_in_the_replay_adds_one_to_the_jobs_count():
    planner = Recorder(preempt_at=100.0)
    running = RunningView(7, "a1", "a", "a10g", 0, 10.0, 50.0, (("n1", (0,)),), True, fair_reclaims=2)
    snap = _snapshot(running=(running,), queued=(QueuedView("b1", "b", "a10g", 1, 0, 20.0),))
    fc.forecast(snap, runtime_s={"a1": 3600.0, "b1": 60.0}, grace_s={"a1": 30.0}, planner=planner)
    requeued = [q for s in planner.seen for q in s.queued if q.job_id == "a1"]
    assert requeued and {q.fair_reclaims for q in requeued} == {3}
