"""The fault tests of issue 39.5 for a container job, besides those of test_podman_killed (podman killed), test_container_jobs
(the fence) and test_container_containment (an agent killed with -9): an agent frozen (SIGSTOP) past its
lease has its container job stopped by the fence watchdog, SIGTERM first (a chance to checkpoint), then
every process of it killed; the agent, thawed, reports the attempt fenced and removes the container."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid

from tests.containers.conftest import needs_podman
from tests.security.agent_helpers import uid_pool

pytestmark = needs_podman

FENCE_AFTER_S, GRACE_S = 1.5, 1.0

# A real Runner and fence watchdog in a process of their own (the test freezes it), renewing the lease
# every 0.2 s and polling its attempts; each report is a JSON line on stdout.
AGENT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from gpunodes.agent.fence import Watchdog
    from gpunodes.agent.identity import UidPool
    from gpunodes.agent.runner import Runner
    root, node, image, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    say = lambda name, kwargs: print(json.dumps([name, kwargs]), flush=True)
    runner = Runner(node=node, log_dir=root / "logs", checkpoint_root=root / "ckpt", work_root=root / "work",
                    report=say, state_path=root / "state" / "running.json", uids=UidPool(first, first + 99))
    dog = Watchdog(state_path=runner.state_path, tree=runner.cgroups.base if runner.cgroups else None,
                   uids=(first, first + 99), fence_after_s=float(sys.argv[5]), grace_s=float(sys.argv[6]))
    runner.lease_lapsed = dog.lapsed
    script = ("trap 'echo term > $GPUQUOTA_CHECKPOINT_DIR/term; exit 143' TERM; echo up; "
              "while true; do sleep 0.1; done")
    print(json.dumps(["start", runner.start(attempt_id=1, number=1, job_id=7, command=[script],
                                            use_shell=True, image=image)]), flush=True)
    print(json.dumps(["hold", str(runner._procs[1].checkpoint_hold.path), runner._procs[1].user.uid]), flush=True)
    while True:
        dog.renew()
        runner.poll()
        time.sleep(0.2)
    """
)


def _uid_of(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def processes_of(uid: int) -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) == uid]


def test_a_frozen_agent_has_its_container_job_fenced_then_removed_once_it_thaws(root_dir, image, podman):
    node = f"ct{uuid.uuid4().hex[:6]}"
    pool = uid_pool()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    agent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            AGENT,
            str(root_dir),
            node,
            image,
            str(pool.first),
            str(FENCE_AFTER_S),
            str(GRACE_S),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines: list = []

    def read() -> None:
        for line in agent.stdout:
            lines.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()

    def wait(predicate, timeout, what):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}: {lines}")

    try:
        wait(lambda: any(x[0] == "start" for x in lines), 60, "the start")
        assert ["start", "started"] in lines, lines
        _, hold, uid = next(x for x in lines if x[0] == "hold")
        wait(
            lambda: any(
                "up" in (x[1].get("text") or "") for x in lines if len(x) > 1 and isinstance(x[1], dict)
            ),
            30,
            "the job up",
        )
        assert processes_of(uid) and podman.containers(node)
        time.sleep(0.5)  # a few renewals
        agent.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        wait(lambda: not processes_of(uid), FENCE_AFTER_S + GRACE_S + 5, "the container's processes fenced")
        took = time.monotonic() - frozen
        assert FENCE_AFTER_S - 0.5 <= took < FENCE_AFTER_S + GRACE_S + 4, took
        assert os.path.exists(f"{hold}/term"), "the job got no SIGTERM before the kill"
        print(f"\nfrozen agent: its container job's processes ended {took:.1f} s after the freeze")
        agent.send_signal(signal.SIGCONT)
        done = wait(
            lambda: next((x[1] for x in lines if x[0] == "jobs.tasks.attempt_finished"), None),
            30,
            "the end report",
        )
        assert done["how"] == "fenced", done
        wait(lambda: podman.containers(node) == [], 30, "the container record removed")
    finally:
        if agent.poll() is None:
            agent.send_signal(signal.SIGCONT)
            agent.kill()
            agent.wait(10)
        for name, _ in podman.containers(node):
            podman.remove(name)
        for pid in processes_of(uid if "uid" in locals() else -2):
            os.kill(int(pid), signal.SIGKILL)
