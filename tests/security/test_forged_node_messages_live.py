"""Issue 30, finding 1, through a real broker with signing on (a control worker, beat and an agent,
each with its own key): a heartbeat signed by a node that was never accepted, naming another node in
its positional args, changes nothing (it marked another team's running job SUCCEEDED and, with a
far-future boot id, made every real heartbeat of that node be ignored); a node's own, correctly bound
heartbeat with a `link=` callback gets nothing published (it had the control worker sign and send the
callback); a far-future boot id from the node itself does not pin it; a replayed heartbeat is refused.
Every refusal is in the control worker's log with the sender and the cause."""

import time

import pytest
from kombu.serialization import registry

from gpunodes import signing
from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import cluster, wait_for  # noqa: F401 - fixture
from tests.security.signing_helpers import envelope, make_keys, signing_env

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

HEARTBEAT = "gpunodes.tasks.node_heartbeat"


def send_as(keys, name, task, **options):
    """Publish as node `name` would: signed with its key (the test process registers it for the call)."""
    from config.celery import CONTROL_QUEUE, app

    signing.register(str(keys / f"{name}.key"), str(keys / f"{name}.pem"), str(keys / "agent-trusts"))
    try:
        # type(app).send_task: the suite's fixtures may record what goes through app.send_task.
        type(app).send_task(app, task, queue=CONTROL_QUEUE, serializer=signing.SERIALIZER, **options)
    finally:
        registry.unregister(signing.SERIALIZER)


def inventory(name):
    return [
        {"index": i, "uuid": f"GPU-fake-{name}-{i}", "model": "NVIDIA A10G", "memory_mb": 23028}
        for i in (0, 1)
    ]


def control_log(cluster):  # noqa: F811
    return (cluster.tmp / "control.log").read_text(errors="replace")


def test_forged_and_callback_carrying_node_messages_change_nothing(cluster, django_user_model, tmp_path):  # noqa: F811
    keys = make_keys(tmp_path / "keys", ("s1", "pend"))
    base = dict(cluster.env)
    cluster.env = {**base, **signing_env(keys, "control")}
    cluster.start_control_plane()
    cluster.env = {**base, **signing_env(keys, "s1")}
    cluster.start_agent("s1", 2)
    cluster.env = base
    wait_for(lambda: Node.objects.filter(name="s1", state=NodeState.READY).exists(), 90, what="s1 READY")
    Node.objects.create(
        name="pend", gpu_type="a10g", state=NodeState.PENDING
    )  # asked to join, never accepted

    team = Team.objects.create(name="victims", slug="victims")
    user = django_user_model.objects.create_user("v", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="v")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=2)
    job = job_submit(user=user, share=share, name="long", gpus=1, gpu_type="a10g", command=["sleep", "300"])
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 90, what="the job to run")
    attempt = Attempt.objects.get(job=job)
    boot = Node.objects.get(name="s1").boot_id

    # (a) signed by pend: s1's name positionally, a forged success of s1's job, a far-future boot id.
    forged_end = {
        "attempt_id": attempt.pk,
        "number": attempt.number,
        "node": "s1",
        "how": "exited",
        "exit_code": 0,
    }
    send_as(
        keys,
        "pend",
        HEARTBEAT,
        args=["s1", "a10g", inventory("s1"), [], "99999999999999-forged"],
        kwargs={"node": "pend", "finished": [forged_end], "_signed": envelope(HEARTBEAT)},
    )
    # (b) s1's own, correctly bound heartbeat, with a callback that injects a line into the job's log.
    from config.celery import app

    callback = app.signature(
        "jobs.tasks.attempt_log",
        kwargs={
            "attempt_id": attempt.pk,
            "number": attempt.number,
            "node": "s1",
            "offset": 10**9,
            "text": "INJECTED\n",
        },
        immutable=True,
    )
    now = time.time()
    own = {
        "name": "s1",
        "gpu_type": "a10g",
        "inventory": inventory("s1"),
        "running": [[attempt.pk, attempt.number]],
        "boot_id": boot,
        "sent_at": now,
    }
    send_as(keys, "s1", HEARTBEAT, kwargs={**own, "_signed": envelope(HEARTBEAT)}, link=callback)
    # (c) the same signed heartbeat twice: the second is a replay.
    replayed = {**own, "_signed": envelope(HEARTBEAT)}
    send_as(keys, "s1", HEARTBEAT, kwargs=replayed)
    send_as(keys, "s1", HEARTBEAT, kwargs=replayed)

    wait_for(lambda: "repeated message" in control_log(cluster), 60, what="the replay to be refused")
    time.sleep(3)  # the agent heartbeats on (every second); anything the forgeries did would show by now
    log = control_log(cluster)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING  # no forged success
    assert not LogChunk.objects.filter(text__contains="INJECTED").exists()  # no callback ran
    node = Node.objects.get(name="s1")
    assert node.state == NodeState.READY and node.boot_id == boot  # not pinned by a forged boot id
    assert "pend" in log and "positional" in log
    assert "s1" in log and "callback" in log

    # (d) s1's own key, a far-future boot id: its agent's next real heartbeat is not taken for late.
    # Dated 2 s ahead (within MESSAGE_CLOCK_SKEW_S), so that no heartbeat of the agent's in flight is newer.
    far = {**own, "boot_id": "99999999999999-x", "sent_at": time.time() + 2}
    send_as(keys, "s1", HEARTBEAT, kwargs={**far, "_signed": envelope(HEARTBEAT)})
    wait_for(
        lambda: Node.objects.get(name="s1").boot_id == "99999999999999-x", 30, what="the far-future boot id"
    )
    wait_for(
        lambda: Node.objects.get(name="s1").boot_id == boot, 30, what="the agent's next heartbeat to apply"
    )
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
