"""Who an attempt runs as, and where: its own uid and a private working directory.

A root agent gives every attempt a uid of its own from a configured range (`--uid-range`, setting
`JOB_UID_RANGE`). The uid has no account: the job runs with that uid and gid and no supplementary
groups, so it cannot read another attempt's `/proc/PID/environ`, signal its processes, or open its
files; the state directory, the logs and the agent itself (root) are out of its reach.

A uid is never handed out while anything of a previous attempt's is left with it: processes, SysV IPC
objects, files in the host's shared directories (`JOB_SHARED_DIRS`: /tmp, /var/tmp, /dev/shm, ...), a
checkpoint or working directory still its own. The cursor is kept on disk (random the first time), so
an agent that restarts does not start again from the first uid.

Each attempt runs in a mount and IPC namespace of its own: its working directory (its HOME, TMPDIR and
cwd, under `JOB_ROOT`; a size-limited tmpfs by default) holds its `/tmp` and `/var/tmp`, `/dev/shm` is
a fresh tmpfs, SysV IPC is its own, `/proc` shows its own processes only. What it leaves there goes
with it. Checkpoints live in `CHECKPOINT_ROOT/job-<id>` (2770), owned by an id of the job's own that
no process runs as (checkpoint_owner), which every attempt and rank of the job sees as its own through
an idmapped mount (or reaches through the job's group): nothing in it is ever re-owned. An attempt holds
the directory from its start to the end of its clean-up (CheckpointHolds).

Paths built from message fields are checked here: ints are ints, and every path resolves inside its
root without following a symlink.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import logging
import os
import pwd
import re
import shutil
import stat
import struct
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


# The host's directories that every uid may write: where an attempt without a mount namespace of its
# own (an unprivileged container) leaves files for the next attempt of its uid. The agent adds every
# other world-writable directory it finds on the host (world_writable_dirs).
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
# Entries looked at per shared directory and scan, at most (a host's /tmp is small). Each directory has
# its own budget: 200,000 entries in one (/run/lock) never hide what another (/tmp) holds.
SCAN_BUDGET = 200_000
# How deep world_writable_dirs looks below /, and how many directories it reads at most.
WORLD_WRITABLE_DEPTH = 4
WORLD_WRITABLE_BUDGET = 100_000
# Never looked through for world-writable directories: the kernel's own trees.
_NOT_LOOKED_AT = ("/proc", "/sys")


def owners_in(dirs, *, deep: bool = True, budget: int | None = None) -> set[int]:
    """The owners of the entries of these directories and, with `deep`, of every world-writable
    directory below them: a job's uid can create an entry only in a directory it owns (which then
    shows its uid one level up) or in one anyone may write, so this sees all it can have left. Each
    directory is looked through on its own budget, breadth first (its own entries before those of its
    subdirectories), so no directory filled with entries blinds the scan of another."""
    owners: set[int] = set()
    seen: set[tuple[int, int]] = set()
    for top in dirs:
        owners |= _owners_below(str(top), deep, seen, SCAN_BUDGET if budget is None else budget)
    return owners


def _owners_below(top: str, deep: bool, seen: set, budget: int) -> set[int]:
    owners: set[int] = set()
    queue = [top]
    left = budget
    while queue and left > 0:
        try:
            entries = os.scandir(queue.pop(0))
        except OSError:
            continue
        with entries:
            for entry in entries:
                left -= 1
                if left < 0:
                    break
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                owners.add(st.st_uid)
                key = (st.st_dev, st.st_ino)
                if deep and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and key not in seen:
                    seen.add(key)
                    queue.append(entry.path)
    if left < 0:
        log.warning("stopped looking for files of job uids in %s after %d entries", top, budget)
    return owners


def world_writable_dirs(
    root: str = "/",
    *,
    max_depth: int = WORLD_WRITABLE_DEPTH,
    budget: int = WORLD_WRITABLE_BUDGET,
    mountinfo: str = "/proc/self/mountinfo",
) -> list[str]:
    """The host's directories that anyone may write (o+w: /tmp, /var/tmp, /run/lock, /dev/shm, and what
    else this host has, such as a /scratch): every such directory down to `max_depth` below `root`, and
    every mount point that is one, at any depth. An attempt can leave files in each of them, so the agent
    gives every attempt its own (namespaces_fn) or cleans them at its end (remove_leftovers). What lies
    below a world-writable directory is not looked through here (the leftover scans do that)."""
    found: list[str] = []
    queue = [(root, 0)]
    left = budget
    while queue and left > 0:
        path, depth = queue.pop(0)
        try:
            entries = os.scandir(path)
        except OSError:
            continue
        with entries:
            for entry in entries:
                left -= 1
                if left < 0:
                    break
                if entry.path in _NOT_LOOKED_AT:
                    continue
                try:
                    if not entry.is_dir(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_mode & stat.S_IWOTH:
                    found.append(entry.path)
                elif depth + 1 < max_depth:
                    queue.append((entry.path, depth + 1))
    if left < 0:
        log.warning("stopped looking for world-writable directories after %d entries", budget)
    for point in _mount_points(mountinfo):
        if point not in found and not any(Path(point).is_relative_to(p) for p in (*found, *_NOT_LOOKED_AT)):
            try:
                st = os.lstat(point)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH:
                found.append(point)
    return found


def _mount_points(mountinfo: str) -> list[str]:
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return []
    # Field 5 is the mount point, with spaces and such written as octal escapes.
    return [
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[4])
        for line in lines
        if len(line.split()) > 4
    ]


def remove_leftovers(uid: int, dirs, *, max_depth: int = 16, budget: int = SCAN_BUDGET) -> int:
    """At an attempt's end (its processes are gone): remove what its uid left in the host's shared
    directories, in them and in the world-writable directories below them (a file, a socket, a
    message queue, a directory of its own with all in it), so nothing keeps the uid busy for the next
    attempt. Never through a link: each directory is opened by its descriptor, without following one.
    Returns how many entries went."""
    if uid in (0, os.geteuid()):
        raise ValueError(f"refusing to remove every file of uid {uid}")
    removed = 0
    for top in dirs:
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            removed += _remove_owned(fd, str(top), uid, max_depth, [budget])
        finally:
            os.close(fd)
    return removed


def _remove_owned(dir_fd: int, where: str, uid: int, depth: int, budget: list[int]) -> int:
    removed = 0
    try:
        entries = list(os.scandir(dir_fd))
    except OSError:
        return 0
    for entry in entries:
        budget[0] -= 1
        if budget[0] < 0:
            log.warning("stopped removing the files uid %d left in %s: too many entries", uid, where)
            return removed
        try:
            st = os.stat(entry.name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            continue
        try:
            if st.st_uid == uid:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(entry.name, dir_fd=dir_fd)
                else:
                    os.unlink(entry.name, dir_fd=dir_fd)
                removed += 1
            elif stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_IWOTH and depth > 0:
                sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    removed += _remove_owned(sub, os.path.join(where, entry.name), uid, depth - 1, budget)
                finally:
                    os.close(sub)
        except OSError as e:
            log.warning("could not remove %s/%s of uid %d: %s", where, entry.name, uid, e.strerror)
    return removed


def sysv_ipc_owners(root: str = "/proc/sysvipc") -> set[int]:
    """The owners and creators of the SysV shared memory, message queues and semaphores of this IPC
    namespace (the host's): an attempt that could not have a namespace of its own leaves them here."""
    owners: set[int] = set()
    for kind in ("shm", "msg", "sem"):
        try:
            header, *rows = Path(root, kind).read_text().splitlines()
        except (OSError, ValueError):
            continue
        columns = [i for i, name in enumerate(header.split()) if name in ("uid", "cuid")]
        for row in rows:
            fields = row.split()
            owners.update(int(fields[i]) for i in columns if i < len(fields))
    return owners


class NoFreeUid(RuntimeError):
    """Every uid of the range is taken or has something left: the host's shortage, not the job's."""


class UidPool:
    """The range of uids attempts run as. Refuses a range that holds root, a low (system or human)
    uid, or a uid with an account on this host.

    A uid is taken host-wide, not only in this agent: an exclusive lock on `<lock_dir>/<uid>` is held
    while an attempt runs as it (released by the kernel if the agent dies). A uid is skipped while
    anything of an earlier attempt's is left with it (`busy`): so agents on one host (the demo, the
    tests) never share a uid, even with the same range, and no attempt inherits another's leftovers.
    The next uid to try is kept in `<lock_dir>/cursor-FIRST-LAST` (random when there is none)."""

    def __init__(
        self,
        first: int,
        last: int,
        lock_dir: Path | None = None,
        shared_dirs=SHARED_DIRS,
        *,
        find_shared: bool = True,
    ) -> None:
        # Above it are the owners of checkpoint directories, which no attempt may run as.
        if not (MIN_JOB_UID <= first <= last < CHECKPOINT_OWNER_BASE):
            raise ValueError(
                f"--uid-range must lie within {MIN_JOB_UID}-{CHECKPOINT_OWNER_BASE - 1}, got {first}-{last}"
            )
        taken = [p.pw_name for p in pwd.getpwall() if first <= p.pw_uid <= last]
        if taken:
            raise ValueError(f"--uid-range {first}-{last} holds existing accounts: {', '.join(taken[:5])}")
        self.first, self.last = first, last
        self.lock_dir = Path(lock_dir) if lock_dir else default_lock_dir()
        # The configured shared directories and, with `find_shared`, every other one the host has.
        found = world_writable_dirs() if find_shared else []
        self.shared_dirs = tuple(dict.fromkeys([*map(str, shared_dirs), *found]))
        self._used: set[int] = set()
        self._held: dict[int, int] = {}  # uid -> fd of its lock file
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, text: str, **kw) -> UidPool:
        try:
            first, last = (int(x) for x in text.split("-", 1))
        except ValueError:
            raise ValueError(f"--uid-range must be FIRST-LAST, got {text!r}") from None
        return cls(first, last, **kw)

    def busy(self, roots=()) -> set[int]:
        """The uids something is left with: processes, SysV IPC objects of the host's namespace, entries
        of the shared directories, and the top entries of `roots` (the checkpoint and work roots, whose
        directories are root's unless an attempt runs, or a hand-back failed)."""
        from gpunodes.agent.containment import uids_with_processes

        return (
            uids_with_processes()
            | sysv_ipc_owners()
            | owners_in(self.shared_dirs)
            | owners_in([r for r in roots if r], deep=False)
        )

    def acquire(self, roots=()) -> JobUser:
        """A uid of the range that no attempt holds and nothing is left with (`busy`)."""
        with self._lock:
            ensure_root(self.lock_dir, 0o700)
            busy = self.busy(roots)
            size = self.last - self.first + 1
            cursor = os.open(
                self.lock_dir / f"cursor-{self.first}-{self.last}",
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                0o600,
            )
            try:
                fcntl.flock(cursor, fcntl.LOCK_EX)  # agents of one range on one host share the cursor
                text = os.pread(cursor, 32, 0).decode("ascii", "replace").strip()
                uid = int(text) if text.isdigit() and self.first <= int(text) <= self.last else None
                if uid is None:
                    uid = self.first + int.from_bytes(os.urandom(4), "big") % size
                for _ in range(min(size, 100_000)):
                    candidate, uid = uid, self.first + (uid + 1 - self.first) % size
                    if candidate in self._used or candidate in busy:
                        continue
                    fd = os.open(
                        self.lock_dir / str(candidate), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
                    )
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    except BlockingIOError:
                        os.close(fd)  # another agent on this host runs an attempt as it
                        continue
                    self._used.add(candidate)
                    self._held[candidate] = fd
                    os.ftruncate(cursor, 0)
                    os.pwrite(cursor, f"{uid}\n".encode(), 0)
                    return JobUser(candidate, candidate)
            finally:
                os.close(cursor)
        left = len(busy & set(range(self.first, self.last + 1)))
        raise NoFreeUid(
            f"no free uid in --uid-range {self.first}-{self.last}: {len(self._used)} run attempts here, "
            f"{left} of {size} have processes, files or IPC objects left"
        )

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


