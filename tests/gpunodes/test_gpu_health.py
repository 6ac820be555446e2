"""A GPU its agent finds broken (issue 29): the heartbeat makes it UNHEALTHY with its reason, the
attempt on it ends GPU_FAILED at once (re-queued: not the user's failure, not a pre-emption, not a step
towards HELD), the pass and the forecast see one GPU fewer while the node's other GPUs keep working, and
an admin's mark-healthy brings it back only once the agent's re-check agrees. Each change is audited."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from gpunodes import services
from gpunodes.choices import GpuHealth
from gpunodes.models import Gpu, GpuFailure, Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.tasks import attempt_finished
from quotas import scheduler
from quotas.models import AuditEntry
from quotas.services import queue_view
from tests.api.conftest import client_for, run, submit

RECHECK = "gpunodes.agent.tasks.gpu_recheck"
PREEMPT = "gpunodes.agent.tasks.preempt_attempt"
START = "gpunodes.agent.tasks.start_attempt"
XID_79 = {"index": 2, "reason": "xid", "detail": "critical Xid 79 (GPU has fallen off the bus)", "at": 0.0}


@pytest.fixture(autouse=True)
def setup(settings, no_messages):
    settings.NODE_AUTO_ACCEPT = True


@pytest.fixture
def as_alice(alice):
    return client_for(alice)


@pytest.fixture
def as_bob(bob):
    return client_for(bob)


def beat(name="node-1", *, unhealthy=(), rechecked=(), running=(), boot="boot-1"):
    inv = [g.__dict__ for g in fake_inventory(name, 4)]
    faults = [{**f, "at": f["at"] or time.time()} for f in unhealthy]
    return node_heartbeat(
        name,
        "a10g",
        inv,
        [list(r) for r in running],
        boot,
        sent_at=time.time(),
        unhealthy=faults,
        rechecked=[list(r) for r in rechecked],
    )


def gpu(index, node="node-1") -> Gpu:
    return Gpu.objects.get(node__name=node, index=index)


def sent_names(sent):
    return [name for name, *_ in sent]


@pytest.fixture
def two_running(bob, vision_share, nodes):
    """Jobs on GPU 2 and GPU 0 of node-1."""
    on_2, on_0 = submit(bob, vision_share), submit(bob, vision_share)
    return run(on_2, nodes[0], [2]), run(on_0, nodes[0], [0])


def test_a_broken_gpu_ends_its_attempt_gpu_failed_and_leaves_the_rest_running(
    two_running, no_messages, django_capture_on_commit_callbacks
):
    broken, other = two_running
    with django_capture_on_commit_callbacks(execute=True):
        result = beat(unhealthy=[XID_79], running=[(broken.pk, 1), (other.pk, 1)])
    assert result["gpu_failed"] == [broken.pk]
    broken.refresh_from_db()
    other.refresh_from_db()
    assert broken.outcome == Outcome.GPU_FAILED and not broken.claims.exists()
    assert "GPU 2 of node-1 failed: critical Xid 79" in broken.end_reason
    assert other.state == AttemptState.RUNNING and other.claims.count() == 1
    job = Job.objects.get(pk=broken.job_id)
    assert job.state == JobState.QUEUED and job.preemption_count == 0 and job.node_lost_streak == 0
    event = job.events.get(kind=EventKind.GPU_FAILED)
    assert "not the job's" in event.reason and event.attempt_number == 1
    stops = [kw["kwargs"] for name, kw in no_messages if name == PREEMPT]
    assert stops == [{"node": "node-1", "attempt_id": broken.pk, "number": 1, "grace_s": 0}]

    g = gpu(2)
    assert (g.health, g.health_reason) == (GpuHealth.UNHEALTHY, "xid")
    assert g.health_detail == XID_79["detail"] and g.health_changed_at is not None
    failure = GpuFailure.objects.get()
    assert (failure.node.name, failure.index, failure.reason, failure.cleared_at) == (
        "node-1",
        2,
        "xid",
        None,
    )
    entry = AuditEntry.objects.get(action="gpu_unhealthy")
    assert (entry.object_type, entry.object_repr, entry.actor) == ("gpu", "node-1:2", None)
    assert entry.before["health"] == "HEALTHY" and entry.after["health"] == "UNHEALTHY"


def test_the_agents_own_end_report_is_gpu_failed_too_and_a_repeat_changes_nothing(two_running):
    broken, _ = two_running
    assert attempt_finished(
        attempt_id=broken.pk, number=1, node="node-1", how="gpu_failed", exit_code=-9, detail="GPU 2 failed"
    )
    broken.refresh_from_db()
    assert broken.outcome == Outcome.GPU_FAILED
    assert Job.objects.get(pk=broken.job_id).state == JobState.QUEUED
    beat(unhealthy=[XID_79])  # the heartbeat after: the attempt is over already
    assert Attempt.objects.filter(job_id=broken.job_id).count() == 1
    assert Job.objects.get(pk=broken.job_id).events.filter(kind=EventKind.GPU_FAILED).count() == 1


def test_an_end_report_naming_the_fault_takes_the_gpu_out_before_the_job_is_requeued(
    two_running, django_capture_on_commit_callbacks
):
    # The agent's end report can be taken before its heartbeat naming the fault: the GPU must be out of
    # capacity by the time the re-queued job is seen by a pass, or it is placed on the broken GPU again.
    broken, other = two_running
    with django_capture_on_commit_callbacks(execute=True):
        assert attempt_finished(
            attempt_id=broken.pk,
            number=1,
            node="node-1",
            how="gpu_failed",
            exit_code=-9,
            detail="GPU 2 of node-1 failed: critical Xid 79 (GPU has fallen off the bus)",
            gpu_faults=[{**XID_79, "at": time.time()}],
        )
    broken.refresh_from_db()
    assert broken.outcome == Outcome.GPU_FAILED and "critical Xid 79" in broken.end_reason
    assert (gpu(2).health, gpu(2).health_reason) == (GpuHealth.UNHEALTHY, "xid")
    assert GpuFailure.objects.get().index == 2
    assert Job.objects.get(pk=broken.job_id).state == JobState.QUEUED
    scheduler.run_pass("test")
    assert not GpuClaim.objects.filter(gpu=gpu(2)).exists()  # placed elsewhere, or waiting: never on GPU 2
    beat(unhealthy=[XID_79], running=[(other.pk, 1)])  # the heartbeat after it changes nothing
    assert GpuFailure.objects.count() == 1
    assert Job.objects.get(pk=broken.job_id).events.filter(kind=EventKind.GPU_FAILED).count() == 1


@pytest.mark.parametrize(
    "faults",
    [
        [{"index": 9, "reason": "xid", "detail": "no such GPU", "at": 1.0}],
        [{"index": 2, "reason": "made-up", "detail": "x", "at": 1.0}],
        [{"index": 2, "reason": "xid", "detail": "x", "at": 1.0, "extra": 1}],
        ["not a fault"],
    ],
    ids=["unknown-index", "unknown-reason", "extra-field", "not-a-dict"],
)
def test_an_end_report_with_malformed_faults_still_ends_the_attempt_and_leaves_the_gpus(two_running, faults):
    broken, _ = two_running
    assert attempt_finished(
        attempt_id=broken.pk, number=1, node="node-1", how="gpu_failed", exit_code=-9, gpu_faults=faults
    )
    assert Attempt.objects.get(pk=broken.pk).outcome == Outcome.GPU_FAILED
    assert not Gpu.objects.exclude(health=GpuHealth.HEALTHY).exists() and not GpuFailure.objects.exists()


def test_a_gpu_failure_counts_neither_as_a_preemption_nor_towards_held(settings, bob, vision_share, nodes):
    settings.HOLD_AFTER_NODE_LOST = 2
    job = submit(bob, vision_share, max_preemptions=0)
    Job.objects.filter(pk=job.pk).update(node_lost_streak=1)
    job.refresh_from_db()
    attempt = run(job, nodes[0], [2])
    Attempt.objects.filter(pk=attempt.pk).update(state=AttemptState.STOPPING)  # even while stopping
    beat(unhealthy=[XID_79])
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 1 and job.preemption_count == 0
    assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.GPU_FAILED


def test_the_pass_and_the_forecast_see_one_gpu_fewer_and_never_place_on_it(
    bob, vision_share, nodes, no_messages, django_capture_on_commit_callbacks
):
    Node.objects.filter(name="node-2").delete()
    Node.objects.update(last_heartbeat=timezone.now())
    beat(unhealthy=[XID_79])
    loaded = scheduler.load_snapshot()
    assert [(n.name, n.gpus) for n in loaded.snapshot.nodes] == [("node-1", 3)]
    jobs = [submit(bob, vision_share) for _ in range(4)]
    with django_capture_on_commit_callbacks(execute=True):
        result = scheduler.run_pass("test")
    assert len(result.admitted) == 3
    placed = sorted(i for a in Attempt.objects.all() for p in a.placement for i in p["gpus"])
    assert placed == [0, 1, 3]
    assert not GpuClaim.objects.filter(gpu=gpu(2)).exists()
    starts = sorted(kw["kwargs"]["gpus"][0] for name, kw in no_messages if name == START)
    assert starts == [0, 1, 3]
    queue = queue_view()  # the forecast replays the policy from this snapshot
    assert [(n.name, n.gpus) for n in queue.loaded.snapshot.nodes] == [("node-1", 3)]
    waiting = [j.pk for j in jobs if Job.objects.get(pk=j.pk).state == JobState.QUEUED]
    assert len(waiting) == 1 and waiting[0] in queue.forecast.positions
    # The page's picture and running rows speak of the node's own GPU numbers, not the engine's.
    from quotas.usage import live_picture

    rows = [r for rows in live_picture().running.values() for r in rows]
    assert sorted(i for r in rows for _, idx in r.placement for i in idx) == [0, 1, 3]


def test_a_2_gpu_job_fits_the_3_healthy_gpus_around_the_broken_one(
    bob, vision_share, nodes, django_capture_on_commit_callbacks
):
    Node.objects.filter(name="node-2").delete()
    Node.objects.update(last_heartbeat=timezone.now())
    beat(unhealthy=[XID_79])
    one, two = submit(bob, vision_share, gpus=1), submit(bob, vision_share, gpus=2)
    with django_capture_on_commit_callbacks(execute=True):
        scheduler.run_pass("test")
    used = {a.job_id: a.placement[0]["gpus"] for a in Attempt.objects.all()}
    assert sorted(used[one.pk] + used[two.pk]) == [0, 1, 3]


def test_mark_healthy_waits_for_the_agents_recheck(
    alice, bob, vision_share, nodes, no_messages, django_capture_on_commit_callbacks
):
    Node.objects.update(last_heartbeat=timezone.now())
    beat(unhealthy=[XID_79])
    with django_capture_on_commit_callbacks(execute=True):
        g = services.gpu_mark_healthy(node=nodes[0], index=2, actor=alice)
    assert (g.health, g.recheck) == (GpuHealth.CHECKING, 1)
    assert [kw["kwargs"] for name, kw in no_messages if name == RECHECK] == [
        {"node": "node-1", "index": 2, "token": 1}
    ]
    failure = GpuFailure.objects.get()
    assert failure.cleared_by == alice and failure.cleared_at is not None
    entry = AuditEntry.objects.get(action="gpu_mark_healthy")
    assert entry.actor == alice and entry.after["health"] == "CHECKING"
    assert [n.gpus for n in scheduler.load_snapshot().snapshot.nodes if n.name == "node-1"] == [3]

    # The agent has not re-checked yet: still out, and asked again.
    no_messages.clear()
    with django_capture_on_commit_callbacks(execute=True):
        beat(unhealthy=[XID_79])
    assert gpu(2).health == GpuHealth.CHECKING
    assert sent_names(no_messages).count(RECHECK) == 1
    # Its answer: well.
    with django_capture_on_commit_callbacks(execute=True):
        beat(rechecked=[(2, 1)])
    g = gpu(2)
    assert (g.health, g.health_reason, g.health_detail) == (GpuHealth.HEALTHY, "", "")
    assert AuditEntry.objects.filter(action="gpu_healthy", object_repr="node-1:2").exists()
    assert [n.gpus for n in scheduler.load_snapshot().snapshot.nodes if n.name == "node-1"] == [4]


def test_a_recheck_that_finds_it_still_broken_keeps_it_out(alice, nodes):
    beat(unhealthy=[XID_79])
    services.gpu_mark_healthy(node=nodes[0], index=2, actor=alice)
    still = {"index": 2, "reason": "ecc", "detail": "re-check failed: 3 uncorrectable ECC errors", "at": 0.0}
    beat(unhealthy=[still], rechecked=[(2, 1)])
    g = gpu(2)
    assert (g.health, g.health_reason) == (GpuHealth.UNHEALTHY, "ecc")
    assert GpuFailure.objects.filter(cleared_at__isnull=True).get().reason == "ecc"
    assert GpuFailure.objects.count() == 2


def test_an_unhealthy_gpu_stays_so_when_its_restarted_agent_no_longer_reports_it(nodes):
    beat(unhealthy=[XID_79])
    beat(boot="boot-2")
    assert gpu(2).health == GpuHealth.UNHEALTHY


def test_marking_a_healthy_gpu_healthy_changes_nothing_and_an_unknown_index_is_refused(alice, nodes):
    assert services.gpu_mark_healthy(node=nodes[0], index=1, actor=alice).health == GpuHealth.HEALTHY
    assert not AuditEntry.objects.filter(action="gpu_mark_healthy").exists()
    with pytest.raises(Gpu.DoesNotExist):
        services.gpu_mark_healthy(node=nodes[0], index=9, actor=alice)


# --- what people see: the API, the pages, the metrics ---------------------------------------------


def test_the_api_shows_the_broken_gpu_and_an_admin_marks_it_healthy(as_alice, as_bob, nodes):
    beat(unhealthy=[XID_79])
    listed = as_bob.get("/api/v1/nodes/").json()["results"]
    assert [(n["name"], n["gpus"], n["gpus_unhealthy"]) for n in listed] == [
        ("node-1", 4, 1),
        ("node-2", 4, 0),
    ]
    node = as_bob.get("/api/v1/nodes/node-1/").json()
    broken = [g for g in node["gpu_list"] if g["health"] != "HEALTHY"]
    assert [(g["index"], g["health"], g["reason"], g["detail"]) for g in broken] == [
        (2, "UNHEALTHY", "xid", XID_79["detail"])
    ]
    assert broken[0]["since"]
    assert as_bob.post("/api/v1/nodes/node-1/gpus/2/mark-healthy/").status_code == 403
    r = as_alice.post("/api/v1/nodes/node-1/gpus/2/mark-healthy/")
    assert r.status_code == 200
    assert [g["health"] for g in r.json()["gpu_list"]] == ["HEALTHY", "HEALTHY", "CHECKING", "HEALTHY"]
    assert as_alice.post("/api/v1/nodes/node-1/gpus/7/mark-healthy/").status_code == 404
    assert as_alice.post("/api/v1/nodes/node-1/gpus/x/mark-healthy/").status_code == 404


def test_the_grid_and_the_node_page_show_it_in_red_with_reason_and_time(client, alice, bob, nodes):
    beat(unhealthy=[XID_79])
    client.force_login(bob)
    grid = client.get("/nodes/").content.decode()
    assert 'class="gpu unhealthy"' in grid and "UNHEALTHY since" in grid and "Xid 79" in grid
    assert "1 unhealthy" in grid
    page = client.get("/nodes/node-1/").content.decode()
    assert "Critical Xid error: critical Xid 79 (GPU has fallen off the bus)" in page
    assert "Mark healthy" not in page and "not yet" in page
    assert client.post("/nodes/node-1/gpus/2/mark-healthy/").status_code == 403
    client.force_login(alice)
    page = client.get("/nodes/node-1/").content.decode()
    assert "Mark healthy" in page
    r = client.post("/nodes/node-1/gpus/2/mark-healthy/", HTTP_HX_REQUEST="true")
    assert r.status_code == 200 and "re-checking" in r.content.decode()
    assert gpu(2).health == GpuHealth.CHECKING
    assert client.post("/nodes/node-1/gpus/9/mark-healthy/").status_code == 404
    assert client.get("/nodes/nope/").status_code == 404


def test_metrics_count_gpus_by_health_and_failures_by_reason(client, settings, nodes):
    settings.METRICS_TOKEN = "t"
    beat(unhealthy=[XID_79])
    beat("node-2", unhealthy=[{**XID_79, "index": 0, "reason": "off_bus", "detail": "gone"}])
    text = client.get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    assert 'gpuquota_gpus{gpu_type="a10g",state="healthy"} 6.0' in text
    assert 'gpuquota_gpus{gpu_type="a10g",state="unhealthy"} 2.0' in text
    assert 'gpuquota_gpus{gpu_type="a10g",state="checking"} 0.0' in text
    assert 'gpuquota_gpu_failures_total{reason="xid"} 1.0' in text
    assert 'gpuquota_gpu_failures_total{reason="off_bus"} 1.0' in text
    assert 'gpuquota_gpu_failures_total{reason="ecc"} 0.0' in text
    assert 'gpuquota_node_gpus{gpu_type="a10g",node="node-1",state="unhealthy"} 1.0' in text
    assert 'gpuquota_node_gpus{gpu_type="a10g",node="node-1",state="free"} 3.0' in text


def test_the_django_admin_marks_healthy_through_the_service_and_cannot_edit_health(client, alice, nodes):
    from django.urls import reverse

    beat(unhealthy=[XID_79])
    broken = gpu(2)
    client.force_login(alice)
    url = reverse("admin:gpunodes_gpu_changelist")
    r = client.post(url, {"action": "mark_healthy", "_selected_action": [broken.pk]})
    assert r.status_code == 302
    assert gpu(2).health == GpuHealth.CHECKING
    assert AuditEntry.objects.filter(action="gpu_mark_healthy", actor=alice).exists()
    change = reverse("admin:gpunodes_gpu_change", args=[broken.pk])
    client.post(
        change,
        {
            "node": nodes[0].pk,
            "index": 2,
            "uuid": broken.uuid,
            "model": "x",
            "memory_mb": 1,
            "health": "HEALTHY",
        },
    )
    assert gpu(2).health == GpuHealth.CHECKING  # read-only there


def test_the_overview_feed_says_the_gpu_failed(client, bob, two_running):
    broken, _ = two_running
    beat(unhealthy=[XID_79])
    client.force_login(bob)
    body = client.get("/").content.decode()
    assert '<span class="badge off">GPU failed</span>' in body
    assert "GPU 2 of node-1 failed: critical Xid 79" in body
