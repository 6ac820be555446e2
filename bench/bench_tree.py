"""Benchmark 13 (issue 37): the organisation tree's cost and what fair sharing does, no database.

1. Speed, a 3-level tree of 50 shares against the same shares flat: tracegen's 20,000 jobs on 512 GPUs with
   50 teams (seed 1), simulated flat and with 2 divisions > 4 departments > 10 teams holding the 50 shares
   (weights 1-3, no limits, so the two runs decide alike enough to compare), and the whole ITP trace
   (all its virtual clusters, 168 x 8 a100) flat and in 3 departments. Target: the tree at most 1.25x flat,
   for the simulator and for the time in passes.
2. Fair sharing on the ITP trace's busiest fortnight (days 14-28, as bench 10: half the jobs checkpointing,
   grace 30 s, victims by safe point) with its virtual clusters in 3 departments (`DEPARTMENTS`): fair
   reclaim off and on: the GPU-hours lost to `fair_share`, the owners' p95 wait for reclaimed GPUs, and the
   GPU-hours each department took from outside against its weight's part.

    python bench/bench_tree.py [--quick] [--only speed|fairness]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quotas.engine import (
    importtrace,  # noqa: E402
    tracegen,  # noqa: E402
)
from quotas.engine import scenario as sc  # noqa: E402
from quotas.engine.simulate import Profile, simulate  # noqa: E402

TARGET_RATIO = 1.25
WINDOW = (1_209_600, 2_419_200)  # days 14-28, as bench 10
# The ITP trace's virtual clusters (one share each, importtrace --top 0) in 3 departments, dealt in turn by
# capacity rank (dept-a holds the 1st, 4th, 7th and 10th largest): weights 2, 1, 1.
DEPARTMENTS = (("dept-a", 2.0), ("dept-b", 1.0), ("dept-c", 1.0))


def _tree_of_50(data: dict) -> dict:
    """2 divisions > 4 departments > 10 teams, the shares spread over the teams in name order."""
    groups = [{"name": f"div-{d}", "weight": d + 1} for d in range(2)]
    groups += [{"name": f"dept-{d}", "parent": f"div-{d % 2}", "weight": 1 + d % 3} for d in range(4)]
    groups += [{"name": f"team-g{t}", "parent": f"dept-{t % 4}", "weight": 1 + t % 2} for t in range(10)]
    data = copy.deepcopy(data)  # the flat one is run too
    for i, share in enumerate(sorted(data["shares"], key=lambda s: s["name"])):
        share["group"] = f"team-g{i % 10}"
        share["weight"] = 1 + i % 3
    return {**data, "groups": groups}


def _timed(scenario: sc.Scenario, **options) -> tuple[float, float, object]:
    profile = Profile(detail=False)
    t0 = time.perf_counter()
    result = simulate(scenario, profile=profile, **options)
    return time.perf_counter() - t0, profile.seconds.get("passes", 0.0), result


def itp_data(window: tuple[float, float] | None, **overrides) -> dict:
    """The ITP trace's jobs submitted in `window` (seconds; None: all) as a scenario document, on bench
    10's cluster: 168 x 8 a100, every virtual cluster a share, grace 30 s, half the jobs checkpointing
    every 1,800 s (importtrace.Options; `overrides` replace some). Benches 10, 13, 13b, 15 and the
    advisor's hold-out build on it."""
    options = dict(
        start=None if window is None else window[0],
        end=None if window is None else window[1],
        nodes=168,
        node_gpus=8,
        gpu_type="a100",
        top=0,
        grace_s=30,
        checkpoint_fraction=0.5,
        checkpoint_every_s=1800,
        seed=1,
        source=importtrace.ITP_TRACE.name,
    )
    with open(importtrace.ITP_TRACE, encoding="utf-8", newline="") as f:
        data, _ = importtrace.import_trace(f, importtrace.Options(**{**options, **overrides}))
    return dict(data)


def in_departments(data: dict, **settings) -> dict:
    """Bench 13's tree: the shares dealt by capacity rank, in turn, into DEPARTMENTS (a: ranks 1, 4, 7,
    10; b: 2, 5, 8; c: 3, 6, 9); `settings` added to the scenario's."""
    data["groups"] = [{"name": name, "weight": weight} for name, weight in DEPARTMENTS]
    ranked = sorted(data["shares"], key=lambda s: -sum(s["capacity"].values()))
    for i, share in enumerate(ranked):
        share["group"] = DEPARTMENTS[i % 3][0]
    data["settings"] = {**data["settings"], **settings}
    return data


