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
) -> dict:
    if finished:
        _repeat_finished(finished)
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
    )


def _repeat_finished(reports: list[dict]) -> None:
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
        log.info("applying a repeated finished report of attempt %s/%s from %s", *key, r.get("node"))
        attempt_finished(
            attempt_id=key[0],
            number=key[1],
            node=str(r.get("node", "")),
            how=str(r.get("how", "exited")),
            exit_code=r.get("exit_code"),
            detail=str(r.get("detail", "")),
        )
