"""Signed control messages (issue 18), with real keys and Celery's own signing: an agent accepts only
what the control side signed; the control side accepts a node's report only when the node speaks for
itself; unsigned or forged messages are refused."""

import pytest
from celery.exceptions import SecurityError
from kombu.serialization import dumps, loads, registry

from gpunodes import signing
from tests.security.signing_helpers import body


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """control, gpu-1 and gpu-2 (accepted), and rogue (never accepted)."""
    keys = tmp_path_factory.mktemp("keys")
    control_trust, agent_trust = keys / "control-trusts", keys / "agent-trusts"
    control_trust.mkdir()
    agent_trust.mkdir()
    for name in ("control", "gpu-1", "gpu-2", "rogue"):
        signing.make_credentials(name, keys)
    for name in ("control", "gpu-1", "gpu-2"):
        (control_trust / f"{name}.pem").write_bytes((keys / f"{name}.pem").read_bytes())
    (agent_trust / "control.pem").write_bytes((keys / "control.pem").read_bytes())

    def serializer(name, trusting):
        return signing.make_serializer(str(keys / f"{name}.key"), str(keys / f"{name}.pem"), str(trusting))

    return {
        "control": serializer("control", control_trust),
        "agent": {n: serializer(n, agent_trust) for n in ("gpu-1", "gpu-2", "rogue")},
        "keys": keys,
    }


FINISHED, HEARTBEAT, LOG = (
    "jobs.tasks.attempt_finished",
    "gpunodes.tasks.node_heartbeat",
    "jobs.tasks.attempt_log",
)
START = body(
    "gpunodes.agent.tasks.start_attempt", node="gpu-1", attempt_id=1, number=1, job_id=7, command=["true"]
)


def test_an_agent_accepts_a_start_the_control_side_signed(pki):
    signed = pki["control"].serialize(START)
    assert pki["agent"]["gpu-1"].deserialize(signed)[1]["job_id"] == 7


def test_an_agent_refuses_a_start_signed_by_another_node(pki):
    forged = pki["agent"]["gpu-2"].serialize(START)  # gpu-2 writes to gpu-1's queue
    with pytest.raises(SecurityError):
        pki["agent"]["gpu-1"].deserialize(forged)


def test_an_unsigned_or_tampered_message_is_refused(pki):
    with pytest.raises(SecurityError):
        pki["agent"]["gpu-1"].deserialize(b"eyJub3QiOiAic2lnbmVkIn0=")
    signed = pki["control"].serialize(START)
    payload = pki["control"]._unpack(signed)
    tampered = pki["control"]._pack(
        payload["body"].replace(b'"true"', b'"sh"'),
        payload["content_type"],
        payload["content_encoding"],
        signer=payload["signer"],
        signature=payload["signature"],
    )
    with pytest.raises(SecurityError):
        pki["agent"]["gpu-1"].deserialize(tampered)


def test_the_control_side_accepts_a_nodes_report_about_itself(pki):
    report = body(FINISHED, attempt_id=1, number=1, node="gpu-1", how="exited", exit_code=0)
    assert pki["control"].deserialize(pki["agent"]["gpu-1"].serialize(report))[1]["node"] == "gpu-1"
    beat = body(HEARTBEAT, name="gpu-1", gpu_type="a10g", inventory=[], running=[], boot_id="x")
    assert pki["control"].deserialize(pki["agent"]["gpu-1"].serialize(beat))[1]["name"] == "gpu-1"


@pytest.mark.parametrize(
    "forged",
    [
        body(
            FINISHED, attempt_id=1, number=1, node="gpu-2", how="exited", exit_code=137
        ),  # a report as gpu-2
        body(HEARTBEAT, name="evil", gpu_type="a10g", inventory=[], running=[], boot_id="x"),  # as evil
        body(LOG, attempt_id=1, number=1, offset=0, text="forged line"),  # speaking for nobody
    ],
)
def test_a_node_cannot_speak_for_another_node(pki, forged):
    with pytest.raises(SecurityError, match="speaks for"):
        pki["control"].deserialize(pki["agent"]["gpu-1"].serialize(forged))


def test_a_node_that_was_never_accepted_is_refused(pki):
    report = body(FINISHED, attempt_id=1, number=1, node="rogue", how="exited", exit_code=0)
    with pytest.raises(SecurityError, match="unknown certificate"):
        pki["control"].deserialize(pki["agent"]["rogue"].serialize(report))


def test_it_works_through_kombus_serializer_registry(pki, request):
    """What Celery does with CELERY_TASK_SERIALIZER / ACCEPT_CONTENT set to the signed serializer."""
    keys = pki["keys"]
    signing.register(str(keys / "control.key"), str(keys / "control.pem"), str(keys / "control-trusts"))
    request.addfinalizer(lambda: registry.unregister(signing.SERIALIZER))
    content_type, encoding, data = dumps(
        body(FINISHED, node="gpu-1", attempt_id=1), serializer=signing.SERIALIZER
    )
    assert loads(data, content_type, encoding, accept=[content_type])[1]["attempt_id"] == 1
    # A plain JSON message, where only signed ones are accepted: refused by kombu itself.
    from kombu.exceptions import ContentDisallowed

    content_type, encoding, data = dumps(body(FINISHED, node="gpu-1"), serializer="json")
    with pytest.raises(ContentDisallowed):
        loads(data, content_type, encoding, accept=["application/x-gpuquota-auth"])


def test_the_key_is_private(pki):
    import stat

    assert stat.S_IMODE((pki["keys"] / "gpu-1.key").stat().st_mode) == 0o600
