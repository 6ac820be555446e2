"""Applying a plan is all or nothing (issue 28): a failure anywhere in the apply, or the process that
applies it killed mid-way, leaves the old layout whole, no version, no audit entry, and the plan still
to apply; one transaction for a plan of 50 shares."""

import os
import signal
import subprocess
import sys
import time

import pytest

from quotas import layout
from quotas.models import (
    AuditEntry,
    LayoutPlan,
    LayoutVersion,
    PlanState,
    Share,
    ShareCapacity,
    TemporaryChange,
)
from tests.conftest import make_share

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fifty_shares(team) -> None:
    for i in range(50):
        make_share(team, f"s-{i:02d}", capacity={"a10g": 2})


def changed_plan(actor=None, n: int = 20):
    data = layout.load_live().layout.to_data()
    for entry in data["shares"][:n]:
        entry["capacity"] = {"a10g": 3, "h100": 1}
        entry["strategy"] = "LEND"
    data["shares"][n]["until"] = "2d"
    data["shares"][n]["description"] = "for two days"
    return layout.plan(source=data, actor=actor, run_whatif=False)


def snapshot_of_rows():
    return (
        sorted(Share.objects.values_list("name", "strategy", "description", "state")),
        sorted(ShareCapacity.objects.values_list("share__name", "gpu_type", "max_gpus")),
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "where", ["a share's capacity", "the version", "the audit entry", "the temporary change"]
)
def test_a_failure_anywhere_in_the_apply_leaves_the_old_layout_whole(
    no_messages, vision, alice, monkeypatch, where
):
    fifty_shares(vision)
    planned = changed_plan(alice)
    before_hash, before_rows = layout.load_live().layout.hash(), snapshot_of_rows()
    calls = {"n": 0}

    def boom(*args, **kwargs):
        raise RuntimeError(f"injected failure at {where}")

    if where == "a share's capacity":
        real = ShareCapacity.objects.create

        def on_the_11th(*args, **kwargs):  # after ten shares' capacities were written
            calls["n"] += 1
            if calls["n"] == 11:
                boom()
            return real(*args, **kwargs)

        monkeypatch.setattr(ShareCapacity.objects, "create", on_the_11th)
    elif where == "the version":
        monkeypatch.setattr(LayoutVersion.objects, "create", boom)
    elif where == "the audit entry":
        monkeypatch.setattr(layout, "record_version", boom)
    else:
        monkeypatch.setattr(TemporaryChange.objects, "bulk_create", boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        layout.apply(overcommit_ok=True, plan_id=planned.pk, actor=alice)
    assert where != "a share's capacity" or calls["n"] == 11
    assert layout.load_live().layout.hash() == before_hash and snapshot_of_rows() == before_rows
    assert not LayoutVersion.objects.exists() and not AuditEntry.objects.filter(object_type="layout").exists()
    assert not TemporaryChange.objects.exists()
    assert LayoutPlan.objects.get(pk=planned.pk).state == PlanState.PLANNED
    monkeypatch.undo()
    applied = layout.apply(
        overcommit_ok=True, plan_id=planned.pk, actor=alice
    )  # the same plan applies once the fault is gone
    assert applied.version.number == 1 and layout.load_live().layout.hash() == applied.version.hash


@pytest.mark.django_db
def test_fifty_shares_are_applied_in_one_transaction(
    no_messages, vision, alice, django_capture_on_commit_callbacks
):
    fifty_shares(vision)
    planned = changed_plan(alice)
    with django_capture_on_commit_callbacks(execute=True):
        applied = layout.apply(overcommit_ok=True, plan_id=planned.pk, actor=alice)
    assert no_messages == [("pass", "layout version 1")]  # one version: one pass asked for
    assert Share.objects.filter(strategy="LEND").count() == 20
    assert applied.version.diff == planned.diff and len(planned.diff) == 21
    [temporary] = TemporaryChange.objects.all()
    assert temporary.share.name == "s-20" and temporary.fields == {"description": ["", "for two days"]}


APPLY_AND_HANG = """
import os, time
from quotas import layout
real = layout._write
def write_then_hang(*args, **kwargs):
    real(*args, **kwargs)
    print("WRITTEN", flush=True)
    time.sleep(120)
layout._write = write_then_hang
layout.apply(overcommit_ok=True, plan_id=os.environ["PLAN_ID"])  # no READY node: all over-commits
"""


@pytest.mark.django_db(transaction=True)
def test_the_process_applying_killed_mid_apply_leaves_the_old_layout_whole(vision, alice, settings):
    """A separate process applies the plan, writes every share, and is killed (SIGKILL) before it
    commits: the database keeps the old layout (PostgreSQL rolls the killed backend's transaction back
    and frees the layout lock; SQLite discards the uncommitted write-ahead frames)."""
    from tests.live.conftest import _database_url

    fifty_shares(vision)
    planned = changed_plan(alice)
    before_hash, before_rows = layout.load_live().layout.hash(), snapshot_of_rows()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "GPUQUOTA_VAR_DIR": str(settings.VAR_DIR),
        "PLAN_ID": str(planned.pk),
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "shell", "-c", APPLY_AND_HANG],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "WRITTEN" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"the applying process ended first: {proc.stderr.read()}")
        assert "WRITTEN" in line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert layout.load_live().layout.hash() == before_hash and snapshot_of_rows() == before_rows
    assert not LayoutVersion.objects.exists()
    assert LayoutPlan.objects.get(pk=planned.pk).state == PlanState.PLANNED
    applied = layout.apply(
        overcommit_ok=True, plan_id=planned.pk, actor=alice
    )  # the lock went with the process
    assert applied.version.number == 1


@pytest.mark.django_db(transaction=True)
def test_two_plans_applied_at_the_same_moment_one_wins_the_other_is_refused(vision, alice):
    """Two admins' plans from the same layout, applied at once from two threads (two connections): the
    layout lock lets one in; the other then finds the layout changed and applies nothing."""
    import threading

    from django.db import connection

    from jobs.services import Conflict

    fifty_shares(vision)
    first, second = changed_plan(alice, n=10), changed_plan(alice, n=30)
    assert first.base_hash == second.base_hash
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def run(name, planned):
        try:
            barrier.wait()
            outcomes[name] = layout.apply(overcommit_ok=True, plan_id=planned.pk, actor=alice).version.number
        except Conflict as e:
            outcomes[name] = str(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(n, p)) for n, p in (("first", first), ("second", second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(map(type, outcomes.values()), key=str) == [int, str], outcomes
    refused = next(v for v in outcomes.values() if isinstance(v, str))
    assert refused.startswith("The layout changed since this plan was made (version 1 was applied by alice")
    assert LayoutVersion.objects.count() == 1
    winner = LayoutVersion.objects.get().hash
    assert layout.load_live().layout.hash() == winner


@pytest.mark.django_db
def test_plans_never_applied_go_after_30_days_applied_ones_stay(no_messages, vision):
    from datetime import timedelta

    from django.utils import timezone

    from config.celery import app

    make_share(vision, "s", capacity={"a10g": 1})
    data = layout.load_live().layout.to_data()
    old, applied, fresh = (layout.plan(source=data, run_whatif=False) for _ in range(3))
    layout.apply(overcommit_ok=True, plan_id=applied.pk)
    LayoutPlan.objects.filter(pk__in=[old.pk, applied.pk]).update(
        created_at=timezone.now() - timedelta(days=31)
    )
    assert app.tasks["quotas.tasks.prune_layout_plans"].apply().get() == 1
    assert set(LayoutPlan.objects.values_list("pk", flat=True)) == {applied.pk, fresh.pk}
