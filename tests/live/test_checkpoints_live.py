"""Issue 26 end to end with real processes (control worker, beat, a fake-GPU agent running examples/train.py,
which saves every few seconds and on SIGTERM, and resumes from its checkpoint): the agent sees the
checkpoints with no change to the job, the control side keeps them, a reclaim pre-empts the job, and its
page shows the work lost since its last checkpoint (seconds, not its whole run); resumed, it continues
from the step it saved."""

import re
import time

import pytest
from django.test import Client

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState, LostCause, Outcome
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from quotas.choices import Role, Strategy
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import wait_for
from tests.security.agent_helpers import job_python

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

STEP_S = 0.25
EVERY_S = 4  # longer than the agent's settle time (CHECKPOINT_SETTLE_S, 2 s) plus a scan


def log_text(job, number):
    return "".join(
        LogChunk.objects.filter(attempt__job=job, attempt__number=number)
        .order_by("offset")
        .values_list("text", flat=True)
    )


def test_a_checkpointing_job_is_preempted_loses_seconds_and_resumes_from_its_step(cluster, django_user_model):
    team = Team.objects.create(name="t", slug="t")
    user = django_user_model.objects.create_user("t-user", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    owner = Share.objects.create(team=team, name="owner", strategy=Strategy.LEND)
    ShareCapacity.objects.create(share=owner, gpu_type="a10g", max_gpus=1)
    borrower = Share.objects.create(team=team, name="borrower")
    cluster.start_control_plane()
    cluster.start_agent("c1", 1)
    wait_for(lambda: Node.objects.filter(name="c1", state=NodeState.READY).exists(), 60, what="node c1 READY")

    train = [job_python(), cluster.program("train.py"), "--steps", "400", "--step-seconds", str(STEP_S)]
    job = job_submit(
        user=user,
        share=borrower,
        name="trainer",
        gpus=1,
        gpu_type="a10g",
        command=[*train, "--checkpoint-every", str(EVERY_S)],
        preemption_grace_s=10,
    )
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, what="the job running", jobs=[job]
    )
    first = Attempt.objects.get(job=job, number=1)
    assert first.borrowed

    # The agent sees train.py's checkpoints (it was not changed for this) and the control side keeps
    # them; each is on record a few seconds after it was written (the agent's scan and settle time).
    lags, seen = [], [None]

    def checkpointed(n):
        a = Attempt.objects.get(pk=first.pk)
        if a.last_checkpoint_at is not None and a.last_checkpoint_at != seen[0]:
            seen[0] = a.last_checkpoint_at
            lags.append(time.time() - a.last_checkpoint_at.timestamp())
        return a.checkpoints >= n

    wait_for(lambda: checkpointed(3), 60, what="three checkpoints reported by the agent", jobs=[job])
    print(f"checkpoints on record {', '.join(f'{lag:.1f}' for lag in lags)} s after they were written")
    assert all(lag < 10 for lag in lags)

    # The owner needs its GPU back: the trainer is reclaimed, saves on SIGTERM, and is re-queued.
    owner_job = job_submit(
        user=user, share=owner, name="owner", gpus=1, gpu_type="a10g", command=[*train[:2], "--steps", "4"]
    )
    wait_for(
        lambda: Attempt.objects.filter(pk=first.pk, outcome=Outcome.PREEMPTED).exists(),
        60,
        what="the trainer pre-empted",
        jobs=[job, owner_job],
    )
    ended = Attempt.objects.get(pk=first.pk)
    saved = re.search(r"SIGTERM: saved checkpoint at step (\d+)", log_text(job, 1))
    assert saved, log_text(job, 1)[-500:]
    run_s = ended.gpu_seconds_run
    print(
        f"attempt 1 ran {run_s:.1f} GPU-s, lost {ended.gpu_seconds_lost:.2f} GPU-s "
        f"({ended.checkpoints} checkpoints, the last at its SIGTERM)"
    )
    assert ended.lost_cause == LostCause.RECLAIM
    # The moments since its last checkpoint (the one it saved on SIGTERM), not its run.
    assert run_s > 10 and ended.gpu_seconds_lost < run_s / 3
    assert ended.last_checkpoint_at >= ended.stop_requested_at  # the one saved when told to stop

    # Its page says so.
    client = Client()
    client.force_login(user)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    lost_cell = page.split('data-testid="lost-1">', 1)[1].split("</td>", 1)[0]
    assert f"{ended.gpu_seconds_lost:.0f} GPU-s" in lost_cell, lost_cell
    assert "reclaim of borrowed capacity" in lost_cell, lost_cell
    assert 'data-testid="last-checkpoint"' in page
    event = job.events.get(kind="PREEMPTED").reason
    assert "since its last checkpoint at" in event, event

    # Resumed once the owner's job is done: it continues from the step it saved.
    wait_for(
        lambda: f"resuming from step {saved.group(1)}" in log_text(job, 2),
        90,
        what=f"attempt 2 resuming from step {saved.group(1)}",
        jobs=[job, owner_job],
    )
    assert Job.objects.get(pk=owner_job.pk).state == JobState.SUCCEEDED


def test_a_signed_agent_reports_checkpoints_and_the_control_side_takes_them(
    cluster, django_user_model, tmp_path
):
    """With signed messages the checkpoint report is one of the few a node may send about itself: the
    control side takes it, by the quick path and with the heartbeat, and refuses nothing."""
    import shutil

    from gpunodes import signing
    from tests.security.test_signed_cluster import signing_env

    keys = tmp_path / "keys"
    for name in ("control", "k1"):
        signing.make_credentials(name, keys)
    (keys / "control-trusts").mkdir()
    (keys / "agent-trusts").mkdir()
    for name in ("control", "k1"):
        shutil.copy(keys / f"{name}.pem", keys / "control-trusts")
    shutil.copy(keys / "control.pem", keys / "agent-trusts")
    base = dict(cluster.env)
    cluster.env = {**base, **signing_env(keys, "control", "control-trusts")}
    cluster.start_control_plane()
    cluster.env = {**base, **signing_env(keys, "k1", "agent-trusts")}
    cluster.start_agent("k1", 1)
    cluster.env = base
    wait_for(lambda: Node.objects.filter(name="k1", state=NodeState.READY).exists(), 60, what="k1 READY")

    team = Team.objects.create(name="k", slug="k")
    user = django_user_model.objects.create_user("k-user", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="k")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=1)
    train = [job_python(), cluster.program("train.py"), "--steps", "60", "--step-seconds", str(STEP_S)]
    job = job_submit(
        user=user,
        share=share,
        name="signed",
        gpus=1,
        gpu_type="a10g",
        command=[*train, "--checkpoint-every", "3"],
    )
    wait_for(
        lambda: Attempt.objects.filter(job=job, last_checkpoint_at__isnull=False).exists(),
        60,
        what="a checkpoint on record",
        jobs=[job],
    )
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED,
        60,
        what="the job to succeed",
        jobs=[job],
    )
    control_log = (cluster.tmp / "control.log").read_text(errors="replace")
    assert "refused a message" not in control_log, control_log[-2000:]
    assert Attempt.objects.get(job=job).checkpoints >= 2
