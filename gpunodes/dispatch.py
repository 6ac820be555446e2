"""Messages from the control side to the GPU hosts, each on its node's own queue (`node.<name>`).

Sent by task name so that the control side never imports the agent's code. Every message carries
the attempt id and number; the agent ignores one for an attempt number it is not running. With signed
messages a start's env is sealed to its node's key (gpunodes.signing.seal): no other node reads it on
the broker; without signing (the embedded file broker, one user) it travels as it is.
"""

from __future__ import annotations

import logging
from datetime import datetime

from config.celery import app, node_queue

log = logging.getLogger(__name__)

START = "gpunodes.agent.tasks.start_attempt"
PREEMPT = "gpunodes.agent.tasks.preempt_attempt"
NODE_STATE = "gpunodes.agent.tasks.node_state"
GPU_RECHECK = "gpunodes.agent.tasks.gpu_recheck"
LOG_CUT = "gpunodes.agent.tasks.log_cut"


def start_attempt(node: str, payload: dict) -> None:
    from gpunodes import signing

    kwargs = {**payload, "node": node}
    if kwargs.get("env") and signing.signing_on():
        try:
            kwargs["env"] = signing.seal(
                kwargs["env"], node=node, attempt_id=kwargs["attempt_id"], number=kwargs["number"]
            )
        except Exception:  # no certificate of the node: the start waits (sent again by its heartbeats)
            log.exception(
                "cannot seal the env of job %s, attempt %s for %s: its start is not sent",
                kwargs.get("job_id"),
                kwargs["number"],
                node,
            )
            return
    app.send_task(START, kwargs=kwargs, queue=node_queue(node))


def preempt_attempt(node: str, attempt_id: int, number: int, grace_s: int) -> None:
    app.send_task(
        PREEMPT,
        kwargs={"node": node, "attempt_id": attempt_id, "number": number, "grace_s": grace_s},
        queue=node_queue(node),
    )


def node_state(node: str, state: str) -> None:
    """Tell a node's agent its state: it refuses starts unless READY (cordoned, draining, pending)."""
    app.send_task(NODE_STATE, kwargs={"node": node, "state": state}, queue=node_queue(node))


def gpu_recheck(node: str, index: int, token: int) -> None:
    """Ask a node's agent to re-check a GPU an admin marked healthy (its answer names `token`)."""
    app.send_task(GPU_RECHECK, kwargs={"node": node, "index": index, "token": token}, queue=node_queue(node))


def log_cut(node: str, attempt_id: int, number: int) -> None:
    """Tell a node's agent that the control side stores no more of this attempt's output (its team's
    budget): it stops shipping it."""
    app.send_task(
        LOG_CUT, kwargs={"node": node, "attempt_id": attempt_id, "number": number}, queue=node_queue(node)
    )


def start_payloads(
    *,
    attempt_id: int,
    number: int,
    job_id: int,
    placement,
    command,
    env,
    use_shell,
    max_runtime_s,
    grace_s,
    rendezvous_port: int | None = None,
    addresses: dict[str, str | None] | None = None,
    admitted_at: datetime | None = None,
    user: int | None = None,
    image: str = "",
    mounts: list | None = None,
) -> list[dict]:
    """The start messages of one attempt ({"node", "payload"}, one per node of its placement, with its
    rank in the gang and the same rendezvous for all: rank 0's address, the attempt's port): what the
    pass sends, and what a lost start is sent again as."""
    from gpunodes.rendezvous import rendezvous

    world = [node for node, _ in placement]
    meet = rendezvous(world, [len(gpus) for _, gpus in placement], rendezvous_port, addresses or {})
    return [
        {
            "node": node,
            "payload": {
                "attempt_id": attempt_id,
                "number": number,
                "job_id": job_id,
                "command": command,
                "env": env,
                "use_shell": use_shell,
                "gpus": list(gpus),
                "max_runtime_s": max_runtime_s,
                "grace_s": grace_s,
                "rank": rank,
                "world": world,
                "rendezvous": meet,
                # Tells this attempt from another of the same id (a database made anew): an agent
                # restarted since it ended here refuses a stale start of it (agent/runner.py).
                "admitted_us": admitted_us(admitted_at),
                # The job's owner: the agent bounds its host log files per user too (agent/joblog.py).
                "user": user,
                # A container job's image (agent/containers.py); sent only where there is one.
                **({"image": image} if image else {}),
                # Its read-only datasets (jobs/mounts.py), likewise.
                **({"mounts": mounts} if mounts else {}),
            },
        }
        for rank, (node, gpus) in enumerate(placement)
    ]


def admitted_us(at: datetime | None) -> int | None:
    return None if at is None else round(at.timestamp() * 1_000_000)


def start_messages(attempt_ids, only_node: str | None = None) -> list[dict]:
    """The start messages of live attempts, read from the database (two queries)."""
    from gpunodes.models import Node
    from gpunodes.rendezvous import node_address
    from jobs.limits import effective_grace
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
        "rendezvous_port",
        "admitted_at",
        "job__submitted_by_id",
        "job__image",
        "job__mounts",
    )
    rows = list(rows)
    names = {p["node"] for row in rows for p in row[3]}
    addresses = {
        name: node_address(address, hostname)
        for name, address, hostname in Node.objects.filter(name__in=names).values_list(
            "name", "address", "hostname"
        )
    }
    for (
        pk,
        number,
        job_id,
        placement,
        command,
        env,
        use_shell,
        max_runtime,
        grace,
        port,
        admitted,
        user,
        image,
        mounts,
    ) in rows:
        for message in start_payloads(
            attempt_id=pk,
            number=number,
            job_id=job_id,
            placement=[(p["node"], p["gpus"]) for p in placement],
            command=command,
            env=env,
            use_shell=use_shell,
            max_runtime_s=max_runtime,
            grace_s=effective_grace(grace),
            rendezvous_port=port,
            addresses=addresses,
            admitted_at=admitted,
            user=user,
            image=image,
            mounts=mounts,
        ):
            if only_node is None or message["node"] == only_node:
                messages.append(message)
    return messages
