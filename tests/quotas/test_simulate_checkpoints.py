"""The simulator's checkpoints (SCENARIO.md): an attempt with `checkpoint_every_s` reports one at each
whole multiple of it since its start, the policy is told (its safe point moves), and a stop loses the
work since the last one."""

from __future__ import annotations

from quotas.engine import policy
from quotas.engine.simulate import simulate


def _two_borrowers(old_ckpt=100, new_ckpt=None):
    """Share x (capacity 1) runs three 1-GPU jobs on a 4-GPU node: one own, two borrowed, "old" (from
    t=0) and "new" (from t=50). At t=250 o's 1-GPU job breaks the cover by one GPU (x borrows 2; o's
    other idle GPU is all that is lendable, RESERVE r's is not): one of x's borrowed jobs goes, with no
    grace."""
    return {
        "settings": {"preemption_grace_s": 0},
        "nodes": [{"name": "n1", "gpu_type": "a10g", "gpus": 4}],
        "shares": [
            {"name": "x", "capacity": {"a10g": 1}},
            {"name": "o", "capacity": {"a10g": 2}},
            {"name": "r", "capacity": {"a10g": 1}, "strategy": "RESERVE"},
        ],
        "jobs": [
            {"id": "a-own", "share": "x", "submit_at": 0, "duration_s": 5000, "gpus": 1, "gpu_type": "a10g"},
            {
                "id": "old",
                "share": "x",
                "submit_at": 0,
                "duration_s": 5000,
                "gpus": 1,
                "gpu_type": "a10g",
                "checkpoint_every_s": old_ckpt,
            },
            {
                "id": "new",
                "share": "x",
                "submit_at": 50,
                "duration_s": 5000,
                "gpus": 1,
                "gpu_type": "a10g",
                "checkpoint_every_s": new_ckpt,
            },
            {"id": "o1", "share": "o", "submit_at": 250, "duration_s": 100, "gpus": 1, "gpu_type": "a10g"},
        ],
    }


def _victim(result):
    return [
        (job_id, a.start, a.end)
        for job_id, job in result.jobs.items()
        for a in job.attempts
        if a.outcome == "PREEMPTED"
    ]


def test_a_checkpointed_attempt_goes_first_because_it_loses_the_least():
    # old checkpointed at t=200 (safe point 200), new never (safe point 50): old goes and loses 50 s.
    result = simulate(_two_borrowers())
    assert _victim(result) == [("old", 0, 250)]
    assert result.cluster["lost_gpu_seconds"] == 50


def test_without_reporting_checkpoints_the_most_recently_started_goes():
    # The order before safe points, for comparisons: new (started at 50) goes and loses 200 s.
    result = simulate(_two_borrowers(), report_checkpoints=False)
    assert _victim(result) == [("new", 50, 250)]
    assert result.cluster["lost_gpu_seconds"] == 200


def test_checkpoints_are_counted_from_each_attempts_start():
    # new checkpoints every 150 s from its start at 50: at 200 (safe point 200); old's period of 300
    # gives none before 250 (safe point 0). Equal? No: new's 200 > old's 0, new goes, losing 50 s.
    result = simulate(_two_borrowers(old_ckpt=300, new_ckpt=150))
    assert _victim(result) == [("new", 50, 250)]
    assert result.cluster["lost_gpu_seconds"] == 50


def test_the_engine_is_told_every_checkpoint_and_plans_as_from_a_snapshot_of_it():
    seen = []

    def planner(snapshot):
        seen.append({r.job_id: r.last_checkpoint_at for r in snapshot.running})
        return policy.plan(snapshot)

    with_engine = simulate(_two_borrowers(new_ckpt=70))
    from_snapshots = simulate(_two_borrowers(new_ckpt=70), planner=planner)
    assert with_engine.to_json() == from_snapshots.to_json()
    # At t=250, the pass sees old's checkpoint at 200 and new's at 190 (50 + 2 x 70).
    assert {"a-own": None, "old": 200, "new": 190} in seen
