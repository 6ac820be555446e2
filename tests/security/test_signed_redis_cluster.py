"""A signed cluster on Redis, its agent under the documented per-node ACL user (issue 30, finding 2):
a job's env crosses the broker sealed to its node's key (the job still gets it), and a start captured
off the wire and pushed again after the agent restarted runs nothing (it re-ran another team's finished
job: the agent's memory of what it ran goes with it, the message's nonce does not). Real redis-server,
control worker, beat and agent processes."""

import base64
import hashlib
import json
import signal
import time

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import LiveCluster, wait_for
from tests.security.signing_helpers import make_keys, signing_env
from tests.security.test_broker_isolation import broker  # noqa: F401 - fixture

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SECRET = "team-b-hf-token-5517"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()
START = "gpunodes.agent.tasks.start_attempt"


def opened(raw: bytes) -> tuple[dict, str]:
    """A signed kombu message as it lies in Redis: (its headers, its body as the receiver reads it)."""
    message = json.loads(raw)
    signed = base64.b64decode(base64.b64decode(message["body"]))
    body = signed.split(b"\x00\x01", 4)[4].decode()
    return message["headers"], body


def test_a_jobs_env_crosses_the_broker_sealed_and_a_captured_start_replays_nothing(
    broker,  # noqa: F811
    tmp_path,
    django_user_model,
):
    server, admin, url = broker
    keys = make_keys(tmp_path / "keys", ("gpu-1",))
    cluster = LiveCluster(tmp_path, REDIS_URL=server.url)
    base = dict(cluster.env)
    try:
        cluster.env = {**base, **signing_env(keys, "control")}
        cluster.start_control_plane()
        agent_env = {**base, **signing_env(keys, "gpu-1"), "REDIS_URL": url("gpu-1")}
        cluster.env = agent_env
        cluster.start_agent("gpu-1", 1)
        wait_for(lambda: Node.objects.filter(name="gpu-1", state=NodeState.READY).exists(), 90, what="READY")
        cluster.kill("agent-gpu-1", signal.SIGTERM)  # away: its start waits on its queue, to be read

        team = Team.objects.create(name="b", slug="b")
        user = django_user_model.objects.create_user("b", password="pw-123456")
        Membership.objects.create(team=team, user=user, role=Role.MEMBER)
        share = Share.objects.create(team=team, name="b")
        ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=1)
        job = job_submit(
            user=user,
            share=share,
            gpus=1,
            gpu_type="a10g",
            # The job checks it got the env, without the command holding the secret.
            command=["sh", "-c", f'test "$(printf %s "$HF_TOKEN" | sha256sum | cut -c1-64)" = {DIGEST}'],
            env={"HF_TOKEN": SECRET},
        )
        starts = wait_for(
            lambda: [r for r in admin.lrange("node.gpu-1", 0, -1) if opened(r)[0]["task"] == START],
            60,
            what="the start on gpu-1's queue",
        )
        captured = starts[0]

        cluster.start_agent("gpu-1", 1)
        wait_for(
            lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, 90, what="the job to succeed"
        )
        # The agent's memory of what it ran goes with it; the captured start is pushed again.
        boot = Node.objects.get(name="gpu-1").boot_id
        cluster.kill("agent-gpu-1", signal.SIGTERM)
        cluster.start_agent("gpu-1", 1)
        wait_for(lambda: Node.objects.get(name="gpu-1").boot_id != boot, 90, what="the restarted agent")
        admin.lpush("node.gpu-1", captured)
        agent_log = tmp_path / "agent-gpu-1.log"
        wait_for(lambda: "repeated message" in agent_log.read_text(errors="replace"), 60, what="the refusal")
        time.sleep(3)  # a start that ran would have been reported by now
        assert "which is over" not in (tmp_path / "control.log").read_text(errors="replace")
        assert Job.objects.get(pk=job.pk).attempt_count == 1

        # The env never crossed the broker in clear: not in the body, not in the (unsigned) headers.
        headers, body = opened(captured)
        assert SECRET not in body and SECRET not in json.dumps(headers)
        assert isinstance(json.loads(body)[1]["env"], str)
    finally:
        cluster.stop_all()
