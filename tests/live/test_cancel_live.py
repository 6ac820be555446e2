"""Issue 30, finding 5, with real processes: a job that ignores SIGTERM, cancelled while it runs on a real
agent. It stays CANCELLING, its GPU held, until SIGKILL ends it at the end of its grace; only then, its
process gone, is it CANCELLED and the GPU free (before, `gpuquota cancel` printed CANCELLED at once while
the process ran on)."""

import os
import time
import uuid
from pathlib import Path

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import EventKind, JobState
from jobs.models import Attempt, GpuClaim, Job, LogChunk
from jobs.services import job_cancel, job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import wait_for
from tests.security.agent_helpers import alive, job_python

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

GRACE_S = 6
# Prints its pid, then ignores SIGTERM and sleeps: only SIGKILL ends it.
STUBBORN = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM, ignoring it', flush=True))\n"
    "print('pid', os.getpid(), flush=True)\n"
    "while True: time.sleep(0.2)\n"
)


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (found from the host's /proc: whatever pid the
    job saw for itself)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def output(job) -> str:
    return "".join(
        LogChunk.objects.filter(attempt__job=job).order_by("offset").values_list("text", flat=True)
    )


def test_a_cancelled_job_that_ignores_sigterm_holds_its_gpu_until_it_is_killed(cluster, django_user_model):
    team = Team.objects.create(name="t", slug="t")
    user = django_user_model.objects.create_user("stubborn-owner", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="t-main")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=1)
    cluster.start_control_plane()
    cluster.start_agent("c-1", 1)
    wait_for(lambda: Node.objects.filter(name="c-1", state=NodeState.READY).exists(), 60, what="c-1 READY")

    marker = f"stubborn-{uuid.uuid4().hex}"
    job = job_submit(
        user=user,
        share=share,
        gpus=1,
        gpu_type="a10g",
        command=[job_python(), "-c", STUBBORN, marker],
        preemption_grace_s=GRACE_S,
    )
    wait_for(lambda: "pid " in output(job), 60, what=f"job {job.pk} running and its output shipped")
    assert len(processes_with(marker)) == 1

    cancelled_at = time.monotonic()
    assert job_cancel(user=user, job=job).state == JobState.CANCELLING
    wait_for(lambda: "got SIGTERM" in output(job), 30, what="the SIGTERM reaching the job")
    # Within its grace: still stopping, the process alive, its GPU held.
    job.refresh_from_db()
    assert job.state == JobState.CANCELLING and job.finished_at is None
    assert processes_with(marker) and GpuClaim.objects.filter(attempt__job=job).count() == 1

    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.CANCELLED, GRACE_S + 60, what="CANCELLED")
    assert time.monotonic() - cancelled_at >= GRACE_S - 1  # not before its grace ran out
    assert not processes_with(marker), "CANCELLED while its process still runs"
    assert not GpuClaim.objects.filter(attempt__job=job).exists()
    attempt = Attempt.objects.get(job=job)
    assert attempt.outcome == "CANCELLED"
    kinds = list(job.events.order_by("at", "id").values_list("kind", flat=True))
    assert kinds[-2:] == [EventKind.CANCEL_REQUESTED, EventKind.CANCELLED]
