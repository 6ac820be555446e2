"""Who an attempt runs as, and where: its own uid and a private working directory.

A root agent gives every attempt a uid of its own from a configured range (`--uid-range`, setting
`JOB_UID_RANGE`), handed out round-robin so a uid is reused as late as possible. The uid has no
account: the job runs with that uid and gid and no supplementary groups, so it cannot read another
attempt's `/proc/PID/environ`, signal its processes, or open its files; the state directory, the logs
and the agent itself (root) are out of its reach. A private working directory (0700, the job's uid) is
its HOME, TMPDIR and cwd, under `JOB_ROOT`, outside the checkout and the state directory; it is
removed at the end of the attempt. Checkpoints live in `CHECKPOINT_ROOT/job-<id>` (0700), handed to
the uid of each new attempt, so they follow the job across attempts.

Paths built from message fields are checked here: ints are ints, and every path resolves inside its
root without following a symlink.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import pwd
import shutil
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_NO_NEW_PRIVS = 38
# Below this, uids belong to real accounts on common distributions.
MIN_JOB_UID = 10_000


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int

    @property
    def name(self) -> str:
        return f"gpuquota-{self.uid}"

    def env(self, home: Path) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name, "HOME": str(home), "TMPDIR": str(home)}


def default_lock_dir() -> Path:
    return Path("/run/gpuquota/uids") if os.access("/run", os.W_OK) else Path("/var/tmp/gpuquota-uids")


class UidPool:
    """The range of uids attempts run as. Refuses a range that holds root, a low (system or human)
    uid, or a uid with an account on this host.

    A uid is taken host-wide, not only in this agent: an exclusive lock on `<lock_dir>/<uid>` is held
    while an attempt runs as it (released by the kernel if the agent dies), and a uid that still has
    processes is skipped. So agents on one host (the demo, the tests) never share a uid, even with the
    same range."""

    def __init__(self, first: int, last: int, lock_dir: Path | None = None) -> None:
        if not (MIN_JOB_UID <= first <= last < 2**32 - 1):
            raise ValueError(f"--uid-range must lie within {MIN_JOB_UID}-{2**32 - 2}, got {first}-{last}")
        taken = [p.pw_name for p in pwd.getpwall() if first <= p.pw_uid <= last]
        if taken:
            raise ValueError(f"--uid-range {first}-{last} holds existing accounts: {', '.join(taken[:5])}")
        self.first, self.last = first, last
        self.lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
        self._next = first
        self._used: set[int] = set()
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, text: str) -> UidPool:
        try:
            first, last = (int(x) for x in text.split("-", 1))
        except ValueError:
            raise ValueError(f"--uid-range must be FIRST-LAST, got {text!r}") from None
        return cls(first, last)

    def acquire(self) -> JobUser:
        from gpunodes.agent.containment import pids_of_uid

        with self._lock:
            ensure_root(self.lock_dir, 0o700)
            size = self.last - self.first + 1
            for _ in range(min(size, 10_000)):
                uid = self._next
                self._next = self.first + (uid + 1 - self.first) % size
                if uid in self._used:
                    continue
                fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)  # another agent on this host runs an attempt as it
                    continue
                if pids_of_uid(uid):
                    os.close(fd)  # left over from an agent that died: not until it is cleaned up
                    continue
                self._used.add(uid)
                self._held[uid] = fd
                return JobUser(uid, uid)
        raise RuntimeError("no free uid in --uid-range")

    def claim(self, uid: int) -> None:
        """Mark a uid in use (an attempt a previous agent left behind, until it is cleaned up)."""
        with self._lock:
            self._used.add(uid)

    def held_elsewhere(self, uid: int) -> bool:
        """Whether another agent on this host runs an attempt as `uid` now (it holds the uid's lock):
        a previous agent's state file naming it is then out of date, and its processes not orphans."""
        try:
            fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # and with it the lock, where we got it
        return False

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)
            fd = self._held.pop(uid, None)
            if fd is not None:
                os.close(fd)


