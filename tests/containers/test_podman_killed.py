"""Issue 39.5: the `podman run` the agent started for a container job killed with -9 (the host's fault,
not the job's). The container outlives it under conmon; the agent reads the container's state from
podman (not podman's exit status), stops the container as an agent's stop does (SIGTERM, SIGKILL after
the grace) and reports a host fault: re-queued with no strike, its lost work counted by its cause, an
event that says what happened. Exactly one copy runs at every moment. A job's own end stays its own:
one that kills itself with -9, or passes its memory limit, still fails as itself."""

import os
import signal
import threading
import time
import uuid

import pytest

from gpunodes.agent.containment import LimitPolicy
from tests.containers.conftest import needs_podman
from tests.security.agent_helpers import make_runner, uid_pool, wait_until


def start(runner, image, script, grace_s=30, **kw):
    return runner.start(
        attempt_id=1, number=1, job_id=7, command=[script], use_shell=True, image=image, grace_s=grace_s, **kw
    )


def _owner(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def processes_of(uid: int) -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid]


class Copies:
    """How many containers of the node podman lists, sampled all along (at most one, ever)."""

    def __init__(self, podman, node: str) -> None:
        self.podman, self.node, self.most, self.samples = podman, node, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            running = [
                name
                for name, _ in self.podman.containers(self.node)
                if (self.podman.state(name) or {}).get("status") == "running"
            ]
            self.most, self.samples = max(self.most, len(running)), self.samples + 1
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(30)
        return self.most


def kill_podman(runner, podman) -> str:
    """kill -9 of the `podman run` of attempt 1 (not of its container), without letting the agent poll:
    the container's state right after, as podman records it."""
    proc = runner._procs[1]
    os.kill(proc.popen.pid, signal.SIGKILL)
    proc.popen.wait(10)
    return (podman.state(proc.container) or {}).get("status", "")


@needs_podman
def test_podman_killed_under_a_running_container_stops_it_as_a_host_fault_with_one_copy(
    runner, reports, image, podman
):
    script = (
        "trap 'echo got-term; echo saved > $GPUQUOTA_CHECKPOINT_DIR/term; exit 143' TERM; "
        "echo up; while true; do sleep 0.1; done"
    )
    assert start(runner, image, script) == "started"
    copies = Copies(podman, runner.node)
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    # The sampler has seen the one copy run before podman is killed (its podman calls are slow on a busy
    # host: once it listed nothing until the agent had already stopped the container, and saw 0 copies).
    wait_until(lambda: copies.most == 1, timeout=30, what="the sampler to see the container run")
    proc = runner._procs[1]
    uid, hold = proc.user.uid, proc.checkpoint_hold.path
    # What happens: conmon keeps the container running after its podman died.
    assert kill_podman(runner, podman) == "running"
    done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the end")
    assert copies.stop() == 1 and copies.samples > 1
    # Stopped as an agent's stop is (SIGTERM first: it saved), reported as the host's fault.
    assert (hold / "term").exists(), "the container got no SIGTERM"
    assert done["how"] == "shutdown", done
    assert done["detail"] == (
        f"host fault: podman on {runner.node} was killed by signal 9 while its container still ran; the agent "
        "stopped it"
    ), done
    assert done["exit_code"] == 143, done  # the container's own, from podman's record
    assert "gpuquota: podman, which ran this container" in reports.log_of(1)
    # Nothing of it is left when the control side hears the end (and re-queues it): never two copies.
    assert podman.containers(runner.node) == []
    assert processes_of(uid) == []


@needs_podman
def test_podman_killed_under_a_job_that_ignores_sigterm_ends_it_after_the_grace(
    runner, reports, image, podman
):
    assert (
        start(runner, image, "trap '' TERM; echo up; while true; do sleep 0.1; done", grace_s=1) == "started"
    )
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    uid = runner._procs[1].user.uid
    assert kill_podman(runner, podman) == "running"
    began = time.monotonic()
    done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the kill")
    assert done["how"] == "shutdown" and done["detail"].startswith("host fault: podman"), done
    assert 1 <= time.monotonic() - began < 15
    assert podman.containers(runner.node) == [] and processes_of(uid) == []


@needs_podman
@pytest.mark.parametrize(("script", "code"), [("echo up; kill -9 $$", 137), ("echo up; exit 3", 3)])
def test_a_job_that_kills_itself_or_crashes_still_fails_as_itself(
    runner, reports, image, podman, script, code
):
    assert start(runner, image, script) == "started"
    done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the job's end")
    assert done["how"] == "exited" and done["exit_code"] == code, done
    assert "host fault" not in done.get("detail", "")
    assert podman.containers(runner.node) == []


@needs_podman
def test_a_job_past_its_memory_limit_still_fails_as_itself(root_dir, reports, image, podman):
    runner = make_runner(
        root_dir, reports, uids=uid_pool(), podman=podman, limits=LimitPolicy(memory_max_bytes=64 << 20)
    )
    runner.node = f"ct{uuid.uuid4().hex[:6]}"
    try:
        start(runner, image, 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo survived')
        done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the OOM kill")
        assert "survived" not in reports.log_of(1)
        assert done["how"] == "exited" and done["exit_code"] != 0, done
        assert "host fault" not in done.get("detail", "")
    finally:
        runner.shutdown(grace_s=1)
        for name, _ in podman.containers(runner.node):
            podman.remove(name)


# --- the control side: the host fault's report ---------------------------------------------------


@pytest.fixture
def job(bob, vision_share, nodes, monkeypatch, settings):
    from jobs.services import job_submit

    settings.NODE_AUTO_ACCEPT = True
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: None)
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": None)
    return job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["train"])


@pytest.mark.django_db
def test_the_host_fault_re_queues_the_job_with_no_strike_and_counts_its_lost_work(job, nodes):
    from jobs.choices import EventKind, JobState, LostCause, Outcome
    from jobs.tasks import attempt_finished
    from tests.jobs.test_checkpoints_and_lost_work import ago, running

    a = running(job, [("node-1", [0, 1])], started_ago_s=600)
    detail = "host fault: podman on node-1 was killed by signal 9 while its container still ran; the agent stopped it"
    assert attempt_finished(a.pk, 1, "node-1", "shutdown", 143, detail, ended_at=ago(0))
    a.refresh_from_db()
    # Its lost work is the host's fault's, not an orderly stop of the agent's (the lost-work tables).
    assert a.outcome == Outcome.AGENT_STOPPED and a.lost_cause == LostCause.HOST_FAULT
    assert a.gpu_seconds_lost == pytest.approx(2 * 600, abs=5)  # no checkpoint: all of its run
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.node_lost_streak == 0 and job.strike_nodes == []
    event = job.events.order_by("at", "id").last()
    assert event.kind == EventKind.AGENT_STOPPED
    assert event.reason.startswith(detail + " at "), event.reason
    assert "its host's fault, not the job's: no strike toward holding it; re-queued" in event.reason
    assert "orderly" not in event.reason
