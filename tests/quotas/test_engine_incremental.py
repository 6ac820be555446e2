"""The engine kept between passes (policy.Engine) plans exactly what plan() plans from the equivalent
snapshot: after every event of random histories, and for whole simulations of generated traces and of
the example scenarios. Plans read long after they were made (their lazy waiting reasons) still say
what they said when they were made."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotas.engine import policy, reasons, rules, tracegen
from quotas.engine import scenario as sc
from quotas.engine.policy import Engine, NodeView, QueuedView, RunningView, ShareView, plan
from quotas.engine.simulate import simulate
from quotas.engine.state import PassOutput

from .test_policy_properties import SETTINGS, snapshots

HERE = Path(__file__).resolve().parent


def _queues(engine: Engine) -> dict:
    """Each GPU type's queue structures per share as the engine keeps them (empty while it is to be
    rebuilt); shares and types with nothing queued are left out (a rebuild may not know them)."""
    if engine._sh is None:
        return {}
    out = {}
    for t, base in engine._bases.items():
        base.victim_orders()  # what a pass that looks for victims refreshes first
        for s, name in enumerate(engine._sh.names):
            if base.vlist[s]:  # rule 3's order of the share's borrowed attempts
                out[(t, name, "rule 3")] = [a.view.attempt_id for a in base.vlist[s]]
            if base.atts[s] or base.pgpus[s]:  # the attempts in the victim order and rule 8's order
                out[(t, name, "orders")] = (
                    [a.view.attempt_id for a in base.vatts[s]],
                    base.vnprio[s],
                    [a.view.attempt_id for a in base.batts[s]],
                    base.pgpus[s],  # GPUs held per priority
                )
            if base.keys[s] or base.by_size[s]:
                out[(t, name)] = (
                    base.keys[s],
                    [job.job_id for job in base.q[s]],
                    base.suf[s],
                    base.by_size[s],
                )
        if base.size:  # the count of wholly free nodes and of free GPUs, kept as attempts start and end
            out[(t, "whole")] = base.whole
            out[(t, "free")] = base.free_total
        if base.qinfo or base.bens or base.waiting:
            out[t] = ({j: key for j, (_, key) in base.qinfo.items()}, base.bens, set(base.waiting))
    return out


def _check(engine: Engine, now: float, kept: list) -> policy.Plan:
    kept_queues = _queues(engine)
    if kept_queues:  # the queues kept through events are the ones a rebuild makes
        rebuilt_engine = Engine.from_snapshot(engine.snapshot(now))
        rebuilt_engine._state()
        assert kept_queues == _queues(rebuilt_engine)
    incremental = engine.plan(now)
    rebuilt = plan(engine.snapshot(now))
    assert incremental.admissions == rebuilt.admissions
    assert incremental.preemptions == rebuilt.preemptions
    assert incremental.reserved == rebuilt.reserved
    assert (incremental.protected, incremental.recheck_at) == (rebuilt.protected, rebuilt.recheck_at)
    assert engine.usage() == policy.usage(engine.snapshot(now))
    # Read the incremental plan's reasons only at the end, after later events changed the engine.
    kept.append((incremental, dict(rebuilt.waiting)))
    return incremental


def _apply(engine: Engine, decided: policy.Plan, now: float, rng: random.Random, lazy: bool = False) -> None:
    """What the simulator and the control side do with a plan: admissions start, victims pre-empt
    (and now and then stop at once, their jobs re-queued), beneficiaries are flagged. `lazy`: the
    checkpoints were told for later (Engine.checkpoint_later), so a victim's view is asked of current()
    as the simulator does."""
    # Admissions leave the queue one by one (the simulator) or all at once (the forecast's replay).
    at_once = rng.random() < 0.5
    jobs = {a.job_id: engine.queued[a.job_id] for a in decided.admissions}
    if at_once:
        engine.remove_queued_many(list(jobs))
    for a in decided.admissions:
        job = jobs[a.job_id] if at_once else engine.remove_queued(a.job_id)
        engine.add_running(
            RunningView(
                attempt_id=f"{a.job_id}@{now:g}",
                job_id=a.job_id,
                share=a.share,
                gpu_type=job.gpu_type,
                priority=job.priority,
                submitted_at=job.submitted_at,
                started_at=now,
                placement=a.placement,
                borrowed=a.borrowed,
            )
        )
    for x in decided.preemptions:
        run = engine.current(x.attempt_id) if lazy else engine.running[x.attempt_id]
        if rng.random() < 0.3:
            engine.remove_running(x.attempt_id)
            engine.add_queued(
                QueuedView(run.job_id, run.share, run.gpu_type, run.gpus, run.priority, run.submitted_at)
            )
        else:
            engine.add_running(
                dataclasses.replace(run, preempting=True, beneficiary_job_id=x.beneficiary_job_id)
            )
        ben = engine.queued.get(x.beneficiary_job_id)
        if ben is not None and not ben.beneficiary:
            engine.add_queued(dataclasses.replace(ben, beneficiary=True))


def _event(engine: Engine, now: float, rng: random.Random, serial: int, lazy: bool = False) -> None:
    kind = rng.choice(
        (
            "submit",
            "submit",
            "cancel",
            "cancel_many",
            "end",
            "end",
            "priority",
            "node",
            "share",
            "collide",
            "checkpoint",
            "checkpoint",
        )
    )
    queued, running = list(engine.queued.values()), list(engine.running.values())
    types = sorted({n.gpu_type for n in engine.nodes}) or ["a10g"]
    shares = [s.name for s in engine.shares]
    if kind == "submit" or (kind == "cancel" and not queued) or (kind == "priority" and not queued):
        engine.add_queued(
            QueuedView(
                job_id=f"n{serial}",
                share=rng.choice(shares + ["ghost"] if rng.random() < 0.05 else shares),
                gpu_type=rng.choice(types + ["tpu"] if rng.random() < 0.03 else types),
                gpus=rng.choice((1, 1, 2, 4, 8, 16)),
                priority=rng.randint(0, 3),
                submitted_at=now - rng.uniform(0, 7200),
                beneficiary=rng.random() < 0.05,
            )
        )
    elif kind == "cancel":
        engine.remove_queued(rng.choice(queued).job_id)
    elif kind == "cancel_many" and queued:
        # Some queue's first jobs (what remove_jobs slices off) and a few others.
        head = sorted(queued, key=policy.queue_key)[: rng.randint(1, len(queued))]
        gone = {q.job_id for q in head if rng.random() < 0.8} | {rng.choice(queued).job_id}
        engine.remove_queued_many(sorted(gone))
    elif kind == "priority":
        job = rng.choice(queued)
        engine.add_queued(dataclasses.replace(job, priority=rng.randint(0, 5)))
    elif kind == "end" and running:
        engine.remove_running(rng.choice(running).attempt_id)
    elif kind == "node" and engine.nodes:
        nodes = list(engine.nodes)
        i = rng.randrange(len(nodes))
        if rng.random() < 0.2:
            del nodes[i]
        else:
            nodes[i] = dataclasses.replace(nodes[i], schedulable=not nodes[i].schedulable)
        engine.set_nodes(nodes)
    elif kind == "share" and engine.shares:
        all_shares = list(engine.shares)
        i = rng.randrange(len(all_shares))
        t = rng.choice(types)
        cap = dict(all_shares[i].capacity)
        cap[t] = rng.randint(0, 16)
        all_shares[i] = dataclasses.replace(all_shares[i], capacity=cap)
        engine.set_shares(all_shares)
    elif kind == "checkpoint" and running:
        # A checkpoint moves the attempt's safe point, and it in the kept victim orders (now and then
        # a stale report from before its start, or one older than its last: neither moves it).
        run = rng.choice(running)
        at = rng.uniform(run.started_at - 100, max(run.started_at, now))
        if lazy:
            engine.checkpoint_later(run.attempt_id, at)
        else:
            engine.checkpoint(run.attempt_id, at)
    elif kind == "collide" and running:
        other = rng.choice(running)  # a second claim on GPUs someone holds: the engine rebuilds
        if lazy:
            other = engine.current(other.attempt_id)  # (its view with the checkpoints told for later)
        engine.add_running(dataclasses.replace(other, attempt_id=f"c{serial}", job_id=f"c{serial}"))


@SETTINGS
@given(snapshots(queued=(0, 12)), st.integers(0, 2**32 - 1))
def test_engine_plans_what_a_rebuilt_snapshot_plans_after_every_event(snapshot, seed):
    rng = random.Random(seed)
    engine = Engine.from_snapshot(snapshot)
    now = snapshot.now
    kept: list = []
    for serial in range(25):
        decided = _check(engine, now, kept)
        if rng.random() < 0.6:
            _apply(engine, decided, now, rng)
        else:
            _event(engine, now, rng, serial)
        now += rng.choice((0, 0, 1, 600, 4000))
    _check(engine, now, kept)
    for incremental, waiting in kept:
        assert dict(incremental.waiting) == waiting


@SETTINGS
@given(snapshots(queued=(0, 12)), st.integers(0, 2**32 - 1))
def test_checkpoints_told_for_later_decide_as_checkpoints_told_at_once(snapshot, seed):
    # The simulator tells the engine its checkpoints for later (applied only when a pass reads a victim
    # order): every plan, reasons included, must be the one the engine told at once makes.
    eager, lazy = Engine.from_snapshot(snapshot), Engine.from_snapshot(snapshot)
    r1, r2 = random.Random(seed), random.Random(seed)
    now = snapshot.now
    for serial in range(25):
        a, b = eager.plan(now), lazy.plan(now)  # the lazy one first: no snapshot applies them before
        for field in ("admissions", "preemptions", "reserved", "protected", "recheck_at"):
            assert getattr(a, field) == getattr(b, field), field
        assert dict(a.waiting) == dict(b.waiting)
        if r1.random() < 0.6:
            r2.random()
            _apply(eager, a, now, r1)
            _apply(lazy, b, now, r2, lazy=True)
        else:
            r2.random()
            _event(eager, now, r1, serial)
            _event(lazy, now, r2, serial, lazy=True)
        step = r1.choice((0, 0, 1, 600, 4000))
        assert r2.choice((0, 0, 1, 600, 4000)) == step
        now += step
    assert eager.snapshot(now) == lazy.snapshot(now)


def _scenario_json(result) -> str:
    return result.to_json()


@pytest.mark.parametrize("seed", [1, 2])
def test_simulator_results_are_the_same_with_the_engine_as_with_snapshots(seed):
    scenario = sc.parse(tracegen.generate(teams=6, gpus=128, jobs=800, seed=seed))
    with_engine = simulate(scenario)
    from_snapshots = simulate(scenario, planner=policy.plan)
    assert _scenario_json(with_engine) == _scenario_json(from_snapshots)


@pytest.mark.parametrize("path", sorted((HERE / "scenarios").glob("*.json")), ids=lambda p: p.name)
def test_example_scenarios_simulate_the_same_with_the_engine(path):
    scenario = sc.parse(json.loads(path.read_text()))
    assert simulate(scenario).to_json() == simulate(scenario, planner=policy.plan).to_json()


def test_a_node_change_rebuilds_and_still_plans_like_a_snapshot():
    shares = (ShareView(name="a", capacity={"a10g": 8}),)
    engine = Engine(nodes=(NodeView("n1", "a10g", 4),), shares=shares)
    engine.add_queued(QueuedView("j1", "a", "a10g", 4, 0, 0.0))
    assert [a.job_id for a in engine.plan(1.0).admissions] == ["j1"]
    engine.set_nodes((NodeView("n1", "a10g", 4, schedulable=False),))
    assert engine.plan(1.0).admissions == ()
    assert "j1" in engine.plan(1.0).waiting


def test_a_kept_plan_still_gives_its_own_reasons_after_both_queues_change():
    # Two RESERVE shares at capacity: their waiting reasons are written only when read, from the
    # queues as they were; later events change both queues (one job leaves, one jumps the queue).
    shares = (
        ShareView(name="a", capacity={"a10g": 1}, strategy=policy.RESERVE),
        ShareView(name="b", capacity={"a10g": 1}, strategy=policy.RESERVE),
    )
    engine = Engine(nodes=(NodeView("n1", "a10g", 2),), shares=shares)
    for share in ("a", "b"):
        engine.add_running(
            RunningView(
                f"r{share}",
                f"r{share}",
                share,
                "a10g",
                0,
                0.0,
                0.0,
                (("n1", (0 if share == "a" else 1,)),),
                False,
            )
        )
        for i in range(3):
            engine.add_queued(QueuedView(f"{share}{i}", share, "a10g", 1, 0, float(i)))
    kept = engine.plan(10.0)
    expected = dict(plan(engine.snapshot(10.0)).waiting)
    engine.remove_queued("a0")
    engine.add_queued(QueuedView("b-urgent", "b", "a10g", 1, 5, 9.0))
    engine.plan(11.0)  # a later plan, read at once
    engine.remove_queued("b1")
    assert dict(kept.waiting) == expected


@pytest.mark.parametrize("seed", [1, 2])
def test_reasons_read_late_are_the_ones_written_at_once_along_a_generated_trace(seed):
    """Phase C skips jobs that wait the same way as the one before them and leaves their reasons, with
    the numbers of that moment, for when they are read: along a whole simulation (queues of every
    size, borrow limits, lendable GPUs running out), each plan's late reasons must be the sentences
    the pass writes at once."""
    scenario = sc.parse(tracegen.generate(teams=6, gpus=128, jobs=1500, seed=seed))
    compared = 0

    def planner(snapshot):
        nonlocal compared
        lazy = policy.plan(snapshot)
        reasons.LAZY_REASONS = False
        try:
            eager = policy.plan(snapshot)
        finally:
            reasons.LAZY_REASONS = True
        assert dict(lazy.waiting) == dict(eager.waiting)
        compared += len(eager.waiting)
        return lazy

    simulate(scenario, planner=planner)
    assert compared > 10_000


SCENARIOS = HERE.parents[2] / "shared" / "scenarios"


def _cyclic_garbage(run) -> list[str]:
    """The type names of what the cyclic collector finds after `run()` (run with it disabled)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        gc.set_debug(gc.DEBUG_SAVEALL)
        run()
        gc.collect()
        return [type(o).__name__ for o in gc.garbage]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("profiled", [False, True])
