"""The fence watchdog: a job's processes never outlive their agent.

A small process of its own (`python -m gpunodes.agent.fence`), started by the agent, in a session of
its own, as the agent's user (root on a real host: it never changes uid, unlike the jobs, so nothing
resets what it watches). It holds the read end of a pipe whose only write end is the agent's:

- the agent dies (`kill -9`, a crash, the OOM killer): the kernel closes the pipe, the watchdog reads
  EOF at once and kills every attempt of the agent: every `attempt-*` cgroup of the agent's tree, and
  what the agent's state file lists (cgroup, process group, per-attempt uid: `containment.kill_attempt`,
  the same as a restarted agent does for orphans). A parent-death signal would not do: it is reset when
  a job changes uid, and it follows the thread, not the process, that forked;
- with a lease (`--fence-after S`): each line the agent writes renews it (the agent renews after every
  heartbeat the broker accepted). When no renewal came for S seconds (the agent frozen, or cut off from
  the broker), the watchdog fences: SIGTERM to every attempt, `--grace` seconds, then SIGKILL; the
  checkpoints are left alone. It fences once per lapse and watches again from the next renewal.

It imports nothing of Django and nothing beyond `containment`, so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpunodes.agent.containment import (
    AttemptCgroup,
    cgroup2_mount,
    kill_attempt,
    pids_of_uid,
    protect_from_oom,
)

log = logging.getLogger("gpunodes.agent.fence")
FENCED_FILE = "fenced"  # beside the state file: the attempts fenced, one "attempt_id/number" a line
# The state file of attempts the watchdog killed once the agent was gone: a restarted agent removes
# their working directories and takes their checkpoints back, but kills nothing by it.
ENDED_SUFFIX = ".ended"


@dataclass(frozen=True)
class Listed:
    key: str  # "attempt_id/number" where known, else the cgroup's path
    cgroup: AttemptCgroup | None
    pgid: int | None
    uid: int | None


def listed_attempts(state_path: Path, tree: Path | None, uids: tuple[int, int] | None) -> list[Listed]:
    """Every attempt the agent runs: its tree's `attempt-<id>-<number>` cgroups (also one the state file
    does not list yet) and the entries of its state file, each field checked (a cgroup under an agent's
    tree, a uid inside the range, a process group that is still the one the agent started)."""
    found: dict[str, Listed] = {}
    if tree is not None and tree.is_dir():
        for child in tree.iterdir():
            if child.is_dir() and child.name.startswith("attempt-"):
                key = "/".join(child.name.split("-")[1:3])
                found[str(child)] = Listed(key, AttemptCgroup(child), None, None)
    try:
        entries = json.loads(state_path.read_text())
    except (OSError, ValueError):
        entries = []
    mount = cgroup2_mount()
    for i, e in enumerate(entries if isinstance(entries, list) else []):
        if not isinstance(e, dict):
            continue
        cgroup = None
        path = e.get("cgroup")
        if isinstance(path, str) and mount is not None:
            p = Path(path)
            if (
                p.is_relative_to(mount)
                and p.parent.name.startswith("gpuquota-")
                and p.name.startswith("attempt-")
                and p.is_dir()
            ):
                cgroup = AttemptCgroup(p)
        uid = e.get("uid")
        if not (uids and type(uid) is int and uids[0] <= uid <= uids[1]):
            uid = None
        pgid = e.get("pgid")
        if not (
            type(pgid) is int and pgid > 1 and pgid != os.getpgrp() and _same_process(pgid, e.get("started"))
        ):
            pgid = None
        key = f"{e.get('attempt_id')}/{e.get('number')}"
        found[str(cgroup.path) if cgroup else f"entry-{i}"] = Listed(key, cgroup, pgid, uid)
    return list(found.values())


def fenced_keys(state_path: Path) -> set[str]:
    """The attempts ("attempt_id/number") the watchdog has fenced (the agent reports their ends as
    stopped, not as their own exits: the control side re-queues them)."""
    try:
        return set((state_path.parent / FENCED_FILE).read_text().split())
    except OSError:
        return set()


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _same_process(pid: int, started) -> bool:
    """The pid still names the process the agent started (not a reused pid)."""
    now = _start_time(pid)
    return now is not None and (started is None or now == started)


def kill_all(attempts: list[Listed], *, grace_s: float = 0.0) -> bool:
    """SIGTERM every attempt, wait up to `grace_s` for them to end, then SIGKILL what is left. Returns
    whether nothing of them is left that we know of."""
    if grace_s > 0:
        for a in attempts:
            cgroup, pgid = a.cgroup, a.pgid
            if cgroup is not None:
                cgroup.signal(signal.SIGTERM)
            if pgid is not None:
                try:
                    os.killpg(pgid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic() + grace_s
        while time.monotonic() < end and any(_alive(a) for a in attempts):
            time.sleep(0.1)
    done = True
    for a in attempts:
        done = kill_attempt(cgroup=a.cgroup, pgid=a.pgid, uid=a.uid) and done
    return done


def _alive(a: Listed) -> bool:
    if a.cgroup is not None and a.cgroup.populated():
        return True
    if a.uid is not None and pids_of_uid(a.uid):
        return True
    return a.pgid is not None and group_running(a.pgid)


def group_running(pgid: int) -> bool:
    """Whether a process of the group still runs (a zombie does not: its parent, the agent, may be
    frozen and unable to reap it)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[2] == str(pgid) and fields[0] != "Z":
                return True
    return False


