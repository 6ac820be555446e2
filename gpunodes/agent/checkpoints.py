"""Checkpoint reports with no code change in the job: the agent sees a job save its state into its
checkpoint directory (`GPUQUOTA_CHECKPOINT_DIR`) and reports when, so that the control side knows each
running attempt's safe point (SEMANTICS "Checkpoints and safe points").

How it sees a checkpoint: a cheap poll from the reaper thread, every `scan_s` per attempt, of the
directory's files (lstat only, never opened; at most MAX_DEPTH levels and MAX_ENTRIES entries; through
directory descriptors opened O_NOFOLLOW, so a job that swaps a directory for a symlink sends the walk
nowhere else). A file that appeared or changed since the attempt started counts once it has not been
written for `settle_s` (its mtime that old): a file renamed into place is whole at once, one written in
place is counted only when its writer has stopped. The checkpoint's time is the newest such mtime, the
moment its writing ended. Names of files on their way (`*.tmp`, `*.part`, `*~`, hidden files...) are
never a checkpoint. At the attempt's end (its processes gone, nothing is being written any more) a last
scan counts what changed without waiting.

Why a poll and not inotify (IN_CLOSE_WRITE / IN_MOVED_TO): checkpoints often live on shared storage
(NFS, Lustre: CHECKPOINT_ROOT, README), where inotify sees no remote writes; a job's directory has
subdirectories (`step-100/model.pt`), which inotify watches one by one, with a watch limit per user and
events lost on overflow; and IN_CLOSE_WRITE fires for each close of a file written in several opens.
The report goes with the next heartbeat anyway (HEARTBEAT_INTERVAL_S, 5 s), so a scan a second costs
nothing in latency: tens of microseconds for a directory of a few files.

Or a job says it explicitly: `gpuquota checkpoint` (or any write of the file MARKER in the directory:
`touch "$GPUQUOTA_CHECKPOINT_DIR/.gpuquota-checkpoint"`; its mtime is the moment).
Once the marker is there, only the marker counts for that job (its other files are not guessed at):
a job that writes its checkpoint in several steps says when it is whole.

A directory of more than MAX_ENTRIES entries is not walked (said once in the log): only the marker
counts for it. Files the job rewrites all the time (a log, a progress file) keep a directory from ever
settling: keep them elsewhere, or use the marker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

MARKER = ".gpuquota-checkpoint"
# Files on their way to being a checkpoint (written, then renamed into place): never one themselves.
IN_PROGRESS_SUFFIXES = (
    ".tmp",
    ".temp",
    ".part",
    ".partial",
    ".incomplete",
    ".inprogress",
    ".lock",
    "~",
    ".swp",
)
MAX_ENTRIES = 2000
MAX_DEPTH = 4
DEFAULT_SCAN_S = 1.0
DEFAULT_SETTLE_S = 2.0

Signature = tuple[int, int]  # (mtime in ns, size)
Report = Callable[[Hashable, float, int], None]  # (attempt key, checkpoint time, checkpoints seen)


def in_progress(name: str) -> bool:
    """A name that says the file is not finished (or not a checkpoint): temporary, hidden, a lock."""
    return name.startswith(".") or name.endswith(IN_PROGRESS_SUFFIXES)


class TooMany(Exception):
    """The directory holds more than MAX_ENTRIES entries."""


def scan(path: Path | str) -> dict[str, Signature]:
    """{relative path: (mtime_ns, size)} of the regular files under `path` (the marker included, other
    hidden or temporary names left out), at most MAX_DEPTH deep. {} if the directory is not there.
    Raises TooMany past MAX_ENTRIES entries."""
    out: dict[str, Signature] = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return out
    seen = [0]
    try:
        _walk(fd, "", 0, out, seen)
    finally:
        os.close(fd)
    return out


def _walk(fd: int, prefix: str, depth: int, out: dict[str, Signature], seen: list[int]) -> None:
    with os.scandir(fd) as entries:
        for entry in entries:
            seen[0] += 1
            if seen[0] > MAX_ENTRIES:
                raise TooMany
            name = entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone since it was listed
            if stat.S_ISREG(st.st_mode):
                if (name == MARKER and not prefix) or not in_progress(name):
                    out[prefix + name] = (st.st_mtime_ns, st.st_size)
            elif stat.S_ISDIR(st.st_mode) and depth + 1 < MAX_DEPTH and not in_progress(name):
                try:
                    sub = os.open(
                        name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                    )
                except OSError:
                    continue
                try:
                    _walk(sub, f"{prefix}{name}/", depth + 1, out, seen)
                finally:
                    os.close(sub)


@dataclass
class Watch:
    """One attempt's checkpoint directory: what was there when it started, and what it saved since."""

    path: Path
    started: float  # epoch seconds
    known: dict[str, Signature] = field(default_factory=dict)  # files accounted for (start, or counted)
    latest: float | None = None  # the latest checkpoint counted, epoch seconds
    count: int = 0
    next_scan: float = 0.0  # monotonic
    too_many: bool = False

    def look(self, *, now: float, settle_s: float, final: bool = False) -> float | None:
        """Scan; the time of a new checkpoint if one is counted now, else None."""
        try:
            files = scan(self.path)
        except TooMany:
            if not self.too_many:
                log.warning(
                    "%s holds more than %d entries: only its %s marker counts as a checkpoint",
                    self.path,
                    MAX_ENTRIES,
                    MARKER,
                )
                self.too_many = True
            files = {}
            marker = _marker(self.path)
            if marker is not None:
                files[MARKER] = marker
        if MARKER in files:  # the job says when it saved: only the marker counts
            changed = {MARKER: files[MARKER]} if files[MARKER] != self.known.get(MARKER) else {}
            settled = True
        else:
            changed = {name: sig for name, sig in files.items() if self.known.get(name) != sig}
            newest = max((sig[0] for sig in changed.values()), default=0) / 1e9
            settled = final or now - newest >= settle_s
        if not changed or not settled:
            return None
        self.known = files
        at = min(now, max(self.started, max(sig[0] for sig in changed.values()) / 1e9))
        if self.latest is not None and at <= self.latest:
            return None
        self.latest = at
        self.count += 1
        return at


