"""A real partition (tests/faults/netns.py): an agent in a network namespace of its own reaches the
broker over a veth pair at a 10.213.X.0/30 address; its link goes down for 30 s, longer than
FENCE_AFTER_S + FENCE_GRACE_S and NODE_LOST_AFTER_S (set short), then comes back up. Its jobs are
fenced within FENCE_AFTER_S (+ grace), the node is LOST only later and the re-queued copies start on
the other node only then (a copy p2 refuses, its job's checkpoint directory still held by the fenced
attempt, is re-queued and never ran), no two attempts of a job overlap (the ledger), the cut-off
agent's reports reach the control side once the link is back (its outbox empties: every entry
acknowledged), and its node is READY again. The agent runs without DATABASE_URL: it needs only the
broker.

Needs root (`ip netns add`) besides PostgreSQL and redis-server; skipped, saying why, elsewhere."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt
from jobs.services import job_submit
from tests.faults import netns
from tests.faults.conftest import HAVE_REDIS, ON_POSTGRES, Cluster, PrivateRedis, make_team, wait_for
from tests.faults.harness import wait_settled
from tests.faults.ledger import Ledger
from tests.live.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

CUT_S = float(os.environ.get("GPUQUOTA_FAULT_PARTITION_S", "30"))
LOST_S, FENCE_S, GRACE_S = 20, 10, 2


@pytest.fixture
def partitionable(transactional_db, tmp_path, request, no_local_messages):
    """A cluster on a private Redis that also listens on the host side of a fresh veth pair, and the
    namespace at its other end. The namespace and the veth pair go, whatever happens."""
    if not (ON_POSTGRES and HAVE_REDIS):
        pytest.skip("needs PostgreSQL and the redis-server binary")
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    ns = netns.Netns("p")
    redis = live = None
    try:
        redis = PrivateRedis(tmp_path, also_bind=ns.host_addr)
        redis.start()
        live = Cluster(tmp_path, redis)
        yield live, ns
    finally:
        if live is not None:
            live.stop_all()
        if redis is not None:
            redis.kill()
        ns.close()
        rep = getattr(request.node, "rep_call", None)
        if live is not None and rep is not None and rep.failed:
            print(live.logs())
    assert not os.path.exists(netns.NETNS_DIR / ns.name)


def start_agent_inside(cluster: Cluster, ns: netns.Netns, name: str, gpus: int) -> subprocess.Popen:
    """An agent whose only network is the namespace's: the broker at the host side's address, and no
    database (it needs none)."""
    env = {**cluster.env, "REDIS_URL": f"redis://{ns.host_addr}:{cluster.redis.port}/0"}
    env.pop("DATABASE_URL", None)
    argv = [sys.executable, "manage.py", "gpu_agent", "--name", name, "--fake-gpus", str(gpus)]
    argv += ["--gpu-type", "a10g", *([] if os.geteuid() == 0 else ["--unsafe-run-jobs-as-agent-user"])]
    out = open(cluster.tmp / f"agent-{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        ns.argv(argv), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    cluster.procs[f"agent-{name}"] = proc  # stopped with the others
    return proc


def reaches_broker(ns: netns.Netns, port: int) -> bool:
    probe = f"import redis; print(redis.Redis(host={ns.host_addr!r}, port={port}, socket_timeout=2).ping())"
    done = subprocess.run(ns.argv([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=30)
    return done.stdout.strip() == "True"


def outbox_size(cluster: Cluster, node: str) -> int:
    db = sqlite3.connect(cluster.var / "agent" / node / "outbox.sqlite3", timeout=5)
    try:
        return db.execute("SELECT count(*) FROM outbox").fetchone()[0]
    finally:
        db.close()


def state(node: str) -> str:
    return Node.objects.get(name=node).state


def test_an_agent_cut_off_by_a_real_partition_is_fenced_before_lost_and_loses_no_report(
    partitionable, django_user_model
):
    cluster, ns = partitionable
    assert CUT_S > LOST_S > FENCE_S + GRACE_S
    cluster.env.update(
        NODE_LOST_AFTER_S=str(LOST_S),
        FENCE_AFTER_S=str(FENCE_S),
        FENCE_GRACE_S=str(GRACE_S),
        PREEMPT_ACK_TIMEOUT_S="5",
    )
    share, [(user, _)] = make_team(django_user_model, "p", capacity=4)
    assert reaches_broker(ns, cluster.redis.port), "the namespace does not reach redis at the veth address"
    cluster.start_control()
    cluster.start_beat()
    agent = start_agent_inside(cluster, ns, "p1", 2)
    wait_for(lambda: Node.objects.filter(name="p1", state=NodeState.READY).exists(), 90, what="p1 READY")
    ledger = Ledger(cluster.jobs / "ledger")
    jobs = [
        job_submit(
            user=user, share=share, gpus=1, gpu_type="a10g", command=[ledger.command()], use_shell=True
        )
        for _ in range(2)
    ]
    wait_for(
        lambda: Attempt.objects.filter(state=AttemptState.RUNNING, nodes__name="p1").count() == 2,
        60,
        every=0.25,
        what="2 running on p1",
    )
    cluster.start_agent("p2", 2)  # where the copies will run
    wait_for(lambda: Node.objects.filter(name="p2", state=NodeState.READY).exists(), 60, what="p2 READY")

    ns.cut()
    cut_at, t0 = time.time(), time.monotonic()
    try:
        wait_for(
            lambda: len(ledger.spans()) == 2 and all(s.ended for s in ledger.spans()),
            FENCE_S + GRACE_S + 10,
            every=0.1,
            what="p1's jobs fenced",
        )
        fenced_s = time.monotonic() - t0
        assert state("p1") == NodeState.READY  # fenced before the control side gives up on it
        wait_for(lambda: state("p1") == NodeState.LOST, LOST_S + 20, every=0.1, what="p1 LOST")
        lost_s, lost_at = time.monotonic() - t0, time.time()
        # A copy may be refused once or twice by p2 (its job's checkpoint directory still held while p1
        # lets go of its fenced attempt: safe, re-queued without a strike); the one that runs is later.
        wait_for(
            lambda: (
                Attempt.objects.filter(number__gte=2, nodes__name="p2", state=AttemptState.RUNNING)
                .values("job")
                .distinct()
                .count()
                == 2
            ),
            30,
            every=0.25,
            what="the copies running on p2",
            jobs=jobs,
        )
        wait_for(lambda: outbox_size(cluster, "p1") >= 2, 10, what="p1's stopped reports in its outbox")
        held = outbox_size(cluster, "p1")
        time.sleep(max(0.0, CUT_S - (time.monotonic() - t0)))
    finally:
        ns.heal()
    healed = time.monotonic()
    wait_for(lambda: state("p1") == NodeState.READY, 120, every=0.25, what="p1 READY again")
    ready_s = time.monotonic() - healed
    wait_for(lambda: outbox_size(cluster, "p1") == 0, 60, every=0.25, what="p1's outbox acknowledged")
    acked_s = time.monotonic() - healed
    assert agent.poll() is None

    ledger.release()
    wait_settled(60)
    refused = 0
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.SUCCEEDED and job.attempt_count >= 2
        outcomes = list(
            Attempt.objects.filter(job=job).order_by("number").values_list("outcome", "started_at")
        )
        assert outcomes[0][0] == Outcome.NODE_LOST and outcomes[-1][0] == Outcome.SUCCEEDED
        between = outcomes[1:-1]
        assert all(o == Outcome.REFUSED and started is None for o, started in between), outcomes
        refused += len(between)
        first, second = ledger.attempts(job.pk)  # a refused copy never ran: no span
        assert first.ended and first.end - cut_at <= FENCE_S + GRACE_S + 2  # SIGTERM: its end written
        assert second.start > first.end and second.start >= lost_at - 1  # only once LOST
    checked = ledger.assert_no_overlap()
    print(
        f"\npartition {CUT_S:.0f} s (veth down, {ns.addr} -> {ns.host_addr}): jobs fenced after "
        f"{fenced_s:.1f} s (FENCE_AFTER_S={FENCE_S}), node LOST after {lost_s:.1f} s "
        f"(NODE_LOST_AFTER_S={LOST_S}); after healing READY in {ready_s:.1f} s, its {held} held reports "
        f"acknowledged in {acked_s:.1f} s; {checked} attempts, none overlapping ({refused} copies refused by p2)"
    )
