"""Benchmark 2: the full scheduling pass on the configured database (PostgreSQL for the real figure):
load snapshot, plan, apply, enqueue, with N jobs in the table and 2,000 running attempts.

Run with `python -m bench.bench_pass` (uses DATABASE_URL; creates its data in a database of its own,
`<name>_bench`, which it drops and re-creates)."""

from __future__ import annotations

import os
import random
import statistics
import time

SIZES = (10_000, 100_000)
NODES, GPUS_PER_NODE, SHARES, RUNNING = 1000, 8, 50, 2000


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


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
        user = get_user_model().objects.create_user("bench")
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


def measure(repeats: int = 5) -> dict:
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
    times.sort()
    return {
        "median_s": statistics.median(times),
        "p95_s": times[min(len(times) - 1, int(0.95 * len(times)))],
        "plan_median_s": statistics.median(plan_times),
        "queries": max(queries),
    }


def run(sizes=SIZES, repeats: int = 5) -> list[dict]:
    _setup_django()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    import quotas.triggers as triggers
    from gpunodes import dispatch

    dispatch.app.send_task = lambda *a, **k: None  # measure the pass, not the broker
    triggers.request_pass = lambda why="": False
    rows = []
    for n in sizes:
        old = setup_databases(verbosity=0, interactive=False, keepdb=False)
        try:
            populate(n)
            if connection.vendor == "postgresql":
                with connection.cursor() as c:
                    c.execute("ANALYZE")
            rows.append(
                {
                    "bench": "pass",
                    "jobs": n,
                    "running": RUNNING,
                    "nodes": NODES,
                    "db": connection.vendor,
                    **measure(repeats),
                }
            )
        finally:
            teardown_databases(old, verbosity=0)
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
