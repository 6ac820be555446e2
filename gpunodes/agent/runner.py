"""Runs attempts on a GPU host, stops them gracefully, and reports back (each start and end is written
to the durable outbox, outbox.py, before it is sent).

Each attempt runs in its own session, its own cgroup with its own limits (memory, tasks, CPU weight:
containment.py) and, on a root agent, as a uid of its own in private namespaces and a private, size-
limited working directory (identity.py). A stop sends SIGTERM to everything of the attempt, and once
the job's grace has run out, or when the attempt ends in any way, the whole cgroup is killed: no
`setsid` child outlives it. The attempts are written to a state file, so that an agent that was killed
and restarted kills the orphans it left behind; a state file that cannot be written (a full disk) is
logged and written again by the next poll, never a reason to leave an attempt unreported. The output
goes to a per-attempt log file (joblog.py: 0600, the agent's, capped on disk) whose new bytes are
shipped to the control side as they come, up to a cap.

What the host lacks (a free uid, memory or processes to start one more, disk) ends a start as
refused: the control side re-queues the job. What the job got wrong (a program it cannot run or read)
ends it FAILED, with the reason in plain words.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpunodes.agent import containers, identity
from gpunodes.agent.checkpoints import CheckpointWatcher
from gpunodes.agent.containment import (
    JOB_OOM_SCORE_ADJ,
    LIMIT_CONTROLLERS,
    AttemptCgroup,
    AttemptDevices,
    AttemptLimits,
    CgroupTree,
    DeviceTree,
    LimitPolicy,
    Limits,
    LimitTree,
    cgroup2_mount,
    device_number,
    kill_attempt,
    process_owner,
    restrict_ports,
    warn_once,
)
from gpunodes.agent.fence import ENDED_SUFFIX, fenced_keys
from gpunodes.agent.health import STUCK_PROCESS, Fault, HealthWatcher
from gpunodes.agent.identity import JobUser, UidPool
from gpunodes.agent.joblog import OWNER_FILE, LogSink
from gpunodes.agent.outbox import Outbox

log = logging.getLogger(__name__)

LOG_CHUNK_BYTES = 64 * 1024
# What one attempt's log may hold on the control side: the first half and the last half of this are
# kept, what lies between is dropped with a note (a job printing without end fills no database).
LOG_CAP_BYTES = 8 * 1024 * 1024
# How many `podman wait` in a row may follow a container whose `podman run` died before the agent kills it
# without waiting more (Runner._container_outlives_podman).
PODMAN_WAITS = 3
# Report names (control-side tasks).
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
CHECKPOINT = "jobs.tasks.attempt_checkpoint"
LOG = "jobs.tasks.attempt_log"
PULLING = "jobs.tasks.attempt_pulling"
# The fields of a started/finished report that its control-side task takes; the outbox entry of an end
# also keeps the job id and `log_ranges`, the byte ranges of the log that were shipped (the control side
# asks for the gaps it finds: reship_log).
REPORT_FIELDS = frozenset({"attempt_id", "number", "node", "how", "exit_code", "detail"}) | frozenset(
    {
        "checkpoint_at",
        "checkpoints",
        "at",
        "count",
        "gpu_faults",
        "ended_at",
        "pull_s",
    }  # an end's checkpoint, fault and time (the host's clock); a checkpoint's report; a start's pull
)
# A start that fails with these lacks something of the host's (processes, memory, descriptors, disk),
# not of the job's: it is refused, and the job re-queued.
HOST_SHORT = frozenset({errno.EAGAIN, errno.ENOMEM, errno.ENOSPC, errno.EDQUOT, errno.EMFILE, errno.ENFILE})
# How the child says that a step of the host's failed (not the job's program): the start is refused.
SETUP_FAILED = "setup\t"
# What follows the plain reason of a program the job cannot run or read.
PROGRAM_HINT = "job programs must be readable by job uids, see README"
# The working directory's tmpfs, by default: half the attempt's memory limit (what it holds counts
# against that limit too: tmpfs pages are charged to the attempt's memory cgroup).
WORKDIR_AUTO, WORKDIR_ON_DISK = 0, -1

Report = Callable[[str, dict], None]


# A job's environment is built from an allow-list, never from the agent's own environment minus a
# deny-list: whatever else the agent holds (broker and database URLs, cloud keys, proxy passwords)
# stays with the agent. The operator adds names with --pass-env.
ALLOWED_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM"})
# Never passed, not even with --pass-env: with these a job could queue work on any host or rewrite
# the database.
AGENT_ONLY_ENV = frozenset(
    {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "METRICS_TOKEN",
        "DJANGO_SETTINGS_MODULE",
        "CELERY_BROKER_URL",
    }
)


def job_base_env(environ, pass_env=()) -> dict[str, str]:
    """The part of the agent's environment a job sees: the allow-list (PATH, LANG, LC_*, TZ, TERM) and
    the operator's --pass-env names."""
    extra = set(pass_env)
    refused = extra & AGENT_ONLY_ENV
    if refused:
        raise ValueError(f"--pass-env may not pass the agent's own secrets: {', '.join(sorted(refused))}")
    return {k: v for k, v in environ.items() if k in ALLOWED_ENV or k.startswith("LC_") or k in extra}


def rendezvous_env(*, rank: int, nodes: int, gpus: int, rendezvous: dict | None) -> dict[str, str]:
    """What torch.distributed (torchrun), DeepSpeed and Lightning read to find each other, the same on
    every rank of an attempt: rank 0's host and the port the control side chose for this attempt
    (`rendezvous`, from the start message), the world in processes (one per GPU), this node's rank, the
    number of nodes and of GPUs per node, and the hosts of all ranks in rank order. RANK and LOCAL_RANK
    are per process: torchrun sets them for the processes it starts. Nothing without a rendezvous (a
    control side that sends none)."""
    if rendezvous is None:
        return {}
    return {
        "MASTER_ADDR": rendezvous["master_addr"],
        "MASTER_PORT": str(rendezvous["master_port"]),
        "WORLD_SIZE": str(rendezvous["world_size"]),
        "NODE_RANK": str(rank),
        "NNODES": str(nodes),
        "LOCAL_WORLD_SIZE": str(gpus),
        "GPUS_PER_NODE": str(gpus),
        "GPUQUOTA_HOSTS": ",".join(rendezvous["hosts"]),
    }


def _limits_fn(limits: Limits, user: JobUser | None, rlimit_as: bool):
    """The child's step, as root, for what the cgroups do not cover: the job's processes are the first
    the OOM killer takes (raised as root, so the job cannot lower it again), a uid of its own holds at
    most `pids` tasks (RLIMIT_NPROC counts them per uid: per attempt), and, where asked, each process
    at most the memory limit of address space."""
    tasks = limits.pids if user is not None else None
    space = limits.memory_bytes if rlimit_as else None

    def run() -> None:
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(JOB_OOM_SCORE_ADJ))
        if tasks:
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))
        if space:
            resource.setrlimit(resource.RLIMIT_AS, (space, space))

    return run


def attempt_words(job_id, number) -> str:
    """An attempt as the log names it: "job 14, attempt 2" (its id is the control side's own)."""
    return f"job {job_id}, attempt {number}"


def _plain(e: BaseException) -> str:
    """An exec error in words a job's owner reads (the program itself: the child's check saw none)."""
    plain = {
        errno.ENOENT: "not found",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENOEXEC: "not executable (no #! line?)",
    }
    return plain.get(getattr(e, "errno", None), getattr(e, "strerror", None) or str(e))


def _process_start(pid: int) -> str | None:
    """The kernel's start time of a process (field 22 of /proc/PID/stat), None where unknown: with the
    pid it names one process, so a pid reused since is not mistaken for an orphan."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[19]


@dataclass
class Proc:
    attempt_id: int
    number: int
    job_id: int
    popen: subprocess.Popen
    log_path: Path
    grace_s: int
    deadline: float | None  # monotonic; max_runtime_s enforcement
    stop_how: str | None = None  # "stopped" (asked to), "timed_out" or "gpu_failed"
    stop_detail: str = ""  # the end's reason in words, where the control side cannot tell it (shutdown)
    gpu_fault: dict | None = None  # the fault that killed it (its end report carries it: see gpu_failed)
    kill_at: float | None = None
    log_sent: int = 0
    sink: LogSink | None = field(default=None, repr=False)
    user: JobUser | None = None
    cgroup: AttemptCgroup | None = None
    workdir: Path | None = None
    devices: AttemptDevices | None = None
    limits: AttemptLimits | None = None
    checkpoint: Path | None = None
    checkpoint_hold: identity.CheckpointHold | None = None
    memory_bytes: int | None = None
    admitted_us: int | None = None  # when the control side admitted it (start message), if it said
    out_of_memory: bool = False
    gpus: tuple[int, ...] = ()
    log_stopped: bool = False  # the control side stores no more of its output (its team's budget)
    container: str | None = None  # its podman container's name, for a job that names an image
    # The container's own exit code as podman recorded it (Runner._podman_died): its end, whatever
    # became of the `podman run` the agent started.
    container_code: int | None = None
    podman_waits: int = 0  # how many `podman wait` followed it after its `podman run` died
    killed: bool = False  # the agent sent SIGKILL to all of it (Runner._kill)

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed for its memory limit (cgroup v2 or v1)."""
        return max(
            self.cgroup.oom_kills() if self.cgroup is not None else 0,
            self.limits.oom_kills() if self.limits is not None else 0,
        )


