"""Messages from the control side to the GPU hosts, each on its node's own queue (`node.<name>`).

Sent by task name so that the control side never imports the agent's code. Every message carries
the attempt id and number; the agent ignores one for an attempt number it is not running.
"""

from __future__ import annotations

from config.celery import app, node_queue

START = "gpunodes.agent.tasks.start_attempt"
PREEMPT = "gpunodes.agent.tasks.preempt_attempt"


def start_attempt(node: str, payload: dict) -> None:
    app.send_task(START, kwargs={**payload, "node": node}, queue=node_queue(node))


def preempt_attempt(node: str, attempt_id: int, number: int, grace_s: int) -> None:
    app.send_task(
        PREEMPT,
        kwargs={"node": node, "attempt_id": attempt_id, "number": number, "grace_s": grace_s},
        queue=node_queue(node),
    )


def start_messages(attempt_ids, only_node: str | None = None) -> list[dict]:
    """The start messages of live attempts ({"node", "payload"}, one per node of the placement), as
    the pass sends them: for sending a lost start again."""
    from jobs.models import Attempt

    messages = []
    rows = Attempt.objects.filter(pk__in=list(attempt_ids)).values_list(
        "pk",
        "number",
        "job_id",
        "placement",
        "job__command",
        "job__env",
        "job__use_shell",
        "job__max_runtime_s",
        "job__preemption_grace_s",
    )
    for pk, number, job_id, placement, command, env, use_shell, max_runtime, grace in rows:
        world = [p["node"] for p in placement]
        for rank, p in enumerate(placement):
            if only_node is not None and p["node"] != only_node:
                continue
            messages.append(
                {
                    "node": p["node"],
                    "payload": {
                        "attempt_id": pk,
                        "number": number,
                        "job_id": job_id,
                        "command": command,
                        "env": env,
                        "use_shell": use_shell,
                        "gpus": list(p["gpus"]),
                        "max_runtime_s": max_runtime,
                        "grace_s": grace,
                        "rank": rank,
                        "world": world,
                    },
                }
            )
    return messages
