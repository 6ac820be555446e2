"""Benchmark 15 (issue 37.5): fair reclaim (SEMANTICS rule 11) off against on, on the ITP trace's busiest
fortnight, no database.

The scenario is bench 13's (bench/bench_tree.py `_itp`): days 14-28 of ../shared/data/msft-itp-2021.csv,
168 x 8 a100, its 10 virtual clusters as shares (capacity by GPU-hours) dealt by capacity rank into
dept-a (weight 2), dept-b and dept-c (weight 1), no limits, grace 30 s, half the jobs checkpointing every
1,800 s, victims by safe point. The same scenario runs with `fair_reclaim` off and on; for each:

- GPU-hours lost to `fair_share` (and to `reclaim`), and the fair-reclaim pre-emptions;
- owners' p95 wait for reclaimed GPUs (bench 13's `_owner_p95`: per own admission that needed a reclaim,
  its start minus the first instant its admission needed one);
- **time to the weighted part**, p50 and p95. Replayed from the result's attempts, instant by instant
  (the state after the last pass of each instant): a share *waits to borrow* when a job of it is queued
  that does not fit its own capacity next to what it uses (the organisation page's "waiting to borrow");
  its *weighted part* is the organisation page's fair part (quotas.engine.tree `fair_parts`: what
  borrowers may hold now, the top's offers and the unassigned pool, split top-down by weight x
  max(1, capacity) among the siblings that wait to borrow or borrow; bench 15's time-to-part figures in
  bench/RESULTS.md of 2026-12-06 were measured with the weight-only split it used before); it *holds its part* when what it takes from outside plus its
  smallest job that waits to borrow is more than its part (jobs are indivisible: one more job would put
  it above). An episode starts at an instant the share waits to borrow and does not hold its part, after
  an instant it did not (or at its first instant); it ends at the first instant it holds its part or no
  longer waits to borrow (its jobs started). Episodes still open at the end count with their time so far
  (censored, reported).
- which fair-reclaim moves cost the most: lost work per (taker's side, victim's side), and how often the
  same two sides took GPUs from each other in both directions;
- how many times the most-taken job was fair-reclaimed (`--max-per-job N` sets the engine's bound,
  FAIR_RECLAIM_MAX_PER_JOB, for the run; a large N measures fair reclaim without it).

    python bench/bench_fair_reclaim.py [--quick] [--only off|on] [--max-per-job N]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_tree import WINDOW, _itp, _owner_p95  # noqa: E402
from quotas.engine import fairshare  # noqa: E402
from quotas.engine import scenario as sc  # noqa: E402
from quotas.engine.simulate import SimResult, simulate  # noqa: E402
from quotas.engine.tree import Tree, fair_parts, nets  # noqa: E402
from quotas.engine.views import LEND_AND_BORROW, ShareView  # noqa: E402

QUICK_WINDOW = (1_209_600, 1_468_800)  # days 14-17
GPU_TYPE = "a100"


def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[max(0, math.ceil(p * len(values)) - 1)]


def time_to_weighted_part(scenario: sc.Scenario, result: SimResult) -> dict:
    """The episodes of shares waiting to borrow below their weighted part (the module's docstring)."""
    shares = [
        ShareView(s.name, dict(s.capacity), s.strategy, group=s.group, weight=s.weight)
        for s in scenario.shares
    ]
    tree = Tree.build([g.spec() for g in scenario.groups], shares)
    capacity = {s.name: max(0, s.capacity.get(GPU_TYPE, 0)) for s in scenario.shares}
    borrowers = {s.name for s in scenario.shares if s.strategy == LEND_AND_BORROW}
    cluster = sum(n.gpus for n in scenario.nodes if n.gpu_type == GPU_TYPE)
    pool = max(0, cluster - sum(capacity.values()))
    end = result.timeline.end

    # Changes per instant: +/- GPUs in use per share, and queued jobs in and out (share, gpus).
    used_delta: dict[int, Counter] = defaultdict(Counter)
    queue_delta: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for record in result.jobs.values():
        job = record.spec
        if job.gpu_type != GPU_TYPE:
            continue
        queued_from: int | None = job.submit_at
        for a in record.attempts:
            if queued_from is not None and a.start > queued_from:
                queue_delta[queued_from].append((job.share, job.gpus, 1))
                queue_delta[a.start].append((job.share, job.gpus, -1))
            queued_from = None
            used_delta[a.start][job.share] += job.gpus
            if a.end is not None:
                used_delta[a.end][job.share] -= job.gpus
                if a.outcome not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    queued_from = a.end  # back in the queue (pre-empted, node lost)
        if queued_from is not None and queued_from < end:
            queue_delta[queued_from].append((job.share, job.gpus, 1))

    used: Counter = Counter()
    queued: dict[str, Counter] = defaultdict(Counter)  # share -> gpus -> jobs queued
    open_since: dict[str, int] = {}
    durations: list[int] = []
    ended = Counter()
    for t in sorted(used_delta.keys() | queue_delta.keys()):
        if t > end:
            break
        used.update(used_delta.get(t, {}))
        for share, gpus, d in queue_delta.get(t, ()):
            queued[share][gpus] += d
            if not queued[share][gpus]:
                del queued[share][gpus]
        # Who waits to borrow: a queued job that does not fit its share's own capacity beside its use.
        smallest: dict[str, int] = {}
        for share, sizes in queued.items():
            if share not in borrowers or not sizes:
                continue
            over = [g for g in sizes if used[share] + g > capacity[share]]
            if over:
                smallest[share] = min(over)
        if not smallest and not open_since:
            continue
        waiting: set[str] = set()
        for share in smallest:
            waiting.update(tree.path(share))
        n = nets(tree, GPU_TYPE, used, pool)
        borrowable = sum(n.offer[c] for c in tree.top) + pool
        part, _ = fair_parts(tree, n, waiting, float(borrowable), GPU_TYPE)
        for share in borrowers:
            below = share in smallest and n.taken[share] + smallest[share] <= part.get(share, 0.0)
            if below and share not in open_since:
                open_since[share] = t
            elif not below and share in open_since:
                durations.append(t - open_since.pop(share))
                ended["holds its part" if share in smallest else "no longer waits"] += 1
    censored = [end - t0 for t0 in open_since.values()]
    return {
        "episodes": len(durations) + len(censored),
        "ended": dict(ended),
        "censored": len(censored),
        "p50_s": _percentile(durations + censored, 0.5),
        "p95_s": _percentile(durations + censored, 0.95),
    }


def fair_moves(scenario: sc.Scenario, result: SimResult) -> dict:
    """Fair-reclaim pre-emptions by (taker's side, victim's side): how many, the GPU-hours they lost, and
    the pairs of sides that took from each other both ways."""
    shares = [ShareView(s.name, dict(s.capacity), s.strategy, group=s.group) for s in scenario.shares]
    tree = Tree.build([g.spec() for g in scenario.groups], shares)
    share_of = {job_id: record.spec.share for job_id, record in result.jobs.items()}
    by_pair: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0])
    attempts_taken: Counter = Counter()
    lost_per_move: list[float] = []
    for job_id, record in result.jobs.items():
        job = record.spec
        for a in record.attempts:
            if a.preemption_reason != "FAIR_SHARE" or a.end is None:
                continue
            taker, giver = share_of[a.preempted_by], share_of[job_id]
            side_taker, side_giver, _ = tree.sides(taker, giver)
            # The work since its safe point (its start, or its last periodic checkpoint).
            ran = a.end - a.start
            every = job.checkpoint_every_s
            since = ran - (ran // every) * every if every else ran
            lost = 0.0 if job.checkpoint_on_stop else job.gpus * since / 3600
            by_pair[(side_taker, side_giver)][0] += 1
            by_pair[(side_taker, side_giver)][1] += lost
            lost_per_move.append(lost)
            attempts_taken[job_id] += 1
    both_ways = sorted({tuple(sorted(p)) for p in by_pair if p[::-1] in by_pair})
    lost_per_move.sort(reverse=True)
    total = sum(lost_per_move) or 1.0
    tenth = lost_per_move[: max(1, len(lost_per_move) // 10)]
    return {
        "moves": len(lost_per_move),
        "by_sides (moves, GPU-h lost)": {
            f"{a} <- {b}": (v[0], round(v[1])) for (a, b), v in sorted(by_pair.items())
        },
        "pairs_both_ways": both_ways,
        "jobs_taken_more_than_once": sum(1 for c in attempts_taken.values() if c > 1),
        "most_taken": attempts_taken.most_common(1)[0] if attempts_taken else None,
        "lost_h_per_move_p50": _percentile(lost_per_move, 0.5),
        "lost_share_of_costliest_tenth": round(sum(tenth) / total, 2),
    }


def run(fair: bool, quick: bool = False) -> dict:
    scenario = _itp(QUICK_WINDOW if quick else WINDOW, departments=True, fair_reclaim=fair)
    t0 = time.perf_counter()
    result = simulate(scenario)
    seconds = time.perf_counter() - t0
    lost = Counter()
    for data in result.shares.values():
        lost.update(data["lost_gpu_seconds"])
    taken = {g: v["gpu_seconds_from_outside"] / 3600 for g, v in (result.groups or {}).items()}
    return {
        "fair_reclaim": fair,
        "seconds": seconds,
        "lost_fair_share_h": lost["fair_share"] / 3600,
        "lost_reclaim_h": lost["reclaim"] / 3600,
        "owner_p95_s": _owner_p95(result),
        "taken_h": taken,
        "weighted_part": time_to_weighted_part(scenario, result),
        "moves": fair_moves(scenario, result) if fair else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="days 14-17 instead of 14-28")
    parser.add_argument("--only", choices=("off", "on"))
    parser.add_argument(
        "--max-per-job",
        type=int,
        default=fairshare.FAIR_RECLAIM_MAX_PER_JOB,
        help="how many times fair reclaim may take one job (default: the engine's "
        f"FAIR_RECLAIM_MAX_PER_JOB, {fairshare.FAIR_RECLAIM_MAX_PER_JOB}); a large number: no bound",
    )
    args = parser.parse_args(argv)
    if args.max_per_job < 0:
        parser.error("--max-per-job must be 0 or more")
    fairshare.FAIR_RECLAIM_MAX_PER_JOB = args.max_per_job  # the walk reads it at each try
    for fair in (False, True):
        if args.only and args.only != ("on" if fair else "off"):
            continue
        r = run(fair, args.quick)
        w = r["weighted_part"]
        print(
            f"fair_reclaim {f'on (at most {args.max_per_job} per job)' if fair else 'off'}: "
            f"{r['seconds']:.1f} s; lost to fair_share "
            f"{r['lost_fair_share_h']:,.1f} GPU-h, to reclaim {r['lost_reclaim_h']:,.1f}; owners' p95 wait "
            f"{r['owner_p95_s']} s; time to the weighted part p50 {w['p50_s']} s, p95 {w['p95_s']} s "
            f"({w['episodes']} episodes, ended {w['ended']}, {w['censored']} open at the end); taken from "
            "outside (GPU-h): " + ", ".join(f"{g} {h:,.0f}" for g, h in sorted(r["taken_h"].items())),
            flush=True,
        )
        if r["moves"]:
            print(f"  moves: {r['moves']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
