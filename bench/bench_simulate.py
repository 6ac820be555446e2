"""Benchmark: quotas.engine.simulate.simulate() on generated traces, with the real policy, no database.

Sizes from `quotas.engine.tracegen` (6 teams, seed 1): 20,000 jobs on 512 GPUs (target: under 8 s),
100,000 jobs on 2,048 GPUs (target: under 60 s) and 100,000 jobs on 2,560 GPUs (the 20k trace's load per
GPU), simulated as `python -m quotas.simulate` does: the engine kept between passes (policy.Engine).
Prints wall and CPU time, the time in passes, planner passes, peak memory
(the process's, so far), attempts, pre-emptions, utilisation, and how time and attempts grow from the
first size (log t / log n).

With `differential` (make bench's default at the first size): the same trace simulated again with
`policy.plan(snapshot)` rebuilt at every pass must give a byte-identical result (issue 14's differential
test at full size; `make test` runs it at bounded sizes).

Run with `python bench/bench_simulate.py [--sizes 20000:512,100000:2048] [--differential]`, or call `run()`.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402
from quotas.engine import policy, tracegen  # noqa: E402
from quotas.engine import scenario as sc  # noqa: E402
from quotas.engine.simulate import Profile, simulate  # noqa: E402

# (jobs, GPUs, target seconds). Issue 14's pair is 20k on 512 and 100k on 2,048 GPUs; on 2,048 GPUs the
# same generator loads each GPU a quarter more (utilisation 0.51 -> 0.60), and the work to decide grows
# faster than the jobs (attempts n^1.22, pre-emptions 27x). 100k on 2,560 GPUs keeps the 20k trace's
# load per GPU: the growth of the engine's cost at the same load.
SIZES = ((20_000, 512, 8.0), (100_000, 2_048, 60.0), (100_000, 2_560, 60.0))


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run(
    sizes: tuple[tuple[int, int, float], ...] = SIZES,
    *,
    teams: int = 6,
    seed: int = 1,
    differential: bool = False,
) -> list[dict]:
    rows = []
    for i, (jobs, gpus, target) in enumerate(sizes):
        scenario = sc.parse(tracegen.generate(teams=teams, gpus=gpus, jobs=jobs, seed=seed))
        profile = Profile(detail=False)  # the passes only: timing every event would slow the run
        t0, c0 = time.perf_counter(), time.process_time()
        result = simulate(scenario, profile=profile)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        records = list(result.jobs.values())
        row = {
            "jobs": jobs,
            "gpus": gpus,
            "seconds": round(seconds, 2),
            "cpu_s": round(cpu, 2),
            "target_s": target,
            "plan_s": round(profile.seconds.get("passes", 0.0), 2),
            "passes": result.cluster["passes"],
            "peak_mb": round(_peak_mb()),
            "attempts": sum(len(r.attempts) for r in records),
            "preemptions": sum(r.preemptions for r in records),
            "utilisation": result.cluster["utilisation"],
            "warnings": len(result.warnings),
        }
        if differential and i == 0:
            # A fresh plan(snapshot) at every pass: the engine must have decided exactly the same.
            rebuilt = simulate(scenario, planner=policy.plan)
            same = json.dumps(rebuilt.to_dict(), sort_keys=True) == json.dumps(
                result.to_dict(), sort_keys=True
            )
            row["differential"] = "identical" if same else "DIFFERENT"
        rows.append(row)
    return rows


def growth(first: dict, row: dict, field: str) -> float | None:
    """How `field` grows from the first size to this one, as the exponent of the job count."""
    return common.exponent(first["jobs"], first[field], row["jobs"], row[field])


def _table(rows: list[dict]) -> str:
    header = [
        "jobs", "GPUs", "seconds", "target", "in passes", "passes", "peak MB", "attempts", "pre-emptions",
        "util.", "time n^", "attempts n^",
    ]  # fmt: skip
    body = []
    for r in rows:
        t_grow, a_grow = growth(rows[0], r, "seconds"), growth(rows[0], r, "attempts")
        body.append(
            [
                f"{r['jobs']:,}",
                f"{r['gpus']:,}",
                f"{r['seconds']:.1f}",
                f"{r['target_s']:.0f}",
                f"{r['plan_s'] / r['seconds']:.0%}" if r["seconds"] else "-",
                f"{r['passes']:,}",
                f"{r['peak_mb']:,}",
                f"{r['attempts']:,}",
                f"{r['preemptions']:,}",
                f"{r['utilisation']:.3f}",
                "-" if t_grow is None else f"{t_grow:.2f}",
                "-" if a_grow is None else f"{a_grow:.2f}",
            ]
        )
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *body]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", help="JOBS:GPUS[,JOBS:GPUS...] (default 20000:512,100000:2048,100000:2560)"
    )
    parser.add_argument("--differential", action="store_true", help="check the first size against plan()")
    args = parser.parse_args(argv)
    sizes = SIZES
    if args.sizes:
        sizes = tuple((int(j), int(g), 0.0) for j, g in (s.split(":") for s in args.sizes.split(",")))
    rows = run(sizes, differential=args.differential)
    print(_table(rows))
    for r in rows:
        if "differential" in r:
            print(f"{r['jobs']:,} jobs, engine vs plan() at every pass: {r['differential']}")
    return 0 if all(r.get("differential", "identical") == "identical" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
