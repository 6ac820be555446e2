"""Benchmark (issue 38.4): replays in seconds, this checkout side by side with another (today's code).

Three replays, each timed in a fresh process of its own, the two checkouts alternating (base, this,
base, this, ...), wall and CPU seconds (time.process_time: the VM's 2 cores are shared, so the CPU time
is the figure that compares):

- ``itp``: the whole ITP trace (69,351 jobs, 168 x 8 a100, 9 shares, half the jobs checkpointing;
  bench/bench_itp.py's scenario, needs ../shared/data/msft-itp-2021.csv). Target <= 8 s.
- ``tracegen``: tracegen 100,000 jobs on 2,048 GPUs (6 teams, seed 1; bench 6's). Target <= 20 s.
- ``whatif``: the what-if of a 20-share layout change on a 20k-job week (bench 11's shape, without the
  database): the week seed_history writes (tracegen 20,000 jobs on 768 v100, 6 shares, its arrivals
  scaled onto 7 days, the jobs that would still run cut as the window cuts them) beside 44 more
  LEND_AND_BORROW shares on 64 8-GPU a10g nodes with 2,000 jobs submitted at the window's end; the
  change is bench 11's (20 of the 50 shares: capacities, 4 to RESERVE with 4 GPUs, one temporary).
  Timed: quotas.whatif's own work as a part does it (`with_layout`, `replay` of each side, `compare`).
  Both replays one after the other; the worker runs them side by side, so the request waits for
  about the longer of the two (printed too). Target <= 5 s.

The replay is timed to its result (`simulate()`, or the what-if's comparison); writing the simulator's
result JSON is timed apart (json_cpu_s). Each run prints a sha256 of what it produced (the simulator's result JSON; for the what-if, the compare
JSON with its two summaries): both checkouts must give the same.

    python bench/bench_replay_speed.py --base /work/h2a-base [--only itp,tracegen,whatif] [--repeats 2]
    python bench/bench_replay_speed.py --one whatif      # this checkout only, one run (no --base)
    python bench/bench_replay_speed.py --base . --base-as-python   # compiled against itself as Python

Each run says which engine it ran ("engine": compiled or python; quotas/engine/native.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TARGETS = {"itp": 8.0, "tracegen": 20.0, "whatif": 5.0}

# Run in the checkout under test (its own modules), as `python -c`: builds the scenario (not timed),
# then times the replay. Kept to APIs both checkouts have.
WORKER = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, os.getcwd())
which = sys.argv[1]
from quotas.engine import scenario as sc, tracegen
from quotas.engine.simulate import simulate


def digest(text):
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def whatif_week():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django
    django.setup()
    from quotas import whatif
    from quotas.management.commands import seed_history as seed

    days, jobs = 7, 20_000
    data = seed.generate(jobs=jobs, gpus=seed.default_gpus(jobs, days), seed=1, gpu_type="v100")
    span = max(1, max(j["submit_at"] for j in data["jobs"]))
    scale = (days * 86400 - 600) / span
    end = days * 86400 - 600  # "now": the window's end (the last submission)
    for s in data["shares"]:
        s["name"] = "hist-" + s["name"]
    for j in data["jobs"]:
        j["share"] = "hist-" + j["share"]
        j["submit_at"] = int(j["submit_at"] * scale)
        if j["submit_at"] + j["duration_s"] > end:  # still running at the window's end: cancelled
            j["max_runtime_s"] = j["duration_s"]
    for t in range(6):  # bench 11's 44 more shares, 64 a10g nodes, 2,000 jobs queued at the end
        for s in range(44 // 6 + (1 if t < 44 % 6 else 0)):
            data["shares"].append({"name": f"team-{t}-s{s}", "team": f"team-{t}",
                                   "capacity": {"a10g": 8 + (s % 3) * 4}, "strategy": "LEND_AND_BORROW"})
    data["nodes"] += [{"name": f"a10g-{i:02d}", "gpu_type": "a10g", "gpus": 8} for i in range(64)]
    extra = [s["name"] for s in data["shares"] if not s["name"].startswith("hist-")]
    for i in range(2000):
        data["jobs"].append({"id": f"q{i}", "share": extra[i % len(extra)], "submit_at": end,
                             "duration_s": 3600, "max_runtime_s": 3600, "gpus": (1, 2, 4, 8)[i % 4],
                             "gpu_type": "a10g"})
    data["settings"] = {**data.get("settings", {}), "tick_s": 1, "until_s": end + whatif.TAIL_S}
    scenario = sc.parse(data)
    # bench 11's change: 20 of the 50 shares (4 seeded), as quotas.layout.whatif_variant gives them
    shares = [{"name": s.name, "team": s.team, "capacity": dict(s.capacity), "strategy": s.strategy,
               "borrow_limit": s.borrow_limit} for s in scenario.shares]
    changed = [s for s in shares if s["name"].startswith("hist-")][:4]
    changed += [s for s in shares if not s["name"].startswith("hist-")][:16]
    reverts = []
    for i, s in enumerate(changed):
        gpu_type = next(iter(s["capacity"]))
        before = {**s, "capacity": dict(s["capacity"])}
        if i in (8, 9, 10, 11):
            s["strategy"], s["borrow_limit"] = "RESERVE", -1
            s["capacity"][gpu_type] = 4
        else:
            s["capacity"][gpu_type] += 4
        if i == 7:  # a temporary change: it goes back after 2 days of the replay
            reverts.append({"share": s["name"], "after_s": 2 * 86400, "set": before})
    variant = {"shares": shares, "reverts": reverts}
    return whatif, scenario, variant, [s["name"] for s in changed], float(end)


out = {}
if which == "itp":
    sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
    from bench.bench_itp import itp_scenario
    scenario = itp_scenario(None)
elif which == "tracegen":
    scenario = sc.parse(tracegen.generate(teams=6, gpus=2048, jobs=100_000, seed=1))
else:
    whatif, scenario, variant, changed, window_s = whatif_week()
c0, t0 = time.process_time(), time.perf_counter()
if which == "whatif":
    planned, _ = whatif.with_layout(scenario, variant)
    c1, t1 = time.process_time(), time.perf_counter()
    before = whatif.replay(scenario, window_s=window_s)
    c2, t2 = time.process_time(), time.perf_counter()
    after = whatif.replay(planned, window_s=window_s)
    c3, t3 = time.process_time(), time.perf_counter()
    compared = whatif.compare(before, after, changed)
    text = json.dumps(compared, sort_keys=True, default=str)
    out["replays_cpu_s"] = [round(c2 - c1, 2), round(c3 - c2, 2)]
    out["replays_wall_s"] = [round(t2 - t1, 2), round(t3 - t2, 2)]
else:
    result = simulate(scenario)
out["cpu_s"] = round(time.process_time() - c0, 2)
out["wall_s"] = round(time.perf_counter() - t0, 2)
if which != "whatif":  # the result JSON (what `python -m quotas.simulate --out` writes), timed apart
    c0 = time.process_time()
    text = result.to_json()
    out["json_cpu_s"] = round(time.process_time() - c0, 2)
out["digest"] = digest(text)
out["jobs"] = len(scenario.jobs)
out["engine"] = "compiled" if getattr(sys.modules["quotas.engine"], "COMPILED", False) else "python"
print("RESULT " + json.dumps(out))
"""


