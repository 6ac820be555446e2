"""The embedded broker: kombu's file-system transport, made safe for several processes and quick.

kombu's own transport (kombu/transport/filesystem.py) creates a message file and only then locks and
writes it, while a getter moves and reads any `*.msg` without a lock: a getter can read an empty or
half-written file, and the JSONDecodeError kills the worker (celery/kombu#1551). It also moves a taken
message to the system's temporary folder, which is a copy, not a rename, when that folder is another
file system (two getters can then both deliver it), and it sleeps a whole second whenever a queue is
empty or the worker's prefetch is full, so the control queue moved about one message a second.

Here:
- a put writes under a temporary name in `incoming/` and renames it into the queue folder: a getter
  sees a complete message or none;
- a get renames the message into `taking/` (the same file system): of two getters, exactly one wins;
- a message that cannot be decoded is moved to `bad/` with a log line, and the worker goes on;
- one directory listing serves every queue of the process for a moment (20k queued messages are not
  listed 20k times), and an empty poll waits `POLLING_INTERVAL_S`, not a second.

Selected by settings.CELERY_BROKER_TRANSPORT when REDIS_URL is unset.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from pathlib import Path
from queue import Empty

from kombu.exceptions import ChannelError
from kombu.transport import filesystem, virtual
from kombu.utils.encoding import bytes_to_str, str_to_bytes
from kombu.utils.json import dumps, loads

log = logging.getLogger(__name__)

# How long an empty poll sleeps. Each process lists one small folder this often while idle.
POLLING_INTERVAL_S = 0.05
# A listing of the queue folder is reused this long before an empty queue lists the folder again.
LISTING_TTL_S = 0.02


def message_name(queue: str) -> str:
    # Wall-clock nanoseconds, zero-padded: names sort in put order across processes.
    return f"{time.time_ns():020d}_{uuid.uuid4().hex}.{queue}.msg"


def queue_of(filename: str) -> str | None:
    """The queue a message file belongs to (`<stamp>_<id>.<queue>.msg`), or None for other files."""
    stem, dot, rest = filename.partition(".")
    if not dot or not rest.endswith(".msg"):
        return None
    return rest[: -len(".msg")]


class Channel(filesystem.Channel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pending: dict[str, deque[str]] = {}
        self._listed_at = 0.0

    def _sibling(self, name: str) -> Path:
        # Next to the queue folder, so that renames stay on one file system.
        folder = Path(self.data_folder_in).parent / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _put(self, queue, payload, **kwargs):
        name = message_name(queue)
        incoming = self._sibling("incoming") / name
        try:
            with open(incoming, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(incoming, Path(self.data_folder_out) / name)
        except OSError as exc:
            raise ChannelError(f"Cannot add message {name!r} to the queue folder") from exc

    def _list(self) -> None:
        pending: dict[str, deque[str]] = {}
        for filename in sorted(os.listdir(self.data_folder_in)):
            q = queue_of(filename)
            if q is not None:
                pending.setdefault(q, deque()).append(filename)
        self._pending = pending
        self._listed_at = time.monotonic()

    def _get(self, queue):
        for _ in range(2):
            waiting = self._pending.get(queue)
            if not waiting:
                if time.monotonic() - self._listed_at < LISTING_TTL_S:
                    raise Empty()
                self._list()
                waiting = self._pending.get(queue)
            while waiting:
                message = self._take(waiting.popleft())
                if message is not None:
                    return message
        raise Empty()

    def _take(self, filename: str):
        """Claim one message file by renaming it; None when another getter had it first or it is
        undecodable (then it is set aside in bad/ with a log line)."""
        taken = self._sibling("taking") / filename
        try:
            os.rename(os.path.join(self.data_folder_in, filename), taken)
        except FileNotFoundError:
            return None
        try:
            payload = taken.read_bytes()
        except OSError as exc:
            raise ChannelError(f"Cannot read message {filename!r}") from exc
        try:
            message = loads(bytes_to_str(payload))
            if not isinstance(message, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            bad = self._sibling("bad") / filename
            os.replace(taken, bad)
            log.error(
                "skipped an undecodable broker message (%d bytes, %s): kept as %s", len(payload), exc, bad
            )
            return None
        if self.store_processed:
            os.replace(taken, self._sibling("processed") / filename)
        else:
            taken.unlink(missing_ok=True)
        return message

    def _size(self, queue):
        return sum(1 for f in os.listdir(self.data_folder_in) if queue_of(f) == queue)

    def _purge(self, queue):
        count = 0
        for filename in os.listdir(self.data_folder_in):
            if queue_of(filename) == queue:
                try:
                    os.remove(os.path.join(self.data_folder_in, filename))
                    count += 1
                except FileNotFoundError:
                    pass
        self._pending.pop(queue, None)
        return count


class Transport(filesystem.Transport):
    Channel = Channel
    polling_interval = POLLING_INTERVAL_S
    global_state = virtual.BrokerState()

    @property
    def default_connection_params(self):
        # No host: the broker is a folder (kombu warns on every connection that it defaults to localhost).
        return {"port": self.default_port, "hostname": ""}