@pytest.mark.parametrize(
    "scenario",
    [
        lambda: sc.parse(tracegen.generate(teams=4, gpus=64, jobs=300, seed=3)),
        # groups: the organisation's accounting refers back to the simulator
        lambda: sc.parse(json.loads((SCENARIOS / "two-departments-lend-limit.json").read_text())),
    ],
    ids=["flat", "groups"],
)
def test_a_simulation_leaves_no_reference_cycle_so_all_it_made_is_freed_at_once(scenario, profiled):
    """Nothing a simulation makes is left for the cyclic collector: not a pass (a plan nobody reads,
    most of the simulator's and the forecast's, is freed by reference counting: collecting passes was
    ~15 % of a 100k-job simulation), nor the simulator, its engine and its jobs once the result is made
    (found by the collector, they cost a walk over all the run kept: 0.9 s of tracegen 100k). The
    collector's pause moves what the run kept to the oldest generation on that promise
    (collector.paused(promote=True))."""
    from quotas.engine.simulate import Profile

    made = scenario()
    left = _cyclic_garbage(lambda: simulate(made, profile=Profile() if profiled else None))
    assert left == []


def test_a_promoting_pause_moves_what_it_kept_to_the_oldest_generation_and_keeps_a_freeze():
    """collector.paused(promote=True): what the pause made and kept is in the oldest generation after
    it, and no collection walks it as the collector comes back (one does after a plain pause: 5,000
    young objects are over the young generation's threshold); objects the process had frozen itself
    (a web worker's, config/wsgi.py) stay frozen, and then nothing is moved."""
    import gc

    from quotas.engine import collector

    def collections_around(promote: bool) -> tuple[list, list]:
        seen: list[int] = []

        def heard(phase, info):
            if phase == "start":
                seen.append(info["generation"])

        gc.callbacks.append(heard)
        try:
            with collector.paused(promote=promote):
                assert not gc.isenabled()
                kept = [[i] for i in range(5000)]
            assert gc.isenabled()
            [[i] for i in range(100)]  # under the threshold: collects only what was left young
        finally:
            gc.callbacks.remove(heard)
        return kept, seen

    was_frozen = gc.get_freeze_count()
    gc.unfreeze()
    try:
        kept, seen = collections_around(promote=True)
        assert seen == []
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert id(kept[0]) in oldest and id(kept[-1]) in oldest
        assert gc.get_freeze_count() == 0

        young, seen = collections_around(promote=False)
        assert seen  # the young generation's collection, walking all the pause made

        marker = [[i] for i in range(10)]
        gc.freeze()
        frozen = gc.get_freeze_count()
        more, seen = collections_around(promote=True)
        # the process's freeze left as it was (give or take an object freed): not undone, not added to
        assert abs(gc.get_freeze_count() - frozen) < 100
        assert seen and marker and young and more
    finally:
        gc.unfreeze()
        if was_frozen:
            gc.freeze()