def drop_privileges_fn(user: JobUser, before=None):
    """The function the child runs between fork and exec: join the attempt's cgroup (as root), then
    become the job's uid and gid with no supplementary groups, and forbid gaining privileges back
    through setuid binaries (no_new_privs)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def run() -> None:
        if before is not None:
            before()
        os.setgroups([])
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    return run


CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000


def under_tmp(path) -> bool:
    """Whether a path (symlinks resolved) lies under the host's /tmp, which an attempt's own /tmp hides."""
    try:
        return Path(os.path.realpath(path)).is_relative_to("/tmp")
    except (OSError, ValueError):
        return False


def paths_in(argv: list[str], path_env: str) -> list[str]:
    """The files a command names: its program (found on PATH if bare) and its absolute arguments."""
    import shutil

    out = [a for a in argv if a.startswith("/")]
    if argv and not argv[0].startswith("/"):
        found = shutil.which(argv[0], path=path_env or None)
        if found:
            out.append(found)
    return out


def private_tmp_fn(tmp: Path, *, bind_tmp: bool = True):
    """The function the child runs (as root, before it drops privileges) for a /tmp and /dev/shm of the
    attempt's own: a mount namespace of its own, where /tmp is `tmp` (inside the attempt's working
    directory) and /dev/shm a fresh tmpfs. What an attempt leaves there is seen by no other attempt,
    even one that later runs as the same uid, and goes with it. /proc is mounted again with
    hidepid=invisible: the job sees its own processes only (not other jobs' command lines). Best
    effort: where the host forbids a
    mount namespace (an unprivileged container) the attempt shares the host's /tmp (the README's
    residual risks); nothing is mounted before mounts are made private, so nothing leaks to the host.
    `bind_tmp=False`: keep the host's /tmp (the job's own files are there), the rest as above."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    source = str(tmp).encode()

    def run() -> None:
        if libc.unshare(CLONE_NEWNS) != 0:
            return
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            return
        if bind_tmp:
            libc.mount(source, b"/tmp", None, MS_BIND | MS_REC, None)
        libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777")
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=invisible")

    return run


# --- paths that message fields choose -------------------------------------------------------------


def ensure_root(path: Path, mode: int, *, reachable: bool = False) -> Path:
    """Create (or check) a directory the agent owns: not a symlink, ours, not writable by others. A root
    with a predictable name (in /var/tmp) could have been planted by someone else: refuse it then.
    `reachable`: the jobs' uids must get through every directory above it (o+x)."""
    path = Path(path)
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        d.mkdir(mode=mode, exist_ok=True)
        os.chmod(d, mode)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise RuntimeError(f"{path} is not a directory (a symlink?)")
    if st.st_uid != os.geteuid():
        raise RuntimeError(f"{path} belongs to uid {st.st_uid}, not to the agent")
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
    if reachable:
        for above in path.parents:
            if not os.stat(above).st_mode & stat.S_IXOTH:
                raise RuntimeError(
                    f"{path} is out of reach of the jobs' uids: {above} is not searchable by others "
                    "(chmod o+x it, or choose another JOB_ROOT / CHECKPOINT_ROOT)"
                )
    return path


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refused if it is a symlink or resolves outside root."""
    for part in parts:
        if not part or "/" in part or part in (".", ".."):
            raise ValueError(f"bad path component {part!r}")
    path = Path(root).joinpath(*parts)
    if path.is_symlink():
        raise ValueError(f"{path} is a symlink")
    real_root = Path(root).resolve()
    if not path.resolve().is_relative_to(real_root):
        raise ValueError(f"{path} resolves outside {real_root}")
    return path


def chown_tree(path: Path, uid: int, gid: int) -> None:
    """Give a checkpoint tree to the attempt's uid, never following a symlink (lchown)."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
        for name in dirnames + filenames:
            try:
                os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)
            except OSError as e:
                log.warning("could not hand %s to uid %d: %s", name, uid, e.strerror)


def checkpoint_dir(root: Path, job_id: int, user: JobUser | None) -> Path:
    """CHECKPOINT_ROOT/job-<id>, 0700, owned by the attempt's uid (a root agent)."""
    if type(job_id) is not int or job_id <= 0:
        raise ValueError(f"job_id must be a positive int, got {job_id!r}")
    path = inside(root, f"job-{job_id}")
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path} is not a directory") from None
    os.chmod(path, 0o700, follow_symlinks=False)
    if user is not None:
        chown_tree(path, user.uid, user.gid)
    return path


def make_workdir(root: Path, name: str, user: JobUser | None) -> Path:
    """A fresh private working directory for one attempt (0700, the job's uid)."""
    path = inside(root, name)
    if path.exists():
        remove_tree(path)
    path.mkdir(mode=0o700)
    if user is not None:
        os.chown(path, user.uid, user.gid)
    return path


def remove_tree(path: Path) -> None:
    # shutil.rmtree does not follow symlinks (it works on directory fds where the platform allows).
    for _ in range(3):
        try:
            shutil.rmtree(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("could not remove %s: %s", path, e)
            time.sleep(0.05)
