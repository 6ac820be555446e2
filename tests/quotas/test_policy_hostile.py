"""plan() on hostile snapshots (issue 8): huge counts, empty capacity, shares and jobs that reference
nothing, absurd times, thousands of shares. It never raises and never breaks an invariant of
SEMANTICS.md (the checks are those of test_policy_properties, on inputs no sane cluster produces)."""

from __future__ import annotations

import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotas.engine.policy import (
    LEND,
    LEND_AND_BORROW,
    PRIORITY,
    RECLAIM,
    RESERVE,
    STRATEGIES,
    NodeView,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
    borrowed_attempts,
    plan,
)
from tests.quotas.test_policy_properties import _bcap, _used, after, deficit, types_of

HOSTILE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
HUGE = (2**31 - 1, 10**12, 2**62)
TYPES = ("a10g", "h100")


@st.composite
def hostile(draw) -> Snapshot:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    nodes = [
        NodeView(
            name=f"n{i}",
            gpu_type=rng.choice(TYPES),
            gpus=rng.choice((1, 2, 8, 64, 1024)),  # 0-GPU nodes: see the xfail below
            schedulable=rng.random() < 0.7,
        )
        for i in range(draw(st.integers(0, 12)))
    ]
    shares = [
        ShareView(
            name=f"s{i}",
            capacity={t: rng.choice((0, 1, 3, 8, *HUGE)) for t in (*TYPES, "tpu") if rng.random() < 0.6},
            strategy=rng.choice(STRATEGIES),
            borrow_limit=rng.choice((-1, 0, 1, 50, 100, 1000, *HUGE)),
            in_share_preemption=rng.random() < 0.5,
        )
        for i in range(draw(st.integers(0, 8)))
    ]
    names = [s.name for s in shares] + ["deleted-share"]
    times = (0.0, -1e12, 1.0, 5000.0, 1e10, 1e12)
    running, free = [], {n.name: list(range(n.gpus)) for n in nodes}
    for n in nodes:
        while free[n.name] and rng.random() < 0.6:
            k = min(len(free[n.name]), rng.choice((1, 2, 8, 1024)))
            idx = tuple(sorted(rng.sample(free[n.name], k)))
            for x in idx:
                free[n.name].remove(x)
            preempting = rng.random() < 0.2
            running.append(
                RunningView(
                    attempt_id=len(running) + 1,
                    job_id=10**9 + len(running),
                    share=rng.choice(names),
                    gpu_type=n.gpu_type,
                    priority=rng.choice((0, 1, 9999)),
                    submitted_at=rng.choice(times),
                    started_at=rng.choice(times),
                    placement=((n.name, idx),),
                    borrowed=rng.random() < 0.5,
                    preempting=preempting,
                    beneficiary_job_id=rng.choice((None, 1, 2, 999)) if preempting else None,
                )
            )
    queued = [
        QueuedView(
            job_id=j,
            share=rng.choice(names + ["never-existed"]),
            gpu_type=rng.choice((*TYPES, "tpu")),
            gpus=rng.choice((0, -5, 1, 1, 2, 3, 8, 1024, 1025, 2048, *HUGE)),
            priority=rng.choice((0, 1, 9999)),
            submitted_at=rng.choice(times),
            beneficiary=rng.random() < 0.2,
        )
        for j in range(draw(st.integers(0, 30)))
    ]
    return Snapshot(
        now=rng.choice(times),
        nodes=tuple(nodes),
        shares=tuple(shares),
        running=tuple(running),
        queued=tuple(queued),
        starvation_s=rng.choice((0.0, 1.0, 3600.0, 1e12)),
    )


