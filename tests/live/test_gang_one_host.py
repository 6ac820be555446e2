"""Issue 42.1 end to end, on the embedded defaults (SQLite and the file broker, as `make run`): the
README's gang example, examples/allreduce.py over 8 GPUs, on two agents that share one host and one
checkpoint root, as `make run`'s two demo agents do. Each agent used to hand the job's checkpoint
directory to its own rank's uid, and the other rank's first save failed with PermissionError (the job
ended FAILED). Now the directory has one owner per job, which each rank sees as its own: both ranks
checkpoint and the job succeeds. (The network-namespace gang test needs PostgreSQL and Redis; this one
runs everywhere.)"""

import re

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import wait_for
from tests.security.agent_helpers import job_python

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

NODES = ("gang-a", "gang-b")
STEPS, EVERY = 36, 12  # a save every 3 s: it settles (CHECKPOINT_SETTLE_S) and is reported by both agents


def output(attempt: Attempt, node: str) -> str:
    chunks = LogChunk.objects.filter(attempt=attempt, node=node).order_by("offset")
    return "".join(chunks.values_list("text", flat=True))


def test_the_readme_gang_on_two_agents_of_one_host_checkpoints_on_both_ranks(cluster, django_user_model):
    team = Team.objects.create(name="g", slug="g")
    user = django_user_model.objects.create_user("g-user", password="pw-123456")
    Membership.objects.create(team=team, user=user)
    share = Share.objects.create(team=team, name="g-main")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=8)
    cluster.start_control_plane()
    for name in NODES:
        cluster.start_agent(name, 4)
    wait_for(
        lambda: Node.objects.filter(name__in=NODES, state=NodeState.READY).count() == 2,
        60,
        what="2 READY nodes",
    )

    command = [job_python(), cluster.program("allreduce.py"), "--steps", str(STEPS), "--step-seconds", "0.25"]
    job = job_submit(
        user=user,
        share=share,
        name="gang",
        gpus=8,
        gpu_type="a10g",
        command=[*command, "--checkpoint-every", str(EVERY)],
    )
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state in (JobState.SUCCEEDED, JobState.FAILED),
        120,
        what="the gang to end",
        jobs=[job],
    )
    attempt = Attempt.objects.get(job=job, number=1)
    logs = {node: output(attempt, node) for node in NODES}
    assert Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, logs
    assert sorted(p["node"] for p in attempt.placement) == list(NODES)
    for node in NODES:
        # Each rank saved every EVERY steps and at its end, or it would have died on the first save.
        wait_for(lambda node=node: "as expected" in output(attempt, node), 20, what=f"{node}'s last line")
    ranks = {re.search(r"rank (\d)/2", text).group(1) for text in map(lambda n: output(attempt, n), NODES)}
    assert ranks == {"0", "1"}
    saved = sorted(p.name for p in (cluster.jobs / "checkpoints" / f"job-{job.pk}").glob("allreduce-*.json"))
    assert saved == [f"allreduce-{s}.rank{r}.json" for s in (STEPS - EVERY, STEPS) for r in (0, 1)], saved
    attempt.refresh_from_db()
    assert set(attempt.checkpoint_by_node) == set(NODES) and attempt.checkpoints >= STEPS // EVERY
