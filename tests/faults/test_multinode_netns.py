"""A gang over two whole nodes whose agents live in network namespaces of their own (issue 29): each
reaches the broker through its own veth pair to the host, and the two reach each other only over a link
between the namespaces, at the addresses they advertise (--advertise-address). The job is
examples/allreduce.py: it finds its peer with the variables gpuquota sets (MASTER_ADDR, MASTER_PORT,
NODE_RANK, NNODES), and nothing else. Both ranks connect and all-reduce; an in-share pre-emption stops
both, each with a checkpoint of the same step; the next attempt gets a fresh port and the same ranks on
the same nodes, resumes from that step on both, and finishes with the right result. Each node keeps its
own checkpoints (CHECKPOINT_ROOT per agent, as on separate hosts).

Needs root (`ip netns add`), PostgreSQL and redis-server; skipped, saying why, elsewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import AttemptState, EventKind, JobState, Outcome
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from quotas.models import Share
from tests.faults import netns
from tests.faults.conftest import HAVE_REDIS, ON_POSTGRES, Cluster, PrivateRedis, make_team, wait_for
from tests.live.conftest import ROOT
from tests.security.agent_helpers import job_python

pytestmark = pytest.mark.django_db(transaction=True)

NODES = ("mn-a", "mn-b")  # rank 0 and rank 1: the engine places a gang on nodes in name order
STEPS, STEP_S, EVERY = 40, 0.25, 2


@pytest.fixture
def two_hosts(transactional_db, tmp_path, request, no_local_messages):
    """A cluster on a private Redis that listens on the host side of two namespaces' veth pairs, the two
    namespaces, and a link between them. All of it goes, whatever happens."""
    if not (ON_POSTGRES and HAVE_REDIS):
        pytest.skip("needs PostgreSQL and the redis-server binary")
    ok, why = netns.available()
    if not ok:
        pytest.skip(why)
    made: list = []
    redis = live = None
    try:
        a = netns.Netns("a")
        made.append(a)
        b = netns.Netns("b")
        made.append(b)
        link = netns.Link(a, b)
        made.append(link)
        redis = PrivateRedis(tmp_path, also_bind=[a.host_addr, b.host_addr])
        redis.start()
        live = Cluster(tmp_path, redis)
        yield live, a, b, link
    finally:
        if live is not None:
            live.stop_all()
        if redis is not None:
            redis.kill()
        for thing in reversed(made):
            thing.close()
        rep = getattr(request.node, "rep_call", None)
        if live is not None and rep is not None and rep.failed:
            print(live.logs())
    for ns in made[:2]:
        assert not os.path.exists(netns.NETNS_DIR / ns.name)


def start_agent_inside(cluster: Cluster, ns: netns.Netns, name: str, gpus: int, address: str) -> None:
    """An agent whose network is the namespace's: the broker at its host side, its peers over the link
    (the address it advertises); its own checkpoints, as on a host of its own; no database."""
    checkpoints = cluster.jobs / f"checkpoints-{name}"
    env = {
        **cluster.env,
        "REDIS_URL": f"redis://{ns.host_addr}:{cluster.redis.port}/0",
        "CHECKPOINT_ROOT": str(checkpoints),
    }
    env.pop("DATABASE_URL", None)
    argv = [sys.executable, "manage.py", "gpu_agent", "--name", name, "--fake-gpus", str(gpus)]
    argv += ["--gpu-type", "a10g", "--advertise-address", address]
    argv += [] if os.geteuid() == 0 else ["--unsafe-run-jobs-as-agent-user"]
    out = open(cluster.tmp / f"agent-{name}.log", "ab")  # noqa: SIM115 - closed with the process
    cluster.procs[f"agent-{name}"] = subprocess.Popen(
        ns.argv(argv), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )


def output(attempt: Attempt, node: str) -> str:
    chunks = LogChunk.objects.filter(attempt=attempt, node=node).order_by("offset")
    return "".join(chunks.values_list("text", flat=True))


def lines(attempt: Attempt, pattern: str) -> dict[str, re.Match]:
    """{node: the first line of its output matching `pattern`} for the nodes that printed one."""
    found = {}
    for node in NODES:
        m = re.search(pattern, output(attempt, node), re.MULTILINE)
        if m:
            found[node] = m
    return found


def on_every_rank(
    attempt: Attempt, pattern: str, what: str, job: Job, timeout: float = 30
) -> dict[str, re.Match]:
    """lines() once every rank has printed one: an attempt is over with its first rank's end, and the
    other rank's last lines are shipped when its own process has ended, a moment later."""
    wait_for(
        lambda: set(lines(attempt, pattern)) == set(NODES),
        timeout,
        what=what,
        jobs=[job],
        saw=lambda: {n: output(attempt, n)[-300:] for n in NODES},
    )
    return lines(attempt, pattern)


