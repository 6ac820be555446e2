"""Load: 20 concurrent clients submit short jobs over the HTTP API while 8 fake agents run them; all
end SUCCEEDED, the invariants hold, and the throughput and p95 submit latency are printed.

The issue asks for 10,000 jobs; the default here is 300 so the whole suite stays within CI's 30 minutes
(1,000 took 110 s and 2,000 took 190 s on 2 cores: the submit path is CPU-bound there). Set
GPUQUOTA_LOAD_JOBS=10000 for the full run (and `-m load` to run only this)."""

from __future__ import annotations

import os
import time

import pytest

from jobs.choices import JobState
from jobs.models import Job
from quotas.models import SchedulerPass
from tests.faults.conftest import make_team, needs_stack
from tests.faults.harness import burst, wait_settled

pytestmark = [needs_stack, pytest.mark.load, pytest.mark.django_db(transaction=True)]

JOBS = int(os.environ.get("GPUQUOTA_LOAD_JOBS", "300"))
CLIENTS = 20
AGENTS = 8


def test_load_many_clients_many_short_jobs(cluster, django_user_model):
    clients = []
    strategies = ["LEND_AND_BORROW", "LEND_AND_BORROW", "LEND", "RESERVE"]
    for t, strategy in enumerate(strategies):
        share, members = make_team(
            django_user_model, f"load{t}", users=CLIENTS // len(strategies), capacity=8, strategy=strategy
        )
        clients += [(token, share.name) for _, token in members]
    url = cluster.start_web(workers=3, threads=8)
    cluster.start({f"l{i}": 4 for i in range(AGENTS)})
    passes_before = SchedulerPass.objects.count()

    result = burst(url, clients, JOBS)
    submitted = time.perf_counter()
    settled = wait_settled(60 + JOBS / 5)
    states = dict(Job.objects.values_list("pk", "state"))

    assert not result.failed, sorted(set(result.failed))
    assert len(result.created) == JOBS and set(result.created) == set(states)
    assert set(states.values()) == {JobState.SUCCEEDED}
    elapsed = settled - result.started
    print(
        f"\nload: {JOBS} jobs from {CLIENTS} clients on {AGENTS} agents: "
        f"submitted in {submitted - result.started:.1f}s ({JOBS / (submitted - result.started):.0f}/s), "
        f"all SUCCEEDED after {elapsed:.1f}s: throughput {JOBS / elapsed:.1f} jobs/s; "
        f"submit latency p95 {result.p95_ms:.0f} ms; "
        f"{SchedulerPass.objects.count() - passes_before} passes; 0 lost"
    )
