"""Faults injected into a running cluster (real processes, PostgreSQL, a private Redis): an agent
killed with -9, the broker restarted in the middle of a burst of submits, the control worker killed in
the middle of a pass, and PostgreSQL connections dropped under a busy cluster. Whatever happens, a job
that was accepted is never lost and never runs twice at once (the invariants are checked after each)."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node
from gpunodes.services import fake_inventory, node_register, tell_agent
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, GpuClaim, Job
from jobs.services import job_submit, record_event
from quotas.models import SchedulerPass
from tests.faults.audit import check_invariants
from tests.faults.conftest import make_team, needs_stack, wait_for
from tests.faults.harness import burst, wait_settled

pytestmark = [needs_stack, pytest.mark.django_db(transaction=True)]

BURST = int(os.environ.get("GPUQUOTA_FAULT_BURST", "100"))


def state(job_id: int) -> str:
    return Job.objects.values_list("state", flat=True).get(pk=job_id)


def alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def other_connection():
    s = connection.settings_dict
    return psycopg.connect(
        host=s["HOST"] or "127.0.0.1",
        port=s["PORT"] or 5432,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=True,
    )


# --- an agent killed -9 --------------------------------------------------------------------------

# Long on n1's first attempt (so it is still running, with a child, when its agent dies); short else.
SLOW_ON_N1 = (
    'if [ "$GPUQUOTA_NODE" = n1 ] && [ "$GPUQUOTA_ATTEMPT" = 1 ]; then sleep 300 & sleep 300; '
    "else sleep 3; fi"
)


def test_a_killed_agent_loses_its_node_requeues_its_jobs_and_comes_back_ready(cluster, django_user_model):
    share, [(user, _)] = make_team(django_user_model, "t", capacity=4)
    cluster.start({"n1": 2, "n2": 2})
    jobs = [
        job_submit(
            user=user,
            share=share,
            name=f"j{i}",
            gpus=1,
            gpu_type="a10g",
            command=[SLOW_ON_N1],
            use_shell=True,
        )
        for i in range(4)
    ]
    wait_for(
        lambda: Attempt.objects.filter(state=AttemptState.RUNNING).count() == 4,
        30,
        what="4 running",
        jobs=jobs,
    )
    on_n1 = [a.job_id for a in Attempt.objects.filter(nodes__name="n1", number=1)]
    assert len(on_n1) == 2
    orphans = [e["pgid"] for e in json.loads(cluster.agent_state_file("n1").read_text())]
    assert len(orphans) == 2

    cluster.kill("agent-n1")  # kill -9: its fence watchdog kills its jobs (tests/faults/test_fencing.py)
    wait_for(lambda: Node.objects.get(name="n1").state == NodeState.LOST, 20, what="n1 LOST")
    for job_id in on_n1:
        first = Attempt.objects.get(job_id=job_id, number=1)
        assert first.outcome == Outcome.NODE_LOST and not first.claims.exists()
        assert Job.objects.get(pk=job_id).events.filter(kind=EventKind.NODE_LOST).exists()
    submitted = {j.pk: j.submitted_at for j in jobs}
    assert {j.pk: j.submitted_at for j in Job.objects.filter(pk__in=submitted)} == submitted
    check_invariants()

    cluster.start_agent("n1", 2)
    wait_for(lambda: Node.objects.get(name="n1").state == NodeState.READY, 60, what="n1 READY again")
    wait_for(lambda: not any(alive(pgid) for pgid in orphans), 15, what="the orphans killed")
    wait_settled(60)
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}
    for job_id in on_n1:
        assert Job.objects.get(pk=job_id).attempt_count == 2


# --- the broker restarted mid-burst --------------------------------------------------------------


def test_redis_restarted_mid_burst_loses_no_accepted_job(cluster, django_user_model):
    """The issue asks for 2,000 submits; BURST (100 by default, GPUQUOTA_FAULT_BURST) keeps the test
    within half a minute. Redis runs without persistence, so its restart drops every queued message:
    pass triggers, starts, reports. The beat, the heartbeats (which repeat lost reports and re-send
    lost starts) and the pass bring everything back."""
    clients = []
    for t in range(4):
        share, members = make_team(django_user_model, f"team{t}", users=5, capacity=4)
        clients += [(token, share.name) for _, token in members]
    url = cluster.start_web()
    cluster.start({f"r{i}": 4 for i in range(4)})
    restarted = threading.Event()

    def fault(done: int) -> None:
        if done >= BURST // 3 and not restarted.is_set():
            restarted.set()
            threading.Thread(target=cluster.redis.restart, kwargs={"down_s": 1.5}, daemon=True).start()

    result = burst(url, clients, BURST, on_progress=fault)
    assert restarted.is_set()
    assert result.gave_up == 0 and len(result.created) == BURST, sorted(set(result.failed))
    # 16 GPUs run the jobs one after another: about 8 a second here, fewer on a loaded machine.
    wait_settled(max(180, BURST * 0.3))
    created = set(result.created)
    in_db = dict(Job.objects.values_list("pk", "state"))
    assert created <= set(in_db), f"accepted jobs missing: {sorted(created - set(in_db))[:10]}"
    assert {in_db[pk] for pk in created} == {JobState.SUCCEEDED}
    assert set(in_db.values()) == {JobState.SUCCEEDED}  # also any created while its answer was lost
    print(
        f"\nredis restart mid-burst: {BURST} submits, {len(created)} accepted (201), {len(result.failed)} tries "
        f"refused and retried ({sorted(set(result.failed))}), {len(in_db)} jobs in the database, all SUCCEEDED, "
        f"0 lost"
    )


# --- a web worker killed mid-burst ----------------------------------------------------------------------


def _web_workers(main_pid: int) -> list[int]:
    try:
        return [int(p) for p in open(f"/proc/{main_pid}/task/{main_pid}/children").read().split()]
    except OSError:
        return []


def test_a_web_worker_killed_mid_burst_is_started_again_and_loses_no_accepted_job(cluster, django_user_model):
    """As the OOM killer would: SIGKILL one of the web server's two worker processes a third of the way
    through a burst of submits. Its connections drop (the clients retry, as a patient client does), the
    server starts a new worker (README: --respawn-failed-workers) and every 201 is a job in the database."""
    import signal

    clients = []
    for t in range(2):
        share, members = make_team(django_user_model, f"web{t}", users=4, capacity=4)
        clients += [(token, share.name) for _, token in members]
    for name in ("w1", "w2"):  # GPUs of the type must exist for a submit to be valid; nothing runs here
        node_register(name=name, gpu_type="a10g", gpus=fake_inventory(name, 4))
    cluster.start_web(workers=2, threads=4)
    main = cluster.procs["web"].pid
    wait_for(lambda: len(_web_workers(main)) == 2, 30, what="two web workers")
    killed: list[int] = []
    once = threading.Lock()

    def fault(done: int) -> None:
        with once:
            if done >= 200 // 3 and not killed:
                killed.append(_web_workers(main)[0])
                os.kill(killed[0], signal.SIGKILL)

    result = burst(cluster.web_url, clients, 200, on_progress=fault)
    assert killed
    assert result.gave_up == 0 and len(result.created) == 200, sorted(set(result.failed))
    wait_for(
        lambda: len(_web_workers(main)) == 2 and killed[0] not in _web_workers(main), 30, what="a new worker"
    )
    assert cluster.procs["web"].poll() is None  # the server itself kept running
    assert set(result.created) <= set(Job.objects.values_list("pk", flat=True))


# --- the control worker killed mid-pass ---------------------------------------------------------


def _blocked_on_job_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%%jobs_job%%FOR UPDATE%%'"
        )
        return cursor.fetchone()[0]


def test_a_control_worker_killed_mid_pass_leaves_no_half_applied_plan(cluster, django_user_model):
    share, [(user, _)] = make_team(django_user_model, "k", capacity=4)
    cluster.start({"k1": 4})
    # A node without an agent, with a job running on it, whose heartbeat is "fresh" until we say not.
    ghost, _ = node_register(name="ghost", gpu_type="a10g", gpus=fake_inventory("ghost", 1))
    # Both nodes cordoned while the stranded job is made by hand: a pass meanwhile must not admit it
    # itself (its attempt 1 would collide with ours).
    Node.objects.filter(name__in=["ghost", "k1"]).update(state=NodeState.CORDONED)
    Node.objects.filter(pk=ghost.pk).update(last_heartbeat=timezone.now() + timedelta(hours=1))
    stranded = job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["true"])
    attempt = Attempt.objects.create(
        job=stranded,
        number=1,
        state=AttemptState.RUNNING,
        placement=[{"node": "ghost", "gpus": [0]}],
        reason="ADMITTED_OWN",
        started_at=timezone.now(),
    )
    attempt.nodes.add(ghost)
    GpuClaim.objects.create(attempt=attempt, gpu=Gpu.objects.get(node=ghost))
    Job.objects.filter(pk=stranded.pk).update(state=JobState.RUNNING, attempt_count=1)
    record_event(stranded.pk, EventKind.ADMITTED, "ADMITTED_OWN on ghost", attempt_number=1)
    Node.objects.filter(name="ghost").update(state=NodeState.READY)  # k1 stays cordoned: nothing admitted
    jobs = [
        job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["true"]).pk for _ in range(3)
    ]

    # Hold the rows the pass will lock to admit these jobs, then let it run into them: it housekeeps
    # (the ghost node goes LOST, its attempt ends) and blocks in the middle of applying its plan.
    release, locked = threading.Event(), threading.Event()

    def hold_rows():
        from django.db import connection as conn

        try:
            with transaction.atomic():
                list(Job.objects.select_for_update().filter(pk__in=jobs))
                locked.set()
                release.wait(60)
        finally:
            conn.close()

    holder = threading.Thread(target=hold_rows, daemon=True)
    holder.start()
    locked.wait(10)
    # Passes before this moment (the submits asked for some) may still commit; the one that admits
    # these jobs starts after k1 is ready again, and it must leave no record.
    ready_at = timezone.now()
    with transaction.atomic():
        Node.objects.filter(name="k1").update(state=NodeState.READY)
        # As an admin's un-cordon does (services._set_node_state): k1's agent hears it is READY. A
        # heartbeat while k1 was cordoned told it CORDONED, and it would refuse every start after.
        tell_agent("k1", NodeState.READY)
        Node.objects.filter(name="ghost").update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    wait_for(lambda: _blocked_on_job_locks() >= 1, 20, what="a pass blocked mid-apply")
    cluster.kill("control")
    cluster.kill("beat")  # no new passes until we say so
    release.set()
    holder.join(10)
    wait_for(lambda: _blocked_on_job_locks() == 0, 10, what="the dead pass's backend gone")

    # Rolled back as a whole: the housekeeping as well as the admissions.
    assert Node.objects.get(name="ghost").state == NodeState.READY
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.RUNNING
    assert GpuClaim.objects.filter(attempt=attempt).count() == 1
    assert not Attempt.objects.filter(job_id__in=jobs).exists()
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {JobState.QUEUED}
    assert not SchedulerPass.objects.filter(started_at__gte=ready_at).exists()
    check_invariants()

    cluster.start_control("control-2")
    cluster.start_beat()
    wait_settled(60)
    assert Node.objects.get(name="ghost").state == NodeState.LOST
    assert Attempt.objects.get(pk=attempt.pk).outcome == Outcome.NODE_LOST
    assert set(Job.objects.values_list("state", flat=True)) == {JobState.SUCCEEDED}


# --- PostgreSQL connections dropped under a busy cluster -------------------------------------------


def test_database_connections_dropped_under_load_lose_nothing(cluster, django_user_model):
    """Every other backend of the database (the control worker's passes, heartbeats and reports) is
    terminated again and again while 60 jobs go through; each failed pass or task is followed by one
    that succeeds, and the processes survive."""
    share, [(user, _)] = make_team(django_user_model, "d", capacity=8)
    cluster.start({"d1": 4, "d2": 4})
    jobs = [
        job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["sleep", "0.3"]).pk
        for _ in range(60)
    ]
    terminated = 0
    with other_connection() as other:
        me = other.execute("SELECT pg_backend_pid()").fetchone()[0]
        connection.ensure_connection()
        mine = connection.connection.info.backend_pid
        for _ in range(10):
            time.sleep(0.7)
            rows = other.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid NOT IN (%s, %s) AND backend_type = 'client backend'",
                [me, mine],
            ).fetchall()
            terminated += len(rows)
    assert terminated > 0
    wait_settled(90)
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {JobState.SUCCEEDED}
    assert all(p.poll() is None for p in cluster.procs.values()), "a process died of a dropped connection"
    print(f"\ndropped {terminated} database connections under load: 60 jobs, all SUCCEEDED, 0 lost")
