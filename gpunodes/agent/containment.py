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

What an attempt may use (`Limits`: memory, tasks, a CPU weight) is set on the same cgroup where the
host delegates the cgroup v2 controllers (`memory.max` with `memory.oom.group=1`, `pids.max`,
`cpu.weight`); on a hybrid host whose controllers are on cgroup v1 (`LimitTree`) in a directory of
the attempt's own in each of the v1 `memory`, `pids` and `cpu` hierarchies; with neither, the runner
sets `RLIMIT_NPROC` (and `RLIMIT_AS` where the operator asks) in the child. The agent and its fence
watchdog lower their own `oom_score_adj` (`protect_from_oom`); jobs raise theirs.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import signal
import struct
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# The controllers an attempt is limited with (cgroup v2 names; v1 has a hierarchy for each).
LIMIT_CONTROLLERS = ("memory", "pids", "cpu")
# A job's processes are the first the kernel's OOM killer takes when the host runs short; the agent
# and its fence watchdog nearly the last (not -1000, "never": an agent that leaks stays stoppable).
JOB_OOM_SCORE_ADJ = 1000
AGENT_OOM_SCORE_ADJ = -999
_warned: set[str] = set()


def warn_once(key: str, message: str, *args, level: int = logging.WARNING) -> None:
    """A host fact (no controller, no namespace) is logged once per process, not once per attempt."""
    if key not in _warned:
        _warned.add(key)
        log.log(level, message, *args)


def join_fn(*procs_files: Path):
    """A function for the child to call between fork and exec (as root, before it drops to the job's
    uid): it moves itself into these cgroups, so nothing it starts can be outside them."""
    names = [str(p) for p in procs_files]

    def enter() -> None:
        pid = str(os.getpid()).encode()
        for name in names:
            fd = os.open(name, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    return enter


def remove_dir_when_empty(path: Path, tries: int = 50) -> bool:
    """rmdir a cgroup once its last processes are reaped (EBUSY until then)."""
    for _ in range(tries):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.02)
    return False


def _write(path: Path, value) -> None:
    path.write_text(str(value))


def _count(text: str, key: str) -> int:
    """The value of `key N` in a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


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
        """For the child, before exec: join the cgroup (join_fn)."""
        return join_fn(self.path / "cgroup.procs")

    def limit(self, limits: Limits, controllers: frozenset[str]) -> None:
        """Write the attempt's limits, for the controllers the tree has (before anything joins). A job
        that reaches memory.max is killed whole (memory.oom.group), not one process at a time."""
        if "memory" in controllers and limits.memory_bytes:
            _write(self.path / "memory.max", limits.memory_bytes)
            _write(self.path / "memory.oom.group", 1)
            swap = self.path / "memory.swap.max"
            if swap.exists():
                _write(swap, 0)  # else a job past memory.max swaps instead, slowing the whole host
        if "pids" in controllers and limits.pids:
            _write(self.path / "pids.max", limits.pids)
        if "cpu" in controllers and limits.cpu_weight:
            _write(self.path / "cpu.weight", limits.cpu_weight)

    def oom_kills(self) -> int:
        """How many of the attempt's processes the kernel killed for its memory limit."""
        try:
            return _count((self.path / "memory.events").read_text(), "oom_kill")
        except OSError:
            return 0

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
    """The agent's own directory of attempt cgroups, under the agent's own cgroup. `controllers`: the
    ones (of memory, pids, cpu) its attempt cgroups have, where the host delegates them."""

    def __init__(self, base: Path, controllers: frozenset[str] = frozenset()) -> None:
        self.base = base
        self.controllers = controllers

    @classmethod
    def create(cls, label: str) -> CgroupTree | None:
        """A tree for this agent process, None (with a warning: the fallbacks are weaker) where the host
        has no cgroup v2 this process may write."""
        mount, own = cgroup2_mount(), own_cgroup2()
        if mount is None or own is None:
            log.warning("no cgroup v2 on this host: attempts are contained by process group and uid only")
            return None
        own_dir = mount / own.lstrip("/")
        if own_dir.name.startswith("gpuquota-agent-"):
            own_dir = own_dir.parent  # this process moved itself into a leaf before (delegate_controllers)
        base = own_dir / f"gpuquota-{label}"
        _remove_stale_trees(own_dir)
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
        return cls(base, delegate_controllers(own_dir, base))

    def attempt(self, name: str, limits: Limits | None = None) -> AttemptCgroup:
        path = self.base / name
        path.mkdir(exist_ok=True)
        cgroup = AttemptCgroup(path)
        if limits is not None and self.controllers:
            try:
                cgroup.limit(limits, self.controllers)
            except OSError:
                cgroup.remove()
                raise
        return cgroup

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


