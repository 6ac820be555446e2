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
) -> dict:
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