def drop_privileges_fn(user: JobUser, groups: tuple[int, ...] = ()):
    """The function the child runs between fork and exec, after what it does as root: become the
    job's uid and gid with no supplementary groups but `groups` (its job's checkpoint group, where the
    host cannot idmap: CheckpointHold.groups), and forbid gaining privileges back through setuid
    binaries (no_new_privs)."""
    libc = _libc()

    def run() -> None:
        os.setgroups(list(groups))
        os.setresgid(user.gid, user.gid, user.gid)
        os.setresuid(user.uid, user.uid, user.uid)
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)

    return run


def _libc():
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x40000
# The host's shared directories an attempt gets its own of, and their names in its working directory.
PRIVATE_DIRS = {"/tmp": "tmp", "/var/tmp": "var-tmp"}


# A /tmp or /var/tmp path inside a longer string: a shell command's, an option's value (`--out=...`).
_TMP_MENTION = re.compile(r"(?<![\w.-])/(?:var/)?tmp(?:/[^\s'\"`;:|&<>(){}$*?\[\]=,]+)+")


def paths_in(argv: list[str], path_env: str, env_values=()) -> list[str]:
    """The files a command names: its program (found on PATH if bare), its absolute arguments, and the
    /tmp and /var/tmp paths written inside its arguments (a shell command) or its own env values."""
    out = [a for a in argv if a.startswith("/")]
    if argv and not argv[0].startswith("/"):
        found = shutil.which(argv[0], path=path_env or None)
        if found:
            out.append(found)
    for text in [*argv, *env_values]:
        out.extend(_TMP_MENTION.findall(text))
    return list(dict.fromkeys(out))


