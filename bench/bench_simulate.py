"""Benchmark: quotas.engine.simulate.simulate() on generated traces, with the real policy, no database.

Two sizes from `quotas.engine.tracegen` (6 teams, seed 1): 20,000 jobs on 512 GPUs (target: under 60 s on one
core) and 100,000 jobs on 2,048 GPUs (target: under 2 minutes). Prints wall time, planner passes, the
share of time inside `policy.plan()`, attempts, pre-emptions and utilisation per size.

Run with `python bench/bench_simulate.py [--sizes 20000:512,100000:2048]`, or call `run()`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quotas.engine import policy, tracegen  # noqa: E402
from quotas.engine import scenario as sc  # noqa: E402
from quotas.engine.simulate import simulate  # noqa: E402

SIZES = ((20_000, 512, 60.0), (100_000, 2_048, 120.0))  # (jobs, GPUs, target seconds)


def run(sizes: tuple[tuple[int, int, float], ...] = SIZES, *, teams: int = 6, seed: int = 1) -> list[dict]:
    rows = []
    for jobs, gpus, target in sizes:
        scenario = sc.parse(tracegen.generate(teams=teams, gpus=gpus, jobs=jobs, seed=seed))
        in_plan = 0.0

        def timed_plan(snapshot: policy.Snapshot) -> policy.Plan:
            nonlocal in_plan
            t0 = time.perf_counter()
            try:
                return policy.plan(snapshot)
            finally:
                in_plan += time.perf_counter() - t0

        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(scenario, planner=timed_plan)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        records = list(result.jobs.values())
        rows.append(
            {
                "jobs": jobs,
                "gpus": gpus,
                "seconds": round(seconds, 2),
                "cpu_s": round(cpu, 2),
                "target_s": target,
                "plan_s": round(in_plan, 2),
                "passes": result.cluster["passes"],
                "attempts": sum(len(r.attempts) for r in records),
                "preemptions": sum(r.preemptions for r in records),
                "utilisation": result.cluster["utilisation"],
                "warnings": len(result.warnings),
            }
        )
    return rows


def _table(rows: list[dict]) -> str:
    header = ["jobs", "GPUs", "seconds", "target", "in plan()", "passes", "attempts", "pre-emptions", "util."]
    body = [
        [
            f"{r['jobs']:,}",
            f"{r['gpus']:,}",
            f"{r['seconds']:.1f}",
            f"{r['target_s']:.0f}",
            f"{r['plan_s'] / r['seconds']:.0%}" if r["seconds"] else "-",
            f"{r['passes']:,}",
            f"{r['attempts']:,}",
            f"{r['preemptions']:,}",
            f"{r['utilisation']:.3f}",
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *body]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", help="JOBS:GPUS[,JOBS:GPUS...] (default 20000:512,100000:2048)")
    args = parser.parse_args(argv)
    sizes = SIZES
    if args.sizes:
        sizes = tuple((int(j), int(g), 0.0) for j, g in (s.split(":") for s in args.sizes.split(",")))
    print(_table(run(sizes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
