"""A node-signed message is bound whole (issue 30, finding 1): only the few tasks a node may send, no
positional args, no callbacks, errbacks, chains or chords, its task name, issue time and a nonce inside
what is signed (a message delivered under another task name, stale, from the future or seen before is
refused by the task that receives it). Each refusal is logged with its sender and cause."""

import logging
import time
import uuid

import pytest
from celery.app.trace import trace_task
from celery.exceptions import SecurityError

from gpunodes.choices import NodeState
from gpunodes.models import Node
from gpunodes.tasks import node_heartbeat
from tests.security.signing_helpers import body, envelope, make_keys, serializer

HEARTBEAT = "gpunodes.tasks.node_heartbeat"
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
CHECKPOINT = "jobs.tasks.attempt_checkpoint"
LOG = "jobs.tasks.attempt_log"
START = "gpunodes.agent.tasks.start_attempt"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """gpu-1 and pend are trusted by the control side (pend only asked to join), rogue is not."""
    return make_keys(tmp_path_factory.mktemp("keys"), ("gpu-1", "pend"), ("rogue",))


@pytest.fixture(scope="module")
def control(keys):
    return serializer(keys, "control")


def sent_by(keys, name, message):
    return serializer(keys, name).serialize(message)


def beat(name, **kw):
    inventory = [{"index": 0, "uuid": f"GPU-{name}-0", "model": "NVIDIA A10G", "memory_mb": 1}]
    return {"gpu_type": "a10g", "inventory": inventory, "running": [], "boot_id": "b", **kw, "name": name}


# --- what the deserializer refuses ---------------------------------------------------------------


def test_a_heartbeat_naming_another_node_in_positional_args_is_refused(keys, control):
    """The forged heartbeat of the finding: sa1's name positionally, the signer's own as `node`."""
    forged = body(HEARTBEAT, "gpu-1", "a10g", [], [], "99999999999999-x", node="pend")
    with pytest.raises(SecurityError, match="positional"):
        control.deserialize(sent_by(keys, "pend", forged))


def test_positional_args_are_refused_even_with_the_senders_own_name(keys, control):
    with pytest.raises(SecurityError, match="positional"):
        control.deserialize(sent_by(keys, "gpu-1", body(STARTED, 1, 1, node="gpu-1")))


def test_a_checkpoint_report_about_another_node_is_refused(keys, control):
    """gpu-1 may not move the safe point of an attempt by speaking as pend."""
    forged = body(CHECKPOINT, attempt_id=1, number=1, node="pend", at=1.5e9, count=1)
    with pytest.raises(SecurityError, match="speaks for"):
        control.deserialize(sent_by(keys, "gpu-1", forged))


def test_a_heartbeat_speaks_for_its_name_not_its_node_keyword(keys, control):
    forged = body(HEARTBEAT, **beat("pend"), node="gpu-1")  # signed by gpu-1, registers pend
    with pytest.raises(SecurityError, match="speaks for"):
        control.deserialize(sent_by(keys, "gpu-1", forged))


CALLBACK = {
    "task": "jobs.tasks.attempt_log",
    "args": [],
    "kwargs": {"attempt_id": 1, "number": 1, "node": "gpu-2", "offset": 0, "text": "injected"},
    "options": {},
    "subtask_type": None,
    "immutable": True,
}


@pytest.mark.parametrize(
    "embed",
    [{"callbacks": [CALLBACK]}, {"errbacks": [CALLBACK]}, {"chain": [CALLBACK]}, {"chord": CALLBACK}],
    ids=["link", "link_error", "chain", "chord"],
)
def test_a_node_message_with_a_callback_is_refused(keys, control, embed):
    """A correctly bound heartbeat with `link=` made the control worker publish the callback signed as
    control (a log line injected, a start on another host)."""
    with pytest.raises(SecurityError, match="callback"):
        control.deserialize(sent_by(keys, "gpu-1", body(HEARTBEAT, embed=embed, **beat("gpu-1"))))


def test_a_node_message_that_overrides_the_request_is_refused(keys, control):
    """Extra embed keys become attributes of the task's request (is_eager, delivery_info...)."""
    with pytest.raises(SecurityError, match="callback"):
        control.deserialize(
            sent_by(keys, "gpu-1", body(HEARTBEAT, embed={"is_eager": True}, **beat("gpu-1")))
        )


@pytest.mark.parametrize(
    "task, kwargs",
    [
        (START, {"node": "gpu-1", "attempt_id": 1, "number": 1, "job_id": 1, "command": ["id"]}),
        ("gpunodes.agent.tasks.outbox_ack", {"node": "gpu-1", "epoch": "e", "ids": [1]}),
        ("quotas.tasks.run_pass", {"node": "gpu-1"}),
        ("celery.chain", {"node": "gpu-1"}),
    ],
)
def test_a_node_may_send_only_its_own_few_tasks(keys, control, task, kwargs):
    with pytest.raises(SecurityError, match="may not send"):
        control.deserialize(sent_by(keys, "gpu-1", body(task, **kwargs)))


