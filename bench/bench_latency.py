"""Benchmark 4: submit-to-start latency with free GPUs, and reclaim latency, on a live cluster: a real
control Celery worker (threads, as tests/live starts it), two fake 4-GPU a10g agents, PostgreSQL + Redis,
and NO beat: every pass is event-triggered, so the figures cannot come from the beat interval.

- submit-to-start: a 1-GPU job submitted into a cluster with free GPUs, until the host reports it
  started (`Attempt.started_at`); the job is then cancelled and the next one submitted.
- reclaim: share `borrower` (LEND_AND_BORROW, no capacity) runs 8 borrowed 1-GPU jobs that fill the
  cluster; share `owner` (LEND, 8 GPUs) submits one job; measured until the chosen victim's process
  receives SIGTERM (it writes the time of the signal to a file).

Needs DATABASE_URL (a `*_bench` PostgreSQL database; it is emptied) and REDIS_URL.
`python -m bench.bench_latency [--samples N]`, or call `run()`."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.common import PYTHON, celery_worker, pct, row, setup_django, spawn, stop, wait_for, wipe

NODES, GPUS = 2, 4
# The jobs run as uids of their own (a root agent): an interpreter they may execute, not the checkout's.
JOB_PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else PYTHON
# The job: sleep until SIGTERM, then write the time of the signal to <dir>/term-<job id>.
TRAP = (
    "import os, signal, sys, time\n"
    "def term(*_):\n"
    "    open(os.path.join(sys.argv[1], 'term-' + os.environ['GPUQUOTA_JOB_ID']), 'w').write(repr(time.time()))\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "time.sleep(3600)\n"
)


def _cluster(tmp: Path) -> list:
    env = {
        "JOB_LOG_DIR": str(tmp / "logs"),
        # A root agent runs each attempt as a uid of its own: the jobs' directories must be reachable.
        "JOB_ROOT": str(tmp / "jobs"),
        "CHECKPOINT_ROOT": str(tmp / "jobs" / "checkpoints"),
        "HEARTBEAT_INTERVAL_S": "2",
        "NODE_JOIN_TOKEN": "bench-join-token",  # the bench's agents join READY (else PENDING on Redis)
        "SCHEDULER_INTERVAL_S": "3600",  # beat is not started anyway
        "LOG_LEVEL": "WARNING",
    }
    procs = [spawn(celery_worker("control", "bench-control", concurrency=4), tmp / "control.log", env)]
    for i in range(NODES):
        name = f"bench-node-{i}"
        procs.append(
            spawn(
                [
                    PYTHON,
                    "manage.py",
                    "gpu_agent",
                    "--name",
                    name,
                    "--fake-gpus",
                    str(GPUS),
                    "--gpu-type",
                    "a10g",
                    *([] if os.geteuid() == 0 else ["--unsafe-run-jobs-as-agent-user"]),
                ],
                tmp / f"{name}.log",
                env,
            )
        )
    return procs


def _setup():
    from django.contrib.auth import get_user_model

    from quotas.choices import Role, Strategy
    from quotas.models import Membership, Share, ShareCapacity, Team

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-pw-123")
    team = Team.objects.create(name="bench", slug="bench")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    owner = Share.objects.create(name="owner", team=team, strategy=Strategy.LEND)
    ShareCapacity.objects.create(share=owner, gpu_type="a10g", max_gpus=NODES * GPUS)
    borrower = Share.objects.create(name="borrower", team=team, strategy=Strategy.LEND_AND_BORROW)
    return user, owner, borrower


def _submit(user, share, out: Path):
    from jobs.services import job_submit

    return job_submit(
        user=user,
        share=share,
        gpus=1,
        gpu_type="a10g",
        command=[JOB_PYTHON, "-c", TRAP, str(out)],
        preemption_grace_s=5,
    )


def _started(job_id: int):
    from jobs.models import Attempt

    return (
        Attempt.objects.filter(job_id=job_id, started_at__isnull=False)
        .values_list("started_at", flat=True)
        .first()
    )


def _cancel_all(user) -> None:
    from jobs.choices import JOB_OPEN_STATES
    from jobs.models import Job
    from jobs.services import job_cancel

    for job in Job.objects.filter(state__in=list(JOB_OPEN_STATES)):
        job_cancel(user=user, job=job)


def _idle() -> bool:
    from jobs.choices import ATTEMPT_ACTIVE_STATES
    from jobs.models import Attempt

    return not Attempt.objects.filter(state__in=list(ATTEMPT_ACTIVE_STATES)).exists()


def run(samples: int = 20, reclaims: int = 5) -> list[dict]:
    setup_django()
    from django.db import close_old_connections

    from gpunodes.models import Node
    from jobs.choices import JobState
    from jobs.models import Job

    wipe()
    tmp = Path(tempfile.mkdtemp(prefix="gpuquota-bench-", dir="/var/tmp"))
    tmp.chmod(0o711)  # searchable by the jobs' uids (a root agent runs each attempt as its own uid)
    out = tmp / "signals"
    out.mkdir()
    out.chmod(0o777)  # the victims write the time of their SIGTERM here
    user, owner, borrower = _setup()
    procs = _cluster(tmp)
    starts: list[float] = []
    reclaim: list[float] = []
    try:
        wait_for(lambda: Node.objects.filter(state="READY").count() == NODES, 60, "agents to register", 0.2)
        _submit(user, owner, out)  # warm-up: worker, agent and connections
        wait_for(lambda: Job.objects.filter(state=JobState.RUNNING).exists(), 60, "the warm-up job")
        _cancel_all(user)
        wait_for(_idle, 60, "the warm-up job to end")
        for _ in range(samples):
            t0 = time.time()
            job = _submit(user, owner, out)
            started = wait_for(lambda job=job: _started(job.pk), 30, "a start", 0.005)
            starts.append(started.timestamp() - t0)
            close_old_connections()
            _cancel_all(user)
            wait_for(_idle, 60, "the job to end", 0.02)

        for _ in range(reclaims):
            for _ in range(NODES * GPUS):
                _submit(user, borrower, out)
            wait_for(
                lambda: Job.objects.filter(share=borrower, state=JobState.RUNNING).count() == NODES * GPUS,
                60,
                "the borrowers to fill the cluster",
                0.05,
            )
            before = {p.name for p in out.iterdir()}
            t0 = time.time()
            _submit(user, owner, out)
            sig = wait_for(lambda b=before: {p.name for p in out.iterdir()} - b, 30, "a SIGTERM", 0.005)
            path = out / sorted(sig)[0]
            at = wait_for(path.read_text, 5, "the signal time to be written", 0.005)  # created, then written
            reclaim.append(float(at) - t0)
            _cancel_all(user)
            wait_for(_idle, 60, "the jobs to end", 0.05)
    finally:
        _cancel_all(user)
        stop(procs)
        wipe()
    return [
        row(
            "4 latency",
            f"submit-to-start, {len(starts)} jobs, free GPUs",
            starts,
            target="p50 < 0.5 s, p99 < 2 s",
            met=bool(starts) and pct(starts, 50) < 0.5 and pct(starts, 99) < 2.0,
            note=f"p99 {pct(starts, 99) * 1000:.0f} ms; no beat running",
        ),
        row(
            "4 latency",
            f"reclaim: owner submit to victim's SIGTERM, {len(reclaim)} times",
            reclaim,
            target="p50 < 1 s",
            met=bool(reclaim) and pct(reclaim, 50) < 1.0,
            note="cluster full of borrowed work; no beat running",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--reclaims", type=int, default=5)
    args = parser.parse_args()
    for r in run(args.samples, args.reclaims):
        print(r)