@dataclass(frozen=True)
class Carry:
    """A host path under /tmp or /var/tmp that an attempt sees through its own copy of that directory
    (bound at the same path there)."""

    source: str
    target: str  # inside the attempt's working directory
    is_dir: bool


def carries(workdir: Path, *, exact=(), named=(), agent_roots=(), shared=tuple(PRIVATE_DIRS)) -> list[Carry]:
    """What of the host's /tmp and /var/tmp an attempt still sees behind its own: the directories the
    agent chose (`exact`: its working and checkpoint directories, --workdir), each as itself, and for
    each path its command names that exists there (`named`: a checkout under /tmp, its Python) the
    top entry of /tmp or /var/tmp it lies in (or the first entry below that holds none of the agent's
    directories), with the host's permissions. Never the directory as a whole, and never the agent's
    own directories (`agent_roots`: JOB_ROOT, the logs, the state) or what holds them: a job that
    names `/tmp/x` gets `/tmp/x` if it exists, not the host's /tmp."""
    roots = [os.path.realpath(r) for r in agent_roots if r]
    found: dict[str, Carry] = {}
    for path, whole in [(p, True) for p in exact if p] + [(p, False) for p in named if p]:
        real = os.path.realpath(path)
        for host_dir in shared:
            base = os.path.realpath(host_dir)
            if real == base or not Path(real).is_relative_to(base):
                continue
            source = real if whole else _entry_for(real, base, roots)
            if source is None:
                continue
            if not os.path.lexists(source):
                continue
            rel = os.path.relpath(source, base)
            target = os.path.join(workdir, PRIVATE_DIRS[host_dir], rel)
            found[source] = Carry(source, target, os.path.isdir(source))
    return [
        c
        for c in found.values()
        if not any(o != c.source and Path(c.source).is_relative_to(o) for o in found)
    ]


def _entry_for(path: str, base: str, roots: list[str]) -> str | None:
    """The entry of `base` that brings `path` in: its top one, or the first below it that holds none
    of the agent's own directories; None for a path inside one of them."""
    source = base
    for part in Path(path).relative_to(base).parts:
        source = os.path.join(source, part)
        if not any(Path(r).is_relative_to(source) for r in roots):
            break
    else:
        return None  # the path holds an agent's directory
    return None if any(Path(source).is_relative_to(r) for r in roots) else source


