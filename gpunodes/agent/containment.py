"""Containment of one attempt on its host: a cgroup (v2) per attempt, and how to end all of it.

Everything an attempt starts lands in its cgroup, whatever it does with sessions or process groups
(`setsid`, double forks), so its end (success, cancel, pre-emption after grace, and fencing when the
agent loses its lease) reaches every process: `AttemptCgroup.kill()`. The unit is small on purpose:
`CgroupTree.create()` once per agent, `tree.attempt(name)` per attempt, `enter_fn()` for the child to
join before it runs anything, `signal()` for a graceful stop, `kill()` and `remove()` at the end.

Where the host cannot do it, `kill_attempt()` falls back, in this order:

1. `cgroup.kill` (Linux 5.14+): the kernel kills every process of the cgroup at once;
2. older kernels: freeze the cgroup (`cgroup.freeze`, 5.2+) so nothing forks, SIGKILL every pid in
   `cgroup.procs`, thaw, until the cgroup is empty;
3. no cgroup v2 the agent may write (no delegation): SIGKILL the attempt's process group, then every
   process that runs under the attempt's own uid (each attempt has its own uid on a root agent, taken
   host-wide, so the uid names exactly its processes). A non-root agent that runs jobs as itself has
   only the process group: a `setsid` child escapes it (README, "Security model").
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


def cgroup2_mount(mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a
    hybrid v1 host), None without one."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        if post.split(" ", 1)[0] == "cgroup2":
            return Path(pre.split()[4])
    return None


def own_cgroup2(pid: str = "self") -> str | None:
    """The cgroup v2 path of a process (`0::/path` in /proc/PID/cgroup)."""
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class AttemptCgroup:
    path: Path
    # The kernel's kill-everything file (5.14+); the tests name a missing one to take the fallback.
    KILL_FILE = "cgroup.kill"

    @property
    def name(self) -> str:
        return self.path.name

    def enter_fn(self):
        """A function for the child to call between fork and exec (as root, before it drops to the
        job's uid): it moves itself into the cgroup, so nothing it starts can be outside."""
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return enter

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def populated(self) -> bool:
        try:
            events = (self.path / "cgroup.events").read_text()
        except OSError:
            return False  # gone
        return "populated 1" in events

    def signal(self, sig: int) -> None:
        """Send `sig` to every process in the cgroup (a graceful stop reaches `setsid` children too)."""
        for pid in self.pids():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def kill(self) -> None:
        """SIGKILL everything in the cgroup: `cgroup.kill` where the kernel has it, else freeze, kill
        each pid, thaw (repeated by `wait_empty` until nothing is left)."""
        kill_file = self.path / self.KILL_FILE
        if kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError as e:
                log.warning("cgroup.kill of %s failed (%s); killing pid by pid", self.path, e)
        freeze = self.path / "cgroup.freeze"
        frozen = False
        try:
            freeze.write_text("1")
            frozen = True
        except OSError:
            pass
        try:
            self.signal(signal.SIGKILL)
        finally:
            if frozen:
                try:
                    freeze.write_text("0")
                except OSError:
                    pass

    def wait_empty(self, timeout: float = 5.0) -> bool:
        end = time.monotonic() + timeout
        while self.populated():
            if time.monotonic() >= end:
                return False
            self.kill()
            time.sleep(0.02)
        return True

    def remove(self) -> bool:
        """Remove the (empty) cgroup; False while processes are still in it."""
        try:
            self.path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            return False


class CgroupTree:
    """The agent's own directory of attempt cgroups, under the agent's own cgroup."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def create(cls, label: str) -> CgroupTree | None:
        """A tree for this agent process, None (with a warning: the fallbacks are weaker) where the host
        has no cgroup v2 this process may write."""
        mount, own = cgroup2_mount(), own_cgroup2()
        if mount is None or own is None:
            log.warning("no cgroup v2 on this host: attempts are contained by process group and uid only")
            return None
        base = mount / own.lstrip("/") / f"gpuquota-{label}"
        _remove_stale_trees(base.parent)
        try:
            base.mkdir(mode=0o755, exist_ok=True)
            probe = base / "probe"
            probe.mkdir(exist_ok=True)
            probe.rmdir()
        except OSError as e:
            log.warning(
                "cannot create cgroups under %s (%s): attempts are contained by process group and uid only",
                base.parent,
                e.strerror,
            )
            return None
        return cls(base)

    def attempt(self, name: str) -> AttemptCgroup:
        path = self.base / name
        path.mkdir(exist_ok=True)
        return AttemptCgroup(path)

    def remove(self) -> None:
        for child in self.base.iterdir() if self.base.exists() else ():
            if child.is_dir():
                cg = AttemptCgroup(child)
                cg.wait_empty(2)
                cg.remove()
        try:
            self.base.rmdir()
        except OSError:
            pass


def _remove_stale_trees(parent: Path) -> None:
    """Empty trees of agents that are gone (`gpuquota-<node>-<pid>` whose pid no longer runs): the
    attempts in them were killed by their agent's successor (Runner.kill_orphans) or ended."""
    try:
        entries = list(parent.glob("gpuquota-*-*"))
    except OSError:
        return
    for tree in entries:
        pid = tree.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for child in tree.glob("attempt-*"):
            AttemptCgroup(child).remove()
        try:
            tree.rmdir()
        except OSError:
            pass


def pids_of_uid(uid: int) -> list[int]:
    """Live processes (not zombies) whose real or effective uid is `uid` (from /proc/PID/status)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                for line in f:
                    if line.startswith("State:") and line.split()[1] == "Z":
                        break
                    if line.startswith("Uid:"):
                        real, effective = (int(x) for x in line.split()[1:3])
                        if uid in (real, effective):
                            found.append(int(entry.name))
                        break
        except (OSError, ValueError):
            continue
    return found


def kill_uid(uid: int, rounds: int = 20) -> int:
    """SIGKILL every process of a per-attempt uid until none is left (a fork between the scan and the
    kill is caught by the next round). Never for root or the agent's own uid."""
    if uid in (0, os.getuid(), os.geteuid()):
        raise ValueError(f"refusing to kill every process of uid {uid}")
    killed = 0
    for _ in range(rounds):
        pids = pids_of_uid(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return killed


def kill_attempt(*, cgroup: AttemptCgroup | None, pgid: int | None, uid: int | None) -> bool:
    """End every process of an attempt, with the best means this host has (module docstring). Returns
    whether nothing of it is left that we know of."""
    if pgid and pgid > 1 and pgid != os.getpgrp():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if cgroup is not None:
        cgroup.kill()
        return cgroup.wait_empty()
    if uid is not None and uid not in (0, os.getuid(), os.geteuid()):
        kill_uid(uid)
        return not pids_of_uid(uid)
    return True


# --- GPU devices ---------------------------------------------------------------------------------


def cgroup1_mount(controller: str, mountinfo: str = "/proc/self/mountinfo") -> Path | None:
    """Where a cgroup v1 controller is mounted (`/sys/fs/cgroup/devices` on a hybrid host), if it is."""
    try:
        lines = Path(mountinfo).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        pre, _, post = line.partition(" - ")
        fields = post.split()
        if fields and fields[0] == "cgroup" and controller in fields[-1].split(","):
            return Path(pre.split()[4])
    return None


def own_cgroup1(controller: str, pid: str = "self") -> str | None:
    try:
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    except (OSError, ValueError):
        pass
    return None


def device_number(path: str) -> tuple[str, int, int] | None:
    """('c' or 'b', major, minor) of a device node, None if it is not one."""
    import stat as st

    try:
        info = os.stat(path)
    except OSError:
        return None
    kind = "c" if st.S_ISCHR(info.st_mode) else "b" if st.S_ISBLK(info.st_mode) else None
    return (kind, os.major(info.st_rdev), os.minor(info.st_rdev)) if kind else None


@dataclass(frozen=True)
class AttemptDevices:
    """An attempt's cgroup in the v1 `devices` hierarchy: the GPUs it was not given are denied to it."""

    path: Path

    def deny(self, devices: list[tuple[str, int, int]]) -> None:
        for kind, major, minor in devices:
            (self.path / "devices.deny").write_text(f"{kind} {major}:{minor} rwm")

    def enter_fn(self):
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)

        return enter

    def remove(self) -> bool:
        for _ in range(50):
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                time.sleep(0.02)  # its last processes are still being reaped
        return False


class DeviceTree:
    """GPU device isolation per attempt where the host has the cgroup v1 `devices` controller (hybrid
    hosts): each attempt is denied the device nodes of the host's other GPUs, so CUDA_VISIBLE_DEVICES is
    not its only boundary. Pure cgroup v2 hosts need a BPF device program for this (what container
    runtimes and systemd's DeviceAllow= do): there, run jobs in containers (README, "Security model")."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def create(cls, label: str) -> DeviceTree | None:
        mount, own = cgroup1_mount("devices"), own_cgroup1("devices")
        if mount is None or own is None:
            return None
        base = mount / own.lstrip("/") / f"gpuquota-{label}"
        _remove_stale_trees(base.parent)
        try:
            base.mkdir(exist_ok=True)
            if not (base / "devices.deny").exists():
                base.rmdir()
                return None
        except OSError as e:
            log.warning(
                "no device cgroups under %s (%s): GPUs are fenced by CUDA_VISIBLE_DEVICES only", mount, e
            )
            return None
        return cls(base)

    def attempt(self, name: str, deny: list[tuple[str, int, int]]) -> AttemptDevices:
        path = self.base / name
        path.mkdir(exist_ok=True)
        devices = AttemptDevices(path)
        devices.deny(deny)
        return devices

    def remove(self) -> None:
        if not self.base.exists():
            return
        for child in self.base.iterdir():
            if child.is_dir():
                AttemptDevices(child).remove()
        try:
            self.base.rmdir()
        except OSError:
            pass
