"""Signed control messages end to end (issue 18): a control worker, beat and an agent, each with its own
key, run a job to success over the file broker; an unsigned heartbeat, and one signed by a node the
control side never accepted, register nothing. Real processes."""

import shutil
import time

import pytest
from kombu.serialization import registry

from gpunodes import signing
from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import cluster, wait_for  # noqa: F401 - fixture

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def signing_env(keys, name, trusted):
    return {
        "MESSAGE_SIGNING_KEY": str(keys / f"{name}.key"),
        "MESSAGE_SIGNING_CERT": str(keys / f"{name}.pem"),
        "MESSAGE_TRUSTED_CERTS": str(keys / trusted),
    }


def heartbeat(name):
    inventory = [{"index": 0, "uuid": f"GPU-{name}-0", "model": "NVIDIA A10G", "memory_mb": 1}]
    return {
        "name": name,
        "gpu_type": "a10g",
        "inventory": inventory,
        "running": [],
        "boot_id": "00000000000001-x",
    }


def test_a_signed_cluster_runs_jobs_and_refuses_unsigned_or_unknown_senders(
    cluster,  # noqa: F811 - the live cluster fixture, imported above
    django_user_model,
    tmp_path,
):
    from config.celery import CONTROL_QUEUE, app

    keys = tmp_path / "keys"
    for name in ("control", "s1", "rogue"):
        signing.make_credentials(name, keys)
    (keys / "control-trusts").mkdir()
    (keys / "agent-trusts").mkdir()
    for name in ("control", "s1"):
        shutil.copy(keys / f"{name}.pem", keys / "control-trusts")
    shutil.copy(keys / "control.pem", keys / "agent-trusts")

    base = dict(cluster.env)
    cluster.env = {**base, **signing_env(keys, "control", "control-trusts")}
    cluster.start_control_plane()
    cluster.env = {**base, **signing_env(keys, "s1", "agent-trusts")}
    cluster.start_agent("s1", 2)
    cluster.env = base
    wait_for(lambda: Node.objects.filter(name="s1", state=NodeState.READY).exists(), 60, what="s1 READY")

    team = Team.objects.create(name="t", slug="t")
    user = django_user_model.objects.create_user("u", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="s")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=2)
    job = job_submit(user=user, share=share, name="signed", gpus=1, gpu_type="a10g", command=["true"])
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, 60, what="the job to succeed")

    # Forgeries on the control queue: plain JSON, then signed by a key the control side does not trust.
    # (type(app).send_task: the security suite's fixtures record what goes through app.send_task.)
    send = type(app).send_task
    send(app, "gpunodes.tasks.node_heartbeat", kwargs=heartbeat("evil-json"), queue=CONTROL_QUEUE)
    signing.register(str(keys / "rogue.key"), str(keys / "rogue.pem"), str(keys / "agent-trusts"))
    try:
        send(
            app,
            "gpunodes.tasks.node_heartbeat",
            kwargs=heartbeat("rogue"),
            queue=CONTROL_QUEUE,
            serializer=signing.SERIALIZER,
        )
    finally:
        registry.unregister(signing.SERIALIZER)
    time.sleep(4)
    assert not Node.objects.filter(name__in=["evil-json", "rogue"]).exists()
    log = (cluster.tmp / "control.log").read_text(errors="replace")
    assert "Refusing to deserialize untrusted content of type json" in log  # the unsigned one, logged
    assert "unknown certificate (b'node:rogue" in log  # the one from a node never accepted, logged
