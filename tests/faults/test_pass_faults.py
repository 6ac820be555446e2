"""A scheduling pass that fails half-way applies nothing, and the next pass completes: the connection to
PostgreSQL dropped under it (pg_terminate_backend from another connection), and a statement failing
in the middle of applying the plan."""

from __future__ import annotations

import psycopg
import pytest
from django.db import DatabaseError, connection
from django.utils import timezone

from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Attempt, GpuClaim, Job, JobEvent
from jobs.services import job_submit
from quotas import scheduler
from quotas.engine import policy
from quotas.models import SchedulerPass
from tests.conftest import heard_all_along
from tests.faults.conftest import needs_postgres


@pytest.fixture
def fresh(nodes):
    Node.objects.update(last_heartbeat=timezone.now())
    return nodes


def queue(bob, share, n=3):
    return [job_submit(user=bob, share=share, gpus=1, gpu_type="a10g", command=["true"]) for _ in range(n)]


def nothing_applied(jobs):
    assert not Attempt.objects.exists() and not GpuClaim.objects.exists()
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True)) == {
        JobState.QUEUED
    }
    assert not JobEvent.objects.exclude(kind="SUBMITTED").exists()
    assert not SchedulerPass.objects.exists()


def terminate_backend(pid: int) -> None:
    s = connection.settings_dict
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    ) as other:
        assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_a_pass_whose_connection_is_dropped_applies_nothing_and_the_next_one_succeeds(
    bob, vision_share, fresh, no_local_messages, monkeypatch
):
    jobs = queue(bob, vision_share)
    no_local_messages.clear()
    real_plan = policy.plan

    def plan_then_lose_the_connection(snapshot):
        decided = real_plan(snapshot)
        assert decided.admissions
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            terminate_backend(cursor.fetchone()[0])  # the pass holds its lock and has housekept
        return decided

    monkeypatch.setattr(scheduler.policy, "plan", plan_then_lose_the_connection)
    with pytest.raises(DatabaseError):
        scheduler.run_pass("test")
    assert no_local_messages == []  # nothing was sent for a pass that did not commit
    connection.close()  # what Celery's Django fixup does with a broken connection between tasks
    monkeypatch.setattr(scheduler.policy, "plan", real_plan)
    nothing_applied(jobs)

    result = scheduler.run_pass("test")
    assert sorted(result.admitted) == sorted(j.pk for j in jobs)
    assert Attempt.objects.count() == 3 and GpuClaim.objects.count() == 3


@needs_postgres
@pytest.mark.django_db(transaction=True)
def test_a_pass_whose_connection_drops_while_housekeeping_leaves_the_node_as_it_was(
    bob, vision_share, fresh, no_local_messages, monkeypatch, settings
):
    """A node that went silent: the failed pass does not leave it half-LOST."""
    jobs = queue(bob, vision_share, 1)
    scheduler.run_pass("admit")
    [attempt] = Attempt.objects.all()
    node = attempt.placement[0]["node"]
    Node.objects.filter(name=node).update(last_heartbeat=timezone.now() - timezone.timedelta(minutes=5))
    heard_all_along()  # the other node's heartbeats: the silence is this node's own
    real_end = scheduler.lifecycle.end_attempt

    def end_then_lose_the_connection(*args, **kwargs):
        ended = real_end(*args, **kwargs)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            terminate_backend(cursor.fetchone()[0])
        return ended

    monkeypatch.setattr(scheduler.lifecycle, "end_attempt", end_then_lose_the_connection)
    with pytest.raises(DatabaseError):
        scheduler.run_pass("test")
    connection.close()
    monkeypatch.setattr(scheduler.lifecycle, "end_attempt", real_end)
    assert Node.objects.get(name=node).state == "READY"  # rolled back with the rest
    assert Attempt.objects.get().state == "ADMITTED" and GpuClaim.objects.count() == 1

    result = scheduler.run_pass("test")
    assert result.lost_nodes == [node] and Job.objects.get(pk=jobs[0].pk).attempt_count == 2


@pytest.mark.django_db(transaction=True)
def test_a_statement_failing_mid_apply_rolls_the_whole_pass_back(
    bob, vision_share, fresh, no_local_messages, monkeypatch
):
    """A plan that claims one GPU twice (a policy bug or a race) hits the unique index half-way
    through applying: the attempts, claims and events already written go with it."""
    jobs = queue(bob, vision_share, 2)
    no_local_messages.clear()
    real_plan = policy.plan

    def same_gpu_twice(snapshot):
        decided = real_plan(snapshot)
        first = decided.admissions[0]
        clash = [a.__class__(**{**_fields(a), "placement": first.placement}) for a in decided.admissions]
        return decided.__class__(admissions=tuple(clash), preemptions=decided.preemptions)

    monkeypatch.setattr(scheduler.policy, "plan", same_gpu_twice)
    with pytest.raises(DatabaseError):
        scheduler.run_pass("test")
    nothing_applied(jobs)
    assert no_local_messages == []
    monkeypatch.setattr(scheduler.policy, "plan", real_plan)
    assert len(scheduler.run_pass("test").admitted) == 2


def _fields(obj) -> dict:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}
