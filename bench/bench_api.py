"""Benchmark 3: submit throughput through the REST API, with concurrent clients, against granian
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


def web_argv(port: int, workers: int = WORKERS, threads: int = THREADS) -> list[str]:
    """The web server as the README runs it: granian, `workers` processes of `threads` threads."""
    from config.webserver import granian_argv

    return granian_argv(
        PYTHON, host="127.0.0.1", port=port, workers=workers, threads=threads, log_level="warning"
    )


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
    from knox.models import AuthToken

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
        tokens.append(AuthToken.objects.create(user=user)[1])
    return tokens


def _session():
    """An HTTP session for one client thread: gpuquota's own (the Python client's stdlib HTTP/1.1 with
    keep-alive), which costs the machine about a third of the CPU per request of `requests` (1.4-1.8 ms
    here, on the same 2 cores as the server); BENCH_HTTP=requests for requests."""
    if os.environ.get("BENCH_HTTP") == "requests":
        import requests

        return requests.Session(), requests.RequestException
    import sys

    from bench.common import ROOT

    sys.path.insert(0, str(ROOT / "client" / "src"))
    from gpuquota_client.client import StdlibSession

    return StdlibSession(), OSError


def _hammer(url: str, tokens: list[str], per_client: int, payload: dict, max_s: float, web_pid: int) -> dict:
    """Each token's client posts `payload` per_client times, all clients at once. Latencies, errors, wall
    time and the CPU seconds of the web server and of the clients."""
    latencies: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(tokens) + 1)

    def client(token: str) -> None:
        session, transport_error = _session()
        session.headers["Authorization"] = f"Token {token}"
        mine, bad = [], []
        barrier.wait()
        deadline = time.perf_counter() + max_s
        for _ in range(per_client):
            if time.perf_counter() > deadline:
                break  # slow: stop at max_s and report the rate reached
            t0 = time.perf_counter()
            try:
                r = session.request("POST", f"{url}/api/v1/jobs/", json=payload, timeout=60)
                if r.status_code != 201:
                    bad.append(f"{r.status_code} {r.content[:100]!r}")
            except transport_error as exc:
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
    server0, client0 = _cpu_s(web_pid), time.process_time()
    for t in pool:
        t.join()
    return {
        "latencies": latencies,
        "errors": errors,
        "wall": time.perf_counter() - t0,
        "server_cpu": _cpu_s(web_pid) - server0,
        "client_cpu": time.process_time() - client0,
    }


def run(
    jobs: int = 3000,
    clients: int = 16,
    max_s: float = 30.0,
    workers: int = WORKERS,
    threads: int = THREADS,
    arrays: int = 20,
    array_size: int = 1000,
    array_clients: int = 4,
) -> list[dict]:
    setup_django()
    from jobs.models import Job

    wipe()
    tokens = _prepare(clients)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="gpuquota-bench-")) / "web.log"
    web = spawn(
        web_argv(port, workers, threads),
        log,
        env={
            "SUBMIT_RATE": "1000000/min",
            "DB_CONN_MAX_AGE": "60",
            "LOG_LEVEL": "WARNING",
            "MAX_QUEUED_PER_SHARE": "100000000",
        },
    )
    url = f"http://127.0.0.1:{port}"
    job = {"share": "bench-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]}
    rows = []
    try:
        wait_for(lambda: _up(url), 30, "the web server")
        got = _hammer(url, tokens, jobs // clients, job, max_s, web.pid)
        sent, errors = len(got["latencies"]), got["errors"]
        stored = Job.objects.count()
        rate = sent / got["wall"]
        ok = not errors and stored == sent
        rows.append(
            row(
                "3 submit",
                f"{sent:,} submits, {clients} clients, granian {workers}x{threads}",
                got["latencies"],
                target=">= 250 submits/s, no errors",
                met=ok and rate >= 250,
                note=f"{rate:.0f} submits/s; {len(errors)} errors; {stored:,}/{sent:,} in the database; CPU per "
                f"submit: web {got['server_cpu'] / max(sent, 1) * 1000:.1f} ms, "
                f"clients {got['client_cpu'] / max(sent, 1) * 1000:.1f} ms"
                + (f"; first error: {errors[0]}" if errors else ""),
                rate=rate,
            )
        )
        if arrays:
            before = Job.objects.count()
            payload = {**job, "array": {"size": array_size}}
            got = _hammer(url, tokens[:array_clients], arrays // array_clients, payload, max_s, web.pid)
            sent, errors = len(got["latencies"]), got["errors"]
            tasks = Job.objects.count() - before
            rate = tasks / got["wall"]
            ok = not errors and tasks == sent * array_size
            rows.append(
                row(
                    "3 arrays",
                    f"{sent} arrays of {array_size:,}, {array_clients} clients",
                    got["latencies"],
                    target=">= 5,000 tasks/s, no errors",
                    met=ok and rate >= 5000,
                    note=f"{rate:,.0f} tasks/s; {len(errors)} errors; {tasks:,}/{sent * array_size:,} tasks in the "
                    f"database; web CPU per task {got['server_cpu'] / max(tasks, 1) * 1e6:.0f} us"
                    + (f"; first error: {errors[0]}" if errors else ""),
                    rate=rate,
                )
            )
    finally:
        stop([web])
    wipe()
    return rows


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
    parser.add_argument(
        "--arrays", type=int, default=20, help="arrays to submit after the single jobs (0: none)"
    )
    parser.add_argument("--array-size", type=int, default=1000)
    args = parser.parse_args()
    for r in run(
        args.jobs, args.clients, args.max_s, args.workers, args.threads, args.arrays, args.array_size
    ):
        print(r)
