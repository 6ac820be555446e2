"""An attempt's output on its host: what the job writes to stdout and stderr goes through a pipe that
the agent drains into the attempt's log file (0600, the agent's), capped on disk as it is on the
control side: the first half of the cap as it comes, then only the latest half. The bytes between are
punched out of the file (`fallocate(PUNCH_HOLE)`), which keeps its size and offsets, so what the
runner ships (head as it comes, the tail at the end, gaps again on request) reads the file as before.

The files are bounded per attempt (the cap), per job and per user (bound_host_logs: before an attempt
starts, the finished logs of its job, and of its owner's jobs, go oldest first past their budgets), and
by age (the runner's prune_logs); no job output is written while the disk is short (`ROOM`, set by the
agent: gpunodes/agent/disk.py), so that one member's output never takes the agent's own room.

Why a pipe and not the file as the job's stdout: a job writing gigabytes a second would fill the disk
between two looks at the file; through the pipe it can write no faster than the agent keeps the file
within its cap (the job waits on a full pipe). A job's output then depends on the agent being alive,
which its processes do anyway (the fence watchdog kills them when it dies).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import logging
import os
import select
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

log = logging.getLogger(__name__)

FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x1, 0x2
READ_BYTES = 1 << 20
# Holes are punched once this much lies between the kept head and tail: the file holds at most the
# cap plus this plus one read on disk.
PUNCH_STEP = 1 << 20
# Whether job output may still be written at a path (the agent's DiskGuard.room_for_output); None: always.
ROOM: Callable[[Path], bool] | None = None
# The file in a job's log directory that names its owner (the per-user budget).
OWNER_FILE = "owner"
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


class LogSink:
    def __init__(self, path: Path, cap_bytes: int) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self.fd).st_size
        self.head = cap_bytes // 2
        self.tail = cap_bytes - self.head
        block = os.fstat(self.fd).st_blksize or 4096
        self.block = block
        self.punched = max(self.size, -(-self.head // block) * block)  # holes start past the head
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.read_fd, fcntl.F_SETPIPE_SZ, READ_BYTES)  # fewer wake-ups for a chatty job
        self.dropped = 0  # bytes the disk refused (full): the log says so at its end
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._abandoned = False
        self._thread = threading.Thread(target=self._pump, name=f"log-{path.name}", daemon=True)
        self._can_punch = True

    def start(self) -> None:
        """After the job has its copy of the pipe's write end: drop ours (the job's end is then the
        only one, and its end means EOF) and drain."""
        os.close(self.write_fd)
        self.write_fd = -1
        self._thread.start()

    def note(self, text: str) -> None:
        """A line of the agent's own in the log (why the start failed, what was dropped)."""
        self._write(text.encode())

    def _pump(self) -> None:
        try:
            while not self._abandoned:
                ready, _, _ = select.select([self.read_fd], [], [], 0.5)
                if not ready:
                    if self._stop.is_set():
                        return  # the job's processes are gone but something holds the pipe
                    continue
                data = os.read(self.read_fd, READ_BYTES)
                if not data:
                    return
                self._write(data)
        except OSError as e:
            log.error("reading the output of %s failed: %s", self.path.name, e)
        finally:
            os.close(self.read_fd)

    def _write(self, data: bytes) -> None:
        with self._lock:
            if self.fd < 0:
                return
            if ROOM is not None and not ROOM(self.path):
                # The disk is short: the agent's own files come first; the log says what was dropped.
                if not self.dropped:
                    log.error("the disk of %s is short: its job's output is dropped", self.path)
                self.dropped += len(data)
                return
            view = memoryview(data)
            while view:
                try:
                    n = os.pwrite(self.fd, view, self.size)
                except OSError as e:
                    if not self.dropped:
                        log.error("cannot write the log %s: %s; its output is dropped", self.path, e)
                    self.dropped += len(view)
                    return
                self.size += n
                view = view[n:]
            self._punch()

    def _write_anyway(self, text: str) -> None:
        """A line of the agent's own, whatever the disk's room (one line; a failure is only logged)."""
        with self._lock:
            if self.fd < 0:
                return
            try:
                self.size += os.pwrite(self.fd, text.encode(), self.size)
            except OSError as e:
                log.error("cannot write the log %s: %s", self.path, e)

    def _punch(self) -> None:
        end = (self.size - self.tail) // self.block * self.block
        if not self._can_punch or end - self.punched < PUNCH_STEP:
            return
        mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
        if _libc.fallocate(self.fd, mode, self.punched, end - self.punched) != 0:
            err = ctypes.get_errno()
            self._can_punch = False
            level = logging.WARNING if err in (errno.EOPNOTSUPP, errno.ENOSYS) else logging.ERROR
            log.log(level, "cannot cap the log %s on disk: %s", self.path, os.strerror(err))
            return
        self.punched = end

    def finish(self, timeout: float = 2.0) -> None:
        """The attempt is over: take what is left in the pipe, then close. A pipe something still
        holds open (a process outside the attempt's cgroup) is let go after `timeout`."""
        if self.write_fd >= 0:  # never started: nothing but the agent's notes came
            os.close(self.write_fd)
            os.close(self.read_fd)
            self.write_fd = -1
        elif self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout)
            self._abandoned = True  # it stops at its next look; what it reads then is not written
        if self.dropped:
            dropped, self.dropped = self.dropped, 0
            self._write_anyway(f"\n[gpuquota: {dropped} bytes of output lost: the agent's disk was full]\n")
        with self._lock:
            os.close(self.fd)
            self.fd = -1