@dataclass(frozen=True)
class PrivateMounts:
    """What the child mounts for its attempt (namespaces_fn)."""

    workdir: str
    uid: int
    gid: int
    cwd: str
    tmpfs_bytes: int = 0  # >0: the working directory (and so its /tmp, /var/tmp) is a tmpfs this big
    carries: tuple[Carry, ...] = ()
    private_shm: bool = True  # False where the job's own directories lie under /dev/shm
    # The job's checkpoint directory, mounted over itself idmapped (its owner seen as the attempt's uid)
    # through this user namespace descriptor (CheckpointHold.userns_fd); -1: not idmapped.
    checkpoint: str = ""
    checkpoint_userns_fd: int = -1
    # The host's other world-writable directories (/run/lock, a /scratch): each gets an empty one of the
    # attempt's own in its working directory, mounted over it (private_dir_name).
    shadowed: tuple[str, ...] = ()


def private_dir_name(host_dir: str) -> str:
    """The name, in an attempt's working directory, of its own copy of a world-writable host directory
    other than /tmp and /var/tmp (`/run/lock` -> `host-run-lock`)."""
    return "host-" + host_dir.strip("/").replace("/", "-")


def namespaces_fn(plan: PrivateMounts):
    """The function the child runs (as root, before it drops privileges) for namespaces of the
    attempt's own: an IPC namespace (SysV IPC and POSIX message queues no other attempt sees) and a
    mount namespace where the working directory is a size-limited tmpfs (its pages are charged to the
    attempt's memory cgroup; `tmpfs_bytes`), /tmp and /var/tmp are directories in it, with the host
    paths it still needs bound in (`carries`), /dev/shm is a fresh tmpfs, every other world-writable
    directory of the host (`shadowed`: /run/lock, ...) is an empty one of its own, and /proc is mounted again
    with hidepid=invisible (the job sees its own processes only, not other jobs' command lines). What
    an attempt leaves there is seen by no other attempt, even one that later runs as the same uid,
    and goes with it. Best effort: where the host forbids namespaces (an unprivileged container) the
    attempt shares the host's (the README's residual risks; the uid pool then waits for what it left);
    nothing is mounted before mounts are made private, so nothing leaks to the host."""
    libc = _libc()
    workdir = plan.workdir.encode()
    size = plan.tmpfs_bytes
    tmpfs_opts = f"size={size},mode=0700,uid={plan.uid},gid={plan.gid}".encode()
    shm_opts = f"mode=1777{f',size={size}' if size else ''}".encode()

    def run() -> None:
        if libc.unshare(CLONE_NEWNS | CLONE_NEWIPC) != 0 and libc.unshare(CLONE_NEWNS) != 0:
            return
        if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            return
        if plan.checkpoint_userns_fd >= 0:  # before the carries, which bind it in as it is then
            idmap_over(libc, plan.checkpoint, plan.checkpoint_userns_fd)
        if size:
            libc.mount(b"tmpfs", workdir, b"tmpfs", MS_NOSUID | MS_NODEV, tmpfs_opts)
        for name in PRIVATE_DIRS.values():
            path = os.path.join(plan.workdir, name)
            if not os.path.isdir(path):
                os.mkdir(path, 0o700)
            os.chown(path, plan.uid, plan.gid)
        for c in plan.carries:
            _make_mount_point(plan.workdir, c)
            libc.mount(c.source.encode(), c.target.encode(), None, MS_BIND | MS_REC, None)
        for host_dir, name in PRIVATE_DIRS.items():
            source = os.path.join(plan.workdir, name).encode()
            libc.mount(source, host_dir.encode(), None, MS_BIND | MS_REC, None)
        for host_dir in plan.shadowed:
            path = os.path.join(plan.workdir, private_dir_name(host_dir))
            if not os.path.isdir(path):
                os.mkdir(path, 0o700)
            os.chown(path, plan.uid, plan.gid)
            libc.mount(path.encode(), host_dir.encode(), None, MS_BIND, None)
        if plan.private_shm:
            libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", MS_NOSUID | MS_NODEV, shm_opts)
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=invisible")
        if os.path.isdir("/dev/mqueue"):
            libc.mount(b"mqueue", b"/dev/mqueue", b"mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        os.chdir(plan.cwd)  # the cwd the child entered before its mounts lies under them

    return run


def _make_mount_point(workdir: str, carry: Carry) -> None:
    """The directories down to a carry's target (root's, 0711: the job passes through, adds nothing)
    and the target itself, in the attempt's working directory."""
    parent = os.path.dirname(carry.target)
    missing = []
    while not os.path.isdir(parent) and parent != workdir:
        missing.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(missing):
        os.mkdir(d, 0o711)
        os.chmod(d, 0o711)  # the child's umask is 077
    if carry.is_dir:
        if not os.path.isdir(carry.target):
            os.mkdir(carry.target, 0o700)
    else:
        os.close(os.open(carry.target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))


# --- no user namespaces ---------------------------------------------------------------------------

# Per architecture the kernel may report (a 64-bit host also runs 32-bit code): its audit id, and the
# numbers of clone, unshare and clone3.
_USERNS_SYSCALLS = {
    "x86_64": [(0xC000003E, 56, 272, 435), (0x40000003, 120, 310, 435)],
    "aarch64": [(0xC00000B7, 220, 97, 435), (0x40000028, 120, 337, 435)],
}
CLONE_NEWUSER = 0x10000000
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _user_namespace_filter(machine: str) -> list[tuple[int, int, int, int]] | None:
    """A seccomp program (classic BPF) that fails clone and unshare with CLONE_NEWUSER (EPERM), and
    clone3, whose flags it cannot read, with ENOSYS (libc then falls back to clone, as under Docker's
    default profile). Other syscalls, and other architectures' (none on a sane host), pass. None for
    an architecture it does not know."""
    arches = _USERNS_SYSCALLS.get(machine)
    if not arches:
        return None
    enosys, eperm = _RET_ERRNO | errno.ENOSYS, _RET_ERRNO | errno.EPERM
    # Labels are resolved to the relative jumps BPF takes, so the blocks are built as lists first.
    blocks = []
    for arch, clone, unshare, clone3 in arches:
        block = [
            ("ld", 0),
            ("jge_x32",),
            ("jeq", clone3, "enosys"),
            ("jeq", unshare, "check"),
            ("jeq", clone, "check"),
            ("ret", _RET_ALLOW),
        ]
        blocks.append((arch, block if arch == 0xC000003E else [i for i in block if i[0] != "jge_x32"]))
    code: list[tuple] = [("ld", 4)]
    for n, (arch, _) in enumerate(blocks):
        code.append(("jeq", arch, f"arch{n}"))
    code.append(("ret", _RET_ALLOW))
    labels = {}
    for n, (_, block) in enumerate(blocks):
        labels[f"arch{n}"] = len(code)
        code.extend(block)
    labels["check"] = len(code)
    code += [("ld", 16), ("jset", CLONE_NEWUSER, "eperm"), ("ret", _RET_ALLOW)]
    labels["enosys"] = len(code)
    code.append(("ret", enosys))
    labels["eperm"] = len(code)
    code.append(("ret", eperm))
    out = []
    for at, op in enumerate(code):
        if op[0] == "ld":
            out.append((_LD_ABS, 0, 0, op[1]))
        elif op[0] == "ret":
            out.append((_RET, 0, 0, op[1]))
        elif op[0] == "jge_x32":  # x32 syscalls (bit 30) on x86_64: none of them
            out.append((_JGE, labels["enosys"] - at - 1, 0, 0x40000000))
        else:
            kind = _JEQ if op[0] == "jeq" else _JSET
            out.append((kind, labels[op[2]] - at - 1, 0, op[1]))
    return out


def deny_user_namespaces_fn():
    """The child's step after it dropped privileges (no_new_privs is set, which lets it install a
    seccomp filter): no user namespace for the job, so no "root" inside one to reach the kernel's
    less-guarded paths from (`unshare -Ur`). None where the architecture is not known (logged)."""
    program = _user_namespace_filter(os.uname().machine)
    if program is None:
        log.warning("cannot deny user namespaces on %s: set user.max_user_namespaces=0", os.uname().machine)
        return None
    filters = (_SockFilter * len(program))(*(_SockFilter(*i) for i in program))
    fprog = _SockFprog(len(program), filters)
    libc = _libc()

    def run() -> None:
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "could not install the seccomp filter")

    run.keep = (filters, fprog)  # the program must outlive the fork
    return run