def _marker(path: Path) -> Signature | None:
    try:
        st = os.lstat(Path(path) / MARKER)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size) if stat.S_ISREG(st.st_mode) else None


class CheckpointWatcher:
    """The checkpoint directories of a host's running attempts. The runner calls `begin` when an attempt
    starts (what is there then is the previous attempts'), `poll` from its reaper, and `end` when the
    attempt is over (a last scan); each new checkpoint goes to `report`."""

    def __init__(
        self,
        report: Report,
        *,
        scan_s: float = DEFAULT_SCAN_S,
        settle_s: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.report = report
        self.scan_s = scan_s
        self.settle_s = settle_s
        self.clock = clock
        self._lock = threading.Lock()
        self._watches: dict[Hashable, Watch] = {}

    def begin(self, key: Hashable, path: Path | str) -> None:
        try:
            known = scan(path)
        except TooMany:
            known = {}
            marker = _marker(Path(path))
            if marker is not None:
                known[MARKER] = marker
        watch = Watch(Path(path), started=self.clock(), known=known, next_scan=time.monotonic() + self.scan_s)
        with self._lock:
            self._watches[key] = watch

    def poll(self) -> None:
        """Scan the directories that are due; report what was saved since."""
        now_mono = time.monotonic()
        with self._lock:
            due = [(k, w) for k, w in self._watches.items() if w.next_scan <= now_mono]
        for key, watch in due:
            watch.next_scan = now_mono + self.scan_s
            try:
                at = watch.look(now=self.clock(), settle_s=self.settle_s)
            except OSError as e:
                log.warning("cannot look at %s: %s", watch.path, e)
                continue
            if at is not None:
                self.report(key, at, watch.count)

    def end(self, key: Hashable) -> tuple[float | None, int]:
        """The attempt is over (its processes are gone): a last scan, then (latest checkpoint, how many)."""
        with self._lock:
            watch = self._watches.pop(key, None)
        if watch is None:
            return None, 0
        with contextlib.suppress(OSError):
            watch.look(now=self.clock(), settle_s=self.settle_s, final=True)
        return watch.latest, watch.count

    def watching(self) -> list[Hashable]:
        with self._lock:
            return list(self._watches)
