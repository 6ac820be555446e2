"""Benchmark 14 (issue 38): the advisor's replays, and whether its advice holds out of sample.

`speed`: tracegen (6 teams, 512 GPUs, --jobs N, seed 1) advised with quotas.advise.search, replays in
this process (--jobs 1) and in a pool of 2 processes; per run the replays, the seconds per replay (the
mean of the one-process run) and the total, and whether the two answers are identical.

`holdout` (needs ../shared/data/msft-itp-2021.csv): advise on an ITP fortnight (bench 10's scenario,
days 14-28 by default; --start D: days D to D+14), then replay the **next** week (days 28-35, or D+14
to D+21; --hold-days N: N days) with today's layout and with the recommended one, and compare
utilisation, owners' p95 wait and lost GPU-hours (quotas.advise.evaluate). --quick advises on days 14-17
and holds out days 17-19.

`celery` (item 3, needs PostgreSQL and Redis): one advice run over a week of seed_history (--history N
jobs) on real Celery workers of the `whatif` queue, first 1, then 2, ... (--workers 1,2), each worker one
thread and one replay process (ADVICE_PROCESSES=1), started fresh for each run with the cache emptied
(no replay read back); per run the seconds from start() to the advice, the replays, and a sha256 of
the advice (the same whatever the number of workers). As `make bench`'s database parts: DATABASE_URL
(a database named `*_bench`: it is emptied) and REDIS_URL (emptied before each run).

    python bench/bench_advise.py speed --jobs 2000
    python bench/bench_advise.py holdout [--quick] [--pool 2] [--start 14] [--hold-days 7]
    DATABASE_URL=... REDIS_URL=... python bench/bench_advise.py celery [--history 5000] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    ROOT,
    celery_worker,
    database_problem,
    redis_problem,
    setup_django,
    spawn,
    stop,
    wait_for,
    wipe,
)
from quotas import advise  # noqa: E402
from quotas.engine import measures, tracegen  # noqa: E402
from quotas.engine import scenario as sc  # noqa: E402

DAY = 86400


def _timed_replayer(scenario, window_s, jobs, seconds):
    inner = advise.local_replayer(scenario, window_s=window_s, jobs=jobs)

    def many(variants):
        t0 = time.perf_counter()
        out = inner(variants)
        seconds.append((len(variants), time.perf_counter() - t0))
        return out

    return many


def speed(args) -> None:
    scenario = sc.parse(tracegen.generate(teams=6, gpus=512, jobs=args.jobs, seed=1))
    window = measures.natural_window(scenario)
    answers = {}
    for jobs in (1, 2):
        seconds: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        answer = advise.search(
            scenario, window_s=window, replay_many=_timed_replayer(scenario, window, jobs, seconds)
        )
        total = time.perf_counter() - t0
        answers[jobs] = answer
        n = answer["replays"]
        print(
            f"tracegen {args.jobs} jobs, {len(scenario.shares)} shares: --jobs {jobs}: {n} replays "
            f"(stage 1 {seconds[0][0]}, stage 2 {seconds[1][0] if len(seconds) > 1 else 0}), "
            f"{total:.1f} s total, {total / n:.2f} s per replay of wall time"
        )
    print("identical answers with 1 and 2 processes:", answers[1] == answers[2])
    print(f"frontier: {len(answers[1]['frontier'])} points, recommended {answers[1]['recommended']}")


def holdout(args) -> None:
    from bench.bench_itp import itp_scenario

    start = args.start * DAY
    train = (start, start + (3 if args.quick else 14) * DAY)
    test = (train[1], train[1] + (2 if args.quick else args.hold_days) * DAY)
    advised = itp_scenario(train)
    window = train[1] - train[0]
    t0 = time.perf_counter()
    answer = advise.search(
        advised, window_s=window, replay_many=advise.local_replayer(advised, window_s=window, jobs=args.pool)
    )
    took = time.perf_counter() - t0
    rec = answer["recommended"]
    chosen = answer["today"] if rec is None else answer["frontier"][rec]
    print(f"advised on days {train[0] // DAY}-{train[1] // DAY}: {answer['replays']} replays in {took:.0f} s")
    print("recommended:", "; ".join(c["words"] for c in chosen["changes"]) or "today's layout")
    # The held-out week with the advised fortnight's shares (importtrace's top 8 of a window differ
    # from week to week): each trained share takes its own cluster's jobs, `other` the rest.
    layout = chosen["layout"]
    held = _held_out(test, today=answer["today"]["layout"]["shares"])
    names = {s.name for s in held.shares}
    recommended = sc.parse(
        {
            **held.to_dict(),
            "shares": [s for s in layout["shares"] if s["name"] in names],
            "settings": {**held.to_dict()["settings"], **layout["settings"]},
        }
    )
    assert names == {s["name"] for s in layout["shares"]}, "the held-out week has other shares"
    hwindow = test[1] - test[0]
    rows = {}
    for label, scenario in (("today's layout", held), ("recommended", recommended)):
        point = advise.evaluate(scenario, window_s=hwindow)
        rows[label] = point
        print(
            f"held out days {test[0] // DAY}-{test[1] // DAY}, {label}: utilisation {point['utilisation']} %, "
            f"owners' p95 wait {point['owners_p95_wait_s']} s, lost {point['lost_gpu_seconds'] / 3600:.0f} GPU-h, "
            f"never started {point['never_started']}"
        )
    in_sample = {k: chosen[k] for k in ("utilisation", "owners_p95_wait_s", "lost_gpu_seconds")}
    today = {k: answer["today"][k] for k in ("utilisation", "owners_p95_wait_s", "lost_gpu_seconds")}
    print("in sample: today", json.dumps(today), "recommended", json.dumps(in_sample))


def _held_out(window: tuple[int, int], *, today: list[dict]):
    import csv

    from quotas.engine import importtrace

    with open(importtrace.ITP_TRACE, encoding="utf-8", newline="") as f:
        clusters = sorted({row["group"] for row in csv.DictReader(f)})
    layout = []
    for share in today:
        takes = [c for c in clusters if importtrace.share_name(c) == share["name"]]
        layout.append({**share, "groups": takes or ["*"]})
    from bench.bench_tree import itp_data

    return sc.parse(itp_data(window, layout=layout, top=8))


def celery_workers(args) -> None:
    problem = database_problem() or redis_problem()
    if problem:
        print(f"celery: {problem}", file=sys.stderr)
        raise SystemExit(2)
    env = {
        **os.environ,
        "GPUQUOTA_VAR_DIR": str(ROOT / "var" / "bench-advise"),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "ADVICE_PROCESSES": "1",
    }
    os.environ.update(env)
    setup_django()
    wipe()
    from django.core.cache import cache
    from django.core.management import call_command
    from django.utils import timezone

    from quotas import advice

    call_command("seed_history", jobs=args.history, stdout=io.StringIO())
    now = timezone.now()
    rows = []
    log = Path(env["GPUQUOTA_VAR_DIR"]) / "workers.log"
    for n in [int(w) for w in args.workers.split(",")]:
        cache.clear()  # the Redis database: no replay read back, no message left over
        workers = [
            spawn(celery_worker("whatif", f"bench-advise-{i}", concurrency=1), log, env) for i in range(n)
        ]
        try:
            from config.celery import app

            # every worker listens before the run
            wait_for(lambda n=n: len(app.control.ping(timeout=0.5) or []) >= n, 60, f"{n} workers to start")
            t0 = time.perf_counter()
            run_id = advice.start(weeks=1, now=now)
            state = wait_for(
                lambda r=run_id: (s := advice.status(r)) and s["finished"] and s, 3600, "the advice"
            )
            seconds = time.perf_counter() - t0
        finally:
            stop(workers)
        if state["state"] != advice.DONE:
            raise SystemExit(f"the run ended {state['state']}: {state['errors']}")
        digest = hashlib.sha256(json.dumps(state["advice"], sort_keys=True).encode()).hexdigest()[:16]
        rows.append((n, state["replays_done"], seconds, state["replay_seconds_mean"], digest))
        print(
            f"{n} worker(s): {state['replays_done']} replays of {state['window']['jobs']} jobs in {seconds:.1f} s "
            f"(a replay {state['replay_seconds_mean']} s on its worker), advice sha256 {digest}",
            flush=True,
        )
    first = rows[0][2]
    for n, _, seconds, _, _ in rows[1:]:
        print(f"{n} workers: {first / seconds:.2f}x sooner than 1")
    print("identical advice whatever the number of workers:", len({r[4] for r in rows}) == 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--jobs", type=int, default=2000)
    h = sub.add_parser("holdout")
    h.add_argument("--quick", action="store_true")
    h.add_argument("--pool", type=int, default=1)
    h.add_argument("--start", type=int, default=14, help="the first day advised on (the trace's day 0 first)")
    h.add_argument("--hold-days", type=int, default=7, help="the days held out, after the fortnight")
    c = sub.add_parser("celery")
    c.add_argument("--history", type=int, default=5000, help="seed_history jobs (a week)")
    c.add_argument("--workers", default="1,2", help="the numbers of workers, one run each")
    args = parser.parse_args()
    {"speed": speed, "holdout": holdout, "celery": celery_workers}[args.what](args)


if __name__ == "__main__":
    main()
