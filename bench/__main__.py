"""`python -m bench` (`make bench`): every benchmark of issue 7, one table at the end.

    python -m bench                 # full sizes (several minutes)
    python -m bench --quick         # small sizes, a minute or two
    python -m bench --only policy,simulate
    python -m bench --json out.json

Benchmarks: 1 policy (plan() alone), 2 pass and 5 pages (PostgreSQL), 3 submit and arrays (granian,
PostgreSQL + Redis), 7 cli (`gpuquota` as fresh processes), 4 latency (control worker + fake agents,
PostgreSQL + Redis), 6 simulate, 9 what-if (a seeded 20k-job week, PostgreSQL), 11 layout (plan,
apply and the what-if of a 50-share change, PostgreSQL), 8 slurm (a one-node Slurm beside gpuquota, alternating; needs
slurm-wlm and root), 10 itp (issue 26: pre-emption's cost on the real ITP trace, victims by safe point and
protection windows; needs ../shared/data/msft-itp-2021.csv), 12 forecast (issue 27: ETA error, range coverage and
width at each submit, on two ITP weeks and tracegen's 20k jobs). Those that need
PostgreSQL or Redis are skipped, with the reason, when DATABASE_URL (a database named `*_bench`, which
they empty) or REDIS_URL is not set or not reachable. Nothing needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import traceback

from bench import common

ALL = (
    "policy",
    "pass",
    "submit",
    "cli",
    "latency",
    "simulate",
    "whatif",
    "layout",
    "slurm",
    "itp",
    "forecast",
)


def _fmt_s(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def _policy(quick: bool) -> list[dict]:
    from bench import bench_policy

    sizes = (1_000, 10_000) if quick else bench_policy.SIZES
    rows = bench_policy.run(sizes, repeats=3 if quick else 7)
    out = []
    for r in rows:
        big = r["queued"] >= 100_000
        last = r is rows[-1]
        grow = r["exponent"] if last and len(rows) > 1 else None
        met = None
        if big:
            met = r["median_s"] < 1.0 and (grow is None or grow <= 1.15)
        out.append(
            {
                "bench": "1 plan()",
                "size": f"{r['queued']:,} queued, {r['running']:,} running, 8,000 GPUs full",
                "n": 3 if quick else 7,
                "median_s": r["median_s"],
                "p95_s": r["p95_s"],
                "exponent": grow,
                "target": "< 1 s at 100k; growth <= n log n (~1.11)" if big else "",
                "met": met,
                "note": f"{r['admissions']} admitted, {r['preemptions']} pre-empted",
            }
        )
    return out


def _simulate(quick: bool) -> list[dict]:
    from bench import bench_simulate

    sizes = ((2_000, 128, 0.0), (5_000, 256, 0.0)) if quick else bench_simulate.SIZES
    rows = bench_simulate.run(sizes, differential=True)
    out = []
    for r in rows:
        grow = bench_simulate.growth(rows[0], r, "seconds")
        work = bench_simulate.growth(rows[0], r, "attempts")
        out.append(
            {
                "bench": "6 simulate",
                "size": f"{r['jobs']:,} jobs on {r['gpus']:,} GPUs",
                "n": 1,
                "median_s": r["seconds"],
                "p95_s": r["seconds"],
                "exponent": grow,
                "target": f"< {r['target_s']:.0f} s" if r["target_s"] else "",
                "met": (r["seconds"] < r["target_s"] and r.get("differential") != "DIFFERENT")
                if r["target_s"]
                else None,
                "note": f"{r['passes']:,} passes, {r['plan_s'] / r['seconds']:.0%} in passes, "
                f"CPU {r.get('cpu_s', 0):.1f} s, peak {r['peak_mb']:,} MB, {r['attempts']:,} attempts"
                + ("" if work is None else f" (n^{work:.2f}), utilisation {r['utilisation']:.3f}")
                + (f", engine vs plan() at every pass: {r['differential']}" if "differential" in r else ""),
            }
        )
    return out


def _pass(quick: bool) -> list[dict]:
    from bench import bench_pass

    sizes = (2_000, 10_000) if quick else bench_pass.SIZES
    return bench_pass.run(sizes, repeats=3 if quick else 5, page_repeats=10 if quick else 20)


def _submit(quick: bool) -> list[dict]:
    from bench import bench_api

    return bench_api.run(
        jobs=600 if quick else 3000,
        clients=8 if quick else 16,
        max_s=10 if quick else 30,
        arrays=4 if quick else 20,
    )


def _latency(quick: bool) -> list[dict]:
    from bench import bench_latency

    return bench_latency.run(samples=5 if quick else 20, reclaims=2 if quick else 5)


def _cli(quick: bool) -> list[dict]:
    from bench import bench_cli

    return bench_cli.run(submits=20 if quick else 100)


def _whatif(quick: bool) -> list[dict]:
    from bench import bench_whatif

    return bench_whatif.run(jobs=2_000 if quick else bench_whatif.JOBS)


def _itp(quick: bool) -> list[dict]:
    from bench import bench_itp
    from quotas.engine import importtrace

    if not importtrace.ITP_TRACE.exists():
        return [
            {"bench": "10 itp", "size": "-", "skipped": True, "note": f"skipped: no {importtrace.ITP_TRACE}"}
        ]
    out = bench_itp.run(quick=quick)
    print(bench_itp.table(out), flush=True)
    met = bench_itp.targets(out)
    goals = {
        "safe points": ("lost", "owner_p95"),
        "safe points, min_runtime 600": ("window", "bound"),
        "today's order, min_runtime 600": ("window",),
    }
    rows = []
    for r in out["runs"]:
        mine = [met[k] for k in goals.get(r["label"], ()) if k in met]
        rows.append(
            {
                "bench": "10 itp",
                "size": f"{r['jobs']:,} jobs (days 14-{17 if quick else 28}), {r['label']}",
                "n": 1,
                "median_s": r["seconds"],
                "p95_s": r["seconds"],
                "target": "; ".join(goal for _, _, goal in mine),
                "met": all(ok for ok, _, _ in mine) if mine else None,
                "note": f"lost {r['lost_total_h']:,.0f} GPU-h (reclaim {r['lost_h']['reclaim']:,.0f}), "
                f"{r['preemptions']:,} pre-emptions, {r['early']:,} within 10 min, owners' wait p50/p95/max "
                f"{r['wait_p50']}/{r['wait_p95']}/{r['wait_max']} s",
            }
        )
    whole = out["whole"]
    rows.append(
        {
            "bench": "10 itp",
            "size": f"{whole['jobs']:,} jobs, {'first week' if quick else 'whole trace'}, half checkpointing",
            "n": 1,
            "median_s": whole["seconds"],
            "p95_s": whole["seconds"],
            "target": f"< {whole['target_s']:.0f} s" if whole["target_s"] else "",
            "met": met["whole"][0] if "whole" in met else None,
            "note": f"CPU {whole['cpu_s']:.1f} s, lost {whole['lost_total_h']:,.0f} GPU-h",
        }
    )
    return rows


def _forecast(quick: bool) -> list[dict]:
    from bench import bench_forecast

    out = bench_forecast.run(quick=quick)
    print(bench_forecast.table(out), flush=True)
    rows = []
    for r in out:
        met = bench_forecast.targets(r)
        w = r["waited"]
        rows.append(
            {
                "bench": "12 forecast",
                "size": f"{r['label']}, {w['n']:,} of {r['jobs']:,} waited",
                "n": 1,
                "median_s": r["seconds"],
                "p95_s": r["seconds"],
                "target": met[1] if met else "",
                "met": met[0] if met else None,
                "note": f"waited: median error {w['median_abs_s']} s, within 25% {w['within_25pct']}, in range "
                f"{w['range_coverage']}, width {w['range_width_median_s']} s; bound late {r['bound_started_late']}",
            }
        )
    return rows


def _layout(quick: bool) -> list[dict]:
    from bench import bench_layout

    return bench_layout.run(
        jobs=2_000 if quick else bench_layout.JOBS, repeats=2 if quick else bench_layout.REPEATS
    )


def _slurm(quick: bool) -> list[dict]:
    from bench import bench_slurm

    return bench_slurm.run(quick=quick)


RUNNERS = {
    "policy": _policy,
    "pass": _pass,
    "submit": _submit,
    "cli": _cli,
    "latency": _latency,
    "simulate": _simulate,
    "whatif": _whatif,
    "layout": _layout,
    "slurm": _slurm,
    "itp": _itp,
    "forecast": _forecast,
}
NEEDS = {
    "pass": ("db",),
    "submit": ("db", "redis"),
    "cli": ("db", "redis"),
    "latency": ("db", "redis"),
    "whatif": ("db",),
    "layout": ("db",),
    "slurm": ("db", "redis"),
}


def table(rows: list[dict]) -> str:
    header = ["bench", "size", "runs", "median", "p95", "growth", "target", "result", "note"]
    body = []
    for r in rows:
        met = r.get("met")
        body.append(
            [
                r["bench"],
                r["size"],
                str(r.get("n", "")) if r.get("n") else "-",
                _fmt_s(r.get("median_s")),
                _fmt_s(r.get("p95_s")),
                f"{r['exponent']:.2f}" if r.get("exponent") is not None else "",
                r.get("target", ""),
                "met" if met else "MISSED" if met is False else "skipped" if r.get("skipped") else "",
                r.get("note", ""),
            ]
        )
    widths = [max(len(x[i]) for x in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in [header, *body]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (a minute or two)")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--json", help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    wanted = [b.strip() for b in args.only.split(",")] if args.only else list(ALL)
    unknown = set(wanted) - set(ALL)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")

    problems = {}
    if any("db" in NEEDS.get(b, ()) for b in wanted):
        problems["db"] = common.database_problem()
    if any("redis" in NEEDS.get(b, ()) for b in wanted):
        problems["redis"] = common.redis_problem()

    print(f"gpuquota benchmarks on {os.cpu_count()} cores{' (quick)' if args.quick else ''}", flush=True)
    rows: list[dict] = []
    for name in wanted:
        why = next((problems[n] for n in NEEDS.get(name, ()) if problems.get(n)), None)
        if why:
            print(f"- {name}: skipped: {why}", flush=True)
            rows.append({"bench": name, "size": "-", "skipped": True, "note": f"skipped: {why}"})
            continue
        print(f"- {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            got = RUNNERS[name](args.quick)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not hide the others
            traceback.print_exc()
            got = [{"bench": name, "size": "-", "met": False, "note": f"failed: {exc}"}]
        rows.extend(got)
        print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)

    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cores": os.cpu_count(), "quick": args.quick, "rows": rows}, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
