"""The what-if's replays under signed messages: the broker redelivers a replay's message when the worker
that held it is lost, maybe long after it was sent (an advice's replays wait behind each other), and a
replay run twice gives the same figures; so a repeated or old replay message runs, while a node still
cannot send one, and every other task keeps refusing repeats (tests/security/test_node_messages_bound.py)."""

import time
import types
import uuid

import pytest
from celery.app.trace import trace_task
from celery.exceptions import SecurityError

from quotas import tasks
from tests.security.signing_helpers import body, envelope, make_keys, serializer

WHATIF = "quotas.tasks.whatif_replay"
ADVICE = "quotas.tasks.advice_replay"


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return make_keys(tmp_path_factory.mktemp("keys"), ("gpu-1",))


@pytest.fixture
def signing_on(settings, tmp_path):
    settings.MESSAGE_SIGNING_KEY = str(tmp_path / "control.key")  # only "is signing on?" is read


@pytest.fixture
def parts(monkeypatch):
    """The replays the tasks ran: (module, run, index, isolated)."""
    ran = []
    monkeypatch.setattr(
        "quotas.whatif.run_part", lambda run_id, index, *, isolated: ran.append(("whatif", run_id, isolated))
    )
    monkeypatch.setattr("quotas.advice.run_part", lambda run_id, index: ran.append(("advice", run_id, None)))
    return ran


def deliver(keys, task, message, sender="control"):
    control = serializer(keys, "control")
    args, kwargs, _ = control.deserialize(serializer(keys, sender).serialize(message))
    return trace_task(task, uuid.uuid4().hex, args, kwargs, request={}, app=task.app).retval


@pytest.mark.parametrize("task, name", [(tasks.whatif_replay, WHATIF), (tasks.advice_replay, ADVICE)])
def test_a_redelivered_replay_runs_again(keys, signing_on, parts, task, name):
    message = body(name, run_id="r1", index=0)
    deliver(keys, task, message)
    deliver(keys, task, message)  # the same message, nonce and all: the broker's redelivery
    assert len(parts) == 2


@pytest.mark.parametrize("task, name", [(tasks.whatif_replay, WHATIF), (tasks.advice_replay, ADVICE)])
def test_a_replay_that_waited_in_the_queue_past_the_message_age_runs(keys, signing_on, parts, task, name):
    message = body(name, signed=envelope(name, at=time.time() - 3 * 3600), run_id="r1", index=0)
    deliver(keys, task, message)
    assert len(parts) == 1


def test_a_replay_message_from_the_future_is_still_refused(keys, signing_on, parts, caplog):
    message = body(WHATIF, signed=envelope(WHATIF, at=time.time() + 3600), run_id="r1", index=0)
    assert deliver(keys, tasks.whatif_replay, message) is None
    assert parts == [] and "future" in caplog.text


def test_a_replay_message_signed_for_another_task_is_refused(keys, signing_on, parts):
    message = body(WHATIF, signed=envelope(ADVICE), run_id="r1", index=0)
    assert deliver(keys, tasks.whatif_replay, message) is None
    assert parts == []


def test_a_node_cannot_send_a_replay(keys, signing_on, parts):
    with pytest.raises(SecurityError):
        deliver(keys, tasks.whatif_replay, body(WHATIF, run_id="r1", index=0), sender="gpu-1")
    assert parts == []


@pytest.mark.parametrize("daemon, isolated", [(True, False), (False, True)])
def test_a_whatif_replay_in_a_prefork_pool_process_runs_in_it(monkeypatch, parts, daemon, isolated):
    """A prefork pool's process is daemonic: multiprocessing refuses it a child process."""
    monkeypatch.setattr("multiprocessing.current_process", lambda: types.SimpleNamespace(daemon=daemon))
    trace_task(
        tasks.whatif_replay,
        uuid.uuid4().hex,
        (),
        {"run_id": "r1", "index": 0},
        request={},
        app=tasks.whatif_replay.app,
    )
    assert parts == [("whatif", "r1", isolated)]
