"""Benchmark 7: the `gpuquota` command as fresh processes, one after another, against granian on
PostgreSQL + Redis (as a user's shell loop would run it): submits per second, and how long
`gpuquota --version` takes (the interpreter's start included).

`python -m bench.bench_cli [--submits N]`, or call `run()`. Needs DATABASE_URL (`*_bench`) and REDIS_URL.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from bench.common import PYTHON, ROOT, free_port, row, setup_django, spawn, stop, wait_for, wipe

CLIENT_SRC = ROOT / "client" / "src"


def cli_env(url: str, token: str) -> dict:
    """The CLI's environment, as an installed client runs: its modules compiled once (pip compiles them
    when it installs), not from source at every start (PYTHONDONTWRITEBYTECODE, set on some machines,
    made each `gpuquota` process compile cli.py and client.py again: 20-30 ms of a submit)."""
    import compileall

    compileall.compile_dir(str(CLIENT_SRC / "gpuquota_client"), quiet=1)
    drop = ("DATABASE_URL", "REDIS_URL", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(
        PYTHONPATH=str(CLIENT_SRC),
        GPUQUOTA_URL=url,
        GPUQUOTA_TOKEN=token,
        GPUQUOTA_CONFIG=str(Path(tempfile.mkdtemp(prefix="gpuquota-cli-")) / "config.json"),
    )
    return env


def cli(*args: str) -> list[str]:
    return [PYTHON, "-m", "gpuquota_client", *args]


SUBMIT = ("submit", "--share", "bench-main", "--gpus", "1", "--gpu-type", "a10g", "--", "true")


def time_version(env: dict, n: int = 10) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cli("--version"), env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return times


def submit_loop(env: dict, n: int, args: tuple[str, ...] = SUBMIT) -> tuple[list[float], list[str]]:
    times, errors = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        done = subprocess.run(cli(*args), env=env, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if done.returncode != 0:
            errors.append(done.stderr.strip()[:200])
    return times, errors


def start_server(clients: int = 1):
    """A prepared database and the web server: (process, url, tokens)."""
    from bench.bench_api import _prepare, _up, web_argv

    setup_django()
    wipe()
    tokens = _prepare(clients)
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="gpuquota-bench-")) / "web.log"
    web = spawn(
        web_argv(port),
        log,
        env={"SUBMIT_RATE": "1000000/min", "LOG_LEVEL": "WARNING", "MAX_QUEUED_PER_SHARE": "100000000"},
    )
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(url), 30, "the web server")
    return web, url, tokens


def run(submits: int = 100) -> list[dict]:
    web, url, tokens = start_server()
    from jobs.models import Job

    try:
        env = cli_env(url, tokens[0])
        version = time_version(env)
        times, errors = submit_loop(env, submits)
        stored = Job.objects.count()
    finally:
        stop([web])
    wipe()
    rate = len(times) / sum(times)
    return [
        row(
            "7 CLI submit",
            f"{len(times)} `gpuquota submit` processes in a row",
            times,
            target=">= 20 submits/s",
            met=not errors and stored == len(times) and rate >= 20,
            note=f"{rate:.1f} submits/s; {len(errors)} errors; {stored}/{len(times)} in the database"
            + (f"; first error: {errors[0]}" if errors else ""),
            rate=rate,
        ),
        row(
            "7 CLI --version",
            "`gpuquota --version`, interpreter start included",
            version,
            target="< 100 ms",
            met=sorted(version)[len(version) // 2] < 0.1,
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=100)
    parser.add_argument("--json", action="store_true", help="time `gpuquota --json submit` as well")
    args = parser.parse_args()
    if args.json:
        web, url, tokens = start_server()
        try:
            env = cli_env(url, tokens[0])
            for extra in ((), ("--json",)):
                times, errors = submit_loop(env, args.submits, (*extra, *SUBMIT))
                print(extra, f"{len(times) / sum(times):.1f}/s", errors[:1])
        finally:
            stop([web])
    for r in run(args.submits):
        print(r)
