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