def _on_disk(path: Path) -> int:
    try:
        return path.lstat().st_blocks * 512  # holes punched (the cap) take no room
    except OSError:
        return 0


def _owner(job_dir: Path) -> int | None:
    try:
        return int((job_dir / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None


def _finished_logs(job_dirs: Iterable[Path], live: set[Path]) -> list[Path]:
    return [
        f
        for d in job_dirs
        if d.is_dir() and not d.is_symlink()
        for f in d.glob("attempt-*.log")
        if f not in live and not f.is_symlink()
    ]


def _trim(files: list[Path], budget: int) -> int:
    """Remove the oldest of `files` until what the rest hold on disk is within `budget`."""
    sized = sorted(((f.lstat().st_mtime, _on_disk(f), f) for f in files if f.exists()), key=lambda x: x[0])
    total, removed = sum(size for _, size, _ in sized), 0
    for _, size, f in sized:
        if total <= budget:
            break
        try:
            f.unlink()
        except OSError:
            continue
        total -= size
        removed += 1
    return removed


def bound_host_logs(
    log_dir: Path,
    *,
    job_id: int,
    user: int | None,
    live: set[Path],
    cap_bytes: int,
    per_job_bytes: int,
    per_user_bytes: int,
) -> int:
    """Before an attempt of job `job_id` (of owner `user`, where the start says) writes its log under
    `log_dir`: the finished log files of that job, then of all that owner's jobs, are removed oldest first
    until, with room for one more attempt's capped log, they hold at most `per_job_bytes` /
    `per_user_bytes` on disk (0: no bound). Their bytes went to the control side as they came; a file
    removed here only cannot fill a gap later. Returns how many were removed."""
    job_dir = log_dir / f"job-{job_id}"
    if user is not None:
        job_dir.mkdir(mode=0o700, exist_ok=True)
        if _owner(job_dir) != user:
            (job_dir / OWNER_FILE).write_text(str(user))
    removed = 0
    if per_job_bytes:
        removed += _trim(_finished_logs([job_dir], live), per_job_bytes - cap_bytes)
    if per_user_bytes and user is not None:
        mine = [d for d in log_dir.glob("job-*") if _owner(d) == user]
        removed += _trim(_finished_logs(mine, live), per_user_bytes - cap_bytes)
    return removed
