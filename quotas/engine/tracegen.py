"""Synthetic scenarios shaped like published GPU-cluster traces, for the simulator and its benchmarks.

``python -m quotas.tracegen --teams 6 --gpus 512 --jobs 20000 --seed 1 > scenario.json`` writes a
valid scenario (../shared/spec/SCENARIO.md). The same arguments always give the same bytes.

Shape, and where the numbers come from:

- **Cluster**: ``--gpus / 8`` nodes of 8 GPUs of one type (``--gpu-type``, default ``v100``, the
  GPUs of Helios' Venus cluster). Everything is assigned to shares (no unassigned pool).
- **Shares**: one per team. Capacities are real virtual-cluster (team quota) sizes of SenseTime's
  Venus cluster on one day (``--vc-day``, default 2020-09-28; 16 non-empty VCs of 8 to 256 GPUs),
  sampled without replacement and scaled to ``--gpus`` in whole nodes. Source: the Helios trace,
  Hu et al., "Characterization and Prediction of Deep Learning Workloads in Large-Scale GPU
  Datacenters", SC'21, github.com/S-Lab-System-Group/HeliosData (CC-BY-4.0), via
  ../shared/data/helios_venus_vc_gpus.csv; `VENUS_VC_GPUS` is a copy of the default day's row so
  that this works without shared/. Strategies are mixed (about 20% RESERVE, 30% LEND, 50%
  LEND_AND_BORROW, at least one LEND_AND_BORROW); borrow limits from {unlimited, 50, 100, 200}%.
- **GPUs per job**: 70% 1 GPU, then powers of two with a long tail: 2 and 4 (7% each), 8 (10%),
  16 (3.5%), 32 (1.5%), 64 (0.8%), 128 (0.2%); above 8 a job is a gang of whole nodes. A job goes only to
  a team that could ever hold it (its capacity, plus for a borrower what the non-RESERVE teams could
  lend, within its borrow limit); one that no team could hold is halved until one can. Mean about 3.7 GPUs,
  median 1: Helios (all clusters) reports a mean of 3.72 GPUs per GPU job, Venus 6.74, and Philly
  (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads",
  ATC'19) a median of 1 and a mean of 1.93.
- **Run time** (``duration_s``): log-normal, median 200 s for a 1-GPU job, times 1 + log2(gpus)/2 for
  larger ones (bigger jobs run longer, as in Philly), sigma 2.2, cut to [10 s, 7 days]. The median
  over all jobs comes out near 250 s and the mean near 3,000 s, with a tail to days. Helios reports a
  median run time of 206 s (Venus 204 s); Philly a median of 874 s and a mean of 18,006 s. The
  size factor and sigma are modelling choices, not published numbers.
- **Arrivals**: per team a two-state Markov-modulated Poisson process (calm, and bursts at 6x the calm
  rate; mean sojourn 4 h calm, 1 h burst), the bursty shape of per-user submissions in both papers.
- **Load**: each team is offered work per GPU of its quota around ``--load`` (default 0.85): times
  1.2 for LEND_AND_BORROW teams and 0.85 for the others, times a log-normal factor (sigma 0.2), and
  at most 0.9 for teams that cannot borrow, so borrowers tend to run over their quota while the others
  lend and no non-borrower's queue grows without bound. Jobs go, in generation order, to the team
  furthest below its target work that could ever hold them; all teams share one time horizon.
- **Priorities**: 0 (70%), 1 (15%), 5 (10%), 9 (5%). Half the jobs longer than an hour checkpoint
  every 30 min; one in ten allows at most 3 pre-emptions. Grace 30 s (the SEMANTICS.md default).

``--itp`` writes a replay of a real trace instead (`itp_scenario`): the 69,351 jobs of Microsoft's ITP
clusters over two months, ../shared/data/msft-itp-2021.csv, one share per cluster.

The data files are read from ``../shared/data``: the directory ``shared`` beside the checkout.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quotas.engine import policy

NODE_GPUS = 8
# ../shared/data beside the checkout (a sibling of it, as the README says), not inside it.
SHARED_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
VENUS_CSV = SHARED_DATA / "helios_venus_vc_gpus.csv"
ITP_CSV = SHARED_DATA / "msft-itp-2021.csv"
ITP_GPUS = 1280  # 160 nodes of 8: the trace's mean offered demand (1,136 GPUs) is a load of about 0.9
VENUS_VC_DAY = "2020-09-28"
# Non-empty Venus virtual clusters on VENUS_VC_DAY (GPUs), copied from helios_venus_vc_gpus.csv.
VENUS_VC_GPUS = {
    "vcEwI": 72,
    "vcWoR": 40,
    "vcHvQ": 64,
    "vcvGl": 160,
    "vc8Gr": 48,
    "vcKeu": 88,
    "vcKrE": 32,
    "vcYVn": 88,
    "vchbv": 32,
    "vcLTP": 64,
    "vchA3": 24,
    "vcJsw": 256,
    "vcefl": 80,
    "vcvlY": 16,
    "vcgkz": 8,
    "vcEhP": 8,
}

JOB_GPUS = ((1, 0.70), (2, 0.07), (4, 0.07), (8, 0.10), (16, 0.035), (32, 0.015), (64, 0.008), (128, 0.002))
MEDIAN_RUN_S = 200
RUN_SIGMA = 2.2
MIN_RUN_S, MAX_RUN_S = 10, 7 * 86400
PRIORITIES = ((0, 0.70), (1, 0.15), (5, 0.10), (9, 0.05))
STRATEGIES = ((policy.RESERVE, 0.2), (policy.LEND, 0.3), (policy.LEND_AND_BORROW, 0.5))
BORROW_LIMITS = (policy.UNLIMITED, 50, 100, 200)
CALM_S, BURST_S, BURST_FACTOR = 4 * 3600, 3600, 6.0
# Work per GPU of quota: borrowers tend to run over their quota, the others a little under it.
_TILT = {policy.RESERVE: 0.85, policy.LEND: 0.85, policy.LEND_AND_BORROW: 1.2}
LOAD_SIGMA = 0.2
MAX_NON_BORROWER_LOAD = 0.9


def venus_vc_sizes(day: str = VENUS_VC_DAY, csv_path: Path = VENUS_CSV) -> dict[str, int]:
    """GPUs per non-empty Venus virtual cluster on `day`, from the CSV if present, else the copy."""
    if not csv_path.exists():
        if day != VENUS_VC_DAY:
            raise ValueError(f"{csv_path} is missing; only {VENUS_VC_DAY} is built in")
        return dict(VENUS_VC_GPUS)
    with csv_path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["date"] == day:
                return {vc: int(n) for vc, n in row.items() if vc not in ("date", "total") and int(n) > 0}
    raise ValueError(f"no row for {day} in {csv_path}")


def _pick(rng: random.Random, table: Sequence[tuple[Any, float]]) -> Any:
    x = rng.random()
    for value, p in table:
        x -= p
        if x < 0:
            return value
    return table[-1][0]


def _scale(sizes: list[int], total: int) -> list[int]:
    """Scale sizes to `total` GPUs in whole nodes (largest remainder), at least one node each."""
    nodes = total // NODE_GPUS
    raw = [s * nodes / sum(sizes) for s in sizes]
    out = [max(1, math.floor(r)) for r in raw]
    order = sorted(range(len(sizes)), key=lambda i: (out[i] - raw[i], i))
    i = 0
    while sum(out) < nodes:
        out[order[i % len(order)]] += 1
        i += 1
    while sum(out) > nodes:
        j = max(range(len(out)), key=lambda k: (out[k] - raw[k], k))
        out[j] -= 1
    return [n * NODE_GPUS for n in out]


def _max_holdable(shares: list[dict[str, Any]], i: int, gpu_type: str) -> int:
    """The most GPUs share `i` could ever hold: its capacity, plus for a borrower what others can lend."""
    share = shares[i]
    own = share["capacity"][gpu_type]
    if share["strategy"] != policy.LEND_AND_BORROW:
        return own
    lendable = sum(
        s["capacity"][gpu_type] for k, s in enumerate(shares) if k != i and s["strategy"] != policy.RESERVE
    )
    if share["borrow_limit"] != policy.UNLIMITED:
        lendable = min(lendable, own * share["borrow_limit"] // 100)
    return own + lendable


def _arrivals(rng: random.Random, n: int, mean_rate: float) -> list[float]:
    """`n` arrival times of a two-state MMPP whose long-run rate is `mean_rate` per second."""
    burst_share = BURST_S / (CALM_S + BURST_S)
    calm_rate = mean_rate / (1 - burst_share + burst_share * BURST_FACTOR)
    t, out = 0.0, []
    burst = rng.random() < burst_share
    state_end = rng.expovariate(1 / (BURST_S if burst else CALM_S))
    while len(out) < n:
        rate = calm_rate * (BURST_FACTOR if burst else 1.0)
        nxt = t + rng.expovariate(rate)
        if nxt > state_end:
            t = state_end
            burst = not burst
            state_end = t + rng.expovariate(1 / (BURST_S if burst else CALM_S))
            continue
        t = nxt
        out.append(t)
    return out


def generate(
    *,
    teams: int = 6,
    gpus: int = 512,
    jobs: int = 20000,
    seed: int = 1,
    gpu_type: str = "v100",
    load: float = 0.85,
    vc_day: str = VENUS_VC_DAY,
    max_runtime: float | None = None,
) -> dict[str, Any]:
    """A scenario as JSON-ready data (see the module docstring for its shape)."""
    if gpus < NODE_GPUS or gpus % NODE_GPUS:
        raise ValueError(f"--gpus must be a positive multiple of {NODE_GPUS}")
    if not 1 <= teams <= gpus // NODE_GPUS:
        raise ValueError(f"--teams must be between 1 and {gpus // NODE_GPUS} (one node each)")
    if jobs < 0 or load <= 0:
        raise ValueError("--jobs must be >= 0 and --load > 0")
    rng = random.Random(seed)
    vcs = venus_vc_sizes(vc_day)
    names = sorted(vcs)
    picked = [names[i % len(names)] for i in rng.sample(range(max(teams, len(names))), teams)]
    capacities = _scale([vcs[vc] for vc in picked], gpus)

    shares = []
    for i, cap in enumerate(capacities):
        strategy = _pick(rng, STRATEGIES)
        shares.append(
            {
                "name": f"team-{i + 1}",
                "team": f"team-{i + 1}",
                "capacity": {gpu_type: cap},
                "strategy": strategy,
                "borrow_limit": rng.choice(BORROW_LIMITS) if strategy == policy.LEND_AND_BORROW else -1,
                "in_share_preemption": rng.random() < 0.5,
                "state": "ENABLED",
            }
        )
    if not any(s["strategy"] == policy.LEND_AND_BORROW for s in shares):
        largest = max(shares, key=lambda s: s["capacity"][gpu_type])
        largest["strategy"] = policy.LEND_AND_BORROW

    # Offered work per GPU of quota, per team; non-borrowers stay below their quota on average.
    holdable = [_max_holdable(shares, i, gpu_type) for i in range(teams)]
    target = []
    for share in shares:
        rho = load * _TILT[share["strategy"]] * rng.lognormvariate(0, LOAD_SIGMA)
        if share["strategy"] != policy.LEND_AND_BORROW:
            rho = min(rho, MAX_NON_BORROWER_LOAD)
        target.append(rho * share["capacity"][gpu_type])

    drafts = []  # (gpus, duration, priority, checkpoint, max_preemptions)
    for _ in range(jobs):
        size = _pick(rng, JOB_GPUS)
        median = MEDIAN_RUN_S * (1 + math.log2(size) / 2)
        duration = int(min(MAX_RUN_S, max(MIN_RUN_S, rng.lognormvariate(math.log(median), RUN_SIGMA))))
        priority = _pick(rng, PRIORITIES)
        checkpoint = 1800 if duration > 3600 and rng.random() < 0.5 else None
        max_preemptions = 3 if rng.random() < 0.1 else -1
        drafts.append((size, duration, priority, checkpoint, max_preemptions))

    # Each job to the team furthest below its target work that could ever hold it.
    per_team: list[list[tuple[int, int, int, int | None, int]]] = [[] for _ in shares]
    work = [0] * teams
    for k in range(jobs):
        size, duration, *rest = drafts[k]
        while size > max(holdable):
            size //= 2
        i = min((i for i in range(teams) if holdable[i] >= size), key=lambda i: (work[i] / target[i], i))
        per_team[i].append((size, duration, *rest))
        work[i] += size * duration
    horizon = sum(work) / sum(target) if jobs else 1.0

    submit = []  # (time, share index, draft)
    for i, mine in enumerate(per_team):
        rng.shuffle(mine)
        times = _arrivals(rng, len(mine), len(mine) / horizon) if mine else []
        submit.extend((int(t), i, draft) for t, draft in zip(times, mine, strict=True))
    submit.sort()

    job_list = []
    for n, (t, i, (size, duration, priority, checkpoint, max_preemptions)) in enumerate(submit):
        job = {
            "id": f"j{n + 1:06d}",
            "share": shares[i]["name"],
            "submit_at": t,
            "duration_s": duration,
            "gpus": size,
            "gpu_type": gpu_type,
            "priority": priority,
            "max_preemptions": max_preemptions,
            "checkpoint_every_s": checkpoint,
        }
        if max_runtime:
            # As users declare it: a margin over the real run time, rounded up to the hour.
            job["max_runtime_s"] = math.ceil(duration * max_runtime / 3600) * 3600
        job_list.append(job)

    provenance = ", ".join(f"{s['name']}={vc}" for s, vc in zip(shares, picked, strict=True))
    return {
        "description": (
            f"quotas.engine.tracegen --teams {teams} --gpus {gpus} --jobs {jobs} --seed {seed} "
            f"--gpu-type {gpu_type} --load {load} --vc-day {vc_day}. Share capacities scaled from Venus "
            f"virtual clusters ({provenance}) of the Helios trace (Hu et al., SC'21; "
            "S-Lab-System-Group/HeliosData, CC-BY-4.0)."
        ),
        "settings": {"tick_s": 1, "preemption_grace_s": 30, "starvation_s": 3600, "until_s": None},
        "nodes": [
            {"name": f"node-{k + 1:04d}", "gpu_type": gpu_type, "gpus": NODE_GPUS} for k in range(gpus // 8)
        ],
        "shares": shares,
        "jobs": job_list,
        "events": [],
    }


def itp_scenario(
    *, csv_path: Path = ITP_CSV, gpus: int = ITP_GPUS, jobs: int | None = None, gpu_type: str = "v100"
) -> dict[str, Any]:
    """A replay of the real ITP trace (../shared/data/msft-itp-2021.csv, see its README): its jobs as
    they came (submit time, run time, GPUs), the first `jobs` of them or all. The release names no team,
    so each of its clusters (c01..c10) is a share, a modelling choice: capacity in proportion to the
    cluster's GPU-seconds over the whole trace, scaled to `gpus` in whole nodes; every share lends and
    borrows without a limit (the trace knows of no quota), priority 0, no checkpoints."""
    if gpus < NODE_GPUS or gpus % NODE_GPUS:
        raise ValueError(f"--gpus must be a positive multiple of {NODE_GPUS}")
    if not csv_path.exists():
        raise ValueError(f"{csv_path} is missing (the ITP trace is in ../shared/data beside the checkout)")
    with csv_path.open(newline="", encoding="utf-8") as f:
        rows = [
            (int(r["submit_s"]), int(r["duration_s"]), int(r["gpus"]), r["group"]) for r in csv.DictReader(f)
        ]
    work: dict[str, int] = {}
    for _, duration, size, group in rows:
        work[group] = work.get(group, 0) + duration * size
    groups = sorted(work)
    if len(groups) > gpus // NODE_GPUS:
        raise ValueError(f"--gpus must give each of the {len(groups)} clusters a node at least")
    capacities = _scale([work[g] for g in groups], gpus)
    rows.sort(key=lambda r: r[0])  # stable: the file's order among equal submit times
    picked = rows if jobs is None else rows[:jobs]
    return {
        "description": (
            f"quotas.engine.tracegen --itp --gpus {gpus}"
            + ("" if jobs is None else f" --jobs {jobs}")
            + f" --gpu-type {gpu_type}. The first {len(picked):,} of {len(rows):,} jobs of Microsoft's ITP "
            "GPU clusters, 2021-03-04 to 2021-05-03 (microsoft/elasticflow-traces, MIT licence, (c) Microsoft "
            "Corporation; ElasticFlow, ASPLOS '23), one share per cluster."
        ),
        "settings": {"tick_s": 1, "preemption_grace_s": 30, "starvation_s": 3600, "until_s": None},
        "nodes": [
            {"name": f"node-{k + 1:04d}", "gpu_type": gpu_type, "gpus": NODE_GPUS} for k in range(gpus // 8)
        ],
        "shares": [
            {
                "name": group,
                "team": group,
                "capacity": {gpu_type: cap},
                "strategy": policy.LEND_AND_BORROW,
                "borrow_limit": policy.UNLIMITED,
                "in_share_preemption": False,
                "state": "ENABLED",
            }
            for group, cap in zip(groups, capacities, strict=True)
        ],
        "jobs": [
            {
                "id": f"itp{n + 1:06d}",
                "share": group,
                "submit_at": submit,
                "duration_s": duration,
                "gpus": min(size, gpus),  # (the widest job is 64 GPUs: only a tiny --gpus cuts it)
                "gpu_type": gpu_type,
                "priority": 0,
                "max_preemptions": -1,
                "checkpoint_every_s": None,
            }
            for n, (submit, duration, size, group) in enumerate(picked)
        ],
        "events": [],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m quotas.tracegen", description="Write a synthetic scenario JSON to standard output."
    )
    parser.add_argument(
        "--itp",
        action="store_true",
        help=f"replay the real ITP trace ({ITP_CSV.name} in ../shared/data) instead: one share per cluster",
    )
    parser.add_argument("--teams", type=int, default=6)
    parser.add_argument(
        "--gpus", type=int, help=f"cluster size, a multiple of 8 (default 512; {ITP_GPUS} with --itp)"
    )
    parser.add_argument("--jobs", type=int, help="how many jobs (default 20000; with --itp all, the first N)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpu-type", default="v100")
    parser.add_argument(
        "--load", type=float, default=0.85, help="offered work per GPU of quota (see the docstring)"
    )
    parser.add_argument("--vc-day", default=VENUS_VC_DAY, help="which day's Venus VC sizes (needs shared/)")
    parser.add_argument(
        "--max-runtime",
        type=float,
        metavar="FACTOR",
        help="give every job a max_runtime_s of FACTOR x its duration, rounded up to the hour (e.g. 1.5)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    try:
        if args.itp:
            data = itp_scenario(gpus=args.gpus or ITP_GPUS, jobs=args.jobs, gpu_type=args.gpu_type)
        else:
            data = generate(
                teams=args.teams,
                gpus=args.gpus or 512,
                jobs=20000 if args.jobs is None else args.jobs,
                seed=args.seed,
                gpu_type=args.gpu_type,
                load=args.load,
                vc_day=args.vc_day,
                max_runtime=args.max_runtime,
            )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