def test_a_two_node_gang_meets_by_the_variables_alone_and_resumes_after_a_preemption(
    two_hosts, django_user_model
):
    cluster, a, b, link = two_hosts
    share, [(user, _)] = make_team(django_user_model, "mn", capacity=4)
    Share.objects.filter(pk=share.pk).update(in_share_preemption=True)
    cluster.start_control()
    cluster.start_beat()
    start_agent_inside(cluster, a, NODES[0], 2, link.a_addr)
    start_agent_inside(cluster, b, NODES[1], 2, link.b_addr)
    wait_for(
        lambda: Node.objects.filter(name__in=NODES, state=NodeState.READY).count() == 2,
        90,
        what="2 READY nodes",
    )
    assert dict(Node.objects.values_list("name", "address")) == {NODES[0]: link.a_addr, NODES[1]: link.b_addr}
    program = cluster.program("allreduce.py")
    command = [job_python(), program, "--steps", str(STEPS), "--step-seconds", str(STEP_S)]
    job = job_submit(
        user=user,
        share=share,
        name="gang",
        gpus=4,
        gpu_type="a10g",
        command=[*command, "--checkpoint-every", str(EVERY)],
    )

    # --- attempt 1: both ranks meet and train ------------------------------------------------------
    wait_for(
        lambda: Attempt.objects.filter(job=job, number=1, state=AttemptState.RUNNING).exists(),
        60,
        what="the gang running",
        jobs=[job],
    )
    first = Attempt.objects.get(job=job, number=1)
    assert [p["node"] for p in first.placement] == list(NODES)
    wait_for(lambda: len(lines(first, r"step 10/")) == 2, 60, what="both ranks at step 10", jobs=[job])
    met = lines(first, r"rank (\d)/2: connected through (\S+):(\d+)")
    assert {n: m.group(1) for n, m in met.items()} == {NODES[0]: "0", NODES[1]: "1"}
    assert {(m.group(2), int(m.group(3))) for m in met.values()} == {(link.a_addr, first.rendezvous_port)}

    # --- an in-share pre-emption: a higher-priority 1-GPU job of the same share --------------------
    urgent = job_submit(
        user=user, share=share, name="urgent", gpus=1, gpu_type="a10g", command=["sleep", "2"], priority=10
    )
    wait_for(
        lambda: Attempt.objects.filter(pk=first.pk, state=AttemptState.ENDED).exists(),
        60,
        what="the gang pre-empted",
        jobs=[job, urgent],
    )
    first.refresh_from_db()
    assert first.outcome == Outcome.PREEMPTED, first.end_reason
    stop_line = r"stopping at step (\d+) \(SIGTERM\), checkpoint saved"
    stopped = on_every_rank(first, stop_line, "both ranks' 'stopping at step' lines", job)
    [stop_step] = {int(m.group(1)) for m in stopped.values()}  # the same step on both ranks
    assert Job.objects.get(pk=job.pk).events.filter(kind=EventKind.PREEMPTED).exists()

    # --- attempt 2: a fresh port, the same ranks, resumed from the step both saved ---------------
    wait_for(
        lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, 120, what="the gang done", jobs=[job]
    )
    second = Attempt.objects.get(job=job, number=2)
    assert second.rendezvous_port != first.rendezvous_port
    assert [p["node"] for p in second.placement] == list(NODES)
    met2 = lines(second, r"rank (\d)/2: connected through (\S+):(\d+)")
    assert {n: m.group(1) for n, m in met2.items()} == {NODES[0]: "0", NODES[1]: "1"}
    assert {(m.group(2), int(m.group(3))) for m in met2.values()} == {(link.a_addr, second.rendezvous_port)}
    resumed = lines(second, r"resumed from step (\d+)")
    assert {n: int(m.group(1)) for n, m in resumed.items()} == dict.fromkeys(NODES, stop_step)
    on_every_rank(
        second, r"done: (\d+) steps, every parameter (\d+) as expected", "both ranks' 'done' lines", job
    )
    assert Job.objects.get(pk=urgent.pk).state == JobState.SUCCEEDED
    print(
        f"\n2-node gang over {link.a_addr} <-> {link.b_addr}: attempt 1 port {first.rendezvous_port}, "
        f"pre-empted at step {stop_step} on both ranks; attempt 2 port {second.rendezvous_port}, resumed at "
        f"step {stop_step}, {STEPS} steps, result as expected on both"
    )
