"""Benchmark 1: quotas.engine.policy.plan() alone, no database.

A full cluster (1,000 nodes x 8 GPUs, every GPU held by a running attempt, borrowers over their
capacity, lenders under theirs), 50 shares of mixed strategies, and 1k / 10k / 100k queued jobs of a
realistic size mix (mostly 1 GPU, a tail of 2/4/8/16/32). Prints the median and p95 of plan() per size
and the growth exponent fitted log-log from the smallest to the largest size (1.0 = linear).

With `--tree` the same 50 shares sit in bench 13's 3-level tree (2 divisions > 4 departments > 10 teams,
group weights 1-3, share weights 1-3, no limits; issue 37.5 asks the tree's plan() to be within 1.25x of
the flat one before the tree existed).

Run with `python bench/bench_policy.py [--repeats N] [--sizes 1000,10000,100000] [--tree]`, or call `run()`.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quotas.engine.policy import (  # noqa: E402
    LEND,
    LEND_AND_BORROW,
    RESERVE,
    UNLIMITED,
    GroupSpec,
    NodeView,
    QueuedView,
    RunningView,
    ShareView,
    Snapshot,
    plan,
)

SIZES = (1_000, 10_000, 100_000)
NODES, GPUS_PER_NODE, SHARES = 1000, 8, 50
GPU_TYPE = "h100"
NOW = 1_000_000.0
# (gpus, weight): mostly single GPUs, a tail of whole nodes and gangs.
QUEUED_MIX = ((1, 0.70), (2, 0.12), (4, 0.08), (8, 0.06), (16, 0.03), (32, 0.01))
RUNNING_MIX = ((1, 0.55), (2, 0.2), (4, 0.15), (8, 0.1))


def _pick(rng: random.Random, mix: tuple[tuple[int, float], ...]) -> int:
    return rng.choices([g for g, _ in mix], weights=[w for _, w in mix])[0]


def build_snapshot(queued: int, seed: int = 1) -> Snapshot:
    """A reproducible full-cluster snapshot with `queued` jobs waiting."""
    rng = random.Random(seed)
    nodes = tuple(NodeView(name=f"n{i:04d}", gpu_type=GPU_TYPE, gpus=GPUS_PER_NODE) for i in range(NODES))
    total = NODES * GPUS_PER_NODE
    # 90% of the cluster is assigned to shares, the rest is the unassigned pool.
    weights = [rng.uniform(0.5, 1.5) for _ in range(SHARES)]
    assigned = int(total * 0.9)
    caps = [int(assigned * w / sum(weights)) for w in weights]
    strategies = [(RESERVE, LEND, LEND_AND_BORROW, LEND_AND_BORROW, LEND)[i % 5] for i in range(SHARES)]
    shares = tuple(
        ShareView(
            name=f"share-{i:02d}",
            capacity={GPU_TYPE: caps[i]},
            strategy=strategies[i],
            borrow_limit=rng.choice((UNLIMITED, 50, 100, 200))
            if strategies[i] == LEND_AND_BORROW
            else UNLIMITED,
            in_share_preemption=i % 4 == 0,
        )
        for i in range(SHARES)
    )
    # Targets that fill the cluster and keep the cover: RESERVE at capacity, LEND at 60-100% of it,
    # borrowers over capacity by exactly what the lenders and the pool leave idle.
    target = [0] * SHARES
    for i in range(SHARES):
        if strategies[i] == RESERVE:
            target[i] = caps[i]
        elif strategies[i] == LEND:
            target[i] = int(caps[i] * rng.uniform(0.6, 1.0))
        else:
            target[i] = caps[i]
    idle = total - sum(target)
    borrowers = [i for i in range(SHARES) if strategies[i] == LEND_AND_BORROW]
    for n in range(idle):
        target[borrowers[n % len(borrowers)]] += 1

    running = []
    node_free = [GPUS_PER_NODE] * NODES
    attempt = 0
    order = [i for i in range(SHARES) for _ in range(target[i])]
    rng.shuffle(order)
    left = list(target)
    node = 0
    for s in order:
        if not left[s]:
            continue
        g = min(_pick(rng, RUNNING_MIX), left[s])
        while node < NODES and node_free[node] == 0:
            node += 1
        if node == NODES:
            break
        g = min(g, node_free[node])
        first = GPUS_PER_NODE - node_free[node]
        node_free[node] -= g
        left[s] -= g
        attempt += 1
        started = NOW - rng.uniform(0, 7200)
        running.append(
            RunningView(
                attempt_id=attempt,
                job_id=10_000_000 + attempt,
                share=shares[s].name,
                gpu_type=GPU_TYPE,
                priority=rng.randint(0, 9),
                submitted_at=started - rng.uniform(0, 600),
                started_at=started,
                placement=((nodes[node].name, tuple(range(first, first + g))),),
                borrowed=False,
            )
        )
    jobs = tuple(
        QueuedView(
            job_id=j,
            share=shares[rng.randrange(SHARES)].name,
            gpu_type=GPU_TYPE,
            gpus=_pick(rng, QUEUED_MIX),
            priority=rng.choice((0, 0, 0, 1, 2, 5, 9)),
            submitted_at=NOW - rng.uniform(0, 7200),
        )
        for j in range(queued)
    )
    return Snapshot(now=NOW, nodes=nodes, shares=shares, running=tuple(running), queued=jobs)


def with_tree(snapshot: Snapshot) -> Snapshot:
    """The snapshot's shares in bench 13's 3-level tree (bench/bench_tree.py `_tree_of_50`): 2 divisions >
    4 departments > 10 teams, the shares dealt over the teams in name order, weights 1-3, no limits."""
    groups = [GroupSpec(f"div-{d}", weight=d + 1) for d in range(2)]
    groups += [GroupSpec(f"dept-{d}", parent=f"div-{d % 2}", weight=1 + d % 3) for d in range(4)]
    groups += [GroupSpec(f"team-g{t}", parent=f"dept-{t % 4}", weight=1 + t % 2) for t in range(10)]
    placed = {
        s.name: replace(s, group=f"team-g{i % 10}", weight=1 + i % 3)
        for i, s in enumerate(sorted(snapshot.shares, key=lambda s: s.name))
    }
    return replace(snapshot, shares=tuple(placed[s.name] for s in snapshot.shares), groups=tuple(groups))


def run(sizes: tuple[int, ...] = SIZES, repeats: int = 7, tree: bool = False) -> list[dict]:
    """Time plan() `repeats` times per size; one dict per size (seconds), plus the fitted exponent
    on each row (None on the first). `tree`: the shares in a 3-level tree (with_tree)."""
    rows: list[dict] = []
    for n in sizes:
        snapshot = build_snapshot(n)
        if tree:
            snapshot = with_tree(snapshot)
        result = plan(snapshot)  # warm-up, and a sanity check that the pass did something
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            plan(snapshot)
            times.append(time.perf_counter() - t0)
        times.sort()
        rows.append(
            {
                "queued": n,
                "running": len(snapshot.running),
                "median_s": statistics.median(times),
                "p95_s": times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)],
                "admissions": len(result.admissions),
                "preemptions": len(result.preemptions),
                "waiting": len(result.waiting),
            }
        )
    first, last = rows[0], rows[-1]
    exponent = None
    if len(rows) > 1 and last["queued"] != first["queued"]:
        exponent = math.log(last["median_s"] / first["median_s"]) / math.log(last["queued"] / first["queued"])
    for row in rows:
        row["exponent"] = exponent
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    parser.add_argument("--tree", action="store_true", help="the shares in a 3-level tree of groups")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    rows = run(sizes, args.repeats, args.tree)
    print(
        f"plan(): {NODES} nodes x {GPUS_PER_NODE} GPUs (full), {SHARES} shares"
        f"{' in a 3-level tree' if args.tree else ''}, {args.repeats} runs per size"
    )
    print(f"{'queued':>8} {'running':>8} {'median ms':>10} {'p95 ms':>8} {'admit':>6} {'preempt':>8}")
    for r in rows:
        print(
            f"{r['queued']:>8} {r['running']:>8} {r['median_s'] * 1000:>10.1f} {r['p95_s'] * 1000:>8.1f}"
            f" {r['admissions']:>6} {r['preemptions']:>8}"
        )
    if rows[0]["exponent"] is not None:
        print(
            f"growth exponent (log-log, {rows[0]['queued']} -> {rows[-1]['queued']}): {rows[0]['exponent']:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
