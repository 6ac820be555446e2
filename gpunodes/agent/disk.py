"""The agent's room on its own disks (issue 41 item 3): a member filled the agent's state disk (through
its checkpoint directory, or its output alone), every control message then failed to record its nonce,
and every start and stop failed. What holds now:

- the agent keeps a reserve file on its state disk (`AGENT_DISK_RESERVE_BYTES`), and gives it back the
  moment the disk runs short, so that its own small files (the outbox, the nonces, the state file) still
  have room while the disk is full of someone else's bytes; it takes it again once there is room;
- below `AGENT_MIN_FREE_BYTES` free (the reserve not counted) on the disk of its state or of the job
  logs it writes, it refuses starts (the control side re-queues the job: no strike), says so once at
  ERROR (an alert, with how much is free and where), and writes no more job output there (the log says
  how many bytes were dropped) until there is room again.

Stops never depend on the disk: a stop whose nonce cannot be recorded runs anyway (gpunodes/signing.py).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

log = logging.getLogger(__name__)
MiB = 1 << 20


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path` (a job's share of it)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def words(n: int) -> str:
    return f"{n / MiB:.1f} MiB"


class DiskGuard:
    """`paths`: the agent's own directories (its state directory first: the reserve lies there; the job
    log directory); each filesystem is looked at once."""

    def __init__(self, paths: list[Path], *, min_free_bytes: int, reserve_bytes: int = 0) -> None:
        self.paths = [Path(p) for p in paths]
        self.min_free_bytes = max(0, int(min_free_bytes))
        self.reserve_bytes = max(0, int(reserve_bytes))
        self.reserve = self.paths[0] / "disk-reserve" if self.paths else None
        self._lock = threading.Lock()
        self._alerted = False

    def _distinct(self) -> list[Path]:
        seen, out = set(), []
        for p in self.paths:
            try:
                dev = os.stat(p).st_dev
            except OSError:
                continue
            if dev not in seen:
                seen.add(dev)
                out.append(p)
        return out

    def short(self) -> str:
        """Why starts are refused now (a disk of the agent's below AGENT_MIN_FREE_BYTES), or ""."""
        if not self.min_free_bytes:
            return ""
        for path in self._distinct():
            try:
                free = free_bytes(path)
            except OSError:
                continue
            if free < self.min_free_bytes:
                return (
                    f"the agent's disk at {path} has {words(free)} free, below AGENT_MIN_FREE_BYTES "
                    f"({words(self.min_free_bytes)})"
                )
        return ""

    def check(self) -> str:
        """Called every second or so: give the reserve back while short (and alert, once), take it again
        once there is room for it and the threshold. Returns short()."""
        why = self.short()
        with self._lock:
            if why:
                released = self._release()
                if not self._alerted:
                    self._alerted = True
                    log.error(
                        "disk short: %s; starts are refused and job output there is dropped until there is "
                        "room%s",
                        why,
                        f" (gave back its {words(released)} reserve for its own files)" if released else "",
                    )
                return why
            if self._alerted:
                self._alerted = False
                log.warning("disk room again: starts are taken again")
            self._take()
        return ""

    def _release(self) -> int:
        if self.reserve is None:
            return 0
        try:
            size = self.reserve.stat().st_size
            self.reserve.unlink()
        except OSError:
            return 0
        return size

    def _take(self) -> None:
        """(Re)create the reserve, only with room for it above the threshold."""
        if not self.reserve_bytes or self.reserve is None or not self.reserve.parent.is_dir():
            return
        try:
            if self.reserve.exists() and self.reserve.stat().st_size >= self.reserve_bytes:
                return
            if free_bytes(self.reserve.parent) < self.min_free_bytes + self.reserve_bytes:
                return
            fd = os.open(self.reserve, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)
            finally:
                os.close(fd)
        except OSError as e:
            log.warning("cannot keep a disk reserve at %s: %s", self.reserve, e)
            self.reserve.unlink(missing_ok=True)

    def room_for_output(self, path: Path) -> bool:
        """Whether job output may still be written at `path` (its filesystem not short)."""
        if not self.min_free_bytes:
            return True
        try:
            return free_bytes(path) >= self.min_free_bytes
        except OSError:
            return True
