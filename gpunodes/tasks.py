"""Control-side tasks of the gpunodes app: heartbeats (registration, liveness, reconciliation).
Nodes that stop heartbeating are marked LOST by the scheduling pass itself (quotas/scheduler.py)."""

import logging

from celery import shared_task

from gpunodes import services

log = logging.getLogger(__name__)


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
    if finished:
        from gpunodes.choices import NodeState
        from gpunodes.models import Node

        # Before the reconciliation (a restarted host's reports are its last word on what ended); only
        # from a node that was accepted.
        if Node.objects.filter(name=name).exclude(state=NodeState.PENDING).exists():
            _repeat_finished(name, finished)
    return services.node_heartbeat(
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


def _repeat_finished(node: str, reports: list[dict]) -> None:
    """The heartbeat repeats the host's recent finished reports, so that one lost with the broker is
    not lost for good. Only those about attempts still live here are applied (one query for the rest);
    applying one twice changes nothing (compare-and-set on the attempt number)."""
    from jobs.choices import AttemptState
    from jobs.models import Attempt
    from jobs.tasks import attempt_finished

    wanted = {(int(r["attempt_id"]), int(r["number"])): r for r in reports}
    live = set(
        Attempt.objects.filter(pk__in=[a for a, _ in wanted])
        .exclude(state=AttemptState.ENDED)
        .values_list("pk", "number")
    )
    for key in sorted(live & set(wanted)):
        r = wanted[key]
        log.info("applying a repeated finished report of attempt %s/%s from %s", *key, node)
        attempt_finished(
            attempt_id=key[0],
            number=key[1],
            node=node,  # the heartbeat's sender, whatever the report says
            how=str(r.get("how", "exited")),
            exit_code=r.get("exit_code"),
            detail=str(r.get("detail", "")),
        )
