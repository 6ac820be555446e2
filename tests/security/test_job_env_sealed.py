"""A job's `env` is never in clear in a message another node could read (issue 30, finding 2): with
signed messages the control side seals a start's env to the target node's certificate key (AES-GCM
under a data key wrapped with RSA-OAEP), and only that node's agent opens it. Without signing (the
embedded file broker, one user) it stays a plain mapping."""

import base64
import hashlib
import json
import logging

import pytest
from kombu.serialization import registry

from gpunodes import dispatch, signing
from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.runner import FINISHED
from tests.security.agent_helpers import make_runner, wait_until
from tests.security.signing_helpers import make_keys, serializer, signing_env

SECRET = "hf-secret-value-0042"
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()
PAYLOAD = {
    "attempt_id": 5,
    "number": 1,
    "job_id": 9,
    # The job checks it got the env, without the command holding the secret.
    "command": ["sh", "-c", f'test "$(printf %s "$HF_TOKEN" | sha256sum | cut -c1-64)" = {DIGEST}'],
    "env": {"HF_TOKEN": SECRET},
    "use_shell": False,
    "gpus": [0],
    "max_runtime_s": None,
    "grace_s": 1,
    "rank": 0,
    "world": ["n1"],
}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"), ("n1", "n2"))


@pytest.fixture
def become(settings, keys):
    """Make this process `name`'s: its key, certificate and trust directory, registered."""

    def as_(name):
        env = signing_env(keys, name)
        settings.MESSAGE_SIGNING_KEY = env["MESSAGE_SIGNING_KEY"]
        settings.MESSAGE_SIGNING_CERT = env["MESSAGE_SIGNING_CERT"]
        settings.MESSAGE_TRUSTED_CERTS = env["MESSAGE_TRUSTED_CERTS"]
        signing.register(
            *(env[k] for k in ("MESSAGE_SIGNING_KEY", "MESSAGE_SIGNING_CERT", "MESSAGE_TRUSTED_CERTS"))
        )

    yield as_
    registry.unregister(signing.SERIALIZER)


def sent_start(no_messages) -> dict:
    (kwargs,) = [kw["kwargs"] for name, kw in no_messages if name == dispatch.START]
    return kwargs


@pytest.fixture
def agent(tmp_path, reports, monkeypatch):
    runner = make_runner(tmp_path, reports)
    runner.gpu_indexes = {0}
    monkeypatch.setattr(agent_tasks, "RUNNER", runner)
    yield runner
    runner.shutdown(grace_s=0)


def test_the_control_side_seals_a_starts_env_to_its_node(become, keys, no_messages):
    become("control")
    dispatch.start_attempt("n1", dict(PAYLOAD))
    kwargs = sent_start(no_messages)
    assert isinstance(kwargs["env"], str) and SECRET not in json.dumps(kwargs)
    # Nor anywhere in the signed message as it lies on the broker.
    wire = serializer(keys, "control").serialize([[], kwargs, {}])
    assert SECRET.encode() not in base64.b64decode(wire)


def test_only_the_target_nodes_agent_opens_it(become, no_messages, agent, reports):
    become("control")
    dispatch.start_attempt("n1", dict(PAYLOAD))
    kwargs = sent_start(no_messages)
    become("n1")
    assert agent_tasks.start_attempt.run(**kwargs) == "started"
    wait_until(lambda: reports.finished(5), runner=agent, what="the job to end")
    assert reports.finished(5)["exit_code"] == 0  # the job saw its env


def test_another_node_cannot_open_it(become, no_messages, agent, caplog):
    become("control")
    dispatch.start_attempt("n2", {**PAYLOAD, "world": ["n2"]})
    kwargs = {**sent_start(no_messages), "node": "n1"}  # n2's start, moved to n1's queue
    become("n1")
    with caplog.at_level(logging.ERROR):
        assert agent_tasks.start_attempt.run(**kwargs) == "refused"
    assert agent.running() == [] and "env" in caplog.text


def test_without_signing_the_env_stays_a_mapping(settings, no_messages):
    settings.MESSAGE_SIGNING_KEY = ""
    dispatch.start_attempt("n1", dict(PAYLOAD))
    assert sent_start(no_messages)["env"] == {"HF_TOKEN": SECRET}


def test_a_sealed_env_of_another_attempt_is_refused(become, no_messages, agent, reports, caplog):
    become("control")
    dispatch.start_attempt("n1", dict(PAYLOAD))
    kwargs = {**sent_start(no_messages), "attempt_id": 6}
    become("n1")
    with caplog.at_level(logging.ERROR):
        assert agent_tasks.start_attempt.run(**kwargs) == "refused"
    assert reports.of(FINISHED) == [] and agent.running() == []
