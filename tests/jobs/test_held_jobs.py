"""Issue 30, finding 4 (control side): a job whose attempts keep ending with their host's agent (it
OOM-killed the agent, or the agent died under it) was re-queued for ever, taking agents down again and
again. Once such strikes in a row reach HOLD_AFTER_NODE_LOST different hosts it is HELD (Slurm's admin
hold): not run again until an admin releases it (`scontrol release`), or cancelled by its owner; each
step an event. Issue 41 item 7 (the amplifier): a strike only for an end on a host that was lost while
the job ran, once per host, and none when many hosts lapse at once (the control plane's outage), for a
start its host refused, or for an orderly stop of its agent (issue 42 item 2)."""

import pytest
from django.utils import timezone

from gpunodes.models import Gpu, Node
from gpunodes.services import fake_inventory, node_register
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


def third_node():
    return node_register(name="node-3", gpu_type="a10g", gpus=fake_inventory("node-3", 4))[0]


def test_strikes_on_three_different_hosts_hold_the_job(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 3
    lost_with_its_agent(job, nodes[0])
    lost_with_its_agent(job, nodes[1])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 2
    assert job.strike_nodes == ["node-1", "node-2"]
    assert "strike on node-2: 2 of 3 hosts (node-1, node-2)" in job.events.order_by("at", "id").last().reason
    lost_with_its_agent(job, third_node())
    job.refresh_from_db()
    assert job.state == JobState.HELD and not GpuClaim.objects.exists()
    assert job.state_reason.startswith(
        "its attempts ended with their host's agent on 3 different hosts (node-1, node-2, node-3; "
        "HOLD_AFTER_NODE_LOST=3): held, not run again until an admin releases it"
    )
    last = list(job.events.order_by("at", "id").values_list("kind", "attempt_number"))[-2:]
    assert last == [(EventKind.NODE_LOST, 3), (EventKind.HELD, 3)]


def test_strikes_on_one_host_count_once(job, nodes, settings):
    """A host that keeps failing (or whose agent keeps dying for its own reasons) is not the job's
    doing: its strikes there count as one host, however many."""
    settings.HOLD_AFTER_NODE_LOST = 2
    for _ in range(4):
        lost_with_its_agent(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 4 and job.strike_nodes == ["node-1"]
    reason = job.events.order_by("at", "id").last().reason
    assert "a strike on node-1 again: strikes count once per host (1 of 2 hosts)" in reason
    lost_with_its_agent(job, nodes[1])
    job.refresh_from_db()
    assert job.state == JobState.HELD


def fenced_on(job, node) -> Attempt:
    attempt = attempt_of(job, node)
    assert attempt_finished(attempt.pk, attempt.number, node.name, "fenced", -9)
    return attempt


def test_many_hosts_lapsing_at_once_is_no_strike(job, nodes, settings):
    """Issue 41 item 1: a node's Redis user filled the broker, every host's lease lapsed, every job was
    fenced, and three rounds held them. Hosts whose leases lapsed together: the control plane's outage."""
    settings.HOLD_AFTER_NODE_LOST = 1
    settings.FENCE_AFTER_S, settings.FENCE_GRACE_S, settings.HEARTBEAT_INTERVAL_S = 20, 5, 2
    lapsed = timezone.now() - timezone.timedelta(seconds=60)
    Node.objects.filter(pk__in=[n.pk for n in nodes]).update(last_heartbeat=lapsed)
    fenced_on(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 0 and job.strike_nodes == []
    event = job.events.order_by("at", "id").last()
    assert event.kind == EventKind.NODE_LOST and event.detail["strike"] is False
    assert (
        "no strike toward holding it (1 other host (node-2) lapsed at the same time: the control plane's"
        in (event.reason)
    )
    attempt = Attempt.objects.get(job=job, number=1)
    assert (attempt.outcome, attempt.lost_cause) == (Outcome.NODE_LOST, "fenced")


def test_a_host_that_lapsed_alone_is_a_strike(job, nodes, settings):
    settings.HOLD_AFTER_NODE_LOST = 1
    settings.FENCE_AFTER_S, settings.FENCE_GRACE_S, settings.HEARTBEAT_INTERVAL_S = 20, 5, 2
    Node.objects.filter(pk=nodes[0].pk).update(last_heartbeat=timezone.now() - timezone.timedelta(seconds=60))
    Node.objects.filter(pk=nodes[1].pk).update(last_heartbeat=timezone.now())
    fenced_on(job, nodes[0])
    job.refresh_from_db()
    assert job.state == JobState.HELD and job.strike_nodes == ["node-1"]


def test_an_orderly_agent_shutdown_is_no_strike(job, nodes, settings):
    """Issue 42 item 2: three Ctrl-C restarts of `make run` held a running job."""
    settings.HOLD_AFTER_NODE_LOST = 1
    for _ in range(3):
        attempt = attempt_of(job, nodes[0])
        assert attempt_finished(attempt.pk, attempt.number, "node-1", "shutdown", -15)
        job.refresh_from_db()
        assert job.state == JobState.QUEUED and job.node_lost_streak == 0
        assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.AGENT_STOPPED


def test_a_start_that_never_ran_is_no_strike(job, nodes, settings):
    """An older agent says "unknown" of a start it would not run (no free uid, a GPU in use): the
    attempt never started, so its end is the host's refusal."""
    settings.HOLD_AFTER_NODE_LOST = 1
    attempt = attempt_of(job, nodes[0])
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ADMITTED)
    Job.objects.filter(pk=job.pk).update(state=JobState.ADMITTED)
    assert attempt_finished(attempt.pk, attempt.number, "node-1", "unknown", None, "refused: no free uid")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 0
    assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.REFUSED
    assert "no strike toward holding it" in job.events.order_by("at", "id").last().reason


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
        assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.REFUSED
    event = job.events.order_by("at", "id").last()
    assert (event.kind, event.detail["strike"]) == (EventKind.REQUEUED, False)
    assert event.reason.startswith(
        "refused: node-2 is CORDONED; its host's state or shortage, not the job's: no strike"
    )
    lost_with_its_agent(job, nodes[1])  # a real loss, on another host, still counts
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
    assert job.state == JobState.QUEUED and job.node_lost_streak == 5 and len(job.strike_nodes) == 2


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
    assert job.strike_nodes == []
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
        f"job {held.pk}: HELD (its attempts ended with their host's agent on 1 different hosts"
    )


def test_a_stale_report_after_the_hold_changes_nothing(held, nodes):
    attempt = Attempt.objects.get(job=held)
    assert not attempt_finished(attempt.pk, attempt.number, "node-1", "unknown", None)
    held.refresh_from_db()
    assert held.state == JobState.HELD and held.events.filter(kind=EventKind.HELD).count() == 1