def watch(
    fd: int,
    *,
    state_path: Path,
    tree: Path | None,
    uids: tuple[int, int] | None,
    fence_after_s: float,
    grace_s: float,
) -> str:
    """Watch the agent through `fd` until it goes away; returns why it stopped watching."""
    renewed = time.monotonic()
    armed = fence_after_s > 0
    buf = b""
    while True:
        timeout = max(0.0, renewed + fence_after_s - time.monotonic()) if armed else None
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            attempts = listed_attempts(state_path, tree, uids)
            log.warning(
                "fence: the agent's lease lapsed (no renewal for %.0f s): stopping %d attempt(s)",
                time.monotonic() - renewed,
                len(attempts),
            )
            with open(state_path.parent / FENCED_FILE, "a") as f:  # before any of them ends
                f.write("".join(f"{a.key}\n" for a in attempts))
            kill_all(attempts, grace_s=grace_s)
            armed = False  # until the next renewal
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            try:
                listed = state_path.read_bytes()
            except OSError:
                listed = None
            attempts = listed_attempts(state_path, tree, uids)
            if attempts:
                log.warning("fence: the agent is gone: killing %d attempt(s)", len(attempts))
            kill_all(attempts)
            end = time.monotonic() + 5
            while any(_alive(a) for a in attempts) and time.monotonic() < end:
                time.sleep(0.05)  # a killed process is gone only once it has exited
            if listed is not None and not any(_alive(a) for a in attempts):
                # Nothing of them is left: a restarted agent must not take their uids, free again and
                # perhaps another attempt's by then, for its orphans'. (Unless it has started already.)
                try:
                    if state_path.read_bytes() == listed:
                        state_path.replace(state_path.with_name(state_path.name + ENDED_SUFFIX))
                except OSError:
                    pass
            for a in attempts:
                if a.cgroup is not None:
                    a.cgroup.remove()
            if tree is not None:
                try:
                    tree.rmdir()  # the dead agent's tree, once empty
                except OSError:
                    pass
            return "agent gone"
        buf = (buf + chunk)[-4096:]
        if b"\n" in buf:
            buf = buf.rsplit(b"\n", 1)[1]
            renewed = time.monotonic()
            armed = fence_after_s > 0


class Watchdog:
    """The agent's side: start the watchdog, renew the lease, and nothing else (closing the pipe, or
    dying, is what tells it the agent is gone)."""

    def __init__(
        self,
        *,
        state_path: Path,
        tree: Path | None = None,
        uids: tuple[int, int] | None = None,
        fence_after_s: float = 0.0,
        grace_s: float = 0.0,
    ):
        import subprocess

        argv = [sys.executable, "-m", "gpunodes.agent.fence", "--state", str(state_path)]
        if tree is not None:
            argv += ["--tree", str(tree)]
        if uids is not None:
            argv += ["--uids", f"{uids[0]}-{uids[1]}"]
        argv += ["--fence-after", str(fence_after_s), "--grace", str(grace_s)]
        # Its own session (a signal to the agent's group does not reach it); stdin is the pipe whose one
        # write end this process holds (not inherited by anything else: close_fds).
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, start_new_session=True, cwd=Path(__file__).resolve().parents[2]
        )
        self.fence_after_s = fence_after_s
        self.renewed = time.monotonic()

    def renew(self) -> None:
        """The broker took a heartbeat: the lease runs FENCE_AFTER_S from now."""
        try:
            self.proc.stdin.write(b"renew\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            log.error("the fence watchdog is gone (exit %s): jobs are no longer fenced", self.proc.poll())
            return
        self.renewed = time.monotonic()

    def lapsed(self) -> bool:
        """Whether the watchdog may have fenced since the last renewal (the agent then takes its jobs'
        ends for a fence, not for their own exits)."""
        return self.fence_after_s > 0 and time.monotonic() - self.renewed >= self.fence_after_s

    def close(self, timeout: float = 10.0) -> None:
        """After the agent stopped its jobs: the watchdog sees EOF, finds nothing left, and exits."""
        import subprocess

        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", required=True, type=Path, help="the agent's running.json")
    parser.add_argument("--tree", type=Path, default=None, help="the agent's cgroup tree")
    parser.add_argument("--uids", default="", help="FIRST-LAST: the per-attempt uid range")
    parser.add_argument("--fence-after", type=float, default=0.0, help="lease in seconds (0: none)")
    parser.add_argument("--grace", type=float, default=0.0, help="SIGTERM to SIGKILL when fencing")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    protect_from_oom()  # it must outlive the jobs it kills when the host runs short of memory
    # The agent's group may be signalled as a whole (Ctrl-C, a process manager): the watchdog outlives
    # that and ends with the pipe, after the agent.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    uids = None
    if args.uids:
        first, _, last = args.uids.partition("-")
        uids = (int(first), int(last or first))
    why = watch(
        sys.stdin.fileno(),
        state_path=args.state,
        tree=args.tree,
        uids=uids,
        fence_after_s=args.fence_after,
        grace_s=args.grace,
    )
    log.info("fence watchdog: %s", why)
    return 0


if __name__ == "__main__":
    sys.exit(main())
