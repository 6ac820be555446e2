"""Benchmarks 2 and 5: the full scheduling pass (load snapshot, plan, apply, enqueue) with N jobs in the
table and 2,000 running attempts filling 1,000 x 8 GPUs; then, on the same data, the latency of
`GET /api/v1/jobs/?share=...`, the dashboard overview `/`, a team page and a `/metrics` scrape.

Runs on DATABASE_URL (PostgreSQL for the real figure), a database whose name ends in `_bench`: it is
migrated and emptied first. `python -m bench.bench_pass`, or call `run()`."""

from __future__ import annotations

import random
import time

from bench.common import exponent, row, setup_django, wipe

SIZES = (10_000, 100_000)
NODES, GPUS_PER_NODE, SHARES, RUNNING = 1000, 8, 50, 2000


def populate(total_jobs: int, seed: int = 1) -> None:
    from django.contrib.auth import get_user_model
    from django.db import transaction
    from django.utils import timezone

    from gpunodes.models import Gpu, Node
    from jobs.choices import AttemptState, JobState
    from jobs.models import Attempt, GpuClaim, Job
    from quotas.models import Share, ShareCapacity, Team

    rng = random.Random(seed)
    now = timezone.now()
    with transaction.atomic():
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-pw-123")
        team = Team.objects.create(name="bench", slug="bench")
        nodes = Node.objects.bulk_create(
            [Node(name=f"n{i:04d}", gpu_type="a10g", last_heartbeat=now) for i in range(NODES)]
        )
        gpus = Gpu.objects.bulk_create(
            [Gpu(node=n, index=i, uuid=f"GPU-{n.name}-{i}") for n in nodes for i in range(GPUS_PER_NODE)]
        )
        strategies = ["RESERVE", "LEND", "LEND_AND_BORROW"]
        shares = Share.objects.bulk_create(
            [Share(name=f"s{i:02d}", team=team, strategy=strategies[i % 3]) for i in range(SHARES)]
        )
        per_share = NODES * GPUS_PER_NODE // SHARES
        ShareCapacity.objects.bulk_create(
            [ShareCapacity(share=s, gpu_type="a10g", max_gpus=per_share) for s in shares]
        )
        # 2,000 running attempts of 4 GPUs fill the whole cluster (1,000 × 8).
        running_jobs = Job.objects.bulk_create(
            [
                Job(
                    share=shares[i % SHARES],
                    submitted_by=user,
                    gpu_type="a10g",
                    gpus=4,
                    state=JobState.RUNNING,
                    attempt_count=1,
                    command=["true"],
                    submitted_at=now - timezone.timedelta(hours=2),
                )
                for i in range(RUNNING)
            ]
        )
        attempts = Attempt.objects.bulk_create(
            [
                Attempt(
                    job=j,
                    number=1,
                    state=AttemptState.RUNNING,
                    started_at=now,
                    placement=[
                        {"node": nodes[i // 2].name, "gpus": [0, 1, 2, 3] if i % 2 == 0 else [4, 5, 6, 7]}
                    ],
                )
                for i, j in enumerate(running_jobs)
            ]
        )
        GpuClaim.objects.bulk_create(
            [GpuClaim(attempt=a, gpu=gpus[i * 4 + k]) for i, a in enumerate(attempts) for k in range(4)]
        )
        Attempt.nodes.through.objects.bulk_create(
            [Attempt.nodes.through(attempt_id=a.pk, node_id=nodes[i // 2].pk) for i, a in enumerate(attempts)]
        )
        sizes = [1] * 70 + [2] * 12 + [4] * 10 + [8] * 6 + [16] * 2
        queued = total_jobs - RUNNING
        batch = []
        for _ in range(queued):
            batch.append(
                Job(
                    share=shares[rng.randrange(SHARES)],
                    submitted_by=user,
                    gpu_type="a10g",
                    gpus=rng.choice(sizes),
                    priority=rng.randrange(10),
                    command=["true"],
                    submitted_at=now - timezone.timedelta(seconds=rng.randrange(86400)),
                )
            )
            if len(batch) == 5000:
                Job.objects.bulk_create(batch)
                batch = []
        Job.objects.bulk_create(batch)


def measure_pass(repeats: int) -> tuple[list[float], list[float], int]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from quotas import scheduler

    times, plan_times, queries = [], [], []
    for _ in range(repeats):
        with CaptureQueriesContext(connection) as ctx:
            t0 = time.perf_counter()
            result = scheduler.run_pass("bench")
            times.append(time.perf_counter() - t0)
        plan_times.append(result.plan_ms / 1000)
        queries.append(len(ctx.captured_queries))
    return times, plan_times, max(queries)


def measure_forecast() -> tuple[float, dict]:
    """What the control worker does after a pass: forecast the whole queue and store it (the pages
    measured next read what it stored)."""
    from quotas import services

    t0 = time.perf_counter()
    result = services.forecast_refresh()
    return time.perf_counter() - t0, result


def _client():
    from django.contrib.auth import get_user_model
    from django.test import Client
    from knox.models import AuthToken

    user = get_user_model().objects.get(username="bench")
    _, key = AuthToken.objects.create(user=user)
    api = Client(HTTP_AUTHORIZATION=f"Token {key}")
    web = Client()
    web.force_login(user)
    return api, web


def measure_pages(repeats: int) -> dict[str, list[float]]:
    """Server-side latency through Django's test client (no network): each page `repeats` times."""
    from django.conf import settings

    api, web = _client()
    settings.METRICS_TOKEN = "bench"
    pages = {
        "GET /api/v1/jobs/?share=": (api, "/api/v1/jobs/?share=s07", {}),
        "GET / (overview)": (web, "/", {}),
        "GET /teams/bench/": (web, "/teams/bench/", {}),
        "GET /metrics": (api, "/metrics", {"HTTP_AUTHORIZATION": "Bearer bench"}),
    }
    # As config/wsgi.py does in a web worker once it has loaded: what lives for the whole process is
    # kept out of the collector's full collections (here also what setting up the database left).
    import gc

    gc.collect()
    gc.freeze()
    out: dict[str, list[float]] = {}
    for name, (client, url, headers) in pages.items():
        first = client.get(url, **headers)  # warm-up; a page that is not there is skipped
        if first.status_code != 200:
            out[name] = []
            continue
        times = []
        started = time.perf_counter()
        for _ in range(repeats):
            if len(times) >= 3 and time.perf_counter() - started > 10:
                break  # a slow page: enough samples to say so
            t0 = time.perf_counter()
            r = client.get(url, **headers)
            times.append(time.perf_counter() - t0)
            assert r.status_code == 200, (url, r.status_code)
        out[name] = times
    return out


def run(sizes=SIZES, repeats: int = 5, page_repeats: int = 20) -> list[dict]:
    setup_django()
    from django.db import connection

    import quotas.triggers as triggers
    from gpunodes import dispatch

    # Measure the pass, not the broker: nothing is sent while this runs (restored afterwards, for the
    # benchmarks that run next in the same process).
    saved = dispatch.app.send_task, triggers.request_pass
    dispatch.app.send_task = lambda *a, **k: None
    triggers.request_pass = lambda why="": False
    passes, pages, forecasts = [], {}, []
    try:
        for n in sizes:
            wipe()
            populate(n)
            with connection.cursor() as c:
                c.execute("ANALYZE")
            times, plan_times, queries = measure_pass(repeats)
            passes.append((n, times, plan_times, queries))
            forecasts.append((n, measure_forecast()))
            for name, t in measure_pages(page_repeats).items():
                pages.setdefault(name, []).append((n, t))
        wipe()
    finally:
        dispatch.app.send_task, triggers.request_pass = saved
    rows = []
    n0, t0 = passes[0][0], min(passes[0][1])
    for n, times, plan_times, queries in passes:
        grow = exponent(n0, t0, n, min(times)) if n != n0 else None
        big = n >= 100_000
        rows.append(
            row(
                "2 pass",
                f"{n:,} jobs, {RUNNING:,} running",
                times,
                target="< 2 s at 100k; queries constant" if big else "queries constant",
                met=(sorted(times)[len(times) // 2] < 2.0 and queries == passes[0][3]) if big else None,
                exponent=grow,
                note=f"plan() {sorted(plan_times)[len(plan_times) // 2] * 1000:.0f} ms; {queries} queries",
            )
        )
    for n, (seconds, result) in forecasts:
        big = n >= 100_000
        rows.append(
            row(
                "5 forecast",
                f"stored forecast, {n:,} jobs ({result['jobs']:,} queued)",
                [result["seconds"]],
                target="every queued job's ETA stored < 5 s, its range < 60 s at 100k" if big else "",
                met=(
                    result["seconds"] < 5
                    and result["etas"] == result["jobs"]
                    and result["with_ranges_s"] < 60
                )
                if big
                else None,
                note=f"{result['etas']:,} ETAs, {result['passes']:,} replay passes (FORECAST_BUDGET_S caps it); "
                f"{result['ranges']:,} ranges stored {result['with_ranges_s']:.2f} s after the start "
                f"({seconds:.2f} s in all)",
            )
        )
    for name, series in pages.items():
        m0 = min(series[0][1]) if series[0][1] else 0
        for n, times in series:
            if not times:
                rows.append(
                    row("5 pages", f"{name} {n:,} jobs", [], note="skipped: page not there (not 200)")
                )
                continue
            big = n >= 100_000
            p95 = sorted(times)[min(len(times) - 1, int(0.95 * len(times)))]
            rows.append(
                row(
                    "5 pages",
                    f"{name} {n:,} jobs",
                    times,
                    target="p95 < 100 ms at 100k" if big and "metrics" not in name else "",
                    met=(p95 < 0.1) if big and "metrics" not in name else None,
                    exponent=exponent(series[0][0], m0, n, min(times)) if n != series[0][0] else None,
                )
            )
    return rows


if __name__ == "__main__":
    for r in run():
        print(r)
