"""The agent's durable outbox: every report about an attempt (started; checkpointed, the latest only;
finished with its exit code and how, which covers pre-empted, stopped, fenced and refused, its last
checkpoint, and the byte ranges of its log that were shipped)
is written here before it is sent, and stays until the control side acknowledges it.

Why this scheme: a message the broker took is not a message the control side applied (a Redis restart
drops what it held, the control worker may be away), and the agent cannot tell which. So the outbox is
not emptied by sending, only by an acknowledgement that the control side sends *after* it has applied
the reports: each heartbeat carries the oldest unacknowledged entries (a bounded batch), the control
worker applies them idempotently (attempt numbers: a duplicate, or a report about an attempt that is
over, changes nothing) and then puts `outbox_ack` (the entry ids it recorded) on this node's queue. A
lost heartbeat or a lost ack only means the entries ride along again with the next heartbeat; nothing
depends on how long the broker stays away, nor on the agent staying up (the file survives a restart).
The log bytes themselves are not kept here (the log file is): a finished report names the ranges that
were shipped, and the control side withholds its ack and asks for the gaps it finds (`relog`) until it
holds them all.

SQLite in WAL mode with synchronous=FULL: a report that returned from `add` survives the agent's crash
and the host's power cut. Reports are few (two per attempt, and at most one a second for its
checkpoints, each replacing the one before until it is sent), so the fsync costs nothing that matters.
`epoch` names this file: an ack meant for an earlier outbox (the state directory was wiped) removes
nothing from a new one whose ids start again.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# How many entries one heartbeat carries, oldest first (a backlog drains a batch per heartbeat).
BATCH = 200
# How long the attempts that ended on this host are remembered across agent restarts.
ENDED_KEEP_S = 7 * 86400


@dataclass(frozen=True)
class Entry:
    id: int
    name: str  # the control-side task the report is for (jobs.tasks.attempt_started, ...)
    kwargs: dict
    created: float  # time.time() when written

    def as_message(self) -> dict:
        return {
            "id": self.id,
            "name": self.name,
            "kwargs": self.kwargs,
            "age_s": round(max(0.0, time.time() - self.created), 1),
        }


class Outbox:
    def __init__(self, path: Path | str):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        # One connection, shared by the agent's threads under the lock (reports come from the reaper
        # and the worker threads, the heartbeat thread reads, acks arrive on worker threads).
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT,"
            " name TEXT NOT NULL, kwargs TEXT NOT NULL, created REAL NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        # The attempts that ended on this host, each with the time the control side admitted it (which
        # tells this attempt from one of the same id of a control side whose database was made anew): a
        # start of one of them that arrives after a restart of the agent is stale, and never runs.
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS ended (attempt_id INTEGER NOT NULL, number INTEGER NOT NULL,"
            " admitted_us INTEGER NOT NULL, at REAL NOT NULL, PRIMARY KEY (attempt_id, number))"
        )
        self._db.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('epoch', ?)", (uuid.uuid4().hex[:16],)
        )
        self.epoch: str = self._db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()[0]
        if self.path != ":memory:":
            Path(self.path).chmod(0o600)

    def add(self, name: str, kwargs: dict) -> int:
        """Write a report; once this returns it is on disk. Returns its id (ids only grow)."""
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO outbox (name, kwargs, created) VALUES (?, ?, ?)",
                (name, json.dumps(kwargs, sort_keys=True), time.time()),
            )
            return int(cur.lastrowid)

    def replace(self, old_id: int | None, name: str, kwargs: dict) -> int:
        """add(), removing the entry `old_id` in the same transaction: a report that only the latest of
        its kind matters for (an attempt's checkpoint) keeps one entry, however often it changes. An
        old entry already acknowledged (or sent and applied) is simply gone."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if old_id is not None:
                    self._db.execute("DELETE FROM outbox WHERE id = ?", (int(old_id),))
                cur = self._db.execute(
                    "INSERT INTO outbox (name, kwargs, created) VALUES (?, ?, ?)",
                    (name, json.dumps(kwargs, sort_keys=True), time.time()),
                )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            return int(cur.lastrowid)

    def pending(self, limit: int = BATCH) -> list[Entry]:
        """The oldest unacknowledged reports, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id, name, kwargs, created FROM outbox ORDER BY id LIMIT ?", (limit,)
            ).fetchall()
        return [Entry(i, n, json.loads(k), c) for i, n, k, c in rows]

    def get(self, entry_id: int) -> Entry | None:
        with self._lock:
            row = self._db.execute(
                "SELECT id, name, kwargs, created FROM outbox WHERE id = ?", (int(entry_id),)
            ).fetchone()
        return None if row is None else Entry(row[0], row[1], json.loads(row[2]), row[3])

    def ack(self, ids, epoch: str | None = None) -> int:
        """The control side recorded these entries: remove them. An ack for another epoch removes
        nothing. Returns how many were removed."""
        if epoch is not None and epoch != self.epoch:
            return 0
        ids = [int(i) for i in ids]
        if not ids:
            return 0
        with self._lock:
            cur = self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
            return cur.rowcount

    def mark_ended(self, key: tuple[int, int], admitted_us: int) -> None:
        """Remember on disk that attempt `key`, admitted at `admitted_us` (the control side's time, in
        microseconds), ended here."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO ended (attempt_id, number, admitted_us, at) VALUES (?, ?, ?, ?)",
                (int(key[0]), int(key[1]), int(admitted_us), time.time()),
            )

    def ended(self, keep_s: float = ENDED_KEEP_S) -> dict[tuple[int, int], int]:
        """{(attempt id, number): admitted_us} of the attempts that ended here in the last `keep_s`
        seconds; older ones are forgotten."""
        with self._lock:
            self._db.execute("DELETE FROM ended WHERE at < ?", (time.time() - keep_s,))
            rows = self._db.execute("SELECT attempt_id, number, admitted_us FROM ended").fetchall()
        return {(a, n): us for a, n, us in rows}

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def oldest_age_s(self) -> float | None:
        with self._lock:
            row = self._db.execute("SELECT min(created) FROM outbox").fetchone()
        return None if row[0] is None else max(0.0, time.time() - row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
