"""`make run`'s processes (Procfile.dev under config.procman): a crashed one is restarted while the
others go on, and all stop on Ctrl-C within the shutdown timeout, each by itself: none has to be
killed, an agent with a running job included (honcho stopped everything when one process died, and
had to SIGKILL the prefork control worker, stuck in billiard's pool shutdown, and an agent)."""

import os
import signal
import socket
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpunodes.choices import NodeState
from gpunodes.models import Node
from jobs.choices import JobState
from jobs.models import Job
from jobs.services import job_submit
from quotas.choices import Role
from quotas.models import Membership, Share, ShareCapacity, Team
from tests.live.conftest import ROOT, wait_for

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SHUTDOWN_TIMEOUT_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_crashed_process_is_restarted_and_ctrl_c_stops_every_process_without_a_kill(
    cluster, tmp_path, django_user_model
):
    team = Team.objects.create(name="t", slug="t")
    user = django_user_model.objects.create_user("u", password="pw-123456")
    Membership.objects.create(team=team, user=user, role=Role.MEMBER)
    share = Share.objects.create(team=team, name="s")
    ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=8)

    port = free_port()
    procfile = (ROOT / "Procfile.dev").read_text()
    assert "127.0.0.1:${PORT:-8000}" in procfile  # make run's PORT, 8000 unless given
    procfile = procfile.replace("127.0.0.1:${PORT:-8000}", f"127.0.0.1:{port}")
    procfile = procfile.replace("var/celerybeat-schedule", str(tmp_path / "beat-schedule"))
    lines = [line for line in procfile.splitlines() if line and not line.startswith("demo:")]
    (tmp_path / "Procfile").write_text("\n".join(lines) + "\n")
    cluster.env["PATH"] = f"{Path(sys.executable).parent}:{cluster.env['PATH']}"
    manager = cluster._spawn(
        "procman",
        [
            sys.executable,
            "-m",
            "config.procman",
            str(tmp_path / "Procfile"),
            "--shutdown-timeout",
            str(SHUTDOWN_TIMEOUT_S),
        ],
    )
    wait_for(lambda: Node.objects.filter(state=NodeState.READY).count() == 2, 90, every=0.5, what="2 agents")
    wait_for(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200,
        60,
        every=0.5,
        what="the web server",
    )
    job = job_submit(
        user=user,
        share=share,
        gpus=1,
        gpu_type="a10g",
        command=["sleep", "120"],
    )
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, 60, what="a running job")

    # The control worker crashes: it is started again, with a log line, and the rest goes on.
    log_path = tmp_path / "procman.log"
    worker_pid = int(log_path.read_text().split("started worker (pid ", 1)[1].split(")", 1)[0])
    os.kill(worker_pid, signal.SIGKILL)
    wait_for(
        lambda: "worker exited with code -9; restarting it in 1 s (restart 1)" in log_path.read_text(), 30
    )
    again = job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["sleep", "120"])
    wait_for(
        lambda: Job.objects.get(pk=again.pk).state == JobState.RUNNING, 60, what="a job after the restart"
    )

    started = time.monotonic()
    manager.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal does (the manager takes it alone)
    assert manager.wait(timeout=SHUTDOWN_TIMEOUT_S + 10) == 0
    took = time.monotonic() - started
    log = (tmp_path / "procman.log").read_text(errors="replace")
    stopped = [line for line in log.splitlines() if "procman |" in line and " stopped (code" in line]
    print(f"stopped in {took:.1f} s:", *stopped, sep="\n  ")
    assert "killed" not in log, log[-3000:]
    assert {line.split("procman |")[1].split()[0] for line in stopped} == {
        "web",
        "worker",
        "whatif",
        "beat",
        "agent_1",
        "agent_2",
    }
    assert took < SHUTDOWN_TIMEOUT_S