def delegate_controllers(own: Path, base: Path) -> frozenset[str]:
    """Turn the memory, pids and cpu controllers on for the attempt cgroups under `base`, where the
    host delegates them to the agent's cgroup `own` (listed in its cgroup.controllers: systemd's
    Delegate=yes, a container's own cgroup namespace). cgroup v2 lets a cgroup hand controllers down
    only while no process sits in it: an agent alone in its cgroup (a service) moves into a leaf of
    its own first. Returns the controllers the attempts get (logged once where some are missing)."""
    wanted = set(LIMIT_CONTROLLERS)
    try:
        available = wanted & set((own / "cgroup.controllers").read_text().split())
        enabled = set((own / "cgroup.subtree_control").read_text().split())
    except OSError:
        available, enabled = set(), set()
    missing = available - enabled
    if missing:
        line = " ".join(f"+{c}" for c in sorted(missing))
        try:
            _write(own / "cgroup.subtree_control", line)
        except OSError as e:
            try:
                if e.errno != errno.EBUSY or (own / "cgroup.procs").read_text().split() != [str(os.getpid())]:
                    raise
                leaf = own / f"gpuquota-agent-{os.getpid()}"
                leaf.mkdir(exist_ok=True)
                _write(leaf / "cgroup.procs", os.getpid())
                _write(own / "cgroup.subtree_control", line)
            except OSError:
                available &= enabled
    if available:
        try:
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(available)))
        except OSError:
            available = set()
    if wanted - available:
        warn_once(
            "v2-controllers",
            "cgroup v2 controllers %s are not delegated to %s: their limits come from cgroup v1 or "
            "rlimits where this host has them",
            ",".join(sorted(wanted - available)),
            own,
        )
    return frozenset(available)


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


def _processes():
    """(pid, real uid, effective uid) of every live process (zombies left out), from /proc/PID/status."""
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
                        yield int(entry.name), real, effective
                        break
        except (OSError, ValueError):
            continue


def pids_of_uid(uid: int) -> list[int]:
    """Live processes (not zombies) whose real or effective uid is `uid`."""
    return [pid for pid, real, effective in _processes() if uid in (real, effective)]


def process_owner(pid: int) -> tuple[int | None, str | None]:
    """Who a process is: its real uid and its cgroup v2 path (None where it is gone or unreadable). With
    a uid and a cgroup per attempt, either names the attempt a pid belongs to (a GPU's holder, say)."""
    uid = None
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
                    break
    except (OSError, ValueError):
        return None, None
    return uid, own_cgroup2(str(int(pid)))


def uids_with_processes() -> set[int]:
    """Every uid some live process runs as (one pass over /proc for a whole uid range)."""
    return {uid for _, real, effective in _processes() for uid in (real, effective)}


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
        return join_fn(self.path / "cgroup.procs")

    def remove(self) -> bool:
        return remove_dir_when_empty(self.path)


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


# --- rendezvous ports ----------------------------------------------------------------------------

# bpf(2): its number per architecture, the commands, the program type and the attach points used.
_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
_BPF_CGROUP_INET4_BIND, _BPF_CGROUP_INET6_BIND = 8, 9
_USER_PORT = 24  # offsetof(struct bpf_sock_addr, user_port): network byte order


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def port_rule_program(low: int, high: int, allowed: int | None) -> bytes:
    """An eBPF program for a cgroup's bind(2) hook: a port of low-high is refused (EPERM) unless it is
    `allowed` (the attempt's own rendezvous port); every other port, and port 0, binds as before."""
    return b"".join(
        [
            _insn(0x61, 2, 1, _USER_PORT),  # r2 = ctx->user_port (u32 load)
            _insn(0xDC, 2, 0, 0, 16),  # r2 = be16(r2): the port in host order (little-endian hosts)
            _insn(0x15, 2, 0, 4, -1 if allowed is None else allowed),  # its own port: allow
            _insn(0xA5, 2, 0, 3, low),  # below the range: allow
            _insn(0x25, 2, 0, 2, high),  # above the range: allow
            _insn(0xB7, 0, 0, 0, 0),  # r0 = 0: refused
            _insn(0x95),
            _insn(0xB7, 0, 0, 0, 1),  # r0 = 1: allowed
            _insn(0x95),
        ]
    )


