"""Control-side tasks of the gpunodes app: heartbeats (registration, liveness, the reports of the
agent's outbox and their acknowledgement, reconciliation).
Nodes that stop heartbeating are marked LOST by the scheduling pass itself (quotas/scheduler.py)."""

import logging

from celery import shared_task

from gpunodes import services

log = logging.getLogger(__name__)

# Report and message names, by name: the control side never imports the agent's code.
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
OUTBOX_ACK = "gpunodes.agent.tasks.outbox_ack"
MAX_REPORTS = 1000  # one heartbeat's worth (the agent sends at most outbox.BATCH)


@shared_task(name="gpunodes.tasks.node_heartbeat", ignore_result=True)
def node_heartbeat(
    name: str,
    gpu_type: str,
    inventory: list[dict],
    running: list[list[int]],
    boot_id: str,
    agent_version: str = "",
    hostname: str = "",
    labels: dict | None = None,
    sent_at: float | None = None,
    finished: list[dict] | None = None,
    join_token: str = "",
    outbox: list[dict] | None = None,
    outbox_epoch: str = "",
) -> dict:
    from django.core.exceptions import ValidationError

    from gpunodes.models import node_name_validator
    from quotas.models import gpu_type_validator

    try:
        node_name_validator(name)
        gpu_type_validator(gpu_type)
    except (ValidationError, TypeError):
        log.warning("refusing a heartbeat with a malformed node name or GPU type: %r, %r", name, gpu_type)
        return {"refused": True}
    # `finished`: what agents without an outbox repeat (their recent finished reports, no ids).
    reports = list(outbox or []) + [{"name": FINISHED, "kwargs": r} for r in finished or ()]
    recorded = []
    if reports:
        from gpunodes.choices import NodeState
        from gpunodes.models import Node

        # Before the reconciliation (a restarted host's reports are its last word on what ended); only
        # from a node that was accepted.
        if Node.objects.filter(name=name).exclude(state=NodeState.PENDING).exists():
            recorded = apply_reports(name, reports)
    result = services.node_heartbeat(
        name=name,
        gpu_type=gpu_type,
        inventory=[services.GpuInfo(**g) for g in inventory],
        running=[(int(a), int(n)) for a, n in running],
        boot_id=boot_id,
        agent_version=agent_version,
        hostname=hostname,
        labels=labels,
        sent_at=sent_at,
        join_token=join_token,
    )
    if recorded and isinstance(outbox_epoch, str) and outbox_epoch:
        # Applied (each report committed on its own): the agent may forget them. A lost ack costs only
        # a repeat with the next heartbeat.
        try:
            send_outbox_ack(name, outbox_epoch, recorded)
        except Exception:
            log.exception("could not acknowledge %d outbox report(s) of %s", len(recorded), name)
    return result


def _report_key(report: dict) -> tuple[int | None, str, int, int] | None:
    """(outbox id, task name, attempt id, number) of a well-formed report, else None."""
    kwargs = report.get("kwargs") if isinstance(report, dict) else None
    entry_id = report.get("id") if isinstance(report, dict) else None
    if not isinstance(kwargs, dict) or report.get("name") not in (STARTED, FINISHED):
        return None
    a, n = kwargs.get("attempt_id"), kwargs.get("number")
    if type(a) is not int or type(n) is not int or (entry_id is not None and type(entry_id) is not int):
        return None
    return entry_id, report["name"], a, n


def apply_reports(node: str, reports: list[dict]) -> list[int]:
    """Apply the reports a heartbeat carries (the agent's outbox, oldest first), as if each had
    arrived on its own: a report lost with the broker is not lost for good. Applying one twice changes
    nothing (compare-and-set on the attempt number); only those about attempts still live are
    applied (one query for the rest), and each counts for the heartbeat's sender, whatever it says.
    Returns the outbox ids recorded: applied, or found moot (the attempt is over) or malformed."""
    from jobs.choices import AttemptState
    from jobs.models import Attempt
    from jobs.tasks import attempt_finished, attempt_started

    keyed = [(r, _report_key(r)) for r in reports[:MAX_REPORTS]]
    for r, key in keyed:
        if key is None:
            log.warning("ignoring a malformed report in a heartbeat of %s: %.200r", node, r)
    live = set(
        Attempt.objects.filter(pk__in={key[2] for _, key in keyed if key})
        .exclude(state=AttemptState.ENDED)
        .values_list("pk", "number")
    )
    recorded = []
    for r, key in keyed:
        if key is not None and (key[2], key[3]) in live:
            entry_id, task, attempt_id, number = key
            if task == STARTED:
                attempt_started(attempt_id=attempt_id, number=number, node=node)
            else:
                log.info("applying a repeated finished report of attempt %s/%s from %s", *key[2:], node)
                kwargs = r["kwargs"]
                exit_code = kwargs.get("exit_code")
                attempt_finished(
                    attempt_id=attempt_id,
                    number=number,
                    node=node,  # the heartbeat's sender, whatever the report says
                    how=str(kwargs.get("how", "exited")),
                    exit_code=exit_code if type(exit_code) is int else None,
                    detail=str(kwargs.get("detail", "")),
                )
                live.discard((attempt_id, number))  # ended (or refused): a later copy is moot
        entry_id = r.get("id") if isinstance(r, dict) else None
        if type(entry_id) is int and entry_id > 0:
            recorded.append(entry_id)
    return recorded


def send_outbox_ack(node: str, epoch: str, ids: list[int]) -> None:
    """Tell the node's agent which of its outbox entries the control side recorded (it drops them)."""
    from config.celery import app, node_queue

    app.send_task(OUTBOX_ACK, kwargs={"node": node, "epoch": epoch, "ids": ids}, queue=node_queue(node))
