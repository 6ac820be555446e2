"""Multi-node rendezvous (issue 29): each node advertises where its peers reach it; at admission the pass
chooses one port per attempt (a fresh one each attempt, none that a live attempt with the same rank 0
holds); every rank's start carries the same rendezvous; the agent checks it and turns it into what
torchrun, DeepSpeed and Lightning read."""

from __future__ import annotations

import sys
import time

import pytest
from django.utils import timezone

from gpunodes.agent.runner import rendezvous_env
from gpunodes.agent.tasks import Invalid, validate_start
from gpunodes.dispatch import start_messages
from gpunodes.models import Node
from gpunodes.rendezvous import choose_port, port_range
from gpunodes.services import fake_inventory
from gpunodes.tasks import node_heartbeat
from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas import scheduler
from tests.gpunodes.test_runner import Reports, make_runner, wait_finished

START = "gpunodes.agent.tasks.start_attempt"


# --- the agent: the variables, and the checks of a start's rendezvous ----------------------------------


def test_every_variable_the_frameworks_read():
    meet = {
        "master_addr": "10.0.0.1",
        "master_port": 29613,
        "hosts": ["10.0.0.1", "10.0.0.2"],
        "world_size": 8,
    }
    assert rendezvous_env(rank=1, nodes=2, gpus=4, rendezvous=meet) == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29613",
        "WORLD_SIZE": "8",
        "NODE_RANK": "1",
        "NNODES": "2",
        "LOCAL_WORLD_SIZE": "4",
        "GPUS_PER_NODE": "4",
        "GPUQUOTA_HOSTS": "10.0.0.1,10.0.0.2",
    }
    assert rendezvous_env(rank=0, nodes=1, gpus=1, rendezvous=None) == {}


def test_a_job_gets_them_in_its_environment(tmp_path):
    reports = Reports()
    runner = make_runner(tmp_path, reports)
    meet = {
        "master_addr": "gpu-a.example",
        "master_port": 29500,
        "hosts": ["gpu-a.example", "10.0.0.2"],
        "world_size": 4,
    }
    code = "import os; print(*(os.environ[k] for k in ('MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'NODE_RANK', 'NNODES', 'LOCAL_WORLD_SIZE', 'GPUQUOTA_HOSTS', 'CUDA_VISIBLE_DEVICES')))"
    try:
        runner.start(
            attempt_id=1,
            number=1,
            job_id=7,
            command=[sys.executable, "-c", code],
            env={"MASTER_PORT": "1", "WORLD_SIZE": "99"},  # the job's own cannot make the ranks disagree
            gpus=[0, 1],
            rank=1,
            world=["a", "b"],
            rendezvous=meet,
        )
        assert wait_finished(runner, reports)["exit_code"] == 0
    finally:
        runner.shutdown(grace_s=1)
    text = "".join(k["text"] for k in reports.of("jobs.tasks.attempt_log"))
    assert text.split() == ["gpu-a.example", "29500", "4", "1", "2", "2", "gpu-a.example,10.0.0.2", "0,1"]


def start_message(**rendezvous):
    meet = {
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "hosts": ["10.0.0.1", "10.0.0.2"],
        "world_size": 8,
    }
    meet.update(rendezvous)
    return {
        "attempt_id": 1,
        "number": 1,
        "job_id": 1,
        "command": ["true"],
        "gpus": [0],
        "rank": 0,
        "world": ["a", "b"],
        "rendezvous": {k: v for k, v in meet.items() if v != "-"},
    }


@pytest.mark.parametrize(
    "change, why",
    [
        ({"master_addr": "10.0.0.9"}, "rank 0's"),
        ({"master_addr": "evil; rm -rf /", "hosts": ["evil; rm -rf /", "10.0.0.2"]}, "host address"),
        ({"hosts": ["10.0.0.1"]}, "2 host address"),
        ({"hosts": ["10.0.0.1", "a b"]}, "host address"),
        ({"master_port": 80}, "1024 to 65535"),
        ({"master_port": "29500"}, "1024 to 65535"),
        ({"master_port": 70000}, "1024 to 65535"),
        ({"world_size": 0}, "world_size"),
        ({"world_size": "-"}, "must have"),
        ({"extra": 1}, "must have"),
    ],
)
def test_a_start_with_a_bad_rendezvous_is_refused(change, why):
    with pytest.raises(Invalid, match=why):
        validate_start(start_message(**change))


def test_a_start_without_a_rendezvous_is_taken():
    message = start_message()
    assert validate_start(message)["rendezvous"]["master_port"] == 29500
    del message["rendezvous"]
    assert validate_start(message)["rendezvous"] is None


# --- the control side: addresses, ports, start messages ---------------------------------------------


@pytest.fixture(autouse=True)
def sent(monkeypatch, settings):
    settings.NODE_AUTO_ACCEPT = True
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    return sent


