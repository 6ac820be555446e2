"""A GPU fails under a real agent (issue 29): a --fake-gpus agent reads the faults this test writes into
its fault file (gpunodes/agent/health.py, FakeNvml) and its health watcher acts on them as on NVML's.

A critical Xid on GPU 2 of a 4-GPU node ends the job on it as GPU_FAILED within one heartbeat interval
(the agent kills it and sends a heartbeat at once) and re-queues it; the node's other 3 GPUs keep
running their jobs and take new ones, never GPU 2; the pass and the forecast see 3 GPUs; an admin's
mark-healthy through the API (the web process sends the re-check to the agent) brings GPU 2 back, and
the next job runs on it. An application Xid (13) ends nothing. No two attempts of a job overlap (the
ledger), and the invariants hold after (tests/faults/conftest.py), including that no attempt was given
a GPU after it was found broken (tests/faults/audit.py)."""

from __future__ import annotations

import json
import time

import pytest
import requests
from knox.models import AuthToken

from gpunodes.choices import GpuHealth
from gpunodes.models import Gpu, GpuFailure
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas.scheduler import load_snapshot
from quotas.services import queue_view
from tests.faults.conftest import make_team, needs_stack, wait_for
from tests.faults.harness import wait_settled
from tests.faults.ledger import Ledger

pytestmark = [needs_stack, pytest.mark.django_db(transaction=True)]

HEARTBEAT_S = 5  # long enough that "before the next heartbeat" is a real bound, even under load


def inject(cluster, node: str, **fault) -> float:
    """Append a fault line to the node's fake NVML file; returns when."""
    path = cluster.var / "agent" / node / "fake-gpu-faults.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps(fault) + "\n")
    return time.monotonic()


def gpus_seen(node: str) -> int:
    return sum(n.gpus for n in load_snapshot().snapshot.nodes if n.name == node)


def on_gpu(index: int, node: str = "n1") -> Attempt | None:
    for attempt in Attempt.objects.filter(
        state__in=[AttemptState.ADMITTED, AttemptState.RUNNING], nodes__name=node
    ):
        if any(p["node"] == node and index in p["gpus"] for p in attempt.placement):
            return attempt
    return None


def agent_log(cluster, node: str) -> str:
    return (cluster.tmp / f"agent-{node}.log").read_text(errors="replace")


