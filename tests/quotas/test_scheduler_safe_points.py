"""The production pass and issue 26: the snapshot gives each running attempt its last checkpoint and each
share its protection window; a checkpoint the agent saw moves the victim of a reclaim (the whole path:
agent -> outbox -> heartbeat -> attempt -> snapshot -> plan); a job that waits for protection gets a pass
at the end of the window that matters, its reason names the protected jobs and that instant, and its
owner's wait for reclaimed GPUs is kept from the first pass that needed GPUs back to its start."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from gpunodes.models import Node
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job
from jobs.services import job_submit
from jobs.tasks import attempt_started
from quotas import scheduler, services, triggers
from quotas.choices import Strategy
from quotas.engine import policy
from quotas.models import QueueForecast
from tests.conftest import make_share
from tests.gpunodes.test_runner import Reports, make_runner

PASS = "quotas.tasks.scheduling_pass"


@pytest.fixture(autouse=True)
def sent(monkeypatch, settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    settings.NODE_AUTO_ACCEPT = True
    cache.clear()
    sent = []
    monkeypatch.setattr(
        "gpunodes.dispatch.app.send_task",
        lambda name, args=None, kwargs=None, **kw: sent.append((name, {"kwargs": kwargs, **kw})),
    )
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    return sent


@pytest.fixture
def world(bob, charlie, vision, language, nodes, django_capture_on_commit_callbacks):
    """owner (LEND, 8 GPUs: the whole cluster) lends; borrower (no capacity) runs x and y, 2 GPUs each,
    borrowed on one node, x started 100 s ago and y 50 s ago; owner's o1 holds the other node."""
    Node.objects.update(last_heartbeat=timezone.now())
    owner = make_share(vision, "owner", capacity={"a10g": 8}, strategy=Strategy.LEND)
    borrower = make_share(language, "borrower", capacity={"a10g": 0})
    x = job_submit(user=charlie, share=borrower, gpus=2, gpu_type="a10g", command=["true"], name="x")
    y = job_submit(user=charlie, share=borrower, gpus=2, gpu_type="a10g", command=["true"], name="y")
    run(django_capture_on_commit_callbacks)
    attempts = {}
    for job, ago_s in ((x, 100), (y, 50)):
        a = Attempt.objects.get(job=job)
        attempt_started(a.pk, 1, a.placement[0]["node"])
        Attempt.objects.filter(pk=a.pk).update(started_at=timezone.now() - timedelta(seconds=ago_s))
        attempts[job.name] = Attempt.objects.get(pk=a.pk)
    assert {a.placement[0]["node"] for a in attempts.values()} == {"node-1"}, "x and y share a node"
    o1 = job_submit(user=bob, share=owner, gpus=4, gpu_type="a10g", command=["true"], name="o1")
    run(django_capture_on_commit_callbacks)
    assert Job.objects.get(pk=o1.pk).state == JobState.ADMITTED
    return {"owner": owner, "borrower": borrower, "bob": bob, **attempts}


def run(django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        return scheduler.run_pass("test")


def needs_two_back(world):
    """o2: 2 more GPUs of the owner's own capacity; the cover then needs 2 borrowed GPUs back."""
    return job_submit(
        user=world["bob"], share=world["owner"], gpus=2, gpu_type="a10g", command=["true"], name="o2"
    )


# --- the snapshot ------------------------------------------------------------------------------------


def test_the_snapshot_has_each_attempts_last_checkpoint_and_each_shares_window(world):
    world["borrower"].min_runtime_s = 900
    world["borrower"].save()
    at = timezone.now() - timedelta(seconds=20)
    Attempt.objects.filter(pk=world["x"].pk).update(last_checkpoint_at=at)
    snapshot = scheduler.load_snapshot().snapshot
    runs = {r.attempt_id: r for r in snapshot.running}
    assert runs[world["x"].pk].last_checkpoint_at == pytest.approx(at.timestamp(), abs=0.01)
    assert runs[world["x"].pk].safe_point == pytest.approx(at.timestamp(), abs=0.01)
    assert runs[world["y"].pk].last_checkpoint_at is None
    shares = {s.name: s for s in snapshot.shares}
    assert (shares["borrower"].min_runtime_s, shares["owner"].min_runtime_s) == (900, 0)


# --- victims by safe point, from what the agent saw -------------------------------------------------


def test_a_checkpoint_the_agent_saw_makes_its_attempt_the_cheaper_victim(
    world, tmp_path, sent, django_capture_on_commit_callbacks
):
    x, y = world["x"], world["y"]
    o2 = needs_two_back(world)
    # Without checkpoints: the most recently started (y) would go.
    plan = policy.plan(scheduler.load_snapshot().snapshot)
    assert [p.attempt_id for p in plan.preemptions] == [y.pk]

    # x's job saves a checkpoint on its host: the agent sees it and writes the report to its outbox.
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None, checkpoint_scan_s=0.05, checkpoint_settle_s=0.1)
    code = (
        "import os, pathlib, time; d = pathlib.Path(os.environ['GPUQUOTA_CHECKPOINT_DIR']); "
        "(d / 'model.tmp').write_text('w'); (d / 'model.tmp').replace(d / 'model.pt'); time.sleep(30)"
    )
    try:
        runner.node = "node-1"
        runner.start(
            attempt_id=x.pk, number=1, job_id=x.job_id, command=[sys.executable, "-c", code], grace_s=0
        )
        end = time.monotonic() + 20
        while time.monotonic() < end and not reports.of("jobs.tasks.attempt_checkpoint"):
            runner.poll()
            time.sleep(0.02)
        outbox = [e.as_message() for e in runner.outbox.pending()]
        assert [m["name"] for m in outbox][-1] == "jobs.tasks.attempt_checkpoint"
        saved = outbox[-1]["kwargs"]["at"]
        # ... and the next heartbeat carries it to the control side.
        node = Node.objects.get(name="node-1")
        inv = [g.__dict__ for g in fake_inventory("node-1", 4)]
        with django_capture_on_commit_callbacks(execute=True):
            node_heartbeat(
                "node-1",
                "a10g",
                inv,
                [[x.pk, 1], [y.pk, 1]],
                node.boot_id or "boot",
                outbox=outbox,
                outbox_epoch=runner.outbox.epoch,
            )
    finally:
        runner.shutdown(grace_s=0)
    x.refresh_from_db()
    assert x.last_checkpoint_at.timestamp() == pytest.approx(saved, abs=0.01)
    snapshot = scheduler.load_snapshot().snapshot
    assert {r.attempt_id: r.safe_point for r in snapshot.running}[x.pk] == pytest.approx(saved, abs=0.01)

    result = run(django_capture_on_commit_callbacks)
    assert result.preempted == [x.pk]  # x's safe point is now the most recent: it loses the least
    x.refresh_from_db()
    assert x.state == AttemptState.STOPPING and x.preempted_by_id == o2.pk
    assert Job.objects.get(pk=o2.pk).reclaim_needed_at is not None


