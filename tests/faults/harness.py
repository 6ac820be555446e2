"""Submit bursts over the real HTTP API from concurrent clients, and wait for a cluster to settle."""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from jobs.choices import JOB_TERMINAL_STATES
from jobs.models import Job


@dataclass
class Burst:
    created: list[int] = field(default_factory=list)  # ids of jobs whose submit answered 201
    failed: list[str] = field(default_factory=list)  # what the refused tries got (each retried)
    gave_up: int = 0  # submits still refused after every retry
    latencies: list[float] = field(default_factory=list)  # seconds, of the 201s
    started: float = 0.0
    ended: float = 0.0

    @property
    def p95_ms(self) -> float:
        if len(self.latencies) < 2:
            return (self.latencies or [0.0])[0] * 1000
        return statistics.quantiles(self.latencies, n=20)[18] * 1000


def burst(
    url: str,
    tokens_shares: list[tuple[str, str]],
    total: int,
    *,
    command=None,
    on_progress=None,
    retries: int = 60,
    retry_s: float = 0.25,
) -> Burst:
    """`total` submits spread over one client thread per (token, share); a refused submit (an error,
    a 5xx) is retried like a patient client would. `on_progress(done)` is called by the clients as
    they go (to inject a fault part-way)."""
    result = Burst()
    lock = threading.Lock()
    done = [0]
    per_client = [total // len(tokens_shares)] * len(tokens_shares)
    for i in range(total % len(tokens_shares)):
        per_client[i] += 1

    def client(token: str, share: str, n: int) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        body = {"share": share, "gpu_type": "a10g", "gpus": 1, "command": command or ["true"]}
        for _ in range(n):
            for _try in range(retries + 1):
                t0 = time.perf_counter()
                try:
                    r = session.post(f"{url}/api/v1/jobs/", json=body, timeout=30)
                    outcome = r.status_code
                except requests.RequestException as e:
                    r, outcome = None, type(e).__name__
                dt = time.perf_counter() - t0
                ok = r is not None and r.status_code == 201
                with lock:
                    if ok:
                        result.created.append(r.json()["id"])
                        result.latencies.append(dt)
                    else:
                        result.failed.append(str(outcome))
                if ok or (r is not None and r.status_code < 500 and r.status_code != 429):
                    break
                time.sleep(retry_s)
            else:
                with lock:
                    result.gave_up += 1
            with lock:
                done[0] += 1
                now_done = done[0]
            if on_progress is not None:
                on_progress(now_done)

    threads = [
        threading.Thread(target=client, args=(token, share, n), daemon=True)
        for (token, share), n in zip(tokens_shares, per_client, strict=True)
    ]
    result.started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    result.ended = time.perf_counter()
    return result


def wait_settled(timeout: float, *, every: float = 0.5) -> float:
    """Wait until no job is open; returns when (perf_counter) that was seen."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not Job.objects.exclude(state__in=list(JOB_TERMINAL_STATES)).exists():
            return time.perf_counter()
        time.sleep(every)
    raise AssertionError(f"jobs still open after {timeout}s: {_open_summary()}\n{diagnose()}")


LOG_DIR: Path | None = None  # set by the cluster fixture: where the processes' logs are


def diagnose() -> str:
    """What a stall looks like from outside, short enough to survive a CI log's excerpt: the last pass,
    each node's state and heartbeat age, database sessions waiting on a lock or idle in a transaction,
    and the control worker's last lines (tracebacks left out)."""
    from django.db import connection
    from django.utils import timezone

    from gpunodes.models import Node
    from quotas.models import SchedulerPass

    now = timezone.now()
    lines = []
    last = SchedulerPass.objects.order_by("-started_at").values_list("started_at", "trigger").first()
    lines.append(f"last pass: {(now - last[0]).total_seconds():.1f}s ago ({last[1]})" if last else "no pass")
    for name, state, hb in Node.objects.order_by("name").values_list("name", "state", "last_heartbeat")[:12]:
        lines.append(f"node {name} {state} heartbeat {(now - hb).total_seconds():.1f}s ago" if hb else name)
    if connection.vendor == "postgresql":
        with connection.cursor() as c:
            c.execute(
                "SELECT pid, state, wait_event_type, wait_event, now() - xact_start, left(query, 90)"
                " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND (wait_event_type = 'Lock' OR state LIKE 'idle in transaction%')"
            )
            lines += [f"pg {row}" for row in c.fetchall()]
    if LOG_DIR is not None and (LOG_DIR / "control.log").exists():
        tail = [
            line
            for line in (LOG_DIR / "control.log").read_text(errors="replace").splitlines()
            if line.startswith("[")
        ][-15:]
        lines += ["control.log:"] + tail
    return "\n".join(lines)


def _open_summary() -> dict:
    from collections import Counter

    return dict(
        Counter(Job.objects.exclude(state__in=list(JOB_TERMINAL_STATES)).values_list("state", flat=True))
    )
