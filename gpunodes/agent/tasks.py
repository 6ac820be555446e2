"""The tasks of a host's own queue `node.<name>`. They run only inside the agent process (Celery's
threads pool, so they share the one Runner), and refuse a message meant for another node."""

from __future__ import annotations

import logging

from celery import shared_task

from gpunodes.agent.runner import Runner

log = logging.getLogger(__name__)

RUNNER: Runner | None = None


def _mine(node: str) -> bool:
    if RUNNER is None or node != RUNNER.node:
        log.error("refusing a message for node %r: this agent is %r", node, RUNNER and RUNNER.node)
        return False
    return True


@shared_task(name="gpunodes.agent.tasks.start_attempt", ignore_result=True, acks_late=True)
def start_attempt(
    *,
    node: str,
    attempt_id: int,
    number: int,
    job_id: int,
    command: list[str],
    env: dict | None = None,
    use_shell: bool = False,
    gpus: list[int] = (),
    max_runtime_s: int | None = None,
    grace_s: int = 30,
    rank: int = 0,
    world: list[str] | None = None,
) -> str:
    if not _mine(node):
        return "refused"
    return RUNNER.start(
        attempt_id=attempt_id,
        number=number,
        job_id=job_id,
        command=command,
        env=env,
        use_shell=use_shell,
        gpus=list(gpus),
        max_runtime_s=max_runtime_s,
        grace_s=grace_s,
        rank=rank,
        world=world,
    )


@shared_task(name="gpunodes.agent.tasks.preempt_attempt", ignore_result=True, acks_late=True)
def preempt_attempt(*, node: str, attempt_id: int, number: int, grace_s: int = 30) -> str:
    if not _mine(node):
        return "refused"
    return RUNNER.stop(attempt_id=attempt_id, number=number, grace_s=grace_s)