def check(snapshot: Snapshot) -> None:
    """Everything the invariants say about one plan of `snapshot`."""
    p = plan(snapshot)
    queue = {q.job_id: q for q in snapshot.queued}
    runs = {r.attempt_id: r for r in snapshot.running}
    shares = {s.name: s for s in snapshot.shares}
    nodes = {n.name: n for n in snapshot.nodes}

    admitted = [a.job_id for a in p.admissions]
    assert len(admitted) == len(set(admitted))
    assert set(admitted) | set(p.waiting) == set(queue) and set(admitted).isdisjoint(p.waiting)

    taken = {(n, i) for r in snapshot.running for n, idx in r.placement for i in idx}
    for a in p.admissions:
        q = queue[a.job_id]
        assert a.share == q.share and a.share in shares
        assert sum(len(idx) for _, idx in a.placement) == q.gpus
        for name, idx in a.placement:
            n = nodes[name]
            assert n.schedulable and n.gpu_type == q.gpu_type
            assert all(0 <= i < n.gpus for i in idx)
            assert taken.isdisjoint((name, i) for i in idx)
            taken.update((name, i) for i in idx)
        if shares[a.share].strategy in (RESERVE, LEND):
            assert not a.borrowed

    before = _used(snapshot, grace=True)
    for (name, t), u in _used(after(snapshot, p), grace=True).items():
        if name in shares and u != before.get((name, t), 0):
            cap = shares[name].capacity.get(t, 0)
            assert u <= cap + _bcap(shares[name], cap), (name, t, u)

    borrowed = borrowed_attempts(snapshot)
    ids = [x.attempt_id for x in p.preemptions]
    assert len(ids) == len(set(ids))
    for x in p.preemptions:
        r = runs[x.attempt_id]
        ben = queue[x.beneficiary_job_id]
        assert not r.preempting
        if x.reason == RECLAIM:
            assert r.attempt_id in borrowed and r.share != ben.share
        else:
            assert x.reason == PRIORITY and r.share == ben.share and r.priority < ben.priority

    done = after(snapshot, p)
    for t in types_of(snapshot):
        assert deficit(done, t) <= max(0, deficit(snapshot, t)), t


@HOSTILE
@given(hostile())
def test_plan_survives_hostile_snapshots_and_keeps_the_invariants(snapshot):
    check(snapshot)


def test_empty_everything():
    check(Snapshot(now=0.0, nodes=(), shares=()))
    check(Snapshot(now=0.0, nodes=(NodeView("n", "a10g", 0),), shares=(ShareView("s", {}),)))
    check(
        Snapshot(
            now=0.0,
            nodes=(),
            shares=(ShareView("s", {"a10g": 2**62}, LEND_AND_BORROW, 2**62),),
            queued=(QueuedView(1, "s", "a10g", 2**62, 9999, 0.0),),
        )
    )


def test_thousands_of_shares_in_reasonable_time():
    rng = random.Random(8)
    nodes = tuple(NodeView(f"n{i}", rng.choice(TYPES), rng.choice((4, 8))) for i in range(300))
    shares = tuple(
        ShareView(
            f"s{i}",
            {t: rng.choice((0, 1, 2, 8)) for t in TYPES},
            rng.choice(STRATEGIES),
            rng.choice((-1, 0, 100)),
        )
        for i in range(3000)
    )
    queued = tuple(
        QueuedView(
            j,
            f"s{rng.randrange(3000)}",
            rng.choice(TYPES),
            rng.choice((1, 2, 4, 8, 16)),
            rng.randrange(10),
            float(j),
        )
        for j in range(6000)
    )
    snapshot = Snapshot(now=1e6, nodes=nodes, shares=shares, queued=queued)
    t0 = time.perf_counter()
    check(snapshot)
    assert time.perf_counter() - t0 < 60


def test_the_forecast_replays_with_real_and_simulated_attempts_together():
    # Replayed attempts get ids of the same type as real ones (the planner breaks ties by id), so a
    # forecast over running work gives ETAs instead of falling back to the plain queue order.
    from quotas.engine.forecast import forecast

    node = NodeView("n1", "a10g", 2)
    share = ShareView("s", {"a10g": 2})
    snap = Snapshot(
        now=0.0,
        nodes=(node,),
        shares=(share,),
        running=(RunningView(7, 7, "s", "a10g", 0, 0.0, 0.0, (("n1", (0, 1)),), False),),
        queued=tuple(QueuedView(j, "s", "a10g", 1, 0, float(j)) for j in (9, 10, 11)),
    )
    result = forecast(snap, runtime_s={7: 100, 9: 50, 10: 50, 11: 50})
    assert result.planned
    assert result.eta == {9: 100.0, 10: 100.0, 11: 150.0}


def test_a_node_without_gpus_admits_nothing_and_says_why():
    node = NodeView("n1", "a10g", 0)
    decided = plan(
        Snapshot(
            now=1.0,
            nodes=(node,),
            shares=(ShareView("s", {"a10g": 2}),),
            queued=(QueuedView(1, "s", "a10g", 2, 0, 0.0),),
        )
    )
    assert decided.admissions == () and decided.preemptions == ()
    assert decided.waiting[1]