# --- protection windows: a pass at the end of the window, and why it waits ---------------------------


def test_a_job_waiting_for_protection_gets_a_pass_when_the_window_ends(
    world, sent, django_capture_on_commit_callbacks
):
    world["borrower"].min_runtime_s = 600
    world["borrower"].save()
    o2 = needs_two_back(world)
    sent.clear()
    before = timezone.now()
    result = run(django_capture_on_commit_callbacks)
    assert result.preempted == [] and result.protected == [o2.pk]
    y = world["y"]
    window_end = y.started_at.timestamp() + 600  # y is the first candidate: its window matters first
    assert result.recheck_at == pytest.approx(window_end, abs=0.01)
    [(name, kw)] = [(n, kw) for n, kw in sent if n == PASS]
    assert kw["eta"].timestamp() == pytest.approx(window_end + triggers.RECHECK_MARGIN_S, abs=0.01)
    assert kw["kwargs"]["trigger"] == "recheck: 1 job(s) wait for protection"
    o2.refresh_from_db()
    assert before <= o2.reclaim_needed_at <= timezone.now()
    first_needed = o2.reclaim_needed_at

    # Why it waits, and its ETA, name the protected job and the end of its window.
    services.forecast_refresh()
    stored = QueueForecast.objects.get(job=o2)
    reason = stored.reason
    assert stored.eta is not None and stored.eta.timestamp() >= window_end - 1  # not before the window ends
    until = timezone.localtime(datetime.fromtimestamp(window_end, tz=UTC)).strftime("%H:%M")
    assert reason.startswith("waits for 1 protected job of share borrower") and f"until {until}" in reason

    # Another pass before then asks for no second one.
    sent.clear()
    run(django_capture_on_commit_callbacks)
    assert [n for n, _ in sent if n == PASS] == []

    # The window has ended (time moved on): the pass at its end pre-empts, and the owner's wait runs
    # from the first pass that needed the GPUs back.
    Attempt.objects.filter(pk__in=[world["x"].pk, y.pk]).update(
        started_at=timezone.now() - timedelta(seconds=700)
    )
    result = run(django_capture_on_commit_callbacks)
    assert len(result.preempted) == 1 and result.recheck_at is None
    assert Job.objects.get(pk=o2.pk).reclaim_needed_at == first_needed
    victim = Attempt.objects.get(pk=result.preempted[0])
    lifecycle_end(victim)
    run(django_capture_on_commit_callbacks)
    admitted = Attempt.objects.get(job=o2)
    assert admitted.reclaim_needed_at == first_needed and not admitted.borrowed
    assert Job.objects.get(pk=o2.pk).reclaim_needed_at is None  # handed to the attempt


def lifecycle_end(attempt):
    from jobs.tasks import attempt_finished

    assert attempt_finished(attempt.pk, attempt.number, attempt.placement[0]["node"], "stopped", 143)


def test_a_pass_asked_for_at_an_instant_goes_once(sent):
    at = time.time() + 300
    assert triggers.request_pass_at(at, "recheck") is True
    assert triggers.request_pass_at(at, "recheck") is False  # the same instant: already asked
    assert triggers.request_pass_at(at + 60, "recheck") is False  # a later one: that pass asks again
    assert triggers.request_pass_at(at - 60, "recheck") is True  # an earlier one: asked too
    etas = [kw["eta"] for name, kw in sent if name == PASS]
    assert [e.timestamp() for e in etas] == pytest.approx([at + 0.05, at - 60 + 0.05], abs=0.001)
