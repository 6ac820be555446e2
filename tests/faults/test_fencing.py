"""Fencing on the host: a job's processes never outlive their agent (gpunodes/agent/fence.py). An agent
killed with -9 and not restarted: its jobs stop within a second or two, their copies start elsewhere
only after the node is LOST, and no two attempts of a job overlap (the ledger: start, ticks and end
written from inside the jobs). A frozen agent (SIGSTOP) has its jobs fenced before its node is LOST,
and rejoins READY."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from gpunodes.agent.fence import group_running
from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit
from tests.faults.conftest import make_team, needs_stack, wait_for
from tests.faults.harness import wait_settled
from tests.faults.ledger import Ledger

pytestmark = [needs_stack, pytest.mark.django_db(transaction=True)]


def four_ledger_jobs(cluster, django_user_model, team: str) -> tuple[Ledger, list[int], list[int]]:
    """Nodes `<team>1` and `<team>2` of 2 GPUs each, 4 one-GPU jobs that write the ledger, all running:
    (the ledger, the jobs on `<team>1`, the process groups of its agent's attempts)."""
    share, [(user, _)] = make_team(django_user_model, team, capacity=4)
    cluster.start({f"{team}1": 2, f"{team}2": 2})
    ledger = Ledger(cluster.jobs / "ledger")
    jobs = [
        job_submit(
            user=user, share=share, gpus=1, gpu_type="a10g", command=[ledger.command()], use_shell=True
        )
        for _ in range(4)
    ]
    wait_for(
        lambda: Attempt.objects.filter(state=AttemptState.RUNNING).count() == 4,
        60,
        every=0.5,
        what="4 running",
        jobs=jobs,
    )
    on_first = sorted(
        Attempt.objects.filter(nodes__name=f"{team}1", number=1).values_list("job_id", flat=True)
    )
    groups = [e["pgid"] for e in json.loads(cluster.agent_state_file(f"{team}1").read_text())]
    return ledger, on_first, groups


def test_the_jobs_of_an_agent_killed_with_9_stop_within_seconds_and_run_again_only_once_lost(
    cluster, django_user_model
):
    ledger, on_f1, groups = four_ledger_jobs(cluster, django_user_model, "f")
    assert len(on_f1) == 2 and len(groups) == 2

    cluster.kill("agent-f1")  # kill -9, and it stays dead
    t0 = time.monotonic()
    wait_for(lambda: not any(group_running(g) for g in groups), 10, every=0.05, what="f1's jobs stopped")
    stopped_s = time.monotonic() - t0
    killed_at = time.time()
    wait_for(lambda: Node.objects.get(name="f1").state == NodeState.LOST, 40, every=0.25, what="f1 LOST")
    for job_id in on_f1:
        assert Attempt.objects.get(job_id=job_id, number=1).outcome == Outcome.NODE_LOST

    ledger.release()  # f2's jobs end; the re-queued ones run there
    wait_settled(120)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    for job_id in on_f1:
        first, second = ledger.attempts(job_id)
        assert not first.ended and first.end <= killed_at + 1  # killed, not ended by itself
        assert second.start > first.end
    checked = ledger.assert_no_overlap()
    assert stopped_s < 3, stopped_s
    print(
        f"\nagent kill -9: its {len(groups)} jobs stopped after {stopped_s * 1000:.0f} ms; {checked} attempts, none overlapping"
    )


def test_a_frozen_agent_has_its_jobs_fenced_before_its_node_is_lost_and_rejoins_ready(
    cluster, django_user_model
):
    """SIGSTOP for longer than NODE_LOST_AFTER_S: the watchdog stops the jobs (SIGTERM: they write their
    end) FENCE_AFTER_S after the last renewal, the node goes LOST later, the copies run on the other
    node, and after SIGCONT the agent renews its lease and its node is READY again."""
    lost_s, fence_s, grace_s = 10, 4, 1
    cluster.env.update(NODE_LOST_AFTER_S=str(lost_s), FENCE_AFTER_S=str(fence_s), FENCE_GRACE_S=str(grace_s))
    ledger, on_g1, groups = four_ledger_jobs(cluster, django_user_model, "g")
    agent = cluster.procs["agent-g1"]

    os.kill(agent.pid, signal.SIGSTOP)
    frozen_at, t0 = time.time(), time.monotonic()
    try:
        wait_for(lambda: not any(group_running(g) for g in groups), 30, every=0.1, what="g1's jobs fenced")
        fenced_after = time.monotonic() - t0
        assert Node.objects.get(name="g1").state == NodeState.READY  # fenced before LOST
        wait_for(lambda: Node.objects.get(name="g1").state == NodeState.LOST, 40, every=0.25, what="g1 LOST")
        lost_after = time.monotonic() - t0
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    wait_for(lambda: Node.objects.get(name="g1").state == NodeState.READY, 60, every=0.25, what="g1 READY")
    assert agent.poll() is None

    ledger.release()
    wait_settled(120)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    for job_id in on_g1:
        first, second = ledger.attempts(job_id)
        assert first.ended  # SIGTERM first: it could write its end (a checkpoint)
        assert first.end - frozen_at <= fence_s + grace_s + 2
        assert second.start > first.end
    checked = ledger.assert_no_overlap()
    print(
        f"\nagent frozen: its jobs stopped {fenced_after:.1f} s after the freeze (FENCE_AFTER_S={fence_s}), "
        f"node LOST after {lost_after:.1f} s (NODE_LOST_AFTER_S={lost_s}), READY again after SIGCONT; "
        f"{checked} attempts, none overlapping"
    )