def _itp(window: tuple[int, int] | None, *, departments: bool, fair_reclaim: bool = False) -> sc.Scenario:
    data = itp_data(window)
    return sc.parse(in_departments(data, fair_reclaim=fair_reclaim) if departments else data)


def speed(quick: bool = False) -> list[dict]:
    rows = []
    jobs = 5_000 if quick else 20_000
    flat = tracegen.generate(teams=50, gpus=512, jobs=jobs, seed=1)
    for label, data in (
        ("tracegen 50 shares, flat", flat),
        ("tracegen 50 shares, 3-level tree", _tree_of_50(flat)),
    ):
        seconds, passes_s, result = _timed(sc.parse(data))
        rows.append(
            {"run": label, "seconds": seconds, "passes_s": passes_s, "passes": result.cluster["passes"]}
        )
    window = (0, 604_800) if quick else None
    for label, departments in (("ITP whole trace, flat", False), ("ITP whole trace, 3 departments", True)):
        seconds, passes_s, result = _timed(_itp(window, departments=departments))
        rows.append(
            {"run": label, "seconds": seconds, "passes_s": passes_s, "passes": result.cluster["passes"]}
        )
    return rows


def _owner_p95(result) -> int | None:
    waits = sorted(
        a.start - a.needed_reclaim_at
        for job in result.jobs.values()
        for a in job.attempts
        if a.needed_reclaim_at is not None and a.reason == "ADMITTED_OWN"
    )
    return waits[min(len(waits) - 1, int(round(0.95 * len(waits))) - 1)] if waits else None


def fairness(quick: bool = False) -> list[dict]:
    window = (1_209_600, 1_468_800) if quick else WINDOW
    rows = []
    for fair in (False, True):
        scenario = _itp(window, departments=True, fair_reclaim=fair)
        t0 = time.perf_counter()
        result = simulate(scenario)
        taken = {g: v["gpu_seconds_from_outside"] / 3600 for g, v in (result.groups or {}).items()}
        rows.append(
            {
                "fair_reclaim": fair,
                "seconds": time.perf_counter() - t0,
                "lost_fair_share_h": sum(s["lost_gpu_seconds"]["fair_share"] for s in result.shares.values())
                / 3600,
                "lost_reclaim_h": sum(s["lost_gpu_seconds"]["reclaim"] for s in result.shares.values())
                / 3600,
                "owner_p95_s": _owner_p95(result),
                "taken_h": taken,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("speed", "fairness"))
    args = parser.parse_args(argv)
    ok = True
    if args.only in (None, "speed"):
        rows = speed(args.quick)
        print(f"{'run':40} {'seconds':>8} {'in passes':>10} {'passes':>8}")
        for r in rows:
            print(f"{r['run']:40} {r['seconds']:8.2f} {r['passes_s']:10.2f} {r['passes']:8,}")
        for i in (0, 2):
            ratio, pass_ratio = (
                rows[i + 1]["seconds"] / rows[i]["seconds"],
                rows[i + 1]["passes_s"] / rows[i]["passes_s"],
            )
            met = ratio <= TARGET_RATIO and pass_ratio <= TARGET_RATIO
            ok = ok and met
            print(
                f"{rows[i + 1]['run']}: {ratio:.2f}x flat (passes {pass_ratio:.2f}x) {'OK' if met else 'OVER'} (<= {TARGET_RATIO}x)"
            )
    if args.only in (None, "fairness"):
        weights = {name: w for name, w in DEPARTMENTS}
        total_w = sum(weights.values())
        for r in fairness(args.quick):
            total = sum(r["taken_h"].values()) or 1.0
            split = ", ".join(
                f"{g} {h:,.0f} GPU-h ({h / total:.0%}; weight {weights[g] / total_w:.0%})"
                for g, h in sorted(r["taken_h"].items())
            )
            print(
                f"fair_reclaim {'on ' if r['fair_reclaim'] else 'off'}: {r['seconds']:.1f} s; lost to fair_share "
                f"{r['lost_fair_share_h']:,.1f} GPU-h, to reclaim {r['lost_reclaim_h']:,.1f}; owners' p95 wait for "
                f"reclaimed GPUs {r['owner_p95_s']} s; from outside: {split}"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
