"""Issue 42 item 2 end to end (real control worker, beat and a fake-GPU agent running examples/train.py,
which saves on SIGTERM): Ctrl-C stops the agent (an orderly shutdown: SIGTERM to the job, which saves),
the cluster stays down a while, the agent comes back. The attempt ends when its processes ended (not when
the report is read after the restart), AGENT_STOPPED, its work saved on SIGTERM not lost, and with
HOLD_AFTER_NODE_LOST=1 the job is not held: it runs again and resumes from the step it saved."""

import re
import signal
import time

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import EventKind, JobState, LostCause, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import wait_for
from tests.live.test_checkpoints_live import log_text
from tests.security.agent_helpers import job_python

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]
DOWN_S = 12  # longer than the 7 s the end may be from the Ctrl-C: a receipt's date would fail


def test_ctrl_c_of_the_agent_is_an_orderly_stop_not_lost_work(cluster, django_user_model):
    cluster.env["HOLD_AFTER_NODE_LOST"] = "1"  # one strike would hold it: a shutdown is none
    team = Team.objects.create(name="t", slug="t")
    user = django_user_model.objects.create_user("t-user", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="own")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=1)
    cluster.start_control_plane()
    cluster.start_agent("c1", 1)
    wait_for(lambda: Node.objects.filter(name="c1", state=NodeState.READY).exists(), 60, what="node c1 READY")
    train = [job_python(), cluster.program("train.py"), "--steps", "2000", "--step-seconds", "0.25"]
    job = job_submit(
        user=user,
        share=share,
        name="trainer",
        gpus=1,
        gpu_type="a10g",
        command=[*train, "--checkpoint-every", "30"],
    )
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, what="the job running", jobs=[job]
    )
    time.sleep(5)

    stopped = time.time()
    cluster.kill("agent-c1", signal.SIGINT)  # Ctrl-C: the agent's orderly shutdown
    time.sleep(DOWN_S)  # the host is down; the report waits in the agent's outbox
    cluster.start_agent("c1", 1)
    wait_for(
        lambda: Attempt.objects.filter(job=job, number=1, state="ENDED").exists(),
        60,
        what="attempt 1 ended by the agent's report",
        jobs=[job],
    )
    first = Attempt.objects.get(job=job, number=1)
    run_s = (first.ended_at - first.started_at).total_seconds()
    print(
        f"attempt 1: ended {first.ended_at.timestamp() - stopped:+.1f} s from the Ctrl-C, ran {first.gpu_seconds_run:.1f}"
        f" GPU-s, lost {first.gpu_seconds_lost:.2f} GPU-s; the report applied after {DOWN_S} s down"
    )
    assert (first.outcome, first.lost_cause) == (Outcome.AGENT_STOPPED, LostCause.AGENT_STOPPED)
    assert abs(first.ended_at.timestamp() - stopped) < 7  # its processes' end, not the report's receipt
    assert first.gpu_seconds_run == pytest.approx(run_s, abs=0.5) and run_s < 5 + 7 + 10
    saved = re.search(r"SIGTERM: saved checkpoint at step (\d+)", log_text(job, 1))
    assert saved, log_text(job, 1)[-500:]
    assert first.gpu_seconds_lost < 2  # it saved on SIGTERM
    event = job.events.get(kind=EventKind.AGENT_STOPPED)
    assert "orderly shutdown of the agent on c1" in event.reason and "no strike" in event.reason, event.reason
    wait_for(
        lambda: f"resuming from step {saved.group(1)}" in log_text(job, 2),
        90,
        what=f"attempt 2 resuming from step {saved.group(1)}",
        jobs=[job],
    )
    job.refresh_from_db()
    assert job.node_lost_streak == 0 and job.state in (JobState.ADMITTED, JobState.RUNNING)
