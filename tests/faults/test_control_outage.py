"""An outage of the control side is not a mass node failure (quotas/hearing.py). The control worker, or
the database, is away for much longer than NODE_LOST_AFTER_S while the agents run their jobs: when it is
back, no node is declared LOST, no job is re-queued, the passes resume, and the jobs end once, each
with its one attempt (the ledger: attempt start/end written from inside the jobs)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.db.models import F
from django.utils import timezone
from psycopg import sql

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import AttemptState, EventKind, JobState
from jobs.models import Attempt, Job, JobEvent
from jobs.services import job_submit
from quotas.models import SchedulerPass
from tests.faults.conftest import make_team, needs_stack, wait_for
from tests.faults.harness import wait_settled
from tests.faults.ledger import Ledger

pytestmark = [needs_stack, pytest.mark.django_db(transaction=True)]

LOST_AFTER_S = 8  # NODE_LOST_AFTER_S of these clusters: each outage lasts three times longer
# 24 s (GPUQUOTA_FAULT_OUTAGE_S=600 for ten minutes): what matters is that it outlasts
# NODE_LOST_AFTER_S several times over, and the suite stays within CI's 30 minutes.
OUTAGE_S = float(os.environ.get("GPUQUOTA_FAULT_OUTAGE_S", "24"))


def start_running(cluster, django_user_model, prefix: str) -> tuple[Ledger, list[Job], object]:
    share, [(user, _)] = make_team(django_user_model, prefix, capacity=4)
    cluster.env["NODE_LOST_AFTER_S"] = str(LOST_AFTER_S)
    cluster.start({f"{prefix}1": 2, f"{prefix}2": 2})
    ledger = Ledger(cluster.jobs / "ledger")
    jobs = [
        job_submit(
            user=user,
            share=share,
            gpus=1,
            gpu_type="a10g",
            command=[ledger.command(run_s=600)],
            use_shell=True,
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
    return ledger, jobs, (user, share)


def outage(seconds: float, ledger: Ledger) -> float:
    """Wait out the outage, checking that the jobs keep running on their hosts; returns its end."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        assert time.time() - ledger.last_tick() < 10, "the jobs stopped ticking during the outage"
    return time.monotonic()


def heard_long_enough_after(back: timezone.datetime) -> bool:
    """A pass after the outage that has heard the nodes for NODE_LOST_AFTER_S: from then on a node that
    the outage had made look silent would have been declared LOST."""
    return SchedulerPass.objects.filter(
        started_at__gt=back, hearing_since__lte=F("started_at") - timedelta(seconds=LOST_AFTER_S + 1)
    ).exists()


def assert_nothing_lost(jobs: list[Job]) -> None:
    assert set(Node.objects.values_list("state", flat=True)) == {NodeState.READY}
    assert not JobEvent.objects.filter(kind=EventKind.NODE_LOST).exists()
    ids = [j.pk for j in jobs]
    assert set(Job.objects.filter(pk__in=ids).values_list("attempt_count", flat=True)) == {1}
    assert set(Attempt.objects.filter(job_id__in=ids).values_list("state", flat=True)) == {
        AttemptState.RUNNING
    }


def finish(cluster, ledger: Ledger, jobs: list[Job], user_share) -> None:
    """The passes work again: a new job is admitted and runs; the old ones end once each."""
    user, share = user_share
    ledger.release()
    late = job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["true"])
    wait_settled(120)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert Job.objects.get(pk=late.pk).attempt_count == 1
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("attempt_count", flat=True)) == {1}
    spans = ledger.spans()
    assert sorted((s.job, s.attempt) for s in spans) == sorted((j.pk, 1) for j in jobs)
    assert all(s.ended for s in spans)
    ledger.assert_no_overlap()


def test_a_control_worker_down_three_times_node_lost_after_s_loses_no_node_and_requeues_nothing(
    cluster, django_user_model
):
    ledger, jobs, user_share = start_running(cluster, django_user_model, "cw")
    cluster.kill("control")  # kill -9; beat and the agents go on (their messages wait in the broker)
    outage(OUTAGE_S, ledger)
    back = timezone.now()
    cluster.start_control("control-2")
    wait_for(lambda: heard_long_enough_after(back), 90, every=0.5, what="passes hearing the nodes again")
    assert_nothing_lost(jobs)
    finish(cluster, ledger, jobs, user_share)
    print(
        f"\ncontrol worker down {OUTAGE_S:.0f} s (NODE_LOST_AFTER_S={LOST_AFTER_S}): no node LOST, 0 re-queued"
    )


def test_a_database_away_for_longer_than_node_lost_after_s_loses_no_node(cluster, django_user_model):
    """Every connection of the cluster to PostgreSQL is cut and refused for a while: heartbeats and passes
    fail meanwhile (the heartbeats are gone, not queued). The first pass back may come before a node's
    next heartbeat, and must not take the control side's deafness for the node's silence."""
    ledger, jobs, user_share = start_running(cluster, django_user_model, "db")
    seconds = OUTAGE_S
    with database_refused():
        outage(seconds, ledger)
    back = timezone.now()
    wait_for(lambda: heard_long_enough_after(back), 120, every=0.5, what="passes hearing the nodes again")
    assert_nothing_lost(jobs)
    finish(cluster, ledger, jobs, user_share)
    print(f"\ndatabase away {seconds:.0f} s (NODE_LOST_AFTER_S={LOST_AFTER_S}): no node LOST, 0 re-queued")


@contextmanager
def database_refused():
    """The test database refuses new connections and its other backends are terminated (this test's own
    connections stay), until the block ends."""
    from django.db import connection

    s = connection.settings_dict
    name = s["NAME"]
    connection.ensure_connection()
    mine = connection.connection.info.backend_pid
    # From another database: PostgreSQL refuses to close the one it is connected to.
    with psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    ) as admin:
        try:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(sql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test database's user may not refuse connections (ALTER DATABASE)")
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND pid <> %s AND backend_type = 'client backend'",
                (name, mine),
            )
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(sql.Identifier(name)))