def test_a_critical_xid_takes_one_gpu_out_and_mark_healthy_brings_it_back(cluster, django_user_model):
    cluster.env.update(HEARTBEAT_INTERVAL_S=str(HEARTBEAT_S), NODE_LOST_AFTER_S="40", GPU_HEALTH_CHECK_S="1")
    share, [(user, _)] = make_team(django_user_model, "g", capacity=4)
    admin = django_user_model.objects.create_superuser("root-admin", "a@example.com", "admin-pw-123")
    token = AuthToken.objects.create(user=admin)[1]
    url = cluster.start_web(workers=1, threads=4)
    cluster.start({"n1": 4})
    ledger = Ledger(cluster.jobs / "ledger")

    def submit(name: str) -> Job:
        return job_submit(
            user=user,
            share=share,
            name=name,
            gpus=1,
            gpu_type="a10g",
            command=[ledger.command()],
            use_shell=True,
        )

    jobs = [submit(f"j{i}") for i in range(4)]
    wait_for(
        lambda: Attempt.objects.filter(state=AttemptState.RUNNING).count() == 4,
        60,
        what="4 running",
        jobs=jobs,
    )
    assert gpus_seen("n1") == 4
    victim = on_gpu(2)
    others = {
        a.pk: a.job_id for a in Attempt.objects.filter(state=AttemptState.RUNNING).exclude(pk=victim.pk)
    }

    # --- an application Xid (13) on GPU 1: the job's error, not the GPU's --------------------------
    inject(cluster, "n1", gpu=1, xid=13)
    wait_for(
        lambda: "Xid 13 (graphics engine exception): an application error" in agent_log(cluster, "n1"),
        20,
        what="the agent to read Xid 13",
    )
    time.sleep(HEARTBEAT_S + 1)  # a heartbeat after it
    assert Attempt.objects.filter(state=AttemptState.RUNNING).count() == 4
    assert not Gpu.objects.exclude(health=GpuHealth.HEALTHY).exists() and not GpuFailure.objects.exists()

    # --- a critical Xid (79) on GPU 2 ---------------------------------------------------------------
    t0 = inject(cluster, "n1", gpu=2, xid=79)
    wait_for(
        lambda: Attempt.objects.filter(pk=victim.pk, state=AttemptState.ENDED).exists(),
        HEARTBEAT_S,
        every=0.05,
        what=f"the attempt on GPU 2 to end within one heartbeat interval ({HEARTBEAT_S} s)",
        jobs=[victim.job_id],
    )
    ended_s = time.monotonic() - t0
    victim.refresh_from_db()
    assert victim.outcome == Outcome.GPU_FAILED, victim.end_reason
    assert "GPU 2 of n1 failed: critical Xid 79" in victim.end_reason
    gpu2 = Gpu.objects.get(node__name="n1", index=2)
    assert (gpu2.health, gpu2.health_reason) == (GpuHealth.UNHEALTHY, "xid")
    job = Job.objects.get(pk=victim.job_id)
    assert job.events.filter(kind=EventKind.GPU_FAILED).exists()
    assert job.preemption_count == 0 and job.node_lost_streak == 0
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state == JobState.QUEUED, 10, what="the job re-queued", jobs=[job]
    )
    # The other three run on; the pass and the forecast see 3 GPUs, and the re-queued job waits.
    assert gpus_seen("n1") == 3
    assert [n.gpus for n in queue_view().loaded.snapshot.nodes] == [3]
    time.sleep(2)  # a few passes
    assert set(Attempt.objects.filter(state=AttemptState.RUNNING).values_list("pk", flat=True)) == set(others)
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED and on_gpu(2) is None

    # --- the 3 others take new work: one ends, the re-queued job takes its GPU, not GPU 2 -----------
    freed_attempt = next(iter(others))
    requests.post(
        f"{url}/api/v1/jobs/{others[freed_attempt]}/cancel/",
        headers={"Authorization": f"Token {token}"},
        timeout=30,
    ).raise_for_status()
    wait_for(
        lambda: Attempt.objects.filter(job=job, number=2, state=AttemptState.RUNNING).exists(),
        30,
        what="the re-queued job running again",
        jobs=[job],
    )
    second = Attempt.objects.get(job=job, number=2)
    assert second.placement[0]["gpus"] != [2]
    new = submit("new")
    time.sleep(3)
    assert Job.objects.get(pk=new.pk).state == JobState.QUEUED  # 3 busy, GPU 2 out: it waits

    # --- an admin marks GPU 2 healthy: the agent re-checks it, and the waiting job runs there --------
    t1 = time.monotonic()
    r = requests.post(
        f"{url}/api/v1/nodes/n1/gpus/2/mark-healthy/", headers={"Authorization": f"Token {token}"}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert [g["health"] for g in r.json()["gpu_list"] if g["index"] == 2] in (["CHECKING"], ["HEALTHY"])
    wait_for(
        lambda: Gpu.objects.get(node__name="n1", index=2).health == GpuHealth.HEALTHY,
        30,
        every=0.1,
        what="GPU 2 re-checked and HEALTHY",
    )
    healthy_s = time.monotonic() - t1
    assert "GPU 2 re-checked: healthy again" in agent_log(cluster, "n1")
    wait_for(lambda: gpus_seen("n1") == 4, 10, what="the pass to see 4 GPUs")
    wait_for(
        lambda: Attempt.objects.filter(job=new, state=AttemptState.RUNNING).exists(),
        30,
        what="the new job running on GPU 2",
        jobs=[new],
    )
    assert Attempt.objects.get(job=new).placement == [{"node": "n1", "gpus": [2]}]
    assert GpuFailure.objects.get().cleared_by == admin

    ledger.release()
    wait_settled(60)
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED
    checked = ledger.assert_no_overlap()
    print(
        f"\nXid 79 on GPU 2 of a 4-GPU node: attempt ended GPU_FAILED {ended_s:.2f} s after the fault was "
        f"written (heartbeat interval {HEARTBEAT_S} s); mark-healthy to HEALTHY (re-checked) in "
        f"{healthy_s:.2f} s; Xid 13 ended nothing; {checked} attempts, none overlapping"
    )