def beat(name, address):
    inv = [g.__dict__ for g in fake_inventory(name, 4)]
    return node_heartbeat(name, "a10g", inv, [], "boot-1", sent_at=time.time(), address=address)


@pytest.fixture
def advertised(db):
    beat("node-1", "10.1.0.1")
    beat("node-2", "gpu-2.cluster.example")
    Node.objects.update(last_heartbeat=timezone.now())
    return ["node-1", "node-2"]


def test_a_node_advertises_its_address_and_a_bad_one_is_refused(advertised, caplog):
    assert dict(Node.objects.values_list("name", "address")) == {
        "node-1": "10.1.0.1",
        "node-2": "gpu-2.cluster.example",
    }
    assert beat("node-1", "10.1.0.1; curl evil")["refused"]
    assert Node.objects.get(name="node-1").address == "10.1.0.1"
    assert "address must be an IP address or a host name" in caplog.text


def pass_once(capture):
    with capture(execute=True):
        return scheduler.run_pass("test")


def test_every_rank_of_a_gang_gets_the_same_rendezvous(
    advertised, bob, vision_share, sent, django_capture_on_commit_callbacks
):
    job = job_submit(user=bob, share=vision_share, gpus=8, gpu_type="a10g", command=["true"])
    pass_once(django_capture_on_commit_callbacks)
    attempt = Attempt.objects.get(job=job)
    low, high = port_range()
    assert low <= attempt.rendezvous_port <= high
    starts = {kw["kwargs"]["rank"]: kw["kwargs"] for name, kw in sent if name == START}
    assert sorted(starts) == [0, 1]
    meets = [starts[r]["rendezvous"] for r in (0, 1)]
    assert (
        meets[0]
        == meets[1]
        == {
            "master_addr": "10.1.0.1",
            "master_port": attempt.rendezvous_port,
            "hosts": ["10.1.0.1", "gpu-2.cluster.example"],
            "world_size": 8,
        }
    )
    for message in starts.values():  # what the agent takes
        validate_start({k: v for k, v in message.items() if k != "node"})
    # A lost start sent again carries the same.
    again = {m["payload"]["rank"]: m["payload"]["rendezvous"] for m in start_messages([attempt.pk])}
    assert again == {0: meets[0], 1: meets[1]}
    # And the same admission time, to the microsecond, as the database holds it (a restarted agent
    # tells a stale start of an attempt that ended on its host by it).
    stamps = {m["payload"]["admitted_us"] for m in start_messages([attempt.pk])}
    assert (
        stamps
        == {starts[0]["admitted_us"], starts[1]["admitted_us"]}
        == {round(attempt.admitted_at.timestamp() * 1_000_000)}
    )


def test_each_attempt_gets_a_fresh_port(
    settings, advertised, bob, vision_share, django_capture_on_commit_callbacks
):
    from jobs import lifecycle
    from jobs.choices import Outcome

    settings.RENDEZVOUS_PORTS = "29500-29501"
    job = job_submit(user=bob, share=vision_share, gpus=8, gpu_type="a10g", command=["true"])
    ports = []
    for number in (1, 2, 3):
        pass_once(django_capture_on_commit_callbacks)
        attempt = Attempt.objects.get(job=job, number=number)
        assert attempt.state == AttemptState.ADMITTED
        ports.append(attempt.rendezvous_port)
        lifecycle.end_attempt(attempt.pk, number, outcome=Outcome.GPU_FAILED, reason="test")
        assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert ports[0] != ports[1] != ports[2] and set(ports) <= {29500, 29501}


def test_ports_of_live_attempts_with_the_same_rank_0_are_not_reused(
    settings, advertised, bob, vision_share, django_capture_on_commit_callbacks
):
    settings.RENDEZVOUS_PORTS = "29500-29503"
    Node.objects.filter(name="node-2").delete()
    for _ in range(4):
        job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    pass_once(django_capture_on_commit_callbacks)
    assert sorted(Attempt.objects.values_list("rendezvous_port", flat=True)) == [29500, 29501, 29502, 29503]


@pytest.mark.parametrize(
    "in_use, avoid, ports, expect",
    [
        ({29500}, None, (29500, 29501), {29501}),
        (set(), 29500, (29500, 29501), {29501}),
        ({29501}, 29500, (29500, 29502), {29502}),
        ({29500, 29501}, None, (29500, 29501), {29500, 29501}),  # full: one anyway
        ({29500, 29501}, 29500, (29500, 29501), {29501}),  # full: never the previous one
    ],
)
def test_choose_port(in_use, avoid, ports, expect):
    for _ in range(20):
        assert choose_port(in_use, avoid, ports) in expect


@pytest.mark.parametrize("value", ["29500", "29500-", "80-90", "30000-29000", "a-b", "29500-70000"])
def test_a_bad_port_range_is_refused_saying_why(value):
    with pytest.raises(ValueError, match="RENDEZVOUS_PORTS"):
        port_range(value)
