"""Properties of plan() on random valid snapshots (SEMANTICS "Invariants").

What "after the plan" means here: the snapshot's attempts, minus nothing, with the plan's victims
marked pre-empting and its admissions added as attempts (tests.quotas.test_policy.apply). GPUs in a
grace period count as being freed for the cover (rule 3), as SEMANTICS says; share limits count them
as used, as SEMANTICS' definition of usage says.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotas.engine.policy import (
    LEND,
    LEND_AND_BORROW,
    PRIORITY,
    RECLAIM,
    RESERVE,
    STRATEGIES,
    UNLIMITED,
    NodeView,
    Plan,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
    borrowed_attempts,
    plan,
)
from tests.quotas.test_policy import apply, settle

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TYPES = ("a10g", "h100")
NOW = 5000.0


@st.composite
def snapshots(
    draw,
    *,
    grace: bool = True,
    one_queue: bool = False,
    fresh: bool = False,
    queued: tuple[int, int] = (0, 8),
) -> Snapshot:
    """Random nodes, shares, running attempts consistent with the nodes (no GPU used twice) and
    queued jobs (between queued[0] and queued[1] of them). grace=False: no pre-empting attempts and
    no beneficiaries. one_queue: only one share has queued jobs. fresh: nobody has waited past
    starvation_s."""
    types = draw(st.lists(st.sampled_from(TYPES), min_size=1, max_size=2, unique=True))
    nodes = []
    for t in types:
        for n in range(draw(st.integers(1, 6))):
            nodes.append(
                NodeView(
                    name=f"{t}-{n}",
                    gpu_type=t,
                    gpus=draw(st.sampled_from((1, 2, 4, 8))),
                    schedulable=draw(st.booleans()) or draw(st.booleans()),
                )
            )
    total = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in types}
    shares = []
    for i in range(draw(st.integers(1, 4))):
        strategy = draw(st.sampled_from(STRATEGIES))
        shares.append(
            ShareView(
                name=f"s{i}",
                capacity={t: draw(st.integers(0, total[t])) for t in types if draw(st.booleans())},
                strategy=strategy,
                borrow_limit=draw(st.sampled_from((UNLIMITED, 0, 50, 100))),
                in_share_preemption=draw(st.booleans()),
                min_runtime_s=draw(st.sampled_from((0, 0, 600, 3000))),  # rule 10's window
            )
        )
    names = [s.name for s in shares]
    queued_ids = [f"q{i}" for i in range(draw(st.integers(*queued)))]

    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    runs = []
    free = {n.name: list(range(n.gpus)) for n in nodes}
    for n in nodes:
        while free[n.name] and rng.random() < (0.7 if rng.random() < 0.8 else 0.2):
            g = rng.choice([x for x in (1, 2, 4, 8) if x <= len(free[n.name])])
            idx = sorted(rng.sample(free[n.name], g))
            for x in idx:
                free[n.name].remove(x)
            runs.append(((n.name, tuple(idx)),))
    # Now and then a gang attempt over two whole free nodes of the largest size.
    for t in types:
        size = max(n.gpus for n in nodes if n.gpu_type == t)
        whole = [n.name for n in nodes if n.gpu_type == t and n.gpus == size and len(free[n.name]) == size]
        while len(whole) >= 2 and rng.random() < 0.5:
            pair, whole = whole[:2], whole[2:]
            runs.append(tuple((w, tuple(free[w])) for w in pair))
            for w in pair:
                free[w] = []
    node_type = {n.name: n.gpu_type for n in nodes}
    running = []
    for n_att, placement in enumerate(runs, 1):
        started = rng.uniform(0, NOW)
        preempting = grace and rng.random() < 0.15
        running.append(
            RunningView(
                attempt_id=f"r{n_att}",
                job_id=f"j{n_att}",
                share=rng.choice(names),
                gpu_type=node_type[placement[0][0]],
                priority=rng.randint(0, 3),
                submitted_at=started - rng.uniform(0, 100),
                started_at=started,
                placement=placement,
                borrowed=rng.random() < 0.3,
                preempting=preempting,
                beneficiary_job_id=rng.choice(queued_ids) if preempting and queued_ids else None,
                # Now and then a checkpoint (or a stale one, from before the start): the safe point.
                last_checkpoint_at=rng.uniform(started - 50, NOW) if rng.random() < 0.3 else None,
            )
        )
    queue_shares = [rng.choice(names)] if one_queue else names + ["ghost"]
    queued = [
        QueuedView(
            job_id=q,
            share=rng.choice(queue_shares),
            gpu_type=rng.choice(types + ["tpu"] if rng.random() < 0.05 else types),
            gpus=rng.choice((1, 1, 1, 2, 3, 4, 8, 16, 16, 32)),
            priority=rng.randint(0, 3),
            submitted_at=rng.uniform(NOW - (1000 if fresh else 7200), NOW),
            beneficiary=grace and rng.random() < 0.1,
        )
        for q in queued_ids
    ]
    return Snapshot(
        now=NOW, nodes=tuple(nodes), shares=tuple(shares), running=tuple(running), queued=tuple(queued)
    )


# --------------------------------------------------------------------------------------------------
# an independent reading of SEMANTICS' accounting, to check plan() against


def _bcap(share: ShareView, cap: int) -> float:
    if share.strategy != LEND_AND_BORROW:
        return 0
    return float("inf") if share.borrow_limit == UNLIMITED else cap * share.borrow_limit // 100


def _used(snapshot: Snapshot, *, grace: bool, extra: dict | None = None) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = dict(extra or {})
    for r in snapshot.running:
        if grace or not r.preempting:
            used[(r.share, r.gpu_type)] = used.get((r.share, r.gpu_type), 0) + r.gpus
    return used


def deficit(snapshot: Snapshot, gpu_type: str, extra: dict | None = None) -> int:
    """Borrowed minus idle-lendable GPUs of a type, GPUs in grace counted as freed. Lendable is
    clamped to what the hardware holds (C - own - RESERVE idle) under over-commit."""
    shares = {s.name: s for s in snapshot.shares}
    used = _used(snapshot, grace=False, extra=extra)
    cluster = sum(n.gpus for n in snapshot.nodes if n.gpu_type == gpu_type and n.schedulable)
    names = set(shares) | {s for s, t in used if t == gpu_type}
    borrowed = own_total = lend = reserve_idle = assigned = 0
    for name in names:
        sh = shares.get(name)
        cap = sh.capacity.get(gpu_type, 0) if sh else 0
        assigned += cap
        u = used.get((name, gpu_type), 0)
        own = min(u, cap)
        borrowed += u - own
        own_total += own
        if sh is None or sh.strategy != RESERVE:
            lend += cap - own
        else:
            reserve_idle += cap - own
    lendable = min(lend + max(0, cluster - assigned), max(0, cluster - own_total - reserve_idle))
    return borrowed - lendable


def after(snapshot: Snapshot, p: Plan) -> Snapshot:
    return apply(snapshot, p, stop_preempted=False)


def types_of(snapshot: Snapshot) -> set[str]:
    return {n.gpu_type for n in snapshot.nodes} | {r.gpu_type for r in snapshot.running}


# --------------------------------------------------------------------------------------------------
# properties


@SETTINGS
@given(snapshots())
def test_plan_never_raises_and_accounts_for_every_queued_job(snapshot):
    p = plan(snapshot)
    admitted = [a.job_id for a in p.admissions]
    assert len(admitted) == len(set(admitted))
    assert set(admitted).isdisjoint(p.waiting)
    assert set(admitted) | set(p.waiting) == {q.job_id for q in snapshot.queued}
    assert all(isinstance(why, str) and why for why in p.waiting.values())


def plan_lazy_and_eager(snapshot: Snapshot) -> Plan:
    """The plan with its reasons left for later, checked against the same plan with every reason
    written at once: the same decisions and, read, the same sentences job for job."""
    from quotas.engine import reasons

    lazy = plan(snapshot)
    reasons.LAZY_REASONS = False
    try:
        eager = plan(snapshot)
    finally:
        reasons.LAZY_REASONS = True
    assert (lazy.admissions, lazy.preemptions, lazy.reserved) == (
        eager.admissions,
        eager.preemptions,
        eager.reserved,
    )
    assert dict(lazy.waiting) == dict(eager.waiting)
    return lazy


@SETTINGS
@given(snapshots())
def test_reasons_read_after_the_pass_are_the_ones_written_during_it(snapshot):
    """Plan.waiting is lazy (reasons.LAZY_REASONS): the reasons it computes when read must be the
    sentences the pass would have written at once, job for job."""
    plan_lazy_and_eager(snapshot)


@SETTINGS
@given(snapshots(), st.randoms(use_true_random=False))
def test_plan_is_deterministic_whatever_the_input_order(snapshot, rnd):
    def shuffled(xs):
        xs = list(xs)
        rnd.shuffle(xs)
        return tuple(xs)

    reordered = dataclasses.replace(
        snapshot,
        nodes=shuffled(snapshot.nodes),
        shares=shuffled(snapshot.shares),
        running=shuffled(snapshot.running),
        queued=shuffled(snapshot.queued),
    )
    assert plan(snapshot) == plan(snapshot) == plan(reordered)


@SETTINGS
@given(snapshots())
def test_admissions_use_free_gpus_of_schedulable_nodes_only_and_fit_their_shape(snapshot):
    p = plan(snapshot)
    nodes = {n.name: n for n in snapshot.nodes}
    taken = {(n, i) for r in snapshot.running for n, idx in r.placement for i in idx}
    queue = {q.job_id: q for q in snapshot.queued}
    for a in p.admissions:
        q = queue[a.job_id]
        largest = max(n.gpus for n in snapshot.nodes if n.gpu_type == q.gpu_type)
        assert sum(len(idx) for _, idx in a.placement) == q.gpus
        for name, idx in a.placement:
            n = nodes[name]
            assert n.schedulable and n.gpu_type == q.gpu_type
            assert all(0 <= i < n.gpus for i in idx)
            assert taken.isdisjoint((name, i) for i in idx)
            taken.update((name, i) for i in idx)
        if q.gpus > largest:
            assert all(len(idx) == largest == nodes[name].gpus for name, idx in a.placement)
        else:
            assert len(a.placement) == 1
    # after the plan: no GPU held twice, no node over its size
    held = [(n, i) for r in after(snapshot, p).running for n, idx in r.placement for i in idx]
    assert len(held) == len(set(held))


@SETTINGS
@given(snapshots())
def test_share_usage_stays_within_capacity_plus_borrow_cap(snapshot):
    p = plan(snapshot)
    shares = {s.name: s for s in snapshot.shares}
    before = _used(snapshot, grace=True)
    now = _used(after(snapshot, p), grace=True)
    for a in p.admissions:
        sh = shares[a.share]
        if sh.strategy in (RESERVE, LEND):
            assert not a.borrowed and a.reason == "ADMITTED_OWN"
    for (name, t), u in now.items():
        if name not in shares or u == before.get((name, t), 0):
            continue  # nothing admitted for it
        cap = shares[name].capacity.get(t, 0)
        assert u <= cap + _bcap(shares[name], cap)


@SETTINGS
@given(snapshots())
def test_cover_is_never_made_worse_counting_grace_and_earmarks(snapshot):
    """Per type: deficit after the plan <= max(0, deficit before), GPUs in grace counted as freed.
    Also with the beneficiaries of this plan's pre-emptions counted as already running (the state
    the pre-emptions lead to): reclaim takes enough."""
    p = plan(snapshot)
    done = after(snapshot, p)
    admitted = {a.job_id for a in p.admissions}
    queue = {q.job_id: q for q in snapshot.queued}
    pending: dict[tuple[str, str], int] = {}
    for b in {x.beneficiary_job_id for x in p.preemptions} - admitted:
        q = queue[b]
        pending[(q.share, q.gpu_type)] = pending.get((q.share, q.gpu_type), 0) + q.gpus
    for t in types_of(snapshot):
        allowed = max(0, deficit(snapshot, t))
        assert deficit(done, t) <= allowed
        assert deficit(done, t, pending) <= allowed


@SETTINGS
@given(snapshots())
def test_victims_are_borrowed_of_another_share_or_strictly_lower_priority_of_the_same(snapshot):
    p = plan(snapshot)
    runs = {r.attempt_id: r for r in snapshot.running}
    queue = {q.job_id: q for q in snapshot.queued}
    borrowed = borrowed_attempts(snapshot)
    ids = [x.attempt_id for x in p.preemptions]
    assert len(ids) == len(set(ids))  # never pre-empted twice
    taken: dict[tuple[str, str], list[int]] = {}
    for x in p.preemptions:
        r = runs[x.attempt_id]
        assert not r.preempting  # GPUs already in grace are never taken again
        ben = queue[x.beneficiary_job_id]
        assert x.beneficiary_share == ben.share and x.share == r.share and x.job_id == r.job_id
        if x.reason == RECLAIM:
            assert r.attempt_id in borrowed and r.share != ben.share
            taken.setdefault((r.share, r.gpu_type), []).append(r.gpus)
        else:
            assert x.reason == PRIORITY
            assert r.share == ben.share and r.priority < ben.priority
    # Reclaim leaves a share below its own capacity by less than its largest victim.
    shares = {s.name: s for s in snapshot.shares}
    used = _used(snapshot, grace=False)
    for (name, t), sizes in taken.items():
        cap = shares[name].capacity.get(t, 0) if name in shares else 0
        assert sum(sizes) - max(sizes) < used[(name, t)] - cap


def _freeable(snapshot: Snapshot, p: Plan, head: QueuedView) -> bool:
    """Could some single node hold `head` if the right borrowed attempts of other shares were
    reclaimed (respecting the 'largest victim last' rule), counting GPUs free after the plan?"""
    done = after(snapshot, p)
    borrowed = borrowed_attempts(snapshot)
    shares = {s.name: s for s in snapshot.shares}
    used = _used(snapshot, grace=False)
    held: dict[str, set[int]] = {}
    for r in done.running:
        for n, idx in r.placement:
            held.setdefault(n, set()).update(idx)
    for n in snapshot.nodes:
        if not n.schedulable or n.gpu_type != head.gpu_type or n.gpus < head.gpus:
            continue
        free = n.gpus - len(held.get(n.name, ()))
        cands = [
            r
            for r in snapshot.running
            if r.attempt_id in borrowed
            and r.share != head.share
            and not r.preempting
            and any(name == n.name for name, _ in r.placement)
        ]
        for size in range(len(cands) + 1):
            for combo in itertools.combinations(cands, size):
                by_share: dict[str, list[int]] = {}
                for r in combo:
                    by_share.setdefault(r.share, []).append(r.gpus)
                ok = all(
                    sum(v) - max(v) < used[(sh, head.gpu_type)] - shares[sh].capacity.get(head.gpu_type, 0)
                    for sh, v in by_share.items()
                )
                there = sum(len(idx) for r in combo for name, idx in r.placement if name == n.name)
                if ok and free + there >= head.gpus:
                    return True
    return False


@SETTINGS
@given(snapshots(grace=False, one_queue=True, fresh=True))
def test_guarantee_head_below_capacity_is_admitted_or_reclaim_is_under_way(snapshot):
    """The one share with queued jobs, below its own capacity with a head job that fits what it is
    owed: by the end of the pass the head is admitted, or GPUs are being freed for it, or it waits
    for protection, or no node could hold it even if every reclaimable attempt went (or the cover
    cannot be restored)."""
    p = plan(snapshot)
    shares = {s.name: s for s in snapshot.shares}
    used = _used(snapshot, grace=True)
    for t in types_of(snapshot):
        heads = sorted(
            (q for q in snapshot.queued if q.gpu_type == t and q.share in shares),
            key=lambda q: (-q.priority, q.submitted_at, q.job_id),
        )
        if not heads:
            continue
        head = heads[0]
        largest = max(n.gpus for n in snapshot.nodes if n.gpu_type == t)
        cap = shares[head.share].capacity.get(t, 0)
        if head.gpus > largest or used.get((head.share, t), 0) + head.gpus > cap:
            continue  # gangs and jobs that do not fit what the share is owed are not promised this
        if head.job_id in {a.job_id for a in p.admissions}:
            continue
        if head.job_id in p.protected:  # rule 10: it waits for protection
            assert p.waiting[head.job_id].startswith("waits for")
            continue
        # GPUs being freed for it (reclaim or pre-empted jobs; held for it, or not where they would be
        # RESERVE shares' idle GPUs: rule 9's last paragraph)
        if head.job_id in p.reserved or head.job_id in {x.beneficiary_job_id for x in p.preemptions}:
            assert p.waiting[head.job_id].startswith("waiting for")
            continue
        why = p.waiting[head.job_id]
        if why.startswith(("needs", "no schedulable")):
            assert not _freeable(snapshot, p, head), why
        else:
            assert why in (
                "waiting for borrowed capacity to be returned",
                "cluster over-committed: no capacity left to honour the share's guarantee",
            ), why


@SETTINGS
@given(snapshots())
def test_passes_at_one_instant_reach_a_fixed_point_and_lose_no_job(snapshot):
    """Zero grace: the simulator repeats passes at one instant until nothing new is decided. That
    must end (no pre-emption ping-pong), and every job stays queued or running."""
    jobs = {q.job_id for q in snapshot.queued} | {r.job_id for r in snapshot.running}
    settled, plans = settle(snapshot)  # raises after 50 passes
    assert {q.job_id for q in settled.queued} | {r.job_id for r in settled.running} == jobs
    assert len(plans) <= 2 * len(jobs) + 2, len(plans)
