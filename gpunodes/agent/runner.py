"""Runs attempts on a GPU host, stops them gracefully, and reports back (each start and end is written
to the durable outbox, outbox.py, before it is sent).

Each attempt runs in its own session, its own cgroup (containment.py) and, on a root agent, as a uid of
its own in a private working directory (identity.py). A stop sends SIGTERM to everything of the attempt,
and once the job's grace has run out, or when the attempt ends in any way, the whole cgroup is killed:
no `setsid` child outlives it. The attempts are written to a state file, so that an agent that was
killed and restarted kills the orphans it left behind. The output goes to a per-attempt log file (0600,
the agent's) whose new bytes are shipped to the control side as they come, up to a cap.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpunodes.agent import identity
from gpunodes.agent.containment import (
    AttemptCgroup,
    AttemptDevices,
    CgroupTree,
    DeviceTree,
    cgroup2_mount,
    device_number,
    kill_attempt,
)
from gpunodes.agent.fence import fenced_keys
from gpunodes.agent.identity import JobUser, UidPool
from gpunodes.agent.outbox import Outbox

log = logging.getLogger(__name__)

LOG_CHUNK_BYTES = 64 * 1024
# What one attempt's log may hold on the control side: the first half and the last half of this are
# kept, what lies between is dropped with a note (a job printing without end fills no database).
LOG_CAP_BYTES = 8 * 1024 * 1024
# Report names (control-side tasks).
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
LOG = "jobs.tasks.attempt_log"
# The fields of a started/finished report that its control-side task takes; the outbox entry of an end
# also keeps the job id and `log_ranges`, the byte ranges of the log that were shipped (the control side
# asks for the gaps it finds: reship_log).
REPORT_FIELDS = frozenset({"attempt_id", "number", "node", "how", "exit_code", "detail"})

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
    stop_how: str | None = None  # "stopped" (asked to) or "timed_out"
    stop_detail: str = ""  # the end's reason in words, where the control side cannot tell it (shutdown)
    kill_at: float | None = None
    log_sent: int = 0
    log_file: object = field(default=None, repr=False)
    user: JobUser | None = None
    cgroup: AttemptCgroup | None = None
    workdir: Path | None = None
    devices: AttemptDevices | None = None


class Runner:
    """The attempts of one host. `uids`: a root agent's per-attempt uid range (None: jobs run as the
    agent's own user, which only a non-root agent started with the explicit opt-out does, or a test).
    `cgroups`: "auto" makes a cgroup per attempt where the host allows (containment.py)."""

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
    ) -> None:
        self.node = node
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
        # The device node of each of the host's GPUs (index -> /dev/nvidiaN): an attempt is denied the
        # ones it was not given, where the host has device cgroups (containment.DeviceTree).
        self.gpu_devices = dict(gpu_devices or {})
        if device_cgroups == "auto":
            device_cgroups = DeviceTree.create(f"{node}-{os.getpid()}") if self.gpu_devices else None
        self.device_cgroups: DeviceTree | None = device_cgroups
        # Who still uses a GPU (NVML: inventory.gpu_processes), checked before GPUs are handed out.
        self.gpu_holders = gpu_holders
        self.log_cap_bytes = log_cap_bytes
        # A /tmp and /dev/shm of each attempt's own hide the host's: not where the jobs' directories are.
        shadowed = [p for p in (self.work_root, self.checkpoint_root) if _under(p, "/tmp", "/dev/shm")]
        self.private_tmp = uids is not None and not shadowed
        if uids is not None and shadowed:
            log.warning("%s is under /tmp: attempts share the host's /tmp and /dev/shm", shadowed[0])
        self._said_host_tmp = False  # whether an attempt keeping the host's /tmp was logged
        # The control side's word on this node (agent/tasks.py node_state): starts only while READY.
        self.node_state = "READY"
        self.gpu_indexes: set[int] | None = None  # the host's GPUs, where the agent knows them
        self._lock = threading.RLock()
        self._procs: dict[int, Proc] = {}
        # Attempts told to stop before their start arrived: a late start for them is refused.
        self._tombstones: set[tuple[int, int]] = set()
        self._finished: set[tuple[int, int]] = set()
        # Whether the agent's lease lapsed (agent/fence.py: its watchdog fences the jobs): no start then.
        self.lease_lapsed: Callable[[], bool] = lambda: False

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
    ) -> str:
        key = (attempt_id, number)
        with self._lock:
            if attempt_id in self._procs or key in self._finished:
                return "duplicate"
            if key in self._tombstones:
                return "refused"
            if self.lease_lapsed():
                self.refuse(attempt_id, number, f"{self.node} holds no lease (its jobs were fenced)")
                return "refused"
            held = self._gpus_in_use(list(gpus))
            if held:
                why = "; ".join(
                    f"GPU {i} is still used by pid {', '.join(map(str, p))}" for i, p in held.items()
                )
                log.error("refusing attempt %s/%s: %s", attempt_id, number, why)
                self._finished.add(key)
                self._report_finished(
                    {
                        "attempt_id": attempt_id,
                        "number": number,
                        "node": self.node,
                        "how": "unknown",
                        "exit_code": None,
                        "detail": f"refused: {why}",
                    },
                )
                return "refused"
            user = cgroup = workdir = devices = None
            try:
                user = self.uids.acquire() if self.uids is not None else None
                checkpoint_dir = identity.checkpoint_dir(self.checkpoint_root, job_id, user)
                workdir = identity.make_workdir(self.work_root, f"{self.node}-a{attempt_id}-{number}", user)
                private_tmp = None
                if user is not None and self.private_tmp:  # the attempt's own /tmp and /dev/shm
                    private_tmp = workdir / "tmp"
                    private_tmp.mkdir(mode=0o700)
                    os.chown(private_tmp, user.uid, user.gid)
                log_path = identity.inside(self.log_dir, f"job-{job_id}")
                log_path.mkdir(mode=0o700, exist_ok=True)
                log_path = identity.inside(log_path, f"attempt-{number}.{self.node}.log")
                if self.cgroups is not None:
                    cgroup = self.cgroups.attempt(f"attempt-{attempt_id}-{number}")
                if self.device_cgroups is not None:
                    deny = [device_number(p) for i, p in self.gpu_devices.items() if i not in gpus]
                    devices = self.device_cgroups.attempt(
                        f"attempt-{attempt_id}-{number}", [d for d in deny if d]
                    )
            except (OSError, ValueError, RuntimeError) as e:  # RuntimeError: no free uid
                self._cleanup(user, cgroup, workdir, devices)
                log.error("refusing attempt %s/%s: %s", attempt_id, number, e)
                self._finished.add(key)
                self._report_finished(
                    {
                        "attempt_id": attempt_id,
                        "number": number,
                        "node": self.node,
                        "how": "failed_to_start",
                        "exit_code": 127,
                        "detail": f"the host could not prepare the attempt: {e}",
                    },
                )
                return "failed"
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
                "PYTHONUNBUFFERED": "1",
            }
            # argv as given; a shell only when the job asked for it explicitly.
            argv = ["/bin/sh", "-c", command[0]] if use_shell else list(command)
            fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            log_file = os.fdopen(fd, "ab")
            enters = [f.enter_fn() for f in (cgroup, devices) if f is not None]
            if private_tmp is not None:
                # A job whose program, interpreter or directories live under the host's /tmp (a
                # checkout there, say) would not find them behind its own /tmp: it keeps the host's.
                needed = [self.workdir, checkpoint_dir, *identity.paths_in(argv, child_env.get("PATH", ""))]
                bind_tmp = not any(identity.under_tmp(p) for p in needed if p)
                if not bind_tmp:
                    # Said once per agent: with a checkout under /tmp (`make run` there) it is every job.
                    log.log(
                        logging.DEBUG if self._said_host_tmp else logging.WARNING,
                        "attempt %s of job %s: its files are under /tmp; it keeps the host's /tmp%s",
                        number,
                        job_id,
                        "" if self._said_host_tmp else " (so may other jobs: this is said once)",
                    )
                    self._said_host_tmp = True
                enters.append(identity.private_tmp_fn(private_tmp, bind_tmp=bind_tmp))

            def enter() -> None:
                for fn in enters:
                    fn()

            preexec = identity.drop_privileges_fn(user, before=enter) if user else (enter if enters else None)
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    cwd=self.workdir or workdir,
                    start_new_session=True,
                    umask=0o077,
                    preexec_fn=preexec,  # noqa: PLW1509 - only os calls: safe with threads
                )
            except (OSError, subprocess.SubprocessError) as e:
                why = getattr(e, "strerror", None) or str(e)
                log_file.write(f"gpuquota: could not start {argv[0]!r}: {why}\n".encode())
                log_file.close()
                self._cleanup(user, cgroup, workdir, devices)
                self._finished.add(key)
                self._report_finished(
                    {
                        "attempt_id": attempt_id,
                        "number": number,
                        "node": self.node,
                        "how": "failed_to_start",
                        "exit_code": 127,
                        "detail": f"could not start {argv[0]!r}: {why}",
                    },
                )
                return "failed"
            deadline = time.monotonic() + max_runtime_s if max_runtime_s else None
            self._procs[attempt_id] = Proc(
                attempt_id,
                number,
                job_id,
                popen,
                log_path,
                grace_s,
                deadline,
                log_file=log_file,
                user=user,
                cgroup=cgroup,
                workdir=workdir,
                devices=devices,
            )
            self._save_state()
        self._report_durably(STARTED, {"attempt_id": attempt_id, "number": number, "node": self.node})
        return "started"

    def _gpus_in_use(self, gpus: list[int]) -> dict[int, list[int]]:
        """The given GPUs a process still uses (NVML), which are not handed out: with a cgroup per
        attempt nothing of an earlier attempt is left, so a holder is something the operator must look
        at; the start is refused and logged, and the control side re-queues the attempt."""
        if self.gpu_holders is None or not gpus:
            return {}
        return {i: pids for i, pids in self.gpu_holders(gpus).items() if pids}

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
                "how": "unknown",
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
    ) -> None:
        """After an attempt: nothing of it runs, its cgroups and working directory are gone, its uid is
        free again. A uid whose processes could not all be killed is not handed out again."""
        empty = kill_attempt(cgroup=cgroup, pgid=None, uid=user.uid if user else None)
        if cgroup is not None and empty:
            cgroup.remove()
        if devices is not None and empty:
            devices.remove()
        if workdir is not None:
            identity.remove_tree(workdir)
        if user is not None:
            if empty:
                self.uids.release(user.uid)
            else:
                log.error("uid %d still has processes; it is not handed out again", user.uid)

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

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        """A signal to the attempt's process group and, where it has one, to everything in its cgroup
        (a `setsid` child gets its SIGTERM too)."""
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        if proc.cgroup is not None:
            proc.cgroup.signal(sig)

    @staticmethod
    def _kill(proc: Proc) -> bool:
        return kill_attempt(cgroup=proc.cgroup, pgid=proc.popen.pid, uid=proc.user.uid if proc.user else None)

    def fence(self) -> list[tuple[int, int]]:
        """Kill every attempt of this host at once, without a grace (the agent lost its right to run
        them). Their ends are reported by the next poll."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.stop_how is None:
                proc.stop_how = "stopped"
            self._kill(proc)
        return [(p.attempt_id, p.number) for p in procs]

    # --- the reaper ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Called every fraction of a second: ship new log bytes, enforce deadlines, reap exits."""
        now = time.monotonic()
        done: list[Proc] = []
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            self._ship_log(proc)
            code = proc.popen.poll()
            if code is not None:
                done.append(proc)
                continue
            if proc.stop_how is None and proc.deadline is not None and now >= proc.deadline:
                log.info("attempt %s ran past max_runtime_s; stopping it", proc.attempt_id)
                self._terminate(proc, "timed_out", proc.grace_s)
            elif proc.kill_at is not None and now >= proc.kill_at:
                self._kill(proc)
                proc.kill_at = None
        for proc in done:
            # Whatever the leader left behind (its group, its cgroup, its uid) goes with it.
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._cleanup(proc.user, proc.cgroup, proc.workdir, proc.devices)
            self._ship_log(proc, final=True)
            proc.log_file.close()
            with self._lock:
                self._procs.pop(proc.attempt_id, None)
                self._finished.add((proc.attempt_id, proc.number))
                self._save_state()
            code = proc.popen.returncode
            how = proc.stop_how or "exited"
            if proc.stop_how is None and f"{proc.attempt_id}/{proc.number}" in fenced_keys(self.state_path):
                how = "stopped"  # fenced by the watchdog, not its own end: the job is re-queued
            report = {
                "attempt_id": proc.attempt_id,
                "number": proc.number,
                "node": self.node,
                "how": how,
                "exit_code": code,
                "job_id": proc.job_id,
                "log_ranges": self._shipped_ranges(proc.log_sent),
            }
            if proc.stop_detail:
                report["detail"] = proc.stop_detail
            self._report_finished(report)

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

    def _ship_log(self, proc: Proc, final: bool = False) -> None:
        """Ship new log bytes: at most the first half of `log_cap_bytes` as they come, and at the end the
        last half, with a line that says how many bytes in between were dropped."""
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
            log.warning("cannot send the log of attempt %s/%s again: %s", k["attempt_id"], k["number"], e)
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
                        "the log of attempt %s/%s is shorter than shipped", k["attempt_id"], k["number"]
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
            with contextlib.suppress(OSError):
                job_dir.rmdir()  # only when empty
        return removed

    # --- state across restarts -------------------------------------------------------------------

    def running(self) -> list[tuple[int, int]]:
        with self._lock:
            return [(p.attempt_id, p.number) for p in self._procs.values()]

    def _save_state(self) -> None:
        state = [
            {
                "attempt_id": p.attempt_id,
                "number": p.number,
                "pgid": p.popen.pid,
                "started": _process_start(p.popen.pid),
                "cgroup": str(p.cgroup.path) if p.cgroup else None,
                "uid": p.user.uid if p.user else None,
                "workdir": str(p.workdir) if p.workdir else None,
            }
            for p in self._procs.values()
        ]
        self.state_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    def kill_orphans(self) -> list[int]:
        """Kill what a previous agent on this host left running: its attempts' cgroups, their uids, their
        process groups."""
        try:
            state = json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        killed = []
        for entry in state:
            cgroup = _orphan_cgroup(entry.get("cgroup"))
            uid = entry.get("uid")
            if not (self.uids and type(uid) is int and self.uids.first <= uid <= self.uids.last):
                uid = None
            if uid is not None and self.uids.held_elsewhere(uid):
                # The orphans are gone (the previous agent's fence watchdog) and another agent took
                # the uid for an attempt of its own: not ours to kill.
                log.warning("uid %d of a previous attempt now runs another agent's attempt; left alone", uid)
                uid = None
            if cgroup is not None or uid is not None:
                kill_attempt(cgroup=cgroup, pgid=None, uid=uid)
                if cgroup is not None:
                    cgroup.remove()
                    with contextlib.suppress(OSError):
                        cgroup.path.parent.rmdir()  # the previous agent's tree, once empty
            workdir = entry.get("workdir")
            if isinstance(workdir, str):
                with contextlib.suppress(ValueError):
                    identity.remove_tree(identity.inside(self.work_root, Path(workdir).name))
            pgid = int(entry["pgid"])
            if pgid <= 1 or pgid == os.getpgrp():
                continue
            started = entry.get("started")
            if started is not None and _process_start(pgid) not in (started, None):
                # The leader is gone and its pid names another process now, which is not ours. (The
                # kernel does not reuse a pid while a group of that id lives, so none of ours is left.)
                log.warning("pid %d was reused since the previous agent; not killing it", pgid)
                continue
            try:
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
            except (ProcessLookupError, PermissionError):
                pass
        self.state_path.unlink(missing_ok=True)
        if killed:
            log.warning("killed %d orphaned process group(s) of a previous agent", len(killed))
        return killed

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
                proc.stop_how = "unknown"  # re-queued; said plainly, not as a host that lost it
                proc.stop_detail = f"stopped at the shutdown of the agent on {self.node}"
        self.poll()
        if self.cgroups is not None:
            self.cgroups.remove()
        if self.device_cgroups is not None:
            self.device_cgroups.remove()


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
