"""The process manager of `make run` (config/procman.py): a process that dies is restarted with a log
line while the others go on; Ctrl-C stops everything within the shutdown timeout and make exits 0."""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each says "ready" once its SIGTERM handler is in place.
GRACEFUL = (
    "python3 -c 'import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    'print("ready", flush=True); time.sleep(60)\''
)
STUBBORN = (
    "python3 -c 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    'print("ready", flush=True); time.sleep(60)\''
)


def wait_for_text(path: Path, text: str, timeout: float = 15.0, count: int = 1) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = path.read_text(errors="replace")
        if out.count(text) >= count:
            return out
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in the output:\n{path.read_text(errors='replace')}")


def start(argv: list[str], out: Path) -> subprocess.Popen:
    # In a session of its own, as `make run` is in a terminal: Ctrl-C is a SIGINT to the whole group.
    return subprocess.Popen(
        argv, cwd=ROOT, stdout=out.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )


def ctrl_c(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGINT)


# Where a test expects every process to stop by itself, the manager waits up to this long before it kills:
# a process that handles SIGTERM stops at once, but on 2 loaded cores "at once" once took over 3 s.
PATIENT_S = 20


def procman(procfile: Path, *extra: str, timeout: float = 3) -> list[str]:
    return [sys.executable, "-m", "config.procman", str(procfile), "--shutdown-timeout", str(timeout), *extra]


def test_a_process_that_dies_is_restarted_with_a_log_line_and_the_others_go_on(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"crasher: sh -c 'echo up; exit 3'\nsteady: {GRACEFUL}\n")
    out = tmp_path / "out"
    proc = start(procman(procfile), out)
    try:
        text = wait_for_text(out, "(restart 2)")
        assert "crasher exited with code 3; restarting it in 1 s (restart 1)" in text
        assert "crasher exited with code 3; restarting it in 2 s (restart 2)" in text
        assert text.count("started steady") == 1
        assert proc.poll() is None
    finally:
        ctrl_c(proc)
        assert proc.wait(timeout=10) == 0


def test_ctrl_c_stops_every_process_gracefully_and_exits_0(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"one: {GRACEFUL}\ntwo: {GRACEFUL}\n")
    out = tmp_path / "out"
    proc = start(procman(procfile, timeout=PATIENT_S), out)
    wait_for_text(out, "| ready", count=2)
    started = time.monotonic()
    ctrl_c(proc)
    assert proc.wait(timeout=PATIENT_S + 10) == 0
    assert time.monotonic() - started < PATIENT_S / 2  # stopped by itself, not at the timeout
    text = out.read_text()
    assert "one stopped (code 0)" in text and "two stopped (code 0)" in text
    assert "killed" not in text


def test_a_process_that_ignores_sigterm_is_killed_after_the_shutdown_timeout(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"stubborn: {STUBBORN}\n")
    out = tmp_path / "out"
    proc = start(procman(procfile), out)
    wait_for_text(out, "| ready")
    started = time.monotonic()
    ctrl_c(proc)
    assert proc.wait(timeout=10) == 0
    assert 2.5 < time.monotonic() - started < 6
    assert "stubborn did not stop within 3 s: killed" in out.read_text()


def test_a_left_out_process_is_not_started(tmp_path):
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"web: {GRACEFUL}\ndemo: {GRACEFUL}\n")
    out = tmp_path / "out"
    proc = start(procman(procfile, "--without", "demo"), out)
    wait_for_text(out, "started web")
    time.sleep(0.3)
    ctrl_c(proc)
    proc.wait(timeout=10)
    assert "started demo" not in out.read_text()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_ctrl_c_in_a_terminal_stops_make_run_without_an_error(tmp_path):
    """`make run` in a terminal and Ctrl-C typed there: every process stops and make exits 0 without
    reporting an error or an interrupt."""
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"one: {GRACEFUL}\ntwo: {GRACEFUL}\n")
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"run:\n\tcd {ROOT} && {' '.join(procman(procfile, timeout=PATIENT_S))}\n")
    pid, master = pty.fork()
    if pid == 0:  # the child: a session of its own with the pty as its terminal, like a shell's job
        os.execvp("make", ["make", "-s", "-f", str(makefile), "run"])
    out = b""

    def read_until(text: bytes, timeout: float = 15.0, count: int = 1) -> None:
        nonlocal out
        end = time.monotonic() + timeout
        while out.count(text) < count:
            assert time.monotonic() < end, out.decode(errors="replace")
            if select.select([master], [], [], 0.1)[0]:
                try:
                    out += os.read(master, 4096)
                except OSError:  # the child closed the terminal
                    break

    try:
        read_until(b"| ready", count=2)
        os.write(master, b"\x03")  # Ctrl-C
        read_until(b"two stopped", timeout=PATIENT_S + 10)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")
    text = out.decode(errors="replace")
    assert "one stopped (code 0)" in text and "two stopped (code 0)" in text
    assert "Error" not in text and "Interrupt" not in text and "killed" not in text


@pytest.mark.skipif(os.geteuid() != 0, reason="Celery's root warning is said only to root")
def test_running_as_root_is_said_once_not_by_every_celery_process(tmp_path):
    # What each Celery worker (and agent) does at start: warn, in eight lines, when it runs as root.
    worker = (
        f"{sys.executable} -c 'import config; from celery.platforms import check_privileges; "
        'check_privileges(["json"]); print("checked", flush=True); import time; time.sleep(60)\''
    )
    procfile = tmp_path / "Procfile"
    procfile.write_text(f"worker_1: {worker}\nworker_2: {worker}\n")
    out = tmp_path / "out"
    proc = start(procman(procfile), out)
    try:
        text = wait_for_text(out, "| checked", count=2)
    finally:
        ctrl_c(proc)
        assert proc.wait(timeout=10) == 0
    assert text.count("running as root, and so is every process below") == 1
    assert "superuser privileges" not in text and "SecurityWarning" not in text


@pytest.mark.skipif(os.geteuid() != 0, reason="Celery's root warning is said only to root")
def test_a_celery_worker_outside_make_run_still_warns_as_root():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import config; from celery.platforms import check_privileges; check_privileges(['json'])",
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "GPUQUOTA_ROOT_SAID"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "superuser privileges" in done.stderr
