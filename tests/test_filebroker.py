"""The embedded file-system broker (config/filebroker.py): atomic puts, exactly one getter per message,
undecodable messages skipped, and a soak of several putting and getting processes."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from kombu import Connection

from config.filebroker import Transport

SOAK_MESSAGES = int(os.environ.get("GPUQUOTA_BROKER_SOAK", "20000"))


def connection(root: Path) -> Connection:
    return Connection(
        "filesystem://",
        transport=Transport,
        transport_options={
            "data_folder_in": str(root / "queue"),
            "data_folder_out": str(root / "queue"),
            "control_folder": str(root / "control"),
        },
    )


@pytest.fixture
def broker(tmp_path):
    (tmp_path / "queue").mkdir()
    (tmp_path / "control").mkdir()
    # kombu remembers declared bindings per process; each test has a folder of its own.
    Transport.global_state.clear()
    return tmp_path


def test_the_settings_select_our_transport_for_the_embedded_broker():
    if settings.REDIS_URL:
        pytest.skip("REDIS_URL is set: the broker is Redis")
    assert settings.CELERY_BROKER_TRANSPORT == "config.filebroker:Transport"


def test_a_message_put_is_got_once_and_in_order(broker):
    with connection(broker) as conn:
        q = conn.SimpleQueue("control")
        for i in range(5):
            q.put({"i": i})
        got = []
        for _ in range(5):
            m = q.get(timeout=2)
            got.append(m.payload["i"])
            m.ack()
        assert got == [0, 1, 2, 3, 4]
        assert q.qsize() == 0


def test_a_message_is_not_in_the_queue_folder_before_it_is_complete(broker, monkeypatch):
    """While the payload is being encoded and written, a getter listing the queue folder must not see
    the message (kombu's own transport creates the file first: an empty message, JSONDecodeError)."""
    module = sys.modules[Transport.Channel.__module__]
    seen_while_writing = []

    def encoding(text):
        seen_while_writing.extend(os.listdir(broker / "queue"))
        return text.encode()

    monkeypatch.setattr(module, "str_to_bytes", encoding)
    with connection(broker) as conn:
        conn.SimpleQueue("control").put({"x": 1})
    assert seen_while_writing == []
    assert len(os.listdir(broker / "queue")) == 1


def test_an_undecodable_message_is_skipped_with_a_log_line(broker, caplog):
    with connection(broker) as conn:
        q = conn.SimpleQueue("control")
        (broker / "queue" / "00000000000000000001_empty.control.msg").write_bytes(b"")
        (broker / "queue" / "00000000000000000002_junk.control.msg").write_bytes(b"{not json")
        q.put({"ok": True})
        with caplog.at_level(logging.ERROR, logger="config.filebroker"):
            m = q.get(timeout=2)
        assert m.payload == {"ok": True}
        m.ack()
    assert sum("undecodable" in r.getMessage() for r in caplog.records) == 2
    assert sorted(os.listdir(broker / "bad")) == [
        "00000000000000000001_empty.control.msg",
        "00000000000000000002_junk.control.msg",
    ]


def _putter(root: str, first: int, count: int) -> None:
    with connection(Path(root)) as conn:
        q = conn.SimpleQueue("soak")
        for i in range(first, first + count):
            q.put({"i": i})


def _getter(root: str, out: str, done) -> None:
    got = []
    with connection(Path(root)) as conn:
        q = conn.SimpleQueue("soak")
        while True:
            try:
                m = q.get(timeout=0.5)
            except q.Empty:
                if done.is_set():
                    break
                continue
            got.append(m.payload["i"])
            m.ack()
    Path(out).write_text("\n".join(map(str, got)))


def test_four_putters_and_two_getters_lose_and_duplicate_nothing(broker, tmp_path):
    ctx = multiprocessing.get_context("fork")
    done = ctx.Event()
    putters_n, getters_n = 4, 2
    per = SOAK_MESSAGES // putters_n
    getters = [
        ctx.Process(target=_getter, args=(str(broker), str(tmp_path / f"got-{g}"), done))
        for g in range(getters_n)
    ]
    putters = [ctx.Process(target=_putter, args=(str(broker), p * per, per)) for p in range(putters_n)]
    started = time.monotonic()
    for p in getters + putters:
        p.start()
    for p in putters:
        p.join(timeout=300)
        assert p.exitcode == 0
    done.set()
    for g in getters:
        g.join(timeout=120)
        assert g.exitcode == 0, "a getter crashed"
    elapsed = time.monotonic() - started
    got = [int(x) for g in range(getters_n) for x in (tmp_path / f"got-{g}").read_text().split()]
    assert len(got) == len(set(got)), "a message was delivered twice"
    assert sorted(got) == list(range(putters_n * per)), "a message was lost"
    assert not list((broker / "queue").iterdir())
    assert not (broker / "bad").exists() or not list((broker / "bad").iterdir())
    print(f"{len(got)} messages through 4 putters and 2 getters in {elapsed:.1f} s")
