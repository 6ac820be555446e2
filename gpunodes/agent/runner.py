"""Runs attempts as child process groups on a GPU host, stops them gracefully, and reports back.

Each attempt runs in its own session (process group), so a stop reaches everything it spawned:
SIGTERM to the group, SIGKILL once the job's grace has run out. The process groups are written to a
state file, so that an agent that was killed and restarted kills the orphans it left behind. The
output goes to a per-attempt log file whose new bytes are shipped to the control side as they come.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

LOG_CHUNK_BYTES = 64 * 1024
# Finished reports are repeated in the heartbeats for this long (the most recent ones, up to a cap): a
# report lost with the broker (a Redis restart drops what it held) still reaches the control side.
FINISHED_RESEND_S = 120.0
FINISHED_RESEND_MAX = 500
# Report names (control-side tasks).
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
LOG = "jobs.tasks.attempt_log"

Report = Callable[[str, dict], None]


@dataclass(frozen=True)
class RunAs:
    """The unprivileged account jobs run as: uid, primary gid and supplementary groups all dropped
    (Popen's `user=` alone would leave the child in root's groups)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    @classmethod
    def resolve(cls, name: str | None) -> RunAs | None:
        """None: jobs run as the agent's own user. Raises ValueError for root, an unknown user, or a
        --run-as the agent cannot switch to (it is not root and is not that user)."""
        if not name:
            return None
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise ValueError(f"--run-as: no user named {name!r} on this host") from None
        if pw.pw_uid == 0:
            raise ValueError("--run-as must name an unprivileged user, not root")
        if os.geteuid() != 0 and os.geteuid() != pw.pw_uid:
            raise ValueError(f"--run-as {name}: the agent must be started as root to switch users")
        groups = tuple(g for g in os.getgrouplist(pw.pw_name, pw.pw_gid) if g != 0)
        return cls(pw.pw_name, pw.pw_uid, pw.pw_gid, groups, pw.pw_dir)

    def popen_kwargs(self) -> dict:
        if os.geteuid() == self.uid:
            return {}  # already that user
        return {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def env(self) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name, "HOME": self.home}


# The agent's own configuration never reaches a job: with the broker's or the database's URL a job
# could queue starts on any host or rewrite the database. Dropped by name, and anything that looks
# like a credential.
AGENT_ONLY_ENV = frozenset(
    {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "METRICS_TOKEN",
        "METRICS_ALLOWED_IPS",
        "DJANGO_SETTINGS_MODULE",
        "DJANGO_ENV",
        "ALLOWED_HOSTS",
        "CSRF_TRUSTED_ORIGINS",
    }
)
SECRET_MARKERS = ("SECRET", "PASSWORD", "PASSWD", "TOKEN", "CREDENTIAL", "PRIVATE_KEY", "API_KEY")


def job_base_env(environ) -> dict[str, str]:
    """The agent's environment as a job may see it: without the agent's configuration and secrets."""
    return {
        k: v
        for k, v in environ.items()
        if k not in AGENT_ONLY_ENV
        and not k.startswith(("CELERY_", "GPUQUOTA_"))
        and not any(marker in k.upper() for marker in SECRET_MARKERS)
    }


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
    kill_at: float | None = None
    log_sent: int = 0
    log_file: object = field(default=None, repr=False)


