"""A job that names an image runs in it with podman, as its attempt's own uid, with its checkpoint
directory and working directory mounted and the rest read-only, its own processes only, and leaves no
container behind."""

import os
import time

from tests.containers.conftest import needs_podman
from tests.security.agent_helpers import wait_until

pytestmark = needs_podman


def start(runner, image, script, attempt_id=1, job_id=7, **kw):
    return runner.start(
        attempt_id=attempt_id, number=1, job_id=job_id, command=[script], use_shell=True, image=image, **kw
    )


def test_a_container_job_runs_as_its_attempts_uid_with_its_directories(runner, reports, image, podman):
    script = (
        'id -u; id -g; echo "ckpt=$GPUQUOTA_CHECKPOINT_DIR cvd=$CUDA_VISIBLE_DEVICES seed=$SEED"; '
        'echo w > "$GPUQUOTA_CHECKPOINT_DIR/step-1" && echo ckpt-ok; '
        "touch /bin/x 2>/dev/null || echo root-read-only; "
        'touch "$GPUQUOTA_WORKDIR/f" && echo workdir-ok; ps -o pid | wc -l'
    )
    assert start(runner, image, script, gpus=[1], env={"SEED": "3"}) == "started"
    proc = runner._procs[1]
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the container job")
    out = reports.log_of(1)
    assert done["how"] == "exited" and done["exit_code"] == 0, out
    lines = out.splitlines()
    assert str(proc.user.uid) in lines and str(proc.user.gid) in lines, out
    assert f"ckpt={proc.checkpoint_hold.path} cvd=1 seed=3" in out
    for word in ("ckpt-ok", "root-read-only", "workdir-ok"):
        assert word in out, out
    assert podman.containers(runner.node) == []  # removed with the attempt


def test_a_failed_pull_ends_the_attempt_with_the_registrys_reason_once(runner, reports, registry):
    assert start(runner, f"{registry}/nothing/here:1", "true") == "failed"
    done = reports.finished(1)
    assert done["how"] == "failed_to_start"
    assert done["detail"].startswith(f"could not pull image {registry}/nothing/here:1: reading manifest"), (
        done
    )
    assert done["detail"].endswith(": manifest unknown"), done


def test_an_image_is_pulled_from_the_registry_before_the_attempt_starts(
    runner, reports, registry, image, podman
):
    pushed = f"{registry}/team/bb:1"
    podman._run("tag", image, pushed)
    assert podman._run("push", "--tls-verify=false", pushed).returncode == 0
    podman._run("rmi", pushed)
    assert not podman.has_image(pushed)
    assert start(runner, pushed, "echo inside", max_runtime_s=60) == "started"
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the pulled job")
    out = reports.log_of(1)
    assert done["how"] == "exited" and "inside" in out, out
    assert f"pulling image {pushed}" in out and f"pulled image {pushed}" in out
    # ...and the control side heard the pull as it went (the job's page shows it while it waits).
    said = [k["text"] for k in reports.of("jobs.tasks.attempt_pulling")]
    # (the busybox layer's size, from the registry's manifest, before the first byte)
    assert said[0].startswith(f"pulling image {pushed}, 0 of ") and said[0].endswith(" MB"), said
    assert said[-1].startswith(f"pulled image {pushed}: "), said
    podman._run("rmi", pushed)


def test_a_stop_reaches_the_container_and_the_grace_ends_it(runner, reports, image, podman):
    script = "trap 'echo got-term; exit 7' TERM; echo up; while true; do sleep 0.1; done"
    start(runner, image, script)
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    runner.stop(attempt_id=1, number=1, grace_s=5)
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the stop")
    assert done["how"] == "stopped" and "got-term" in reports.log_of(1), reports.log_of(1)
    assert podman.containers(runner.node) == []


def test_a_job_that_ignores_sigterm_is_killed_after_its_grace(runner, reports, image, podman):
    start(runner, image, "trap '' TERM; echo up; while true; do sleep 0.1; done")
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    began = time.monotonic()
    runner.stop(attempt_id=1, number=1, grace_s=1)
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the kill")
    assert done["how"] == "stopped" and time.monotonic() - began < 10
    assert podman.containers(runner.node) == []


def test_a_fence_kills_the_container(runner, reports, image, podman):
    start(runner, image, "echo up; exec sleep 600")
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    runner.fence()
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the fence")
    assert done["how"] == "fenced"
    assert podman.containers(runner.node) == []


def test_a_gang_rank_sees_the_rendezvous_and_the_hosts_network(runner, reports, image):
    meet = {
        "master_addr": "10.0.0.1",
        "master_port": 29512,
        "hosts": ["10.0.0.1", "10.0.0.2"],
        "world_size": 4,
    }
    script = (
        'echo "$MASTER_ADDR:$MASTER_PORT $WORLD_SIZE $NODE_RANK $NNODES $GPUQUOTA_HOSTS"; ls /sys/class/net'
    )
    start(runner, image, script, gpus=[0, 1], rank=1, world=["other", runner.node], rendezvous=meet)
    done = wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the rank")
    out = reports.log_of(1).splitlines()
    assert done["exit_code"] == 0, out
    assert out[0] == "10.0.0.1:29512 4 1 2 10.0.0.1,10.0.0.2"
    assert sorted(out[1:]) == sorted(os.listdir("/sys/class/net"))  # the host's interfaces: its network


def test_the_agents_shutdown_ends_its_containers(runner, reports, image, podman):
    start(runner, image, "echo up; exec sleep 600")
    wait_until(lambda: "up" in reports.log_of(1), timeout=30, runner=runner, what="the job up")
    runner.shutdown(grace_s=1)
    assert reports.finished(1) is not None
    assert podman.containers(runner.node) == []
    assert list((runner.state_path.parent / "containers").iterdir()) == []
