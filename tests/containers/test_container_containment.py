"""A container job reaches nothing but its own: not another attempt's files, not other processes, not
the agent's secrets, not more memory than its attempt's limit; and a container left by an agent killed
with -9 is ended by the next agent."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

from gpunodes.agent.containment import LimitPolicy
from tests.containers.conftest import needs_podman
from tests.security.agent_helpers import alive, make_runner, uid_pool, wait_until

pytestmark = needs_podman


def run(runner, reports, image, script, attempt_id, job_id, env=None, timeout=30):
    assert (
        runner.start(
            attempt_id=attempt_id,
            number=1,
            job_id=job_id,
            command=[script],
            use_shell=True,
            image=image,
            env=env or {},
        )
        == "started"
    )
    return attempt_id


def test_a_container_job_cannot_reach_another_attempt_other_processes_or_the_agents_secrets(
    runner, reports, image, monkeypatch
):
    monkeypatch.setenv("SECRET_KEY", "agent-secret-key")  # the agent's own environment
    # The admin's registry credentials, kept on the host for podman's pulls (root's, 0600).
    auth = runner.state_path.parent / "auth.json"
    auth.parent.mkdir(parents=True, exist_ok=True)
    auth.write_text('{"auths": {"reg.example.com": {"auth": "c2VjcmV0OnRva2Vu"}}}')
    auth.chmod(0o600)
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    victim = (
        'echo "victim-secret" > "$GPUQUOTA_WORKDIR/data"; echo w > "$GPUQUOTA_CHECKPOINT_DIR/model.pt"; '
        "echo up; exec sleep 60"
    )
    run(runner, reports, image, victim, 2, 8, env={"HF_TOKEN": "hf-team-b"})
    wait_until(lambda: "up" in reports.log_of(2), timeout=30, runner=runner, what="the victim")
    other = runner._procs[2]
    state = runner.state_path.parent
    tries = [
        (f"cat {other.workdir}/data", "workdir"),
        (f"ls {other.workdir}", "workdir-list"),
        (f"cat {other.checkpoint_hold.path}/model.pt", "checkpoint"),
        (f"ls {state}", "state-dir"),
        (f"cat {other.log_path}", "log"),
        ("ps -o args | grep -v grep | grep 'sleep 60'", "processes"),
        ("grep -r hf-team-b /proc/*/environ", "other-env"),
        ("env | grep -e agent-secret-key -e SECRET_KEY -e REGISTRY_AUTH", "agent-env"),
        (f"cat {auth}", "registry-credentials"),
        ("grep -rs c2VjcmV0OnRva2Vu /run /tmp /etc", "registry-credentials-copied"),
        ("kill -9 -1", "kill-all"),
    ]
    attack = "; ".join(f"{cmd} >/dev/null 2>&1 && echo LEAK:{what}" for cmd, what in tries) + "; echo done"
    run(runner, reports, image, attack, 1, 7)
    wait_until(lambda: reports.finished(1), timeout=30, runner=runner, what="the attacker")
    out = reports.log_of(1)
    assert "done" in out and "LEAK" not in out, out
    assert other.popen.poll() is None  # the victim runs on
    # ...and its environment file held the job's values, never the agent's secret.
    env_file = state / "containers" / f"gpuquota-{runner.node}-a2-1.env"
    text = env_file.read_text()
    assert "HF_TOKEN=hf-team-b" in text and "agent-secret-key" not in text
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"


def test_a_container_job_cannot_pass_its_attempts_memory_limit(root_dir, reports, image, podman):
    runner = make_runner(
        root_dir, reports, uids=uid_pool(), podman=podman, limits=LimitPolicy(memory_max_bytes=64 << 20)
    )
    runner.node = f"ct{uuid.uuid4().hex[:6]}"
    try:
        # 200 MB in one shell variable, in a 64 MiB attempt.
        run(runner, reports, image, 'x=$(head -c 200000000 /dev/zero | tr "\\0" a); echo survived', 1, 7)
        done = wait_until(lambda: reports.finished(1), timeout=60, runner=runner, what="the OOM kill")
        assert "survived" not in reports.log_of(1)
        assert done["exit_code"] != 0, done
    finally:
        runner.shutdown(grace_s=1)
        for name, _ in podman.containers(runner.node):
            podman.remove(name)


AGENT = textwrap.dedent(
    """
    import sys, time
    from gpunodes.agent.runner import Runner
    from gpunodes.agent.identity import UidPool
    from pathlib import Path
    root, node, image, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    runner = Runner(node=node, log_dir=root / "logs", checkpoint_root=root / "ckpt", work_root=root / "work",
                    report=lambda *a: None, state_path=root / "state" / "running.json",
                    uids=UidPool(first, first + 99))
    print(runner.start(attempt_id=1, number=1, job_id=7, command=["sleep", "600"], image=image), flush=True)
    time.sleep(600)
    """
)


def test_a_container_left_by_an_agent_killed_with_minus_9_is_ended_by_the_next_agent(
    root_dir, reports, image, podman
):
    node = f"ct{uuid.uuid4().hex[:6]}"
    pool = uid_pool()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(root_dir), node, image, str(pool.first)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert agent.stdout.readline().strip() == "started"
        wait_until(lambda: podman.containers(node), timeout=30, what="the container")
        agent.send_signal(signal.SIGKILL)
        agent.wait(10)
        time.sleep(0.5)
        # Its container runs on without the agent (conmon keeps it).
        assert podman.containers(node), "the container went with the agent: nothing to test"
        running = [
            p for p in os.listdir("/proc") if p.isdigit() and _uid_of(p) in range(pool.first, pool.last + 1)
        ]
        assert running, "no process of the attempt's uid after the agent's death"
        began = time.monotonic()
        nxt = make_runner(root_dir, reports, uids=UidPoolFrom(pool), podman=podman)
        nxt.node = node
        nxt.kill_orphans()
        took = time.monotonic() - began
        assert podman.containers(node) == []
        assert not [p for p in running if alive(int(p))], "processes of the orphan container live on"
        # ...nor its env file (the job's values) nor its idmapped checkpoint mount.
        assert list((root_dir / "state" / "containers").iterdir()) == []
        assert str(root_dir / "state" / "containers") not in Path("/proc/self/mountinfo").read_text()
        print(f"orphan container ended in {took:.2f} s")
    finally:
        if agent.poll() is None:
            agent.kill()
        for name, _ in podman.containers(node):
            podman.remove(name)


def UidPoolFrom(pool):
    from gpunodes.agent.identity import UidPool

    return UidPool(pool.first, pool.last)


def _uid_of(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1