class Runner:
    def __init__(
        self,
        *,
        node: str,
        log_dir: Path,
        checkpoint_root: Path,
        report: Report,
        state_path: Path,
        workdir: Path | None = None,
        run_as: str | None = None,
        base_env: dict[str, str] | None = None,
    ) -> None:
        self.node = node
        self.log_dir = Path(log_dir)
        self.checkpoint_root = Path(checkpoint_root)
        self.report = report
        self.state_path = Path(state_path)
        self.workdir = Path(workdir) if workdir else None
        self.run_as = RunAs.resolve(run_as)
        self.base_env = job_base_env(base_env if base_env is not None else os.environ)
        self._lock = threading.RLock()
        self._procs: dict[int, Proc] = {}
        # Attempts told to stop before their start arrived: a late start for them is refused.
        self._tombstones: set[tuple[int, int]] = set()
        self._finished: set[tuple[int, int]] = set()
        self._recent: dict[tuple[int, int], tuple[float, dict]] = {}  # finished reports to repeat

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
            checkpoint_dir = self.checkpoint_root / f"job-{job_id}"
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
            if self.run_as is not None and os.geteuid() == 0:
                os.chown(checkpoint_dir, self.run_as.uid, self.run_as.gid)  # the job writes its checkpoints
            log_path = self.log_dir / f"job-{job_id}" / f"attempt-{number}.{self.node}.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            child_env = {
                **self.base_env,
                **(self.run_as.env() if self.run_as else {}),
                **(env or {}),
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus),
                "GPUQUOTA_JOB_ID": str(job_id),
                "GPUQUOTA_ATTEMPT": str(number),
                "GPUQUOTA_CHECKPOINT_DIR": str(checkpoint_dir),
                "GPUQUOTA_NODE": self.node,
                "GPUQUOTA_NODE_RANK": str(rank),
                "GPUQUOTA_NODES": ",".join(world or [self.node]),
                "PYTHONUNBUFFERED": "1",
            }
            # argv as given; a shell only when the job asked for it explicitly.
            argv = ["/bin/sh", "-c", command[0]] if use_shell else list(command)
            log_file = open(log_path, "ab")  # noqa: SIM115 - closed when the process ends
            try:
                popen = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=child_env,
                    cwd=self.workdir,
                    start_new_session=True,
                    **(self.run_as.popen_kwargs() if self.run_as else {}),
                )
            except OSError as e:
                log_file.write(f"gpuquota: could not start {argv[0]!r}: {e}\n".encode())
                log_file.close()
                self._finished.add(key)
                self._report_finished(
                    {
                        "attempt_id": attempt_id,
                        "number": number,
                        "node": self.node,
                        "how": "failed_to_start",
                        "exit_code": 127,
                        "detail": f"could not start {argv[0]!r}: {e.strerror}",
                    },
                )
                return "failed"
            deadline = time.monotonic() + max_runtime_s if max_runtime_s else None
            self._procs[attempt_id] = Proc(
                attempt_id, number, job_id, popen, log_path, grace_s, deadline, log_file=log_file
            )
            self._save_state()
        self.report(STARTED, {"attempt_id": attempt_id, "number": number, "node": self.node})
        return "started"

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
        self._signal(proc, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)

    @staticmethod
    def _signal(proc: Proc, sig: int) -> None:
        try:
            os.killpg(proc.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

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
                self._signal(proc, signal.SIGKILL)
                proc.kill_at = None
        for proc in done:
            # Whatever the leader left behind in its group goes with it.
            self._signal(proc, signal.SIGKILL)
            self._ship_log(proc, final=True)
            proc.log_file.close()
            with self._lock:
                self._procs.pop(proc.attempt_id, None)
                self._finished.add((proc.attempt_id, proc.number))
                self._save_state()
            code = proc.popen.returncode
            self._report_finished(
                {
                    "attempt_id": proc.attempt_id,
                    "number": proc.number,
                    "node": self.node,
                    "how": proc.stop_how or "exited",
                    "exit_code": code,
                },
            )

    def _ship_log(self, proc: Proc, final: bool = False) -> None:
        try:
            size = proc.log_path.stat().st_size
        except FileNotFoundError:
            return
        while proc.log_sent < size:
            with open(proc.log_path, "rb") as f:
                f.seek(proc.log_sent)
                data = f.read(LOG_CHUNK_BYTES)
            if not data:
                break
            self.report(
                LOG,
                {
                    "attempt_id": proc.attempt_id,
                    "number": proc.number,
                    "node": self.node,
                    "offset": proc.log_sent,
                    "text": data.decode("utf-8", "replace"),
                },
            )
            proc.log_sent += len(data)
            if not final:
                break

    def _report_finished(self, kwargs: dict) -> None:
        with self._lock:
            self._recent[(kwargs["attempt_id"], kwargs["number"])] = (time.monotonic(), kwargs)
        self.report(FINISHED, kwargs)

    def recent_finished(self) -> list[dict]:
        """The finished reports of the last FINISHED_RESEND_S seconds (newest first, capped), for the
        heartbeat: the control side ignores those it already has."""
        cutoff = time.monotonic() - FINISHED_RESEND_S
        with self._lock:
            for key in [k for k, (t, _) in self._recent.items() if t < cutoff]:
                del self._recent[key]
            newest = sorted(self._recent.values(), key=lambda v: v[0], reverse=True)
        return [kwargs for _, kwargs in newest[:FINISHED_RESEND_MAX]]

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
            }
            for p in self._procs.values()
        ]
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(self.state_path)

    def kill_orphans(self) -> list[int]:
        """Kill the process groups a previous agent on this host left running."""
        try:
            state = json.loads(self.state_path.read_text())
        except (FileNotFoundError, ValueError):
            return []
        killed = []
        for entry in state:
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
        """Stop everything (the agent is going away): SIGTERM, then SIGKILL after grace_s."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            self._signal(proc, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(p.popen.poll() is None for p in procs):
            time.sleep(0.05)
        for proc in procs:
            self._signal(proc, signal.SIGKILL)
            proc.popen.wait()
            if proc.stop_how is None:
                proc.stop_how = "unknown"
        self.poll()