def _bpf(command: int, attr: bytes) -> int:
    number = _BPF_SYSCALL.get(os.uname().machine)
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf(2) on {os.uname().machine} is not known")
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(attr, len(attr))
    result = libc.syscall(number, command, buf, len(attr))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def restrict_ports(cgroup: Path, low: int, high: int, allowed: int | None) -> bool:
    """Keep the attempt in `cgroup` (cgroup v2) from binding any port of RENDEZVOUS_PORTS but its own
    (`allowed`), IPv4 and IPv6: no job can squat the ports other attempts are given (torch's TCPStore
    has no authentication: a squatter would be talked to). The rule lives as long as the cgroup. False
    (logged once) where the kernel or the agent cannot load it: the runner's check before a rank 0
    start is all there is then."""
    program = port_rule_program(low, high, allowed)
    code = ctypes.create_string_buffer(program, len(program))
    license_ = ctypes.create_string_buffer(b"GPL")
    try:
        target = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        warn_once("bpf-ports", "cannot restrict the rendezvous ports of attempts (%s): %s", cgroup, e)
        return False
    try:
        for attach in (_BPF_CGROUP_INET4_BIND, _BPF_CGROUP_INET6_BIND):
            attr = bytearray(128)
            struct.pack_into(
                "<IIQQ",
                attr,
                0,
                _BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
                len(program) // 8,
                ctypes.addressof(code),
                ctypes.addressof(license_),
            )
            struct.pack_into("<I", attr, 68, attach)  # expected_attach_type
            prog = _bpf(_BPF_PROG_LOAD, bytes(attr))
            try:
                _bpf(_BPF_PROG_ATTACH, struct.pack("<IIII", target, prog, attach, 0).ljust(128, b"\0"))
            finally:
                os.close(prog)  # the cgroup holds the program now
        return True
    except OSError as e:
        warn_once(
            "bpf-ports",
            "cannot restrict the rendezvous ports of attempts with a cgroup bind program (%s): a job can "
            "bind other attempts' ports; each rank 0 start checks its own is free",
            e.strerror or e,
        )
        return False
    finally:
        os.close(target)


# --- limits per attempt --------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """What one attempt may use: memory in bytes (RAM, page cache and its tmpfs files), tasks
    (processes and threads), a CPU weight (cgroup v2's scale, 1-10000; 100 is the kernel's default)."""

    memory_bytes: int | None = None
    pids: int | None = None
    cpu_weight: int | None = None


def host_memory_bytes(meminfo: str = "/proc/meminfo") -> int:
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no MemTotal in {meminfo}")


@dataclass(frozen=True)
class LimitPolicy:
    """The operator's settings (JOB_MEMORY_MAX_BYTES, AGENT_MEMORY_RESERVE_BYTES, JOB_PIDS_MAX,
    JOB_CPU_WEIGHT_PER_GPU), turned into the limits of one attempt."""

    memory_max_bytes: int = 0  # 0: the attempt's share of the host's memory, less the reserve
    memory_reserve_bytes: int = 0  # 0: a sixteenth of the host's memory, at least 1 GiB
    pids_max: int = 4096
    cpu_weight_per_gpu: int = 100
    host_memory: int = 0  # 0: read from /proc/meminfo

    def for_attempt(self, gpus: int, host_gpus: int | None) -> Limits:
        """An attempt on `gpus` of the host's `host_gpus` GPUs (an attempt without GPUs counts as one)
        gets that share of what the host keeps for jobs: the attempts of a full host together fit."""
        if self.memory_max_bytes > 0:
            memory = self.memory_max_bytes
        else:
            host = self.host_memory or host_memory_bytes()
            reserve = self.memory_reserve_bytes or max(1 << 30, host // 16)
            share = max(gpus, 1) / max(host_gpus or 1, gpus, 1)
            memory = max(256 << 20, int((host - reserve) * share))
        weight = min(10_000, max(1, self.cpu_weight_per_gpu * max(gpus, 1)))
        return Limits(memory_bytes=memory, pids=self.pids_max or None, cpu_weight=weight)


@dataclass(frozen=True)
class AttemptLimits:
    """An attempt's directories in the cgroup v1 hierarchies of a hybrid host (LimitTree)."""

    paths: tuple[Path, ...]
    memory: Path | None = None

    def enter_fn(self):
        return join_fn(*(p / "cgroup.procs" for p in self.paths))

    def oom_kills(self) -> int:
        """How many of the attempt's processes the kernel killed for its memory limit (v1 kills one at
        a time: the runner then kills the rest, as memory.oom.group does on v2)."""
        if self.memory is None:
            return 0
        try:
            return _count((self.memory / "memory.oom_control").read_text(), "oom_kill")
        except OSError:
            return 0

    def remove(self) -> bool:
        return all([remove_dir_when_empty(p) for p in self.paths])