def test_a_node_message_without_its_envelope_is_refused(keys, control):
    bare = [[], {"attempt_id": 1, "number": 1, "node": "gpu-1"}, {}]
    with pytest.raises(SecurityError, match="envelope"):
        control.deserialize(sent_by(keys, "gpu-1", bare))


def test_a_never_accepted_key_is_refused(keys, control):
    with pytest.raises(SecurityError, match="certificate"):
        control.deserialize(sent_by(keys, "rogue", body(HEARTBEAT, **beat("rogue"))))


@pytest.mark.parametrize(
    "task, kwargs",
    [
        (HEARTBEAT, beat("gpu-1")),
        (
            HEARTBEAT,
            beat(
                "gpu-1",
                address="10.0.0.7",
                unhealthy=[{"index": 0, "reason": "xid", "detail": "critical Xid 79", "at": 1.0}],
                rechecked=[[0, 1]],
            ),
        ),
        (STARTED, {"attempt_id": 1, "number": 1, "node": "gpu-1"}),
        (FINISHED, {"attempt_id": 1, "number": 1, "node": "gpu-1", "how": "gpu_failed", "exit_code": -9}),
        (FINISHED, {"attempt_id": 1, "number": 1, "node": "gpu-1", "how": "exited", "exit_code": 0}),
        (
            FINISHED,
            {"attempt_id": 1, "number": 1, "node": "gpu-1", "how": "stopped", "checkpoint_at": 1.5e9},
        ),
        (CHECKPOINT, {"attempt_id": 1, "number": 1, "node": "gpu-1", "at": 1.5e9, "count": 3}),
        (LOG, {"attempt_id": 1, "number": 1, "node": "gpu-1", "offset": 0, "text": "hello\n"}),
    ],
)
def test_what_a_node_sends_about_itself_is_accepted(keys, control, task, kwargs):
    args, received, embed = control.deserialize(sent_by(keys, "gpu-1", body(task, **kwargs)))
    assert args == [] and received["_signed"]["task"] == task and not any(embed.values())


def test_the_control_side_may_send_anything(keys):
    """Control-signed messages are the control side's own (beat, the web, the worker)."""
    message = body(START, embed={"callbacks": [CALLBACK]}, node="gpu-1", attempt_id=1)
    agent = serializer(keys, "gpu-1")
    assert agent.deserialize(sent_by(keys, "control", message))[1]["attempt_id"] == 1


# --- what the receiving task refuses: name, age, repeats ---------------------------------------------


@pytest.fixture
def signing_on(settings, tmp_path):
    settings.MESSAGE_SIGNING_KEY = str(tmp_path / "control.key")  # only "is signing on?" is read
    settings.NODE_AUTO_ACCEPT = True


def deliver(keys, control, task, message, sender="gpu-1"):
    """What a worker does with a message: decode (verify) it, then run the task its header names."""
    args, kwargs, _ = control.deserialize(sent_by(keys, sender, message))
    return trace_task(task, uuid.uuid4().hex, args, kwargs, request={}, app=task.app).retval


def test_a_message_delivered_under_another_task_name_is_refused(db, keys, control, signing_on, caplog):
    """The task name travels in the (unsigned) headers: a body signed as a log chunk (which also
    carries a heartbeat's fields), delivered as a heartbeat, must not run as one."""
    message = body(HEARTBEAT, signed=envelope(LOG), **beat("gpu-1"), node="gpu-1")
    with caplog.at_level(logging.WARNING):
        assert deliver(keys, control, node_heartbeat, message) is None
    assert not Node.objects.exists()
    assert "gpu-1" in caplog.text and LOG in caplog.text


def test_a_repeated_message_is_refused(db, keys, control, signing_on, caplog):
    """A captured heartbeat replayed (it kept a dead node READY while work piled up on it)."""
    message = body(HEARTBEAT, **beat("gpu-1"))
    assert deliver(keys, control, node_heartbeat, message)["state"] == NodeState.READY
    before = Node.objects.get(name="gpu-1").last_heartbeat
    with caplog.at_level(logging.WARNING):
        assert deliver(keys, control, node_heartbeat, message) is None
    assert Node.objects.get(name="gpu-1").last_heartbeat == before
    assert "repeated message" in caplog.text and "gpu-1" in caplog.text


@pytest.mark.parametrize("offset_s, cause", [(-3600, "stale"), (3600, "future")])
def test_a_stale_or_future_message_is_refused(db, keys, control, signing_on, caplog, offset_s, cause):
    message = body(HEARTBEAT, signed=envelope(HEARTBEAT, at=time.time() + offset_s), **beat("gpu-1"))
    with caplog.at_level(logging.WARNING):
        assert deliver(keys, control, node_heartbeat, message) is None
    assert not Node.objects.exists() and cause in caplog.text


def test_a_refusal_is_logged_once_per_sender_and_cause(db, keys, control, signing_on, caplog):
    message = body(HEARTBEAT, **beat("gpu-1"))
    deliver(keys, control, node_heartbeat, message)
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            deliver(keys, control, node_heartbeat, message)
    lines = [r for r in caplog.records if "repeated message" in r.getMessage()]
    assert len(lines) == 1 and "gpu-1" in lines[0].getMessage()