@pytest.mark.engine_as_python  # patches the engine (tests/conftest.py)
def test_a_starving_gangs_nodes_read_from_the_buckets_are_the_best_ranked_of_all(monkeypatch):
    """_most_available reads the nodes with the most GPUs free or being freed level by level; it must
    pick what ranking every node of the largest size picks (most available, then name)."""
    calls = []
    most_available = rules.TypePass._most_available

    def checked(tp, k):
        got = most_available(tp, k)
        ranked = sorted(tp.largest_nodes, key=lambda i: (-(tp.free_u[i] + tp.pend_u[i]), i))[:k]
        assert got == ranked
        calls.append(k)
        return got

    monkeypatch.setattr(rules.TypePass, "_most_available", checked)
    for seed in (1, 2, 3):
        simulate(sc.parse(tracegen.generate(teams=4, gpus=64, jobs=600, seed=seed)))
    assert calls  # the case was reached (fewer than k nodes with any: the test below)


def test_a_node_with_gpus_being_freed_ranks_by_free_plus_freed_once():
    # n1: 1 free + 2 being freed (3), n2: 2 free, n3: none. Ranked: n1, n2; a third has nothing.
    nodes = tuple(NodeView(f"n{i}", "a10g", 4) for i in (1, 2, 3))
    engine = Engine(nodes=nodes, shares=(ShareView(name="a", capacity={"a10g": 12}),))
    runs = [
        ("r1", (("n1", (0, 1)),), True),
        ("r2", (("n1", (2,)),), False),
        ("r3", (("n2", (0, 1)),), False),
        ("r4", (("n3", (0, 1, 2, 3)),), False),
    ]
    for attempt, placement, preempting in runs:
        engine.add_running(
            RunningView(attempt, attempt, "a", "a10g", 0, 0.0, 0.0, placement, False, preempting=preempting)
        )
    _, bases = engine._state()
    tp = rules.TypePass(bases["a10g"], 10.0, 3600, set(), PassOutput())
    assert tp._most_available(2) == [0, 1]
    assert tp._most_available(3) == [0, 1, 2]  # n3 has nothing, and is next by name
