"""Issue 30, finding 4 (control side): a job whose attempts keep ending with their host's agent (it
OOM-killed the agent, or the agent died under it) was re-queued for ever, taking agents down again and
again. After HOLD_AFTER_NODE_LOST such attempts in a row it is HELD (Slurm's admin hold): not run again
until an admin releases it (`scontrol release`), or cancelled by its owner; each step an event."""

import pytest
from django.utils import timezone

from gpunodes.models import Gpu
from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import Conflict, job_cancel, job_release, job_submit
from jobs.tasks import attempt_finished
from quotas.scheduler import end_attempts_on_node, run_pass
from tests.api.conftest import client_for


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


@pytest.fixture
def job(bob, vision_share, nodes):
    return job_submit(
        user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["python", "fork-bomb.py"]
    )


def attempt_of(job, node) -> Attempt:
    """The job's next attempt, running on `node` as the pass and the host would have it."""
    job.refresh_from_db()
    number = job.attempt_count + 1
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=number)
    attempt = Attempt.objects.create(
        job=job, number=number, state=AttemptState.RUNNING, placement=[{"node": node.name, "gpus": [0]}]
    )
    attempt.nodes.add(node)
    GpuClaim.objects.create(attempt=attempt, gpu=Gpu.objects.get(node=node, index=0))
    return attempt


def lost_with_its_agent(job, node) -> Attempt:
    """The agent restarted without it: its end report says the host no longer runs it."""
    attempt = attempt_of(job, node)
    assert attempt_finished(attempt.pk, attempt.number, node.name, "unknown", None)
    return attempt


def test_the_third_attempt_in_a_row_lost_with_its_agent_holds_the_job(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 3
    lost_with_its_agent(job, nodes[0])
    lost_with_its_agent(job, nodes[1])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 2
    lost_with_its_agent(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.HELD and not GpuClaim.objects.exists()
    assert job.state_reason.startswith(
        "its last 3 attempts ended with their host's agent (HOLD_AFTER_NODE_LOST=3): held, not run again "
        "until an admin releases it"
    )
    last = list(job.events.order_by("at", "id").values_list("kind", "attempt_number"))[-2:]
    assert last == [(EventKind.NODE_LOST, 3), (EventKind.HELD, 3)]


def test_starts_its_host_refused_never_hold_the_job(job, nodes, settings):
    """Found by .ci/run under load (test_a_control_worker_killed_mid_pass_leaves_no_half_applied_plan): an
    agent whose word of its node's state was still CORDONED refused every start the pass sent it, and the
    jobs were HELD as if they kept taking their host down. A refused start re-queues and leaves the streak
    as it was."""
    settings.HOLD_AFTER_NODE_LOST = 2
    lost_with_its_agent(job, nodes[0])
    for _ in range(3):
        attempt = attempt_of(job, nodes[1])
        assert attempt_finished(
            attempt.pk, attempt.number, nodes[1].name, "refused", None, "refused: node-2 is CORDONED"
        )
        job.refresh_from_db()
        assert job.state == JobState.QUEUED and job.node_lost_streak == 1
        assert Attempt.objects.get(pk=attempt.pk).outcome == "NODE_LOST"
    assert "refused: node-2 is CORDONED" in job.events.order_by("at", "id").last().reason
    lost_with_its_agent(job, nodes[0])  # a real loss still counts
    job.refresh_from_db()
    assert job.state == JobState.HELD


def test_a_held_job_is_not_admitted(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 1
    lost_with_its_agent(job, nodes[0])
    run_pass()
    job.refresh_from_db()
    assert job.state == JobState.HELD and job.attempt_count == 1


def test_a_node_declared_lost_counts_too(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 2
    attempt_of(job, nodes[0])
    end_attempts_on_node(nodes[0].pk, "node-1", "node node-1 stopped heartbeating", timezone.now())
    lost_with_its_agent(job, nodes[1])
    job.refresh_from_db()
    assert job.state == JobState.HELD


def test_an_attempt_that_ends_otherwise_starts_the_count_again(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 2
    lost_with_its_agent(job, nodes[0])
    attempt = attempt_of(job, nodes[1])
    lifecycle.request_stop(attempt, grace_s=0, reason="PREEMPTED_RECLAIM by job 99")
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING)
    assert lifecycle.end_attempt(attempt.pk, attempt.number, outcome=Outcome.PREEMPTED, exit_code=143)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 0
    lost_with_its_agent(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # one in a row, not two


def test_zero_never_holds(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 0
    for i in range(5):
        lost_with_its_agent(job, nodes[i % 2])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 5


@pytest.fixture
def held(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 1
    lost_with_its_agent(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.HELD
    return job


def test_an_admin_releases_it_into_the_queue_with_its_place(held, alice):
    submitted = held.submitted_at
    job = job_release(user=alice, job=held)
    assert job.state == JobState.QUEUED and job.submitted_at == submitted and job.node_lost_streak == 0
    event = job.events.order_by("-at", "-id").first()
    assert (event.kind, event.reason) == (
        EventKind.RELEASED,
        "released by alice; queued again with its original submit time",
    )
    with pytest.raises(Conflict, match="is QUEUED, not HELD"):
        job_release(user=alice, job=job)


def test_its_owner_may_not_release_it_but_may_cancel_it(held, bob):
    from django.core.exceptions import PermissionDenied

    with pytest.raises(PermissionDenied, match="Only an admin may release a held job."):
        job_release(user=bob, job=held)
    job = job_cancel(user=bob, job=held)
    assert job.state == JobState.CANCELLED and job.finished_at is not None


def test_release_through_the_api_and_the_job_page(held, alice, bob, client):
    assert client_for(bob).post(f"/api/v1/jobs/{held.pk}/release/").status_code == 403
    client.force_login(bob)
    page = client.get(f"/jobs/{held.pk}/").content.decode()
    assert 'data-testid="held"' in page and "Release</button>" not in page
    client.force_login(alice)
    assert "Release</button>" in client.get(f"/jobs/{held.pk}/").content.decode()
    r = client_for(alice).post(f"/api/v1/jobs/{held.pk}/release/")
    assert r.status_code == 200 and r.json()["state"] == JobState.QUEUED
    assert r.json()["events"][-1]["kind"] == EventKind.RELEASED


def test_the_cli_lists_held_jobs_as_open(held, bob):
    """`gpuquota jobs` (open states) asks for HELD too; a held job's line says why."""
    import sys

    from tests.client.conftest import CLIENT_SRC

    if str(CLIENT_SRC) not in sys.path:
        sys.path.insert(0, str(CLIENT_SRC))
    from gpuquota_client.cli import OPEN_STATES, job_line

    assert "HELD" in OPEN_STATES and "CANCELLING" in OPEN_STATES
    data = client_for(bob).get(f"/api/v1/jobs/{held.pk}/").json()
    assert job_line(data).startswith(
        f"job {held.pk}: HELD (its last 1 attempts ended with their host's agent"
    )


def test_a_stale_report_after_the_hold_changes_nothing(held, nodes):
    attempt = Attempt.objects.get(job=held)
    assert not attempt_finished(attempt.pk, attempt.number, "node-1", "unknown", None)
    held.refresh_from_db()
    assert held.state == JobState.HELD and held.events.filter(kind=EventKind.HELD).count() == 1
