"""Node verbs: register an inventory, cordon, uncordon, drain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    model: str = ""
    memory_mb: int = 0


def fake_inventory(
    node_name: str, count: int, model: str = "NVIDIA A10G", memory_mb: int = 23028
) -> list[GpuInfo]:
    """An explicit fake inventory for hosts without GPUs (tests, the demo)."""
    return [GpuInfo(i, f"GPU-fake-{node_name}-{i}", model, memory_mb) for i in range(count)]


@transaction.atomic
def node_register(
    *,
    name: str,
    gpu_type: str,
    gpus: Sequence[GpuInfo],
    hostname: str = "",
    agent_version: str = "",
    labels: dict | None = None,
    state: str | None = None,
) -> tuple[Node, bool]:
    """Create or update a node and make its GPU rows match the inventory. Returns (node, created).
    GPUs the host no longer reports are removed unless an attempt still holds them."""
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "gpu_type": gpu_type,
            "state": state or NodeState.READY,
            "hostname": hostname,
            "agent_version": agent_version,
            "labels": labels or {},
        },
    )
    if not created:
        changed = []
        for field, value in (
            ("gpu_type", gpu_type),
            ("hostname", hostname),
            ("agent_version", agent_version),
        ):
            if value and getattr(node, field) != value:
                setattr(node, field, value)
                changed.append(field)
        if labels is not None and node.labels != labels:
            node.labels = labels
            changed.append("labels")
        if state and node.state != state:
            node.state = state
            node.state_changed_at = timezone.now()
            changed += ["state", "state_changed_at"]
        if changed:
            node.save(update_fields=changed)
    existing = {g.index: g for g in node.gpus.all()}
    reported = {g.index: g for g in gpus}
    for index, info in reported.items():
        row = existing.get(index)
        if row is None:
            Gpu.objects.create(
                node=node, index=index, uuid=info.uuid, model=info.model, memory_mb=info.memory_mb
            )
        elif (row.uuid, row.model, row.memory_mb) != (info.uuid, info.model, info.memory_mb):
            row.uuid, row.model, row.memory_mb = info.uuid, info.model, info.memory_mb
            row.save(update_fields=["uuid", "model", "memory_mb"])
    gone = [i for i in existing if i not in reported]
    if gone:
        node.gpus.filter(index__in=gone, claim__isnull=True).delete()
    return node, created


def node_heartbeat(
    *,
    name: str,
    gpu_type: str,
    inventory: Sequence[GpuInfo],
    running: Sequence[tuple[int, int]],
    boot_id: str,
    agent_version: str = "",
    hostname: str = "",
    labels: dict | None = None,
    sent_at: float | None = None,
) -> dict:
    """Register or refresh a node from its agent's heartbeat, and reconcile what it runs:

    - a LOST (or new) node that heartbeats again is READY; cordoned/draining nodes stay so;
    - after an agent restart (a new boot id), attempts the host no longer reports are lost;
    - attempts the host runs that are over (or unknown) are to be stopped: returned in "stop" and sent.
    """
    from jobs import lifecycle
    from jobs.choices import ATTEMPT_ACTIVE_STATES, AttemptState, Outcome
    from jobs.models import Attempt
    from quotas.triggers import request_pass

    from .dispatch import preempt_attempt

    now = timezone.now()
    with transaction.atomic():
        node, created = node_register(
            name=name,
            gpu_type=gpu_type,
            gpus=inventory,
            hostname=hostname,
            agent_version=agent_version,
            labels=labels,
        )
        previous_boot = node.boot_id
        came_back = created or node.state == NodeState.LOST
        fields = {"last_heartbeat": now, "boot_id": boot_id}
        if came_back:
            fields.update(state=NodeState.READY, state_changed_at=now)
        Node.objects.filter(pk=node.pk).update(**fields)

        reported = dict(running)
        live = {
            a_id: (number, state)
            for a_id, number, state in Attempt.objects.filter(
                state__in=list(ATTEMPT_ACTIVE_STATES), nodes=node.pk
            ).values_list("pk", "number", "state")
        }
        lost = []
        if previous_boot and previous_boot != boot_id:
            for a_id, (number, state) in live.items():
                # ADMITTED ones are left alone: their start may still be waiting in the queue.
                forgotten = state != AttemptState.ADMITTED and reported.get(a_id) != number
                if forgotten and lifecycle.end_attempt(
                    a_id,
                    number,
                    outcome=Outcome.NODE_LOST,
                    reason=f"the agent on {name} restarted and no longer runs it",
                ):
                    lost.append(a_id)
        stop = [(a_id, n) for a_id, n in reported.items() if live.get(a_id, (None,))[0] != n]
        for a_id, n in stop:
            transaction.on_commit(lambda a_id=a_id, n=n: preempt_attempt(name, a_id, n, 0))
        if came_back or lost:
            transaction.on_commit(lambda: request_pass("node ready" if came_back else "node restarted"))
    return {"state": NodeState.READY if came_back else node.state, "lost": lost, "stop": stop}


# --- admin actions: cordon, uncordon, drain --------------------------------------------------------


def _node_conflict(message: str) -> Exception:
    from jobs.services import Conflict

    return Conflict(message)


def _set_node_state(node: Node, to_state: str, from_states: Sequence[str], why: str) -> Node:
    """Compare-and-set the node's state; a node already in `to_state` is left as it is (idempotent)."""
    with transaction.atomic():
        changed = Node.objects.filter(pk=node.pk, state__in=list(from_states)).update(
            state=to_state, state_changed_at=timezone.now()
        )
        if changed:
            from quotas.triggers import request_pass

            transaction.on_commit(lambda: request_pass(why))
    node.refresh_from_db()
    return node


def node_cordon(*, node: Node) -> Node:
    """No new work on the node; what runs there goes on. A LOST node stays cordoned when it comes back."""
    if node.state == NodeState.CORDONED:
        return node
    return _set_node_state(
        node, NodeState.CORDONED, [NodeState.READY, NodeState.DRAINING, NodeState.LOST], "node cordoned"
    )


def node_uncordon(*, node: Node) -> Node:
    """A cordoned or draining node takes work again. A LOST node becomes READY by heartbeating."""
    if node.state == NodeState.READY:
        return node
    if node.state == NodeState.LOST:
        raise _node_conflict(f"Node {node.name} is LOST; it becomes READY when its agent heartbeats again.")
    node = _set_node_state(node, NodeState.READY, [NodeState.CORDONED, NodeState.DRAINING], "node uncordoned")
    if node.state != NodeState.READY:
        raise _node_conflict(f"Node {node.name} is {node.state} and cannot be uncordoned now.")
    return node


def node_drain(*, node: Node) -> Node:
    """No new work; the jobs running there finish (or reach max_runtime_s), then the pass marks the node
    CORDONED (drained) and it can be taken down."""
    if node.state == NodeState.DRAINING:
        return node
    if node.state == NodeState.LOST:
        raise _node_conflict(f"Node {node.name} is LOST; there is nothing running there to drain.")
    node = _set_node_state(node, NodeState.DRAINING, [NodeState.READY, NodeState.CORDONED], "node draining")
    if node.state != NodeState.DRAINING:
        raise _node_conflict(f"Node {node.name} is {node.state} and cannot be drained now.")
    return node
