"""The process manager of `make run`: starts every line of a Procfile, restarts one that dies, and stops
them all on Ctrl-C.

honcho stopped the whole product when one process died, and on Ctrl-C the processes got the terminal's
SIGINT and then honcho's SIGTERM, and had to be killed. Here each process runs in a session of its own
(the terminal's Ctrl-C reaches this manager only), a process that exits by itself is started again with
a log line (after 1 s, doubling up to 30 s while it keeps dying young), and Ctrl-C or SIGTERM sends each
process one SIGTERM, waits up to `--shutdown-timeout` seconds and kills only what is left, then exits 0.

    python -m config.procman Procfile.dev [--without demo]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from config.celery import ROOT_SAID_ENV

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
# A process that ran this long before dying is restarted after FIRST_BACKOFF_S again.
STABLE_AFTER_S = 60.0


def parse_procfile(text: str) -> dict[str, str]:
    procs = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        name, command = line.split(":", 1)
        procs[name.strip()] = command.strip()
    return procs


@dataclass
class Proc:
    name: str
    command: str
    popen: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = FIRST_BACKOFF_S
    restart_at: float | None = None
    reader: threading.Thread | None = field(default=None, repr=False)


class Manager:
    def __init__(self, procs: dict[str, str], *, shutdown_timeout: float = 20.0, out=None):
        self.procs = [Proc(name, command) for name, command in procs.items()]
        self.width = max([len(p.name) for p in self.procs] + [len("procman")])
        self.shutdown_timeout = shutdown_timeout
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self._stop = threading.Event()

    def say(self, name: str, text: str) -> None:
        with self._out_lock:
            self.out.write(f"{time.strftime('%H:%M:%S')} {name.ljust(self.width)} | {text}\n")
            self.out.flush()

    def _pump(self, proc: Proc, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.say(proc.name, raw.decode(errors="replace").rstrip("\n"))
        stream.close()

    def start(self, proc: Proc) -> None:
        proc.popen = subprocess.Popen(
            ["/bin/sh", "-c", f"exec {proc.command}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's Ctrl-C is ours to pass on, once
            env={**os.environ, ROOT_SAID_ENV: "1"} if os.geteuid() == 0 else None,
        )
        proc.started_at = time.monotonic()
        proc.restart_at = None
        proc.reader = threading.Thread(target=self._pump, args=(proc, proc.popen.stdout), daemon=True)
        proc.reader.start()
        self.say("procman", f"started {proc.name} (pid {proc.popen.pid}): {proc.command}")

    def check(self) -> None:
        """Restart what died by itself (after its back-off)."""
        now = time.monotonic()
        for proc in self.procs:
            if proc.restart_at is not None:
                if now >= proc.restart_at:
                    proc.restarts += 1
                    self.start(proc)
                continue
            code = proc.popen.poll()
            if code is None:
                continue
            if now - proc.started_at >= STABLE_AFTER_S:
                proc.backoff_s = FIRST_BACKOFF_S
            self.say(
                "procman",
                f"{proc.name} exited with code {code}; restarting it in {proc.backoff_s:g} s "
                f"(restart {proc.restarts + 1})",
            )
            proc.restart_at = now + proc.backoff_s
            proc.backoff_s = min(proc.backoff_s * 2, MAX_BACKOFF_S)

    def stop(self) -> None:
        running = [p for p in self.procs if p.popen is not None and p.popen.poll() is None]
        self.say("procman", f"stopping {len(running)} processes (SIGTERM, up to {self.shutdown_timeout:g} s)")
        for proc in running:
            try:
                proc.popen.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + self.shutdown_timeout
        for proc in running:
            try:
                proc.popen.wait(timeout=max(0.0, end - time.monotonic()))
                self.say("procman", f"{proc.name} stopped (code {proc.popen.returncode})")
            except subprocess.TimeoutExpired:
                self.say("procman", f"{proc.name} did not stop within {self.shutdown_timeout:g} s: killed")
                try:
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.popen.wait()
        for proc in self.procs:
            if proc.reader is not None:
                proc.reader.join(timeout=2)

    def run(self) -> int:
        def on_signal(signum, frame):
            self._stop.set()

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        terminal = take_the_terminal()
        if os.geteuid() == 0:  # said once here; each Celery worker and agent would say it in 8 lines
            self.say(
                "procman",
                "running as root, and so is every process below: fine for one person trying gpuquota; "
                "in production only the agents run as root (README, Production setup)",
            )
        try:
            for proc in self.procs:
                self.start(proc)
            while not self._stop.wait(0.2):
                self.check()
            self.stop()
        finally:
            give_back_the_terminal(terminal)
        return 0


def take_the_terminal() -> tuple[int, int] | None:
    """Make this process the terminal's foreground process group, so that Ctrl-C reaches the manager
    alone: not `make` above it (which would report the interrupt as its error) nor the processes below
    it (which get one SIGTERM from us instead). Returns what to give back, or None without a terminal."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR)
    except OSError:
        return None
    try:
        previous = os.tcgetpgrp(fd)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # a background group may then take the terminal
        os.setpgid(0, 0)
        os.tcsetpgrp(fd, os.getpgrp())
        return fd, previous
    except OSError:
        os.close(fd)
        return None


def give_back_the_terminal(terminal: tuple[int, int] | None) -> None:
    if terminal is None:
        return
    fd, previous = terminal
    try:
        os.tcsetpgrp(fd, previous)
    except OSError:
        pass
    os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m config.procman", description=__doc__.split("\n")[0])
    parser.add_argument("procfile", type=Path)
    parser.add_argument("--without", action="append", default=[], help="leave out this process (repeatable)")
    parser.add_argument("--shutdown-timeout", type=float, default=20.0)
    args = parser.parse_args(argv)
    procs = parse_procfile(args.procfile.read_text())
    for name in args.without:
        procs.pop(name, None)
    return Manager(procs, shutdown_timeout=args.shutdown_timeout).run()


if __name__ == "__main__":
    sys.exit(main())
