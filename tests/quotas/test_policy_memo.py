"""plan()'s memos (node tables per GPU type, GPU index masks) never change a decision: a plan is the
same whether the memos are cold or were filled by other snapshots, and odd placements (a GPU listed
twice, an index outside the node, a node gone from the snapshot) count as before."""

from hypothesis import given
from hypothesis import strategies as st

from quotas.engine import policy
from quotas.engine.policy import NodeView, QueuedView, RunningView, ShareView, Snapshot, plan

from .test_policy_properties import SETTINGS, snapshots


def cold_plan(snapshot: Snapshot) -> policy.Plan:
    policy.NODE_TABLES.clear()
    policy.MASKS.clear()
    return plan(snapshot)


@SETTINGS
@given(st.lists(snapshots(), min_size=2, max_size=4))
def test_a_plan_does_not_depend_on_what_was_planned_before(snaps):
    cold = [cold_plan(s) for s in snaps]
    policy.NODE_TABLES.clear()
    warm = [plan(s) for s in snaps]
    assert warm == cold


def test_a_changed_node_list_is_not_served_from_the_memo():
    shares = (ShareView(name="a", capacity={"a10g": 8}),)
    queued = (QueuedView(job_id=1, share="a", gpu_type="a10g", gpus=4, priority=0, submitted_at=0.0),)
    ready = Snapshot(now=1.0, nodes=(NodeView("n1", "a10g", 4),), shares=shares, queued=queued)
    cordoned = Snapshot(
        now=1.0, nodes=(NodeView("n1", "a10g", 4, schedulable=False),), shares=shares, queued=queued
    )
    assert [a.job_id for a in plan(ready).admissions] == [1]
    assert plan(cordoned).admissions == ()
    assert [a.job_id for a in plan(ready).admissions] == [1]


def test_odd_placements_count_each_gpu_once_for_the_first_holder():
    nodes = (NodeView("n1", "a10g", 4), NodeView("n2", "a10g", 4))
    shares = (ShareView(name="a", capacity={"a10g": 16}),)  # usage counts every listed index: 9

    def run(aid, placement):
        return RunningView(
            attempt_id=aid,
            job_id=aid,
            share="a",
            gpu_type="a10g",
            priority=0,
            submitted_at=0.0,
            started_at=0.0,
            placement=placement,
            borrowed=False,
        )

    running = (
        run("r1", (("n1", (0, 0, 7, -1)),)),  # GPU 0 twice, 7 and -1 outside the node: holds n1:0
        run("r2", (("n1", (0, 1)), ("gone", (0,)))),  # n1:0 is r1's; a node not in the snapshot
        run("r3", [("n2", [0, 1])]),  # lists instead of tuples
    )
    queued = tuple(
        QueuedView(job_id=f"q{k}", share="a", gpu_type="a10g", gpus=2, priority=0, submitted_at=float(k))
        for k in (1, 2)
    )
    p = plan(Snapshot(now=1.0, nodes=nodes, shares=shares, running=running, queued=queued))
    placed = sorted(idx for a in p.admissions for _, idx in a.placement)
    # n1 has 2, 3 free, n2 has 2, 3 free: both 2-GPU jobs fit.
    assert placed == [(2, 3), (2, 3)]