# --- a program the job cannot run -----------------------------------------------------------------


def _reach(path: str, mode: int) -> str | None:
    """Why this process cannot use `path` (X_OK: run it, R_OK: read it), None if it can."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "not found"
    except PermissionError:
        return "permission denied"
    except OSError as e:
        return (e.strerror or str(e)).lower()
    if mode == os.X_OK and stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not os.access(path, mode):
        if mode == os.X_OK and not st.st_mode & 0o111:
            return "not executable"
        return "permission denied"
    return None


def unusable_program(argv: list[str], path_env: str, *, arguments: bool = True, cwd: str = "") -> str | None:
    """Why the job, as the uid this process now runs as, cannot run its command ("cannot run P: not
    found", "cannot read F: permission denied"), or None. Its program, found on PATH if bare, must be
    executable; with `arguments`, an argument that names a file it cannot read (an existing file
    without read permission, or a path through a directory it may not search) fails it too: `python
    /root/x/train.py` would start and die with "can't open file". What only the agent could see (a
    file's existence behind such a directory) is never told. First of all it must be able to enter its
    working directory (`cwd`, an operator's --workdir)."""
    if cwd and not os.access(".", os.X_OK):
        return f"cannot enter its working directory {cwd}: permission denied"
    program = argv[0]
    if "/" in program:
        why = _reach(program, os.X_OK)
        if why:
            return f"cannot run {program}: {why}"
    else:
        seen = None
        for d in (path_env or os.defpath).split(":"):
            candidate = os.path.join(d or ".", program)
            if not os.path.exists(candidate):  # a directory of PATH it may not search: not there
                continue
            why = _reach(candidate, os.X_OK)
            if why is None:
                break
            seen = seen or f"cannot run {candidate}: {why}"
        else:
            return seen or f"cannot run {program}: not found on PATH"
    for arg in argv[1:] if arguments else ():
        if not arg or arg.startswith("-"):
            continue
        try:
            st = os.stat(arg)
        except PermissionError:
            if "/" in arg:
                return f"cannot read {arg}: permission denied"
            continue
        except (OSError, ValueError):
            continue  # not a path: an option's value, a word
        if stat.S_ISREG(st.st_mode) and not os.access(arg, os.R_OK):
            return f"cannot read {arg}: permission denied"
    return None


class CannotRun(Exception):
    """The job cannot run its command (its reason is written to the start's report pipe)."""


def program_check_fn(
    argv: list[str], path_env: str, report_fd: int, *, arguments: bool = True, cwd: str = ""
):
    """The child's last step before exec, as the job's uid: where it could not run its command, write
    why to `report_fd` and fail the start (Popen raises; the agent reads the reason)."""

    def run() -> None:
        why = unusable_program(argv, path_env, arguments=arguments, cwd=cwd)
        if why:
            os.write(report_fd, why.encode("utf-8", "replace")[:4000])
            raise CannotRun(why)

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


def chown_tree(path: Path, uid: int, gid: int) -> list[str]:
    """Give a tree (a checkpoint) to uid:gid, never through a link: each entry is chowned itself (a
    symlink, never what it points to; the walk goes by directory fds and follows no symlinked
    directory), setuid and setgid bits are dropped, and a file with a hard link outside the tree is
    left alone: a job's `ln /var/tmp/victim $GPUQUOTA_CHECKPOINT_DIR/hl` would otherwise hand another's
    file to the next attempt's uid (or to root). Hard links within the tree are fine. Returns the
    paths of the files left alone."""
    top = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        os.chown(top, uid, gid)
    finally:
        os.close(top)
    linked: dict[tuple[int, int], list[str]] = {}
    links: dict[tuple[int, int], int] = {}
    for dirpath, dirnames, filenames, dirfd in os.fwalk(path, follow_symlinks=False):
        for name in dirnames + filenames:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except OSError:
                continue
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                linked.setdefault(key, []).append(os.path.join(dirpath, name))
                links[key] = st.st_nlink
                continue
            _give(name, dirfd, st, uid, gid)
    outside = []
    for key, names in linked.items():
        if len(names) < links[key]:
            outside.extend(names)
            continue
        for name in names:  # every link of the file is in the tree
            parent = os.open(os.path.dirname(name), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            try:
                st = os.stat(os.path.basename(name), dir_fd=parent, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == key:
                    _give(os.path.basename(name), parent, st, uid, gid)
            finally:
                os.close(parent)
    for name in outside:
        log.warning("%s has a hard link outside %s: not handed to uid %d", name, path, uid)
    return outside


def _give(name: str, dirfd: int, st: os.stat_result, uid: int, gid: int) -> None:
    try:
        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
            try:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            finally:
                os.close(fd)
    except OSError as e:
        log.warning("could not hand %s to uid %d: %s", name, uid, e.strerror)


# --- checkpoint directories: one owner per job ----------------------------------------------------

# A job's checkpoint directory belongs, with all in it, to an id of the job's own that no process runs
# as: CHECKPOINT_OWNER_BASE + the job's id, as uid and gid. Every agent computes the same one, so agents
# that share a checkpoint root (two on one host, as `make run`'s; hosts on shared storage) agree on it
# without asking each other, and nothing in the directory is ever re-owned between attempts or ranks.
CHECKPOINT_OWNER_BASE = 3_000_000_000
# rwx for the owner and its group; setgid: what is made below it keeps the job's group.
CHECKPOINT_MODE = 0o2770
HOLDS_DIR = ".holds"
# A directory from before one owner per job (root's between attempts, each attempt's while it ran) is
# handed to its job's owner once, at the job's first start here, if it holds at most this many entries;
# past that its files stay root's (logged: `chown -R` it), so a start never walks without bound.
ADOPT_MAX_ENTRIES = 10_000
# The syscalls of idmapped mounts (Linux 5.12), numbered alike on every architecture.
SYS_OPEN_TREE, SYS_MOVE_MOUNT, SYS_MOUNT_SETATTR = 428, 429, 442
OPEN_TREE_CLONE, AT_FDCWD, AT_EMPTY_PATH, MOVE_MOUNT_F_EMPTY_PATH = 1, -100, 0x1000, 0x4
MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 0x2, 0x4, 0x100000


def _check_job_id(job_id) -> None:
    if type(job_id) is not int or job_id <= 0:
        raise ValueError(f"job_id must be a positive int, got {job_id!r}")


def checkpoint_owner(job_id: int) -> int:
    """The uid and gid that a job's checkpoint directory belongs to on every host (never run as)."""
    _check_job_id(job_id)
    owner = CHECKPOINT_OWNER_BASE + job_id
    if owner >= 2**32 - 1:
        raise ValueError(f"job_id {job_id} is past the ids checkpoint owners can have")
    return owner


def checkpoint_dir(root: Path, job_id: int, user: JobUser | None) -> Path:
    """CHECKPOINT_ROOT/job-<id>. A root agent's (`user`: the attempt's) belongs to the job's owner
    (checkpoint_owner), mode 2770, whichever attempt or rank runs; a non-root agent's is its own, 0700.
    Only the directory itself is looked at and set: it costs the same for 10 files or 10 million."""
    _check_job_id(job_id)
    path = inside(root, f"job-{job_id}")
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    owner = checkpoint_owner(job_id) if user is not None else None
    if owner is not None and os.lstat(path).st_uid == os.geteuid():
        _adopt(path, owner)  # new (empty), or from before one owner per job
    _set_top(path, owner, CHECKPOINT_MODE if user is not None else 0o700)
    return path


def _adopt(path: Path, owner: int) -> None:
    """Hand a root-owned checkpoint directory and what it holds to its job's owner (chown_tree: never
    through a link; a file also linked from outside is taken out), if it holds at most
    ADOPT_MAX_ENTRIES entries."""
    if _holds_more_than(path, ADOPT_MAX_ENTRIES):
        log.error(
            "%s holds more than %d entries from before checkpoints had one owner per job: they stay "
            "root's, out of its attempts' reach (chown -R %d:%d it)",
            path,
            ADOPT_MAX_ENTRIES,
            owner,
            owner,
        )
        return
    for name in chown_tree(path, owner, owner):
        with contextlib.suppress(OSError):
            os.unlink(name)


def _holds_more_than(path: Path, limit: int) -> bool:
    """Whether a tree holds more than `limit` entries, having looked at `limit` + 1 at most."""
    seen, queue = 0, [str(path)]
    while queue:
        try:
            entries = os.scandir(queue.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    return True
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        queue.append(entry.path)
    return False


def _set_top(path: Path, owner: int | None, mode: int) -> None:
    """Give the directory itself (never what is below it, never through a link) to owner:owner, mode."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ValueError(f"{path} is not a directory") from None
        raise
    try:
        st = os.fstat(fd)
        if owner is not None and (st.st_uid, st.st_gid) != (owner, owner):
            os.fchown(fd, owner, owner)
        if stat.S_IMODE(st.st_mode) != mode:
            os.fchmod(fd, mode)
    finally:
        os.close(fd)


def return_checkpoint(path: Path) -> None:
    """At an attempt's end: the directory itself is set back to its job's owner and mode (an attempt
    that saw it as its own, idmapped, could chmod it), and its mtime says when the job last ran here
    (prune_checkpoints). Nothing below it is touched: no walk, whatever the job left there."""
    try:
        job_id = int(Path(path).name.removeprefix("job-"))
        _set_top(Path(path), checkpoint_owner(job_id), CHECKPOINT_MODE)
        os.utime(path, follow_symlinks=False)
    except (OSError, ValueError) as e:
        log.error("could not set checkpoint directory %s back: %s", path, e)


def prune_checkpoints(root: Path, max_age_s: float, keep=(), holds: CheckpointHolds | None = None) -> int:
    """Remove the checkpoints of jobs that last ran here more than max_age_s ago (the agent's own or
    their jobs' owners'; `keep`: those of running attempts). With `holds`, a directory is removed only
    while held for its removal (a start of the job meanwhile is refused), never while an attempt of
    any agent sharing the root holds it. Returns how many."""
    cutoff = time.time() - max_age_s
    removed = 0
    for entry in os.scandir(root):
        try:
            st = entry.stat(follow_symlinks=False)
            job_id = int(entry.name.removeprefix("job-")) if entry.name.startswith("job-") else 0
        except (OSError, ValueError):
            continue
        if (
            job_id > 0
            and stat.S_ISDIR(st.st_mode)
            and st.st_uid in (os.geteuid(), CHECKPOINT_OWNER_BASE + job_id)
            and st.st_mtime < cutoff
            and Path(entry.path) not in keep
        ):
            try:
                held = holds.take(job_id, (0, 0), "prune") if holds is not None else None
            except CheckpointHeld:
                continue
            try:
                remove_tree(Path(entry.path))
            finally:
                if held is not None:
                    _release(*held)
            removed += 1
    return removed


class CheckpointHeld(RuntimeError):
    """Another attempt of the job holds its checkpoint directory here: its processes may still run, or
    it is being cleaned up. The start is refused (the job is re-queued, not held against it)."""


@dataclass
class CheckpointHold:
    """An attempt's hold on its job's checkpoint directory (CheckpointHolds.hold). `fd` is the locked
    hold file, which the attempt's processes inherit; `userns_fd`, where the host can idmap, the user
    namespace that maps the directory's owner to the attempt's uid (namespaces_fn mounts the directory
    over itself through it), so the attempt sees the directory and all in it as its own, 0600 files
    included, and what it writes belongs to the owner."""

    path: Path
    owner: int | None  # checkpoint_owner; None: a non-root agent's directory
    fd: int
    file: Path
    userns_fd: int | None = None

    @property
    def groups(self) -> tuple[int, ...]:
        """Without an idmapped mount, the attempt reaches the directory through its group."""
        return (self.owner,) if self.owner is not None and self.userns_fd is None else ()

    @property
    def umask(self) -> int:
        """Through the group, what the attempt writes must be its group's too (the next attempt's)."""
        return 0o007 if self.groups else 0o077

    def release(self) -> None:
        _release(self.fd, self.file)
        if self.userns_fd is not None:
            os.close(self.userns_fd)
            self.userns_fd = None
        self.fd = -1


def _release(fd: int, file: Path) -> None:
    if fd < 0:
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(file)  # before the lock goes: a taker never finds a free file of a live name
    os.close(fd)


class CheckpointHolds:
    """Which attempts hold which job's checkpoint directory, for every agent that shares the root:
    a file per holder in ROOT/.holds (`job-<id>.<attempt id>-<number>.<node>`), locked (flock) by its
    agent from the start to the end of the attempt's clean-up, and by the attempt's processes, which
    inherit it: a hold outlives an agent that died before its orphans. The ranks of one attempt share
    the directory; another attempt of the job gets it only once no holder of an earlier one is left."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.dir = ensure_root(self.root / HOLDS_DIR, 0o700)

    @contextlib.contextmanager
    def _mutex(self):
        fd = os.open(self.dir / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def take(self, job_id: int, attempt: tuple[int, int], node: str) -> tuple[int, Path]:
        """Lock a hold file for this attempt on this node: (its descriptor, its path). Raises
        CheckpointHeld where another attempt of the job (or this one, left by a previous agent) holds."""
        _check_job_id(job_id)
        prefix, key = f"job-{job_id}.", f"{attempt[0]}-{attempt[1]}"
        name = f"{prefix}{key}.{node}"
        with self._mutex():
            for holder in self._holders(prefix):
                other, _, where = holder.partition(".")
                if other != key or where == node:
                    what = (
                        "being removed"
                        if other == "0-0"
                        else f"held by attempt {other.replace('-', '/')} on {where}"
                    )
                    raise CheckpointHeld(
                        f"the checkpoint directory of job {job_id} is still {what} (running or being cleaned up)"
                    )
            fd = os.open(self.dir / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody else has it: stale ones were removed
        return fd, self.dir / name

    def _holders(self, prefix: str) -> list[str]:
        """What follows `prefix` in the names of the files still held; those no one holds go."""
        held = []
        for entry in os.scandir(self.dir):
            if not entry.name.startswith(prefix):
                continue
            try:
                fd = os.open(entry.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(entry.name[len(prefix) :])
                os.close(fd)
                continue
            _release(fd, Path(entry.path))  # stale: its holder is gone
        return held

    def held(self, job_id: int) -> list[str]:
        """The holders of a job's directory now ("<attempt id>-<number>.<node>")."""
        with self._mutex():
            return self._holders(f"job-{job_id}.")

    def hold(
        self, job_id: int, attempt: tuple[int, int], node: str, user: JobUser | None, *, idmap: bool
    ) -> CheckpointHold:
        """The job's checkpoint directory (checkpoint_dir), held for this attempt (take) and, with
        `idmap`, with the user namespace of its idmapped mount. Raises CheckpointHeld. O(1): nothing
        below the directory is looked at."""
        fd, file = self.take(job_id, attempt, node)
        hold = CheckpointHold(path=self.root / f"job-{job_id}", owner=None, fd=fd, file=file)
        try:
            hold.path = checkpoint_dir(self.root, job_id, user)
            if user is not None:
                hold.owner = checkpoint_owner(job_id)
                if idmap:
                    try:
                        hold.userns_fd = id_mapping(hold.owner, user.uid, user.gid)
                    except OSError as e:  # the host's trouble (user namespaces used up): the group path
                        log.warning("no idmapped mount of %s for uid %d: %s", hold.path, user.uid, e)
        except BaseException:
            hold.release()
            raise
        return hold


@functools.cache
def _libc_cached():
    return _libc()


def id_mapping(owner: int, uid: int, gid: int) -> int:
    """A descriptor of a new user namespace that maps `owner` (as uid and as gid) to uid and gid and
    nothing else: what an idmapped mount of a job's checkpoint directory goes through. A child of the
    agent makes the namespace (a threaded process cannot), the agent writes its maps (it is root)."""
    libc = _libc_cached()
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # the child does nothing that could take a lock another thread held at the fork
        try:
            os.close(ready_r)
            os.close(go_w)  # its own copy: the agent's close must be the pipe's end
            ok = libc.unshare(CLONE_NEWUSER) == 0
            os.write(ready_w, b"1" if ok else b"0")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            raise OSError(errno.EPERM, "cannot make a user namespace")
        for name, to in (("uid_map", uid), ("gid_map", gid)):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(f"{owner} {to} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(ready_r)
        os.close(go_w)  # the child reads the end of the pipe and exits
        os.waitpid(pid, 0)


def _idmapped_copy(libc, path: str, userns_fd: int) -> int:
    """A detached copy of the mount of `path`, idmapped through `userns_fd`, nosuid and nodev."""
    fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, path.encode(), OPEN_TREE_CLONE | os.O_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"open_tree {path}: {os.strerror(err)}")
    attr = struct.pack("QQQQ", MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, userns_fd)
    if libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, attr, len(attr)) != 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise OSError(err, f"cannot idmap a mount of {path}: {os.strerror(err)}")
    return fd


def idmap_over(libc, path: str, userns_fd: int) -> None:
    """The child's step, as root in its own mount namespace: mount `path` over itself, idmapped."""
    fd = _idmapped_copy(libc, path, userns_fd)
    try:
        if libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, path.encode(), MOVE_MOUNT_F_EMPTY_PATH) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot mount {path} idmapped: {os.strerror(err)}")
    finally:
        os.close(fd)


def idmapped_mounts_work(path: Path) -> bool:
    """Whether this agent can idmap a mount of `path` (Linux 5.12+, root, and a filesystem that allows
    it: ext4, xfs, btrfs, tmpfs from 6.3; not NFS): tried on a detached copy, which nobody sees."""
    try:
        userns = id_mapping(CHECKPOINT_OWNER_BASE, MIN_JOB_UID, MIN_JOB_UID)
        try:
            os.close(_idmapped_copy(_libc_cached(), str(path), userns))
        finally:
            os.close(userns)
    except OSError as e:
        log.info(
            "no idmapped mounts of %s (%s): attempts reach checkpoints through their job's group", path, e
        )
        return False
    return True


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
