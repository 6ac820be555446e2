"""Shared pieces of the benchmarks: statistics, the growth exponent, and the PostgreSQL / Redis / Django
set-up of the benchmarks that need a database (they wipe it, so only a database named `*_bench`)."""

from __future__ import annotations

import math
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def exponent(n0: float, t0: float, n1: float, t1: float) -> float | None:
    """How time grows with size: the slope of log t against log n (1.0 = linear)."""
    if n0 <= 0 or n1 <= 0 or n0 == n1 or t0 <= 0 or t1 <= 0:
        return None
    return math.log(t1 / t0) / math.log(n1 / n0)


def row(bench: str, size: str, times: list[float], *, target: str = "", met: bool | None = None, **extra):
    return {
        "bench": bench,
        "size": size,
        "n": len(times),
        "median_s": median(times),
        "p95_s": pct(times, 95),
        "target": target,
        "met": met,
        **extra,
    }


# -- services ---------------------------------------------------------------------------------------------


def database_problem() -> str | None:
    """Why the database benchmarks cannot run here, or None."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        return "DATABASE_URL is not PostgreSQL (e.g. postgres://postgres@127.0.0.1:5432/gpuquota_bench)"
    name = url.rsplit("/", 1)[-1].split("?", 1)[0]
    if not name.endswith("_bench"):
        return f"database {name!r} does not end in _bench (the benchmarks wipe their database)"
    try:
        import psycopg

        psycopg.connect(url, connect_timeout=3).close()
    except Exception as exc:  # noqa: BLE001 - any failure means: skip, and say why
        return f"PostgreSQL not reachable: {str(exc).strip().splitlines()[0]}"
    return None


def redis_problem() -> str | None:
    url = os.environ.get("REDIS_URL", "")
    if not url:
        return "REDIS_URL is not set (e.g. redis://127.0.0.1:6379/12)"
    try:
        import redis

        redis.Redis.from_url(url, socket_connect_timeout=3).ping()
    except Exception as exc:  # noqa: BLE001
        return f"Redis not reachable: {exc}"
    return None


_django_ready = False


def setup_django() -> None:
    """Django on DATABASE_URL, migrated. Idempotent."""
    global _django_ready
    if _django_ready:
        return
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    _django_ready = True


def wipe() -> None:
    """Empty every table of the bench database, the cache (a what-if replay of the same scenario is
    read back from it: a benchmark must replay) and the bench Redis database."""
    from django.core.cache import cache
    from django.core.management import call_command

    call_command("flush", verbosity=0, interactive=False)
    cache.clear()
    if os.environ.get("REDIS_URL"):
        import redis

        redis.Redis.from_url(os.environ["REDIS_URL"]).flushdb()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(argv: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(procs: list[subprocess.Popen]) -> None:
    import signal

    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 15
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


PYTHON = sys.executable


def celery_worker(queue: str, name: str, *, pool: str = "threads", concurrency: int = 1) -> list[str]:
    """The command line of a Celery worker of `queue` named `name`@host (no gossip or mingle: the
    benchmarks start and stop their workers themselves)."""
    return [
        PYTHON, "-m", "celery", "-A", "config", "worker", "-Q", queue, "-P", pool, "-c", str(concurrency),
        "-n", f"{name}@%h", "--without-gossip", "--without-mingle", "-l", "WARNING",
    ]  # fmt: skip
