"""Benchmark 3: submit throughput through the REST API, with concurrent clients, against gunicorn
(WORKERS processes x THREADS threads, as the README recommends) on PostgreSQL + Redis. Counts errors and
checks that every job is in the database; stops after `max_s` seconds if the N submits take longer, and
reports the rate reached, p95 latency, and the CPU each submit cost the web server and the clients (a
figure that does not depend on what else the machine is doing, unlike the rate).

Needs DATABASE_URL (a `*_bench` PostgreSQL database; it is emptied) and REDIS_URL. The submit throttle is
lifted for the run (SUBMIT_RATE); no control worker runs, so the pass requests just queue in Redis.
`python -m bench.bench_api [--jobs N] [--clients C] [--max-s S]`, or call `run()`."""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

from bench.common import PYTHON, free_port, row, setup_django, spawn, stop, wait_for, wipe

WORKERS = 2
THREADS = 4


def gunicorn_argv(port: int, workers: int = WORKERS, threads: int = THREADS) -> list[str]:
    return [
        PYTHON,
        "-m",
        "gunicorn",
        "config.wsgi",
        "--workers",
        str(workers),
        "--threads",
        str(threads),
        "--worker-class",
        "gthread",
        "--bind",
        f"127.0.0.1:{port}",
    ]


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    pids = [pid]
    try:
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        pass
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _prepare(clients: int) -> list[str]:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from gpunodes.services import fake_inventory, node_register
    from quotas.choices import Role
    from quotas.models import Membership, Share, ShareCapacity, Team

    for i in range(8):  # GPUs of the type must exist for a submit to be valid; nothing runs on them
        node_register(name=f"bench-{i}", gpu_type="a10g", gpus=fake_inventory(f"bench-{i}", 8))
    team = Team.objects.create(name="bench", slug="bench")
    share = Share.objects.create(name="bench-main", team=team)
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=64)
    tokens = []
    for i in range(clients):
        user = get_user_model().objects.create_user(f"client{i}")
        Membership.objects.create(team=team, user=user, role=Role.MEMBER)
        tokens.append(Token.objects.create(user=user).key)
    return tokens


def run(
    jobs: int = 3000, clients: int = 16, max_s: float = 30.0, workers: int = WORKERS, threads: int = THREADS
) -> list[dict]:
    setup_django()
    import requests

    from jobs.models import Job

    wipe()
    tokens = _prepare(clients)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="gpuquota-bench-")) / "gunicorn.log"
    web = spawn(
        gunicorn_argv(port, workers, threads),
        log,
        env={"SUBMIT_RATE": "1000000/min", "DB_CONN_MAX_AGE": "60", "LOG_LEVEL": "WARNING"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), 30, "gunicorn")
        per_client = jobs // clients
        latencies: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(clients + 1)

        def client(token: str) -> None:
            session = requests.Session()
            session.headers["Authorization"] = f"Token {token}"
            mine, bad = [], []
            barrier.wait()
            deadline = time.perf_counter() + max_s
            for _ in range(per_client):
                if time.perf_counter() > deadline:
                    break  # slow: stop at max_s and report the rate reached
                t0 = time.perf_counter()
                try:
                    r = session.post(
                        f"{url}/api/v1/jobs/",
                        json={"share": "bench-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]},
                        timeout=30,
                    )
                    if r.status_code != 201:
                        bad.append(f"{r.status_code} {r.text[:100]}")
                except requests.RequestException as exc:
                    bad.append(str(exc))
                mine.append(time.perf_counter() - t0)
            with lock:
                latencies.extend(mine)
                errors.extend(bad)

        pool = [threading.Thread(target=client, args=(t,)) for t in tokens]
        for t in pool:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        server0, client0 = _cpu_s(web.pid), time.process_time()
        for t in pool:
            t.join()
        wall = time.perf_counter() - t0
        server_cpu, client_cpu = _cpu_s(web.pid) - server0, time.process_time() - client0
    finally:
        stop([web])
    sent = len(latencies)
    stored = Job.objects.count()
    rate = sent / wall
    wipe()
    ok = not errors and stored == sent
    return [
        row(
            "3 submit",
            f"{sent:,} submits, {clients} clients, gunicorn {workers}x{threads} gthread",
            latencies,
            target=">= 250 submits/s, no errors",
            met=ok and rate >= 250,
            note=f"{rate:.0f} submits/s; {len(errors)} errors; {stored:,}/{sent:,} in the database; CPU per "
            f"submit: web {server_cpu / max(sent, 1) * 1000:.1f} ms, clients {client_cpu / max(sent, 1) * 1000:.1f} ms"
            + (f"; first error: {errors[0]}" if errors else ""),
            rate=rate,
        )
    ]


def _up(url: str) -> bool:
    import requests

    try:
        return requests.get(f"{url}/healthz", timeout=1).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-s", type=float, default=30.0)
    parser.add_argument("--workers", type=int, default=WORKERS)
    parser.add_argument("--threads", type=int, default=THREADS)
    args = parser.parse_args()
    for r in run(args.jobs, args.clients, args.max_s, args.workers, args.threads):
        print(r)