def run_one(checkout: Path, which: str, as_python: bool = False) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    if as_python:  # the engine's sources as Python, even where a compiled build is there (native.py)
        env["GPUQUOTA_ENGINE"] = "python"
    env.setdefault("GPUQUOTA_VAR_DIR", str(HERE / "var" / "bench-replay"))
    proc = subprocess.run(
        [sys.executable, "-c", WORKER, which],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{which} in {checkout} failed:\n{proc.stderr[-3000:]}")


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="the other checkout (e.g. a git worktree of today's code)")
    parser.add_argument("--only", default="itp,tracegen,whatif")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--one", help="one run of one target in this checkout only")
    parser.add_argument("--json", help="write the runs here")
    parser.add_argument(
        "--base-as-python",
        action="store_true",
        help="run the base with GPUQUOTA_ENGINE=python (with --base . : this checkout compiled against itself as Python)",
    )
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(HERE, args.one, args.base_as_python)))
        return 0
    if not args.base:
        parser.error("--base is required (or --one TARGET)")
    sides = {"base": Path(args.base).resolve(), "this": HERE}
    runs: list[dict] = []
    for which in args.only.split(","):
        if which not in TARGETS:
            parser.error(f"unknown target {which!r}: one of {', '.join(TARGETS)}")
        for repeat in range(args.repeats):
            for side, checkout in sides.items():
                row = {"target": which, "side": side, "repeat": repeat, "load_before": load_average()}
                row.update(run_one(checkout, which, args.base_as_python and side == "base"))
                row["load_after"] = load_average()
                runs.append(row)
                print(json.dumps(row), flush=True)
    print(f"\n{'target':<9}{'side':<6}{'CPU s (median)':>16}{'wall s (median)':>17}{'target':>8}  digest")
    ok = True
    for which in dict.fromkeys(r["target"] for r in runs):
        digests = {r["digest"] for r in runs if r["target"] == which}
        ok = ok and len(digests) == 1
        for side in sides:
            mine = [r for r in runs if r["target"] == which and r["side"] == side]
            cpu = statistics.median(r["cpu_s"] for r in mine)
            wall = statistics.median(r["wall_s"] for r in mine)
            print(
                f"{which:<9}{side:<6}{cpu:>16.2f}{wall:>17.2f}{TARGETS[which]:>8.0f}  "
                f"{mine[0]['digest']}{'' if len(digests) == 1 else ' DIFFERENT'}"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