class LimitTree:
    """Limits on a host whose memory, pids and cpu controllers are on cgroup v1 (a hybrid host, where
    the v2 hierarchy has none of them): a directory of the agent's own in each of those hierarchies,
    under the agent's own cgroup there, and one per attempt in it."""

    V1_FILES = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.shares"}

    def __init__(self, bases: dict[str, Path]) -> None:
        self.bases = bases

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(self.bases)

    @classmethod
    def create(cls, label: str, controllers) -> LimitTree | None:
        bases = {}
        for controller in controllers:
            mount, own = cgroup1_mount(controller), own_cgroup1(controller)
            if mount is None or own is None:
                continue
            base = mount / own.lstrip("/") / f"gpuquota-{label}"
            _remove_stale_trees(base.parent)
            try:
                base.mkdir(exist_ok=True)
                if not (base / cls.V1_FILES[controller]).exists():
                    base.rmdir()
                    continue
            except OSError as e:
                warn_once(f"v1-{controller}", "no cgroup v1 %s limits under %s: %s", controller, base, e)
                continue
            bases[controller] = base
        return cls(bases) if bases else None

    def attempt(self, name: str, limits: Limits) -> AttemptLimits:
        made: list[Path] = []
        try:
            for controller, base in self.bases.items():
                path = base / name
                path.mkdir(exist_ok=True)
                made.append(path)
                if controller == "memory" and limits.memory_bytes:
                    _write(path / "memory.limit_in_bytes", limits.memory_bytes)
                    memsw = path / "memory.memsw.limit_in_bytes"
                    if memsw.exists():
                        _write(memsw, limits.memory_bytes)  # no swap past the limit either
                elif controller == "pids" and limits.pids:
                    _write(path / "pids.max", limits.pids)
                elif controller == "cpu" and limits.cpu_weight:
                    _write(path / "cpu.shares", max(2, limits.cpu_weight * 1024 // 100))
        except OSError:
            for path in made:
                remove_dir_when_empty(path, tries=1)
            raise
        memory = self.bases.get("memory")
        return AttemptLimits(tuple(made), memory / name if memory else None)

    def remove_stale(self) -> None:
        """The directories of agents that are gone, once their attempts are (Runner.kill_orphans)."""
        for base in self.bases.values():
            _remove_stale_trees(base.parent)

    def remove(self) -> None:
        for base in self.bases.values():
            for child in base.iterdir() if base.exists() else ():
                if child.is_dir():
                    remove_dir_when_empty(child, tries=5)
            remove_dir_when_empty(base, tries=1)


def protect_from_oom(score: int = AGENT_OOM_SCORE_ADJ) -> bool:
    """Set this process's oom_score_adj (lowering it takes root); whether it was set."""
    try:
        Path("/proc/self/oom_score_adj").write_text(str(score))
        return True
    except OSError as e:
        if os.geteuid() != 0 and score < 0:
            # Expected of an agent that is not root (`make run`): lowering it takes root. Said once, as a
            # fact of the setup, not a WARNING at every start.
            warn_once(
                "oom-score",
                "oom_score_adj stays as it was: lowering it to %d takes root (this agent runs as uid %d)",
                score,
                os.geteuid(),
                level=logging.INFO,
            )
        else:
            warn_once("oom-score", "cannot set oom_score_adj to %d: %s", score, e.strerror)
        return False