class Runner:
    """The attempts of one host. `uids`: a root agent's per-attempt uid range (None: jobs run as the
    agent's own user, which only a non-root agent started with the explicit opt-out does, or a test).
    `cgroups`: "auto" makes a cgroup per attempt where the host allows (containment.py); `limits`: what
    each attempt may use (containment.LimitPolicy; its defaults where None), set on v2 cgroups where
    delegated, else on v1 ones (`limit_tree`, "auto"), else as rlimits (`rlimit_as`: RLIMIT_AS too,
    which CUDA's address space reservations do not survive). `workdir_bytes`: the size of a root
    agent's per-attempt tmpfs working directory (0: half the attempt's memory; -1: on disk).
    `gpu_health`: the GPU health watcher (health.py), where there is one: a start on a GPU it holds
    broken is refused, an attempt on a GPU found broken is killed (`gpu_failed`), and the GPUs an attempt
    gave back are watched for processes that outlive it."""

    def __init__(
        self,
        *,
        node: str,
        log_dir: Path,
        checkpoint_root: Path,
        report: Report,
        state_path: Path,
        work_root: Path | None = None,
        workdir: Path | None = None,
        uids: UidPool | None = None,
        base_env: dict[str, str] | None = None,
        pass_env: tuple[str, ...] = (),
        cgroups: CgroupTree | str | None = "auto",
        log_cap_bytes: int = LOG_CAP_BYTES,
        gpu_devices: dict[int, str] | None = None,
        device_cgroups: DeviceTree | str | None = "auto",
        gpu_holders: Callable[[list[int]], dict[int, list[int]]] | None = None,
        outbox: Outbox | None = None,
        limits: LimitPolicy | None = None,
        limit_tree: LimitTree | str | None = "auto",
        rlimit_as: bool = False,
        workdir_bytes: int = WORKDIR_AUTO,
        user_namespaces: bool = False,
        gpu_health: HealthWatcher | None = None,
        checkpoint_scan_s: float = 1.0,
        checkpoint_settle_s: float = 2.0,
        gpu_use_check_s: float = 5.0,
        rendezvous_ports: tuple[int, int] | str | None = "auto",
        podman: containers.Podman | str | None = "auto",
        image_cache_bytes: int = 0,
        registry_auth_file: str | None = None,
    ) -> None:
        self.node = node
        # Container jobs (containers.py): podman, found at the first one ("auto"), and the image cache.
        self._podman, self._podman_why = (podman, "") if podman != "auto" else (None, None)
        self.image_cache_bytes = image_cache_bytes
        # The admin's registry credentials (containers.Podman.authfile); None: REGISTRY_AUTH_FILE if set.
        self.registry_auth_file = registry_auth_file
        # Attempts whose image is being pulled: a start of one sent again meanwhile (the heartbeat
        # resends a start not reported running within seconds) returns at once, holding no thread.
        self._pulling: set[tuple[int, int]] = set()
        self.fake_gpus = not gpu_devices
        self.gpu_health = gpu_health
        self.log_dir = identity.ensure_root(Path(log_dir), 0o700)  # the jobs never read the logs
        # Reachable (0711, not listable) by the jobs' uids, each of which owns only its own entry.
        reachable = uids is not None
        self.checkpoint_root = identity.ensure_root(Path(checkpoint_root), 0o711, reachable=reachable)
        self.work_root = identity.ensure_root(
            Path(work_root) if work_root else self.checkpoint_root.parent / "work", 0o711, reachable=reachable
        )
        self.report = report
        self.state_path = Path(state_path)
        # Started and finished reports are written here before they are sent, and kept until the
        # control side acknowledges them (outbox.py): the heartbeat carries them.
        self.outbox = outbox if outbox is not None else Outbox(self.state_path.parent / "outbox.sqlite3")
        self.workdir = Path(workdir) if workdir else None  # where jobs start (default: their own dir)
        self.uids = uids
        self.base_env = job_base_env(base_env if base_env is not None else os.environ, pass_env)
        if cgroups == "auto":
            cgroups = CgroupTree.create(f"{node}-{os.getpid()}")
        self.cgroups: CgroupTree | None = cgroups
        self.limit_policy = limits or LimitPolicy()
        # Controllers the v2 tree lacks (all of them on a hybrid host), from the v1 hierarchies.
        v1 = set(LIMIT_CONTROLLERS) - (cgroups.controllers if cgroups is not None else set())
        if limit_tree == "auto":
            limit_tree = LimitTree.create(f"{node}-{os.getpid()}", sorted(v1)) if v1 else None
        self.limit_tree: LimitTree | None = limit_tree
        limited = (cgroups.controllers if cgroups is not None else frozenset()) | (
            limit_tree.controllers if limit_tree is not None else frozenset()
        )
        self.rlimit_as = rlimit_as and "memory" not in limited
        if set(LIMIT_CONTROLLERS) - limited:
            warn_once(
                "limits",
                "no cgroup limits %s for attempts on this host: tasks are limited by RLIMIT_NPROC per uid%s",
                ",".join(sorted(set(LIMIT_CONTROLLERS) - limited)),
                ", memory by RLIMIT_AS" if self.rlimit_as else ", memory not at all",
            )
        self.workdir_bytes = workdir_bytes
        # A job uid may not create user namespaces (a seccomp filter) unless the operator allows them.
        self._deny_user_namespaces = (
            identity.deny_user_namespaces_fn() if uids is not None and not user_namespaces else None
        )
        # The device node of each of the host's GPUs (index -> /dev/nvidiaN): an attempt is denied the
        # ones it was not given, where the host has device cgroups (containment.DeviceTree).
        self.gpu_devices = dict(gpu_devices or {})
        if device_cgroups == "auto":
            device_cgroups = DeviceTree.create(f"{node}-{os.getpid()}") if self.gpu_devices else None
        self.device_cgroups: DeviceTree | None = device_cgroups
        # Who still uses a GPU (NVML: inventory.gpu_processes), checked before GPUs are handed out and
        # every `gpu_use_check_s` (an attempt on a GPU it was not given is stopped).
        self.gpu_holders = gpu_holders
        self.gpu_use_check_s = gpu_use_check_s
        self._next_gpu_use_check = 0.0
        self._cgroup2_mount = cgroup2_mount()
        self.log_cap_bytes = log_cap_bytes
        # RENDEZVOUS_PORTS: an attempt may bind only its own of them (containment.restrict_ports).
        if rendezvous_ports == "auto":
            from gpunodes.rendezvous import port_range

            try:
                rendezvous_ports = port_range()
            except Exception:  # no settings (a bare test): no rule
                rendezvous_ports = None
        self.rendezvous_ports: tuple[int, int] | None = rendezvous_ports
        # Private namespaces for the attempts of a root agent (identity.namespaces_fn). A /dev/shm of
        # their own would hide the jobs' directories if they lay under the host's.
        self.private_mounts = uids is not None
        shadowed = [
            p for p in (self.work_root, self.checkpoint_root, self.workdir) if p and _under(p, "/dev/shm")
        ]
        self.private_shm = not shadowed
        if uids is not None and shadowed:
            log.warning("%s is under /dev/shm: attempts share the host's /dev/shm", shadowed[0])
        # The host's other world-writable directories (/run/lock, ...: UidPool.shared_dirs) each attempt
        # gets an empty one of its own of, unless one holds the agent's or the jobs' own directories
        # (those are cleaned at each attempt's end instead: identity.remove_leftovers).
        ours = [p for p in (self.work_root, self.checkpoint_root, self.workdir, self.log_dir) if p]
        self._shadowed = tuple(
            d
            for d in (uids.shared_dirs if uids is not None else ())
            if d not in (*identity.PRIVATE_DIRS, "/dev/shm", "/dev/mqueue")
            and os.path.isdir(d)
            and not os.path.islink(d)
            and not _under(d, *identity.PRIVATE_DIRS, "/dev/shm")
            and not any(_under(p, d) for p in ours)
        )
        self._state_dirty = False  # the state file could not be written: the next poll tries again
        # The control side's word on this node (agent/tasks.py node_state): starts only while READY.
        self.node_state = "READY"
        self.gpu_indexes: set[int] | None = None  # the host's GPUs, where the agent knows them
        self._lock = threading.RLock()
        self._procs: dict[int, Proc] = {}
        # Attempts told to stop before their start arrived: a late start for them is refused.
        self._tombstones: set[tuple[int, int]] = set()
        self._finished: set[tuple[int, int]] = set()
        # What ended here before this agent started ({key: admitted_us}, from the outbox's file): a start
        # of one of those, admitted at the same time, waited on the queue past its end and a restart.
        self._ended_before: dict[tuple[int, int], int] = {}
        try:
            self._ended_before = self.outbox.ended()
        except sqlite3.Error:
            log.exception("cannot read the attempts that ended here from the outbox")
        # Whether the agent's lease lapsed (agent/fence.py: its watchdog fences the jobs): no start then.
        self.lease_lapsed: Callable[[], bool] = lambda: False
        # Who holds which job's checkpoint directory, with every agent sharing the root; and whether
        # attempts see theirs through an idmapped mount (else through their job's group).
        self.checkpoint_holds = identity.CheckpointHolds(self.checkpoint_root)
        self.checkpoint_idmap = uids is not None and identity.idmapped_mounts_work(self.checkpoint_root)
        # The jobs' checkpoints, seen in their directories (checkpoints.py), reported as they come.
        self.checkpoints = CheckpointWatcher(
            self._report_checkpoint, scan_s=checkpoint_scan_s, settle_s=checkpoint_settle_s
        )
        self._checkpoint_entries: dict[tuple[int, int], int] = {}  # the outbox entry of each one's latest

    # --- lifecycle of one attempt ---------------------------------------------------------------

    def start(
        self,
        *,
        attempt_id: int,
        number: int,
        job_id: int,
        command: list[str],
        env: dict[str, str] | None = None,
        use_shell: bool = False,
        gpus: list[int] = (),
        max_runtime_s: int | None = None,
        grace_s: int = 30,
        rank: int = 0,
        world: list[str] | None = None,
        rendezvous: dict | None = None,
        admitted_us: int | None = None,
        image: str = "",
        mounts: list[dict] | None = None,
    ) -> str:
        key = (attempt_id, number)
        # A container job's image is pulled first, outside the lock and before the attempt counts as
        # started (its max_runtime_s and protection run from its start report, after the pull).
        pulled: list[tuple[str, bool]] = []  # the pull's lines, and whether each is a byte count
        image_problem = ""
        pull_s: float | None = None  # the seconds its pull took (0: the image was here), reported at start
        if image:
            with self._lock:
                if key in self._pulling or attempt_id in self._procs:
                    return "duplicate"
                self._pulling.add(key)
            try:
                image_problem, pull_s = self._prepare_image(
                    image,
                    lambda line, progress=False: self._say_pulling(key, line, pulled, progress),
                    attempt_words(job_id, number),
                )
            finally:
                with self._lock:
                    self._pulling.discard(key)
        with self._lock:
            if attempt_id in self._procs or key in self._finished:
                return "duplicate"
            if admitted_us is not None and self._ended_before.get(key) == admitted_us:
                log.warning(
                    "not running %s: it ended on this host before the agent restarted (a stale start)",
                    attempt_words(job_id, number),
                )
                return "duplicate"
            if key in self._tombstones:
                return "refused"
            if self.lease_lapsed():
                self.refuse(attempt_id, number, f"{self.node} holds no lease (its jobs were fenced)")
                return "refused"
            if image_problem:
                log.error("%s did not start: %s", attempt_words(job_id, number), image_problem)
                return self._end_unstarted(key, "failed_to_start", image_problem, exit_code=127)
            held = self._gpus_in_use(list(gpus))
            if held:
                # Not the job's doing, nor a strike against it: it is re-queued ("refused").
                log.error("refusing %s: %s", attempt_words(job_id, number), held)
                return self._end_unstarted(key, "refused", f"refused: {held}")
            taken = self._port_taken(rank, rendezvous)
            if taken:
                # Another process holds rank 0's port: re-queued (a fresh port), not counted.
                log.error("refusing %s: %s", attempt_words(job_id, number), taken)
                return self._end_unstarted(key, "refused", f"refused: {taken}")
            broken = self._broken(gpus)
            if broken:
                # The control side had not heard yet (or raced the report): the job is re-queued, as
                # an attempt whose GPU failed, and this host's heartbeat says why.
                log.error("refusing %s: %s", attempt_words(job_id, number), broken)
                return self._end_unstarted(key, "gpu_failed", f"refused: {broken}")
            if self.gpu_health is not None:
                self.gpu_health.claimed(gpus)
            user = cgroup = workdir = devices = limits = checkpoint_dir = sink = hold = None
            name = f"attempt-{attempt_id}-{number}"
            attempt_limits = self.limit_policy.for_attempt(len(gpus), len(self.gpu_indexes or ()) or None)
            try:
                user = self._acquire_uid()
                hold = self.checkpoint_holds.hold(job_id, key, self.node, user, idmap=self.checkpoint_idmap)
                checkpoint_dir = hold.path
                workdir = identity.make_workdir(self.work_root, f"{self.node}-a{attempt_id}-{number}", user)
                log_path = identity.inside(self.log_dir, f"job-{job_id}")
                log_path.mkdir(mode=0o700, exist_ok=True)
                log_path = identity.inside(log_path, f"attempt-{number}.{self.node}.log")
                sink = LogSink(log_path, self.log_cap_bytes)
                if self.cgroups is not None:
                    cgroup = self.cgroups.attempt(name, attempt_limits)
                    if self.rendezvous_ports is not None:
                        own = rendezvous.get("master_port") if rendezvous else None
                        restrict_ports(cgroup.path, *self.rendezvous_ports, own)
                if self.limit_tree is not None:
                    limits = self.limit_tree.attempt(name, attempt_limits)
                if self.device_cgroups is not None:
                    deny = [device_number(p) for i, p in self.gpu_devices.items() if i not in gpus]
                    devices = self.device_cgroups.attempt(name, [d for d in deny if d])
            except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: no free uid
                if sink is not None:
                    sink.finish()
                self._cleanup(user, cgroup, workdir, devices, limits, hold)
                log.error("refusing %s: %s", attempt_words(job_id, number), e)
                if isinstance(e, identity.NoFreeUid):
                    # The host's shortage, not the job's: re-queued with no strike, and said to the admin.
                    log.error(
                        "HOST SHORTAGE on %s: %s (widen --uid-range, or look at what the busy uids left)",
                        self.node,
                        e,
                    )
                    return self._end_unstarted(key, "refused", f"refused: {self.node} has {e}")
                if isinstance(e, identity.CheckpointHeld):
                    # An earlier attempt of the job is still ending here: re-queued, with no strike.
                    return self._end_unstarted(key, "refused", f"refused: {e}")
                if isinstance(e, RuntimeError) or getattr(e, "errno", None) in HOST_SHORT:
                    return self._end_unstarted(key, "unknown", f"refused: the host could not prepare it: {e}")
                return self._end_unstarted(
                    key, "failed_to_start", f"the host could not prepare the attempt: {e}", exit_code=127
                )
            child_env = {
                **self.base_env,
                **(user.env(workdir) if user else {"HOME": str(workdir), "TMPDIR": str(workdir)}),
                **(env or {}),
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus),
                "GPUQUOTA_JOB_ID": str(job_id),
                "GPUQUOTA_ATTEMPT": str(number),
                "GPUQUOTA_CHECKPOINT_DIR": str(checkpoint_dir),
                "GPUQUOTA_WORKDIR": str(workdir),
                "GPUQUOTA_NODE": self.node,
                "GPUQUOTA_NODE_RANK": str(rank),
                "GPUQUOTA_NODES": ",".join(world or [self.node]),
                **rendezvous_env(
                    rank=rank, nodes=len(world or [self.node]), gpus=len(gpus), rendezvous=rendezvous
                ),
                "PYTHONUNBUFFERED": "1",
            }
            # argv as given; a shell only when the job asked for it explicitly.
            argv = ["/bin/sh", "-c", command[0]] if use_shell else list(command)
            cwd = self.workdir or workdir
            container = None
            if image:
                container = containers.container_name(self.node, attempt_id, number)
                try:
                    argv = self._container_argv(
                        container,
                        image,
                        argv,
                        child_env,
                        env or {},
                        attempt_id,
                        number,
                        user,
                        hold,
                        workdir,
                        attempt_limits,
                        cgroup,
                        limits,
                        list(gpus),
                        mounts or [],
                    )
                except (containers.ContainerError, OSError) as e:
                    self._end_container(container)
                    sink.note(f"gpuquota: {e}\n")
                    sink.finish()
                    self._cleanup(user, cgroup, workdir, devices, limits, hold)
                    return self._end_unstarted(key, "failed_to_start", str(e), exit_code=127)
                for line, _progress in pulled:
                    sink.note(f"gpuquota: {line}\n")
            check_r, check_w = os.pipe2(os.O_CLOEXEC)
            steps = [f.enter_fn() for f in (cgroup, limits, devices) if f is not None]
            if user is not None and self.private_mounts and not image:
                steps.append(
                    identity.namespaces_fn(
                        self._mounts(workdir, hold, cwd, user, argv, child_env, env or {}, attempt_limits)
                    )
                )
            # A container's podman runs as root (its container as the attempt's uid: containers.py).
            steps.append(_limits_fn(attempt_limits, None if image else user, self.rlimit_as))
            if user is not None and not image:
                steps.append(identity.drop_privileges_fn(user, groups=hold.groups))
            if user is not None and self._deny_user_namespaces is not None:
                steps.append(self._deny_user_namespaces)
            if not image:
                steps.append(
                    identity.program_check_fn(
                        argv, child_env.get("PATH", ""), check_w, arguments=not use_shell, cwd=str(cwd)
                    )
                )

            def preexec() -> None:
                for step in steps:
                    try:
                        step()
                    except identity.CannotRun:
                        raise
                    except BaseException as e:  # the host's part failed: said through the same pipe
                        os.write(check_w, f"{SETUP_FAILED}{e}".encode("utf-8", "replace")[:4000])
                        raise

            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=sink.write_fd,
                    stderr=subprocess.STDOUT,
                    env=containers.podman_env() if image else child_env,
                    cwd=cwd,
                    start_new_session=True,
                    umask=hold.umask,
                    # The attempt's processes hold its checkpoint directory too (identity.CheckpointHolds).
                    pass_fds=(hold.fd,),
                    preexec_fn=preexec,  # noqa: PLW1509 - os calls, and Python code that takes no lock
                )
            except (OSError, subprocess.SubprocessError) as e:
                os.close(check_w)
                with os.fdopen(check_r, "rb") as f:
                    reason = f.read().decode("utf-8", "replace")
                who = f"the job runs as uid {user.uid if user else os.geteuid()}"
                if reason.startswith(SETUP_FAILED):
                    how, why, code = (
                        "unknown",
                        f"refused: the host could not set the attempt up: {reason[len(SETUP_FAILED) :]}",
                        None,
                    )
                elif reason:
                    how, why, code = "failed_to_start", f"{reason} ({who}; {PROGRAM_HINT})", 127
                elif getattr(e, "errno", None) in HOST_SHORT:
                    how, why, code = "unknown", f"refused: could not start {argv[0]!r}: {e.strerror}", None
                else:
                    how, why, code = (
                        "failed_to_start",
                        f"could not start {argv[0]!r}: {_plain(e)} ({who})",
                        127,
                    )
                sink.note(f"gpuquota: {why}\n")
                sink.finish()
                self._end_container(container)
                self._cleanup(user, cgroup, workdir, devices, limits, hold)
                log.info("%s did not start: %s", attempt_words(job_id, number), why)
                return self._end_unstarted(key, how, why, exit_code=code)
            os.close(check_w)
            os.close(check_r)
            sink.start()
            deadline = time.monotonic() + max_runtime_s if max_runtime_s else None
            self._procs[attempt_id] = Proc(
                attempt_id,
                number,
                job_id,
                popen,
                log_path,
                grace_s,
                deadline,
                sink=sink,
                user=user,
                cgroup=cgroup,
                workdir=workdir,
                devices=devices,
                limits=limits,
                checkpoint=checkpoint_dir if user is not None else None,
                checkpoint_hold=hold,
                memory_bytes=attempt_limits.memory_bytes,
                gpus=tuple(gpus),
                admitted_us=admitted_us,
                container=container,
            )
            self.checkpoints.begin(key, checkpoint_dir)
            self._save_state()
        started = {"attempt_id": attempt_id, "number": number, "node": self.node}
        if pull_s is not None:
            started["pull_s"] = round(pull_s, 3)  # what the forecast counts for the image's next jobs
        self._report_durably(STARTED, started)
        return "started"

    def _acquire_uid(self) -> JobUser | None:
        if self.uids is None:
            return None
        return self.uids.acquire(roots=(self.checkpoint_root, self.work_root))

    @property
    def podman(self) -> containers.Podman | None:
        """podman and the runtime that works here, found at the first container job (and logged)."""
        if self._podman_why is None:
            self._podman, self._podman_why = containers.Podman.detect(authfile=self.registry_auth_file)
            if self._podman is None:
                log.warning("container jobs cannot run on %s: %s", self.node, self._podman_why)
        return self._podman

    def _prepare_image(self, image: str, say, words: str) -> tuple[str, float | None]:
        """Pull the image where this host lacks it: ("", the seconds the pull took, 0 when it was
        here), or (why it cannot run, None)."""
        podman = self.podman
        if podman is None:
            return f"{self.node} cannot run container jobs: {self._podman_why or 'no podman'}", None
        if self.uids is None:
            # Without a uid of its own the container would run as root on the host.
            return f"{self.node} cannot run container jobs: its agent runs without per-attempt uids", None
        if not self.fake_gpus and not containers.cdi_spec_present():
            return f"{self.node} cannot give a container its GPUs: {containers.CDI_HINT}", None
        cache = containers.ImageCache(podman, self.state_path.parent / "images.json", self.image_cache_bytes)

        def said(line: str, progress: bool = False) -> None:
            say(line, progress=progress)
            if not progress:  # the byte counts go to the job's page, not each to the agent's log
                log.info("%s: %s", words, line)

        took = 0.0
        try:
            if not podman.has_image(image):
                # The download files go under the agent's own 0700 directory, not the host's /var/tmp.
                pulls = identity.ensure_root(self.state_path.parent / "pulls", 0o700)
                took = podman.pull(image, said, tmp_root=pulls)
                cache.prune(keep={image})
        except containers.ContainerError as e:
            return str(e), None
        except (OSError, subprocess.SubprocessError) as e:
            return f"could not pull image {image}: {e}", None
        cache.used(image)
        return "", took

    def _container_argv(
        self,
        name,
        image,
        argv,
        child_env,
        job_env,
        attempt_id,
        number,
        user,
        hold,
        workdir,
        attempt_limits,
        cgroup,
        limits,
        gpus,
        mounts,
    ) -> list[str]:
        """The attempt's `podman run` (containers.py), its environment in a root-only env file."""
        env = {k: v for k, v in child_env.items() if k != "PATH" or "PATH" in job_env}
        if not self.fake_gpus:
            # CDI gives the container only its GPUs, which CUDA numbers from 0 there.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
            env["GPUQUOTA_HOST_GPUS"] = ",".join(str(i) for i in gpus)
        env_dir = identity.ensure_root(self.state_path.parent / "containers", 0o700)
        env_file = env_dir / f"{name}.env"
        containers.write_env_file(env_file, env)
        # The checkpoint directory as the attempt's own, as a host command sees it: an idmapped bind
        # mount in the agent's private directory, which podman mounts into the container.
        if hold.userns_fd is None:
            raise containers.ContainerError(
                f"{self.node} cannot give a container its checkpoint directory: container jobs need "
                "idmapped mounts (Linux 5.12+ and a filesystem that allows them) under CHECKPOINT_ROOT"
            )
        checkpoint_source = env_dir / f"{name}.ckpt"
        containers.mount_idmapped(hold.path, checkpoint_source, hold.userns_fd)
        paths = [
            *(limits.paths if limits is not None else ()),
            *([cgroup.path] if cgroup is not None else ()),
        ]
        size = (
            self.workdir_bytes
            if self.workdir_bytes != WORKDIR_AUTO
            else (attempt_limits.memory_bytes or 0) // 2
        )
        return containers.run_argv(
            self.podman,
            name=name,
            image=image,
            command=argv,
            node=self.node,
            attempt_id=attempt_id,
            number=number,
            env_file=env_file,
            uid=user.uid if user else None,
            gid=user.gid if user else None,
            workdir=workdir,
            checkpoint=hold.path,
            checkpoint_source=checkpoint_source,
            memory_bytes=attempt_limits.memory_bytes,
            pids=attempt_limits.pids,
            cpu_weight=attempt_limits.cpu_weight,
            parent=containers.cgroup_parent(paths) if paths else None,
            gpus=gpus,
            real_gpus=not self.fake_gpus,
            tmpfs_bytes=max(0, size),
            datasets=self._datasets(mounts, workdir, hold.path),
        )

    def _datasets(self, mounts, workdir: Path, checkpoint: Path) -> list[tuple[str, str]]:
        """The job's read-only datasets as (host path, container path), each resolved on this host
        (containers.resolve_dataset: symlinks followed, still under the directory that allowed it) and
        kept off the agent's own directories and the attempt's."""
        own = [
            self.state_path.parent,
            self.log_dir,
            self.checkpoint_root,
            self.work_root,
            workdir,
            checkpoint,
        ]
        return [
            containers.resolve_dataset(
                m.get("host", ""), m.get("container", ""), m.get("allowed_by", ""), avoid=own
            )
            for m in mounts
        ]

    def _say_pulling(
        self, key: tuple[int, int], line: str, said: list[tuple[str, bool]], progress: bool = False
    ) -> None:
        """A line of a pull: kept for the attempt's log (of the byte counts only the last), and sent to
        the control side for the job's page (best effort: not through the outbox; a lost one costs a
        line)."""
        if progress and said and said[-1][1]:
            said[-1] = (line, True)
        else:
            said.append((line, progress))
        try:
            self.report(PULLING, {"attempt_id": key[0], "number": key[1], "node": self.node, "text": line})
        except Exception as e:  # noqa: BLE001 - a broker hiccup never fails a pull
            log.info("could not report the pull of attempt %s/%s: %s", *key, e)

    def _end_container(self, name: str | None) -> None:
        """Its container record and env file go (the processes went with the attempt's uid/cgroup)."""
        if not name or self._podman is None:
            return
        self._podman.remove(name)
        with contextlib.suppress(OSError):
            (self.state_path.parent / "containers" / f"{name}.env").unlink()
        containers.unmount(self.state_path.parent / "containers" / f"{name}.ckpt")

    def _mounts(self, workdir, hold, cwd, user, argv, child_env, job_env, limits) -> identity.PrivateMounts:
        """What the child mounts: its tmpfs working directory, and what of the host's /tmp and /var/tmp
        it still sees (its own directories, and what its command names there)."""
        size = self.workdir_bytes
        if size == WORKDIR_AUTO:
            size = (limits.memory_bytes or 0) // 2
        carries = identity.carries(
            workdir,
            exact=[workdir, hold.path, self.workdir],
            named=identity.paths_in(argv, child_env.get("PATH", ""), job_env.values()),
            agent_roots=[self.work_root, self.checkpoint_root, self.log_dir, self.state_path.parent],
        )
        return identity.PrivateMounts(
            workdir=str(workdir),
            uid=user.uid,
            gid=user.gid,
            cwd=str(cwd),
            tmpfs_bytes=max(0, size),
            carries=tuple(carries),
            private_shm=self.private_shm,
            shadowed=self._shadowed,
            checkpoint=str(hold.path),
            checkpoint_userns_fd=hold.userns_fd if hold.userns_fd is not None else -1,
        )

    def _end_unstarted(
        self, key: tuple[int, int], how: str, detail: str, exit_code: int | None = None
    ) -> str:
        """Report the end of an attempt that never ran here: "unknown" (refused: the job is re-queued),
        "gpu_failed" (refused: its GPU is broken; re-queued) or "failed_to_start" (the job ends FAILED)."""
        self._finished.add(key)
        self._report_finished(
            {
                "attempt_id": key[0],
                "number": key[1],
                "node": self.node,
                "how": how,
                "exit_code": exit_code,
                "detail": detail,
            },
        )
        return "failed" if how == "failed_to_start" else "refused"

    def _gpus_in_use(self, gpus: list[int]) -> str:
        """Why the given GPUs cannot be handed out now (a process still uses one: NVML), or "". A live
        attempt of this host that uses one it was not given is stopped for it (its violation, not the
        GPU's fault nor the new job's); what then still holds one (a process of an attempt that was just
        reaped, or one that is no attempt's: the operator must look) makes the start refused, and the
        control side re-queues it without counting it against the job."""
        if self.gpu_holders is None or not gpus:
            return ""
        held = {i: pids for i, pids in self.gpu_holders(gpus).items() if pids}
        if held and self._stop_violators(held):
            held = {i: pids for i, pids in self.gpu_holders(gpus).items() if pids}
        return "; ".join(f"GPU {i} is still used by pid {', '.join(map(str, p))}" for i, p in held.items())

    def _attempt_of(self, pid: int) -> Proc | None:
        """The live attempt a process belongs to (by its cgroup, or its uid on a root agent), if any."""
        uid, cgroup = process_owner(pid)
        with self._lock:
            for proc in self._procs.values():
                if proc.cgroup is not None and self._same_cgroup(cgroup, proc.cgroup.path):
                    return proc
                if proc.user is not None and uid == proc.user.uid:
                    return proc
        return None

    def _same_cgroup(self, cgroup: str | None, path: Path) -> bool:
        mount = self._cgroup2_mount
        return cgroup is not None and mount is not None and mount / cgroup.lstrip("/") == path

    def _stop_violators(self, held: dict[int, list[int]]) -> bool:
        """Stop every live attempt that uses a GPU it was not given (`held`: NVML's holders of each GPU),
        telling it why. Returns whether there was one."""
        stopped = False
        for index, pids in held.items():
            for pid in pids:
                proc = self._attempt_of(pid)
                if proc is None or index in proc.gpus or proc.stop_how == "violation":
                    continue
                given = ", ".join(map(str, proc.gpus)) or "none"
                proc.stop_how = "violation"
                proc.stop_detail = (
                    f"stopped: its process {pid} used GPU {index} of {self.node}, which this attempt was "
                    f"not given (it was given GPU {given}; CUDA_VISIBLE_DEVICES says which)"
                )
                log.error(
                    "killing %s: its pid %d uses GPU %d, which it was not given",
                    attempt_words(proc.job_id, proc.number),
                    pid,
                    index,
                )
                self._kill(proc)
                stopped = True
        return stopped

    def check_gpu_use(self) -> None:
        """Every GPU_USE_CHECK_S (poll): an attempt that holds a GPU it was not given is stopped now, not
        only when another attempt is given that GPU."""
        indexes = sorted(self.gpu_indexes or (self.gpu_health.gpus if self.gpu_health is not None else ()))
        if self.gpu_holders is None or not indexes:
            return
        try:
            held = {i: pids for i, pids in self.gpu_holders(indexes).items() if pids}
        except Exception:  # NVML trouble is the health watcher's to report
            log.exception("could not read the GPUs' processes")
            return
        if held:
            self._stop_violators(held)

    def _owns(self, proc: Proc) -> Callable[[int], bool]:
        """Whether a pid is this (reaped) attempt's: its cgroup or its uid. A pid this agent cannot see
        (gone since, or of another pid namespace) counts as its, as does any where the attempt had
        neither: NVML's word is all there is then."""
        uid = proc.user.uid if proc.user is not None else None
        path = proc.cgroup.path if proc.cgroup is not None else None

        def owns(pid: int) -> bool:
            pid_uid, cgroup = process_owner(pid)
            if (pid_uid is None and cgroup is None) or (uid is None and path is None):
                return True
            return (path is not None and self._same_cgroup(cgroup, path)) or (
                uid is not None and pid_uid == uid
            )

        return owns

    def _port_taken(self, rank: int, rendezvous: dict | None) -> str:
        """Why rank 0 of an attempt could not bind its rendezvous port here ("" where it can): a process
        listens on it (a job of a host without the bind rule, or no job at all). Bound with
        SO_REUSEADDR, as torch's TCPStore does: a port another attempt left in TIME_WAIT is free."""
        if rank != 0 or not rendezvous or type(rendezvous.get("master_port")) is not int:
            return ""
        port = rendezvous["master_port"]
        for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
            try:
                probe = socket.socket(family, socket.SOCK_STREAM)
            except OSError:
                continue  # no IPv6 on this host
            try:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((address, port))
                return ""
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return f"the rendezvous port {port} of {self.node} is taken by another process"
                if family == socket.AF_INET:
                    return ""
            finally:
                probe.close()
        return ""

    def _broken(self, gpus) -> str:
        """Why these GPUs may not be handed out (one of them is known broken), or ""."""
        if self.gpu_health is None:
            return ""
        faults = self.gpu_health.faults()
        return "; ".join(
            f"GPU {i} of {self.node} is unhealthy: {faults[i].detail}" for i in gpus if i in faults
        )

    def gpu_failed(self, index: int, fault: Fault) -> list[tuple[int, int]]:
        """A GPU was found broken: every attempt on it is killed at once (no grace: what ran on it is
        lost anyway) and ends "gpu_failed" (the control side re-queues it, not as the user's failure).
        An attempt already stopping keeps its own end. Returns the attempts it killed."""
        with self._lock:
            procs = [p for p in self._procs.values() if index in p.gpus]
        killed = []
        for proc in procs:
            if proc.stop_how is None:
                proc.stop_how = "gpu_failed"
                proc.stop_detail = f"GPU {index} of {self.node} failed: {fault.detail}"
                proc.gpu_fault = fault.as_message(index)
            log.error("killing %s: its GPU %d failed", attempt_words(proc.job_id, proc.number), index)
            self._kill(proc)
            killed.append((proc.attempt_id, proc.number))
        return killed

    def refuse(self, attempt_id: int, number: int, why: str) -> None:
        """A start this host will not run (it is cordoned, draining or pending): a late start of it is
        refused too, and the control side hears at once that it does not run here (it re-queues it)."""
        with self._lock:
            self._tombstones.add((attempt_id, number))
        self._report_finished(
            {
                "attempt_id": attempt_id,
                "number": number,
                "node": self.node,
                # Not "unknown": the job did nothing here, and its end must not count toward holding it
                # (HOLD_AFTER_NODE_LOST) when this agent's word of its node's state was merely stale.
                "how": "refused",
                "exit_code": None,
                "detail": f"refused: {why}",
            },
        )

    def _cleanup(
        self,
        user: JobUser | None,
        cgroup: AttemptCgroup | None,
        workdir: Path | None,
        devices: AttemptDevices | None = None,
        limits: AttemptLimits | None = None,
        hold: identity.CheckpointHold | None = None,
        ran: bool = False,
    ) -> bool:
        """After an attempt: nothing of it runs, its cgroups and working directory are gone, its
        checkpoint directory is set back (O(1)) and, once no process of it is left, let go of (`hold`),
        what it left in the host's shared directories is gone (`ran`: it ran), its uid is free again. A
        uid whose processes could not all be killed is not handed out again. Returns whether they could."""
        empty = kill_attempt(cgroup=cgroup, pgid=None, uid=user.uid if user else None)
        if user is not None and empty and ran:
            # What it left in the host's shared directories (where it had no private copy) goes too:
            # nothing keeps its uid busy for ever.
            identity.remove_leftovers(user.uid, self.uids.shared_dirs)
        for group in (cgroup, devices, limits):
            if group is not None and empty:
                group.remove()
        if workdir is not None:
            identity.remove_tree(workdir)
        if hold is not None:
            if user is not None:
                identity.return_checkpoint(hold.path)
            if empty:  # a next attempt of the job may have it now; not while a process could write
                hold.release()
            else:
                log.error("processes of an attempt of %s are left: it stays held", hold.path)
        if user is not None:
            if empty:
                self.uids.release(user.uid)
            else:
                log.error("uid %d still has processes; it is not handed out again", user.uid)
        return empty

    def stop(self, *, attempt_id: int, number: int, grace_s: int) -> str:
        with self._lock:
            proc = self._procs.get(attempt_id)
            if proc is None or proc.number != number:
                if (attempt_id, number) in self._finished:
                    return "finished"
                # Not (yet) here: remember it so a late start is refused, and say it is not running,
                # so the control side can free the GPUs without waiting for the timeout.
                self._tombstones.add((attempt_id, number))
                self._report_finished(
                    {
                        "attempt_id": attempt_id,
                        "number": number,
                        "node": self.node,
                        "how": "unknown",
                        "exit_code": None,
                        "detail": f"not running on {self.node}",
                    },
                )
                return "unknown"
            if proc.stop_how is None:
                self._terminate(proc, "stopped", grace_s)
            return "stopping"

    def _terminate(self, proc: Proc, how: str, grace_s: int) -> None:
        proc.stop_how = how
        proc.kill_at = time.monotonic() + max(0, grace_s)
        if grace_s > 0:
            self._signal(proc, signal.SIGTERM)
        else:
            self._kill(proc)

    def _signal(self, proc: Proc, sig: int) -> None:
        """A signal to the attempt's process group and, where it has one, to everything in its cgroup
        (a `setsid` child gets its SIGTERM too). A container's goes to the container (podman kill): a
        signal to podman's group would also end the `runc kill` podman forwards it with."""
        if proc.container and self._podman is not None:
            self._podman.signal(proc.container, sig)
            return
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.cgroup is not None:
            proc.cgroup.signal(sig)

    @staticmethod
    def _kill(proc: Proc) -> bool:
        proc.killed = True
        return kill_attempt(cgroup=proc.cgroup, pgid=proc.popen.pid, uid=proc.user.uid if proc.user else None)

    def fence(self) -> list[tuple[int, int]]:
        """Kill every attempt of this host at once, without a grace (the agent lost its right to run
        them). Their ends are reported by the next poll."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.stop_how is None:
                proc.stop_how = "fenced"
            self._kill(proc)
        return [(p.attempt_id, p.number) for p in procs]

    # --- the reaper ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Called every fraction of a second: reap exits, enforce deadlines and memory limits, ship new
        log bytes. One attempt's trouble (a full disk, say) never keeps another's end unreported. What
        an ended attempt held on this host (its checkpoint directory, uid, cgroups, GPUs) is let go of
        before anything is sent: sends may each wait for a broker that cannot be reached (a partition),
        and a copy of the job started elsewhere meanwhile must not find its directory still held."""
        now = time.monotonic()
        done: list[Proc] = []
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            code = proc.popen.poll()
            if code is not None:
                if proc.container and self._container_outlives_podman(proc):
                    continue  # podman died under it: stopped as a host fault, followed by `podman wait`
                done.append(proc)
                continue
            if not proc.out_of_memory and proc.oom_kills():
                # cgroup v1 kills one process at a time (v2: memory.oom.group, all at once): the rest
                # of the attempt goes with it, as it would on v2.
                log.info("%s reached its memory limit; killing it", attempt_words(proc.job_id, proc.number))
                proc.out_of_memory = True
                self._kill(proc)
            elif proc.stop_how is None and proc.deadline is not None and now >= proc.deadline:
                log.info("%s ran past max_runtime_s; stopping it", attempt_words(proc.job_id, proc.number))
                self._terminate(proc, "timed_out", proc.grace_s)
            elif proc.kill_at is not None and now >= proc.kill_at:
                self._kill(proc)
                proc.kill_at = None
        ended: list[tuple[Proc, float, bool]] = []
        for proc in done:
            try:
                ended.append((proc, *self._reap_here(proc)))
            except Exception:
                log.exception("reaping %s failed", attempt_words(proc.job_id, proc.number))
        for proc in procs:
            if proc in done:
                continue  # its last bytes go with its end (_report_end)
            try:
                self._ship_log(proc)
            except OSError as e:
                log.warning("could not ship the log of %s: %s", attempt_words(proc.job_id, proc.number), e)
        self.checkpoints.poll()
        if self.gpu_holders is not None and now >= self._next_gpu_use_check:
            self._next_gpu_use_check = now + self.gpu_use_check_s
            self.check_gpu_use()
        for proc, ended_at, oom in ended:
            try:
                self._report_end(proc, ended_at, oom)
            except Exception:
                log.exception("reporting the end of %s failed", attempt_words(proc.job_id, proc.number))
        if done or self._state_dirty:
            with self._lock:
                self._save_state()

    def _container_outlives_podman(self, proc: Proc) -> bool:
        """A container job's podman process ended: was that its container's end? podman's record says
        (Podman.state), not podman's exit status: a container that exited ended on its own (its exit
        code is the job's, a SIGKILL it sent itself or its memory limit included); one that did not was
        left by a podman that died (killed, say), a fault of the host and not the job's. That one is
        stopped as a stop of its agent is (SIGTERM to the container, SIGKILL after its grace: one copy
        only, and a chance to checkpoint) and ends how="shutdown" with the fault in words: re-queued,
        never a strike. Returns True while it still runs (a `podman wait` for it is the attempt's
        process until it ends)."""
        if proc.killed:
            # The agent killed it (a grace over, a fence, its memory limit): its end is that, and conmon
            # went with it, so podman's record may lag; the reap removes the container.
            return False
        state = self._podman.state(proc.container) if self._podman is not None else None
        if state is not None and state["status"] in ("exited", "stopped"):
            if isinstance(state["exit_code"], int):
                proc.container_code = state["exit_code"]
            return False
        code = proc.popen.returncode
        if proc.podman_waits == 0:
            if state is None and code >= 0:
                return False  # podman's own error before any container ran (its exit code, as before)
            if proc.out_of_memory or proc.oom_kills():
                return False  # the attempt's memory limit killed it (podman too): the job's own end
            died = f"was killed by signal {-code}" if code < 0 else f"exited ({code})"
            running = state is not None and state["status"] in ("running", "paused")
            what = "while its container still ran" if running else "before its container ran"
            log.error(
                "podman of %s %s %s: stopping it as a host fault",
                attempt_words(proc.job_id, proc.number),
                died,
                what,
            )
            proc.sink.note(
                f"gpuquota: podman, which ran this container on {self.node}, {died} {what}: the host's "
                "fault, not the job's; the container is stopped and the job re-queued\n"
            )
            if proc.stop_how is None:  # a stop under way (pre-emption, max_runtime_s) keeps its own end
                proc.stop_how = "shutdown"
                # Short: the job's event says it with the work lost and no strike, in 300 characters.
                proc.stop_detail = f"host fault: podman on {self.node} {died} {what}" + (
                    "; the agent stopped it" if running else ""
                )
                if running:
                    self._terminate(proc, "shutdown", proc.grace_s)
            if not running:
                return False  # nothing of it runs: the reap removes what is left
        elif state is None:
            return False
        if proc.podman_waits >= PODMAN_WAITS:
            self._kill(proc)  # podman cannot even wait for it: no more grace
            return False
        proc.podman_waits += 1
        try:
            proc.popen = subprocess.Popen(
                self._podman.wait_argv(proc.container),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=containers.podman_env(),
                start_new_session=True,  # the kill after the grace (killpg) ends it alone of the agent's
            )
        except OSError as e:
            log.error("cannot follow the container of %s: %s", attempt_words(proc.job_id, proc.number), e)
            self._kill(proc)
            return False
        self._state_dirty = True
        return True

    def _reap_here(self, proc: Proc) -> tuple[float, bool]:
        """An attempt whose leader exited: whatever it left behind (its group, its cgroup, its uid, its
        hold on its checkpoint directory) goes with it, on this host only (nothing sent). Returns when
        it ended, by this host's clock (the control side dates the end then, not when it reads the
        report: after a restart, say), and whether it ran out of memory, for _report_end."""
        ended_at = time.time()
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        oom = proc.out_of_memory or proc.oom_kills() > 0  # read before its cgroup goes
        self._end_container(proc.container)
        empty = self._cleanup(
            proc.user, proc.cgroup, proc.workdir, proc.devices, proc.limits, proc.checkpoint_hold, ran=True
        )
        if self.gpu_health is not None and proc.gpus:
            label = f"{proc.attempt_id}/{proc.number}"
            if not empty:
                # Processes that SIGKILL does not end hold their GPUs in the driver: none is handed out.
                fault = Fault(
                    STUCK_PROCESS,
                    f"processes of attempt {label} could not be killed (stuck in the driver?): reset the "
                    "GPU, or reboot",
                    time.time(),
                )
                for index in proc.gpus:
                    self.gpu_health.report(index, fault)
            else:
                self.gpu_health.released(proc.gpus, label, self._owns(proc))
        proc.sink.finish()
        return ended_at, oom

    def _report_end(self, proc: Proc, ended_at: float, oom: bool) -> None:
        """The end of an attempt _reap_here let go of: the rest of its log, then its end (into the
        outbox first)."""
        try:
            self._ship_log(proc, final=True)
        except OSError as e:
            log.warning(
                "could not ship the end of the log of %s: %s", attempt_words(proc.job_id, proc.number), e
            )
        with self._lock:
            self._procs.pop(proc.attempt_id, None)
            self._finished.add((proc.attempt_id, proc.number))
        if proc.admitted_us is not None:
            try:  # for an agent restarted since: a stale start of it never runs again here
                self.outbox.mark_ended((proc.attempt_id, proc.number), proc.admitted_us)
            except (sqlite3.Error, OSError) as e:  # a full disk: remembered until a restart only
                log.warning("cannot write down that %s ended: %s", attempt_words(proc.job_id, proc.number), e)
        code = proc.container_code if proc.container_code is not None else proc.popen.returncode
        how = proc.stop_how or "exited"
        if proc.stop_how is None and f"{proc.attempt_id}/{proc.number}" in fenced_keys(self.state_path):
            how = "fenced"  # by the watchdog, not its own end: the job is re-queued
        end = {
            "attempt_id": proc.attempt_id,
            "number": proc.number,
            "node": self.node,
            "how": how,
            "exit_code": code,
            "job_id": proc.job_id,
            "log_ranges": self._shipped_ranges(proc.log_sent),
            "ended_at": round(ended_at, 3),
        }
        checkpoint_at, checkpoints = self.checkpoints.end((proc.attempt_id, proc.number))
        self._checkpoint_entries.pop((proc.attempt_id, proc.number), None)
        if checkpoint_at is not None:  # one saved when it was told to stop included
            end.update(checkpoint_at=round(checkpoint_at, 3), checkpoints=checkpoints)
        if proc.stop_detail:
            end["detail"] = proc.stop_detail
        if how == "gpu_failed" and proc.gpu_fault is not None:
            # The fault rides with the end: the control side takes the GPU out before it re-queues the
            # job, whichever of this report and the heartbeat naming the fault it hears first.
            end["gpu_faults"] = [proc.gpu_fault]
        if oom and how == "exited":
            end["detail"] = (
                "out of memory: the kernel killed its processes (the attempt's memory limit is "
                f"{proc.memory_bytes // 2**20} MiB, counting its processes, page cache and the files in "
                "its working directory, /tmp and /dev/shm)"
            )
        self._report_finished(end)

    def _send_log(self, attempt_id: int, number: int, offset: int, data: bytes) -> None:
        self.report(
            LOG,
            {
                "attempt_id": attempt_id,
                "number": number,
                "node": self.node,
                "offset": offset,
                "text": data.decode("utf-8", "replace"),
            },
        )

    def stop_log(self, attempt_id: int, number: int) -> bool:
        """The control side stores no more of this attempt's output (its team's budget of stored
        output: it said where in the log): nothing more of it is shipped, none of it waits on the broker.
        Whether this host runs it."""
        with self._lock:
            proc = self._procs.get(attempt_id)
        if proc is None or proc.number != number:
            return False
        proc.log_stopped = True
        return True

    def _ship_log(self, proc: Proc, final: bool = False) -> None:
        """Ship new log bytes: at most the first half of `log_cap_bytes` as they come, and at the end the
        last half, with a line that says how many bytes in between were dropped."""
        if proc.log_stopped:
            return
        try:
            size = proc.log_path.stat().st_size
        except FileNotFoundError:
            return
        head = self.log_cap_bytes // 2
        while proc.log_sent < min(size, head):
            with open(proc.log_path, "rb") as f:
                f.seek(proc.log_sent)
                data = f.read(min(LOG_CHUNK_BYTES, head - proc.log_sent))
            if not data:
                break
            self._send_log(proc.attempt_id, proc.number, proc.log_sent, data)
            proc.log_sent += len(data)
            if not final:
                return
        if not final or proc.log_sent >= size:
            return
        tail_from = max(proc.log_sent, size - (self.log_cap_bytes - head))
        if tail_from > proc.log_sent:
            dropped = tail_from - proc.log_sent
            note = f"\n[gpuquota: {dropped} bytes of output dropped here (log cap {self.log_cap_bytes})]\n"
            self._send_log(proc.attempt_id, proc.number, proc.log_sent, note.encode())
        offset = tail_from
        with open(proc.log_path, "rb") as f:
            f.seek(offset)
            while data := f.read(LOG_CHUNK_BYTES):
                self._send_log(proc.attempt_id, proc.number, offset, data)
                offset += len(data)
        proc.log_sent = offset

    def _shipped_ranges(self, size: int) -> list[list[int]]:
        """The byte ranges [start, end) of a log of `size` bytes that _ship_log sends by its end: all of
        it, or the first and the last half of the cap (the note between is not the log's)."""
        head = self.log_cap_bytes // 2
        if size <= head:
            return [[0, size]] if size else []
        tail_from = max(head, size - (self.log_cap_bytes - head))
        return [[0, head], [tail_from, size]] if tail_from > head else [[0, size]]

    def reship_log(self, entry_id: int, gaps: list[tuple[int, int]]) -> int:
        """Send again the byte ranges of a finished attempt's log that the control side lacks (it
        names them by the outbox entry of the attempt's end). Where the log file is gone (rotated) or
        shorter, nothing more can be sent: the entry leaves the outbox (its end was applied already).
        Returns how many chunks were sent."""
        entry = self.outbox.get(entry_id)
        if entry is None or entry.name != FINISHED or type(entry.kwargs.get("job_id")) is not int:
            return 0
        k = entry.kwargs
        try:
            path = identity.inside(
                self.log_dir, f"job-{k['job_id']}", f"attempt-{k['number']}.{self.node}.log"
            )
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except (OSError, ValueError) as e:
            log.warning("cannot send the log of %s again: %s", attempt_words(k["job_id"], k["number"]), e)
            self.outbox.ack([entry_id])
            return 0
        sent = 0
        with os.fdopen(fd, "rb") as f:
            for start, end in gaps:
                f.seek(start)
                offset = start
                while offset < end and (data := f.read(min(LOG_CHUNK_BYTES, end - offset))):
                    self._send_log(k["attempt_id"], k["number"], offset, data)
                    offset += len(data)
                    sent += 1
                if offset < end:  # the file is shorter than what was shipped from it: give up
                    log.warning(
                        "the log of %s is shorter than shipped", attempt_words(k["job_id"], k["number"])
                    )
                    self.outbox.ack([entry_id])
                    break
        return sent

    def _report_durably(self, name: str, kwargs: dict) -> None:
        """Into the outbox first (on disk, until the control side acknowledges it; the heartbeat
        carries it), then sent at once: the quick path, which a broker outage may lose."""
        try:
            self.outbox.add(name, kwargs)
        except (sqlite3.Error, OSError):  # a full or broken disk: the quick path is all there is
            log.exception(
                "could not write a %s report of attempt %s to the outbox", name, kwargs["attempt_id"]
            )
        self.report(name, {k: v for k, v in kwargs.items() if k in REPORT_FIELDS})

    def _report_finished(self, kwargs: dict) -> None:
        self._report_durably(FINISHED, kwargs)

    def _report_checkpoint(self, key: tuple[int, int], at: float, count: int) -> None:
        """A checkpoint of a running attempt (checkpoints.py): into the outbox in place of the one
        before it not sent yet (only the latest matters), then sent at once."""
        kwargs = {
            "attempt_id": key[0],
            "number": key[1],
            "node": self.node,
            "at": round(at, 3),
            "count": count,
        }
        try:
            self._checkpoint_entries[key] = self.outbox.replace(
                self._checkpoint_entries.get(key), CHECKPOINT, kwargs
            )
        except (sqlite3.Error, OSError):
            log.exception("could not write a checkpoint report of attempt %s to the outbox", key[0])
        self.report(CHECKPOINT, kwargs)

    def prune_logs(self, max_age_s: float) -> int:
        """Host log rotation: remove the log files of attempts that are over and older than max_age_s
        (their bytes went to the control side), and job directories left empty. Returns how many."""
        with self._lock:
            live = {p.log_path for p in self._procs.values()}
        cutoff = time.time() - max_age_s
        removed = 0
        for job_dir in self.log_dir.glob("job-*"):
            if job_dir.is_symlink() or not job_dir.is_dir():
                continue
            for f in job_dir.glob("attempt-*.log"):
                try:
                    if f not in live and not f.is_symlink() and f.stat().st_mtime < cutoff:
                        f.unlink()
                        removed += 1
                except OSError:
                    pass
            if not any(job_dir.glob("attempt-*.log")):
                with contextlib.suppress(OSError):
                    (job_dir / OWNER_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                job_dir.rmdir()  # only when empty
        return removed

    def live_logs(self) -> set[Path]:
        """The log files of the attempts running here (never removed to bound the others)."""
        with self._lock:
            return {p.log_path for p in self._procs.values()}

    def prune_checkpoints(self, max_age_s: float) -> int:
        """Remove the checkpoints of jobs that have not run on this host for max_age_s (identity.py)."""
        with self._lock:
            keep = {p.checkpoint for p in self._procs.values() if p.checkpoint is not None}
        return identity.prune_checkpoints(
            self.checkpoint_root, max_age_s, keep=keep, holds=self.checkpoint_holds
        )

    # --- state across restarts -------------------------------------------------------------------

    def running(self) -> list[tuple[int, int]]:
        """The attempts running here. Without the runner's lock: the heartbeat never waits on a start
        (a start or a reap changes the dict as one step; a copy that met one is made again)."""
        while True:
            try:
                return [(p.attempt_id, p.number) for p in list(self._procs.values())]
            except RuntimeError:  # "dictionary changed size during iteration"
                continue

    def _save_state(self) -> None:
        """Write the running attempts down (for a restarted agent and the fence watchdog). A write that
        fails (a full disk) is logged once and tried again by the next poll; it never fails a start
        or a reap."""
        state = [
            {
                "attempt_id": p.attempt_id,
                "number": p.number,
                "pgid": p.popen.pid,
                "started": _process_start(p.popen.pid),
                "cgroup": str(p.cgroup.path) if p.cgroup else None,
                "uid": p.user.uid if p.user else None,
                "workdir": str(p.workdir) if p.workdir else None,
                "checkpoint": str(p.checkpoint) if p.checkpoint else None,
            }
            for p in self._procs.values()
        ]
        tmp = self.state_path.with_suffix(".tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp.write_text(json.dumps(state))
            tmp.replace(self.state_path)
        except OSError as e:
            if not self._state_dirty:
                log.error("cannot write %s: %s; trying again at the next poll", self.state_path, e)
            self._state_dirty = True
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        if self._state_dirty:
            log.info("wrote %s again", self.state_path)
        self._state_dirty = False

    def kill_orphans(self) -> list[int]:
        """Kill what a previous agent on this host left running: its attempts' cgroups, their uids, their
        process groups; then remove their working directories and take their checkpoints back. (What
        its fence watchdog already killed is listed in `running.json.ended`: cleaned up, not killed.)"""
        ended = self.state_path.with_name(self.state_path.name + ENDED_SUFFIX)
        killed = []
        for entry in _entries(ended):
            self._forget_orphan(entry)
        ended.unlink(missing_ok=True)
        for entry in _entries(self.state_path):
            cgroup = _orphan_cgroup(entry.get("cgroup"))
            uid = self._orphan_uid(entry)
            if cgroup is not None or uid is not None:
                if kill_attempt(cgroup=cgroup, pgid=None, uid=uid) and uid is not None:
                    identity.remove_leftovers(uid, self.uids.shared_dirs)
                if cgroup is not None:
                    cgroup.remove()
                    with contextlib.suppress(OSError):
                        cgroup.path.parent.rmdir()  # the previous agent's tree, once empty
            pgid = entry.get("pgid")
            started = entry.get("started")
            if type(pgid) is not int or pgid <= 1 or pgid == os.getpgrp():
                pass
            elif started is not None and _process_start(pgid) not in (started, None):
                # The leader is gone and its pid names another process now, which is not ours. (The
                # kernel does not reuse a pid while a group of that id lives, so none of ours is left.)
                log.warning("pid %d was reused since the previous agent; not killing it", pgid)
            else:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                    killed.append(pgid)
                except (ProcessLookupError, PermissionError):
                    pass
            self._forget_orphan(entry)
        self.state_path.unlink(missing_ok=True)
        self.end_orphan_containers()
        if self.limit_tree is not None:
            self.limit_tree.remove_stale()
        if killed:
            log.warning("killed %d orphaned process group(s) of a previous agent", len(killed))
        return killed

    def end_orphan_containers(self) -> list[str]:
        """End and remove the containers of this node that no attempt of this agent owns (a killed
        agent's: their processes may outlive it under conmon). Nothing where podman is not installed."""
        if not containers.shutil.which("podman") or self.podman is None:
            return []
        with self._lock:
            procs = list(self._procs.values())
        owned = {containers.attempt_label(p.attempt_id, p.number) for p in procs}
        ended = []
        for name, label in self.podman.containers(self.node):
            if label not in owned:
                self._end_container(name)
                ended.append(name)
        # What a killed agent left of containers podman no longer lists: env files (the jobs' values)
        # and idmapped checkpoint mounts.
        mine = {p.container for p in procs if p.container}
        left = self.state_path.parent / "containers"
        for path in sorted(left.glob(f"gpuquota-{self.node}-a*")) if left.is_dir() else ():
            if path.name.rsplit(".", 1)[0] not in mine:
                self._end_container(path.name.rsplit(".", 1)[0])
        # ...and the download files of a pull it was making (a pull of this agent has none yet: the
        # orphans are ended before it takes a start).
        pulls = self.state_path.parent / "pulls"
        for path in sorted(pulls.glob("pull-*")) if pulls.is_dir() and not self._pulling else ():
            shutil.rmtree(path, ignore_errors=True)
        if ended:
            log.warning(
                "ended %d orphaned container(s) of a previous agent: %s", len(ended), ", ".join(ended)
            )
        return ended

    def _orphan_uid(self, entry: dict) -> int | None:
        """The uid a state entry names, if it is of our range and no other agent runs as it now."""
        uid = entry.get("uid")
        if not (self.uids and type(uid) is int and self.uids.first <= uid <= self.uids.last):
            return None
        if self.uids.held_elsewhere(uid):
            # The orphans are gone (the previous agent's fence watchdog) and another agent took the
            # uid for an attempt of its own: not ours to kill.
            log.warning("uid %d of a previous attempt now runs another agent's attempt; left alone", uid)
            return None
        return uid

    def _forget_orphan(self, entry: dict) -> None:
        """A dead attempt's working directory goes, and its checkpoint directory is set back (O(1): it
        belongs to its job's owner whatever attempt ran; its hold went with the orphans' processes)."""
        for key, root in (("workdir", self.work_root), ("checkpoint", self.checkpoint_root)):
            path = entry.get(key)
            if not isinstance(path, str):
                continue
            try:
                path = identity.inside(root, Path(path).name)
            except ValueError:
                continue
            if key == "workdir":
                identity.remove_tree(path)
            elif self.uids is not None:
                identity.return_checkpoint(path)

    def shutdown(self, grace_s: float = 5) -> None:
        """Stop everything (the agent is going away): SIGTERM, then kill every attempt after grace_s."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(p.popen.poll() is None for p in procs):
            time.sleep(0.05)
        for proc in procs:
            self._kill(proc)
            proc.popen.wait()
            if proc.stop_how is None:
                # An orderly stop (Ctrl-C, a service stop): its own outcome on the control side, re-queued,
                # never a lost host nor a strike toward holding the job (issue 42 item 2).
                proc.stop_how = "shutdown"
                proc.stop_detail = f"stopped at the orderly shutdown of the agent on {self.node}"
        self.poll()
        if self.cgroups is not None:
            self.cgroups.remove()
        if self.device_cgroups is not None:
            self.device_cgroups.remove()
        if self.limit_tree is not None:
            self.limit_tree.remove()


def _entries(path: Path) -> list[dict]:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def _under(path: Path, *roots: str) -> bool:
    real = Path(path).resolve()
    return any(real.is_relative_to(Path(r).resolve()) for r in roots)


def _orphan_cgroup(path) -> AttemptCgroup | None:
    """A cgroup named in the state file, only if it is an attempt cgroup of an agent (under a
    `gpuquota-*` directory in the cgroup v2 hierarchy): the file is ours, but trust it no further."""
    mount = cgroup2_mount()
    if not isinstance(path, str) or mount is None:
        return None
    p = Path(path)
    if not (
        p.is_relative_to(mount) and p.parent.name.startswith("gpuquota-") and p.name.startswith("attempt-")
    ):
        return None
    return AttemptCgroup(p) if p.is_dir() else None
