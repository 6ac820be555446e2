"""Node verbs: register an inventory, join (PENDING until accepted), accept, cordon, uncordon, drain."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from gpunodes.choices import NodeState
from gpunodes.models import Gpu, Node

log = logging.getLogger(__name__)


def is_older_boot(boot_id: str, than: str) -> bool:
    """Whether `boot_id` names an agent process that started before the one `than` names. Boot ids
    begin with their start time in milliseconds (gpunodes.agent.main.new_boot_id); ids without it
    (older agents) are never taken for older."""
    a, b = boot_id.split("-", 1)[0], than.split("-", 1)[0]
    if boot_id == than or len(a) != 14 or len(b) != 14 or not (a.isdigit() and b.isdigit()):
        return False
    return a < b


def start_resend_after_s() -> float:
    """How long an admitted attempt may wait for its host to report it running before the heartbeat
    sends its start again (a few heartbeats: long enough for a start still in the queue)."""
    from django.conf import settings

    return max(10.0, 3.0 * settings.HEARTBEAT_INTERVAL_S)


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
    initial_state: str | None = None,
) -> tuple[Node, bool]:
    """Create or update a node and make its GPU rows match the inventory. Returns (node, created).
    GPUs the host no longer reports are removed unless an attempt still holds them. `initial_state`
    applies only to a node created here, `state` to any."""
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "gpu_type": gpu_type,
            "state": state or initial_state or NodeState.READY,
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


def join_state(join_token: str = "") -> str:
    """The state a node heard of for the first time joins in: READY with the join token, or where new
    nodes are accepted at once (the embedded file broker); else PENDING until an admin accepts it."""
    from django.conf import settings

    expected = settings.NODE_JOIN_TOKEN
    if expected and join_token and hmac.compare_digest(expected.encode(), str(join_token).encode()):
        return NodeState.READY
    return NodeState.READY if settings.NODE_AUTO_ACCEPT else NodeState.PENDING


def tell_agent(node: Node | str, state: str) -> None:
    """After commit, tell the node's agent its state (it refuses starts unless READY)."""
    from .dispatch import node_state

    name = node if isinstance(node, str) else node.name
    transaction.on_commit(lambda: node_state(name, state))


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
    join_token: str = "",
) -> dict:
    """Register or refresh a node from its agent's heartbeat, and reconcile what it runs:

    - a new node joins PENDING (no work) until an admin accepts it, or READY with the join token (or on
      the embedded broker, join_state); a PENDING node's reports change nothing else;
    - a LOST node that heartbeats again is READY; cordoned/draining nodes stay so, and their agent is
      told (it refuses starts);
    - after an agent restart (a new boot id), attempts the host no longer reports are lost;
    - attempts the host runs that are over (or unknown) are to be stopped: returned in "stop" and sent;
    - lost messages are made good: an attempt the host runs but that is still ADMITTED here is marked
      started, and one ADMITTED for a while that the host does not run has its start sent again
      (returned in "resent").
    """
    from jobs import lifecycle
    from jobs.choices import ATTEMPT_ACTIVE_STATES, AttemptState, Outcome
    from jobs.models import Attempt
    from quotas.triggers import request_pass

    from .dispatch import preempt_attempt

    now = timezone.now()
    joining = join_state(join_token)
    with transaction.atomic():
        node, created = node_register(
            name=name,
            gpu_type=gpu_type,
            gpus=inventory,
            hostname=hostname,
            agent_version=agent_version,
            labels=labels,
            initial_state=joining,
        )
        if node.state == NodeState.PENDING:
            if joining != NodeState.READY:
                if created:
                    log.warning(
                        "node %s (host %r) asked to join: PENDING until an admin accepts it", name, hostname
                    )
                Node.objects.filter(pk=node.pk).update(last_heartbeat=now, boot_id=boot_id)
                tell_agent(name, NodeState.PENDING)
                return {"state": NodeState.PENDING, "lost": [], "stop": [], "resent": [], "ignored": True}
            log.info("node %s joined with the join token", name)
            Node.objects.filter(pk=node.pk).update(state=NodeState.READY, state_changed_at=now)
            node.state = NodeState.READY
            created = True  # as good as new: READY from now on
        previous_boot = node.boot_id  # read under the row lock node_register took
        if previous_boot and is_older_boot(boot_id, previous_boot):
            # The last words of a previous agent process on this host, applied after its successor's
            # first heartbeat (heartbeats are handled on several threads): not a restart, ignored.
            log.info("ignoring a late heartbeat of %s from a previous agent boot", name)
            return {"state": node.state, "lost": [], "stop": [], "resent": [], "ignored": True}
        came_back = created or node.state == NodeState.LOST
        fields = {"last_heartbeat": now, "boot_id": boot_id}
        if came_back:
            fields.update(state=NodeState.READY, state_changed_at=now)
        Node.objects.filter(pk=node.pk).update(**fields)

        reported = dict(running)
        live = {}
        admitted_at = {}
        for a_id, number, state, admitted in Attempt.objects.filter(
            state__in=list(ATTEMPT_ACTIVE_STATES), nodes=node.pk
        ).values_list("pk", "number", "state", "admitted_at"):
            live[a_id] = (number, state)
            admitted_at[a_id] = admitted
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
        # The host runs an attempt still ADMITTED here: its STARTED report was lost.
        for a_id, (number, state) in live.items():
            if state == AttemptState.ADMITTED and reported.get(a_id) == number:
                lifecycle.mark_started(a_id, number, name)
        # An attempt ADMITTED long ago that the host does not run: its start message was lost (a broker
        # restart, an agent killed while holding it). Send it again; the agent ignores a duplicate.
        resend_before = now - timedelta(seconds=start_resend_after_s())
        resend = [
            a_id
            for a_id, (number, state) in live.items()
            if state == AttemptState.ADMITTED
            and a_id not in reported
            and a_id not in lost
            and admitted_at[a_id] < resend_before
        ]
        if resend:
            from .dispatch import start_attempt, start_messages

            messages = start_messages(resend, only_node=name)
            log.warning("re-sending the start of %d attempt(s) to %s", len(messages), name)
            transaction.on_commit(lambda: [start_attempt(m["node"], m["payload"]) for m in messages])
        stop = [(a_id, n) for a_id, n in reported.items() if live.get(a_id, (None,))[0] != n]
        for a_id, n in stop:
            transaction.on_commit(lambda a_id=a_id, n=n: preempt_attempt(name, a_id, n, 0))
        if came_back or lost:
            transaction.on_commit(lambda: request_pass("node ready" if came_back else "node restarted"))
        if came_back or node.state != NodeState.READY:
            tell_agent(name, NodeState.READY if came_back else node.state)
    return {
        "state": NodeState.READY if came_back else node.state,
        "lost": lost,
        "stop": stop,
        "resent": resend,
    }


# --- admin actions: cordon, uncordon, drain --------------------------------------------------------


def _node_conflict(message: str) -> Exception:
    from jobs.services import Conflict

    return Conflict(message)


def _set_node_state(
    node: Node, to_state: str, from_states: Sequence[str], why: str, *, action: str, actor=None
) -> Node:
    """Compare-and-set the node's state; a node already in `to_state` is left as it is (idempotent).
    A change is written to the audit log with its actor."""
    from quotas import audit

    with transaction.atomic():
        before = audit.snapshot(node)
        changed = Node.objects.filter(pk=node.pk, state__in=list(from_states)).update(
            state=to_state, state_changed_at=timezone.now()
        )
        if changed:
            from quotas.triggers import request_pass

            audit.record_audit(actor, action, node, before, audit.snapshot(node))
            transaction.on_commit(lambda: request_pass(why))
            tell_agent(node.name, to_state)
    node.refresh_from_db()
    return node


def node_accept(*, node: Node, actor=None) -> Node:
    """An admin accepts a node that asked to join (PENDING): it becomes READY and takes work."""
    if node.state != NodeState.PENDING:
        return node
    return _set_node_state(
        node, NodeState.READY, [NodeState.PENDING], "node accepted", action="accept", actor=actor
    )


def node_cordon(*, node: Node, actor=None) -> Node:
    """No new work on the node; what runs there goes on. A LOST node stays cordoned when it comes back."""
    if node.state == NodeState.CORDONED:
        return node
    return _set_node_state(
        node,
        NodeState.CORDONED,
        [NodeState.READY, NodeState.DRAINING, NodeState.LOST],
        "node cordoned",
        action="cordon",
        actor=actor,
    )


def node_uncordon(*, node: Node, actor=None) -> Node:
    """A cordoned or draining node takes work again. A LOST node becomes READY by heartbeating."""
    if node.state == NodeState.READY:
        return node
    if node.state == NodeState.LOST:
        raise _node_conflict(f"Node {node.name} is LOST; it becomes READY when its agent heartbeats again.")
    node = _set_node_state(
        node,
        NodeState.READY,
        [NodeState.CORDONED, NodeState.DRAINING],
        "node uncordoned",
        action="uncordon",
        actor=actor,
    )
    if node.state != NodeState.READY:
        raise _node_conflict(f"Node {node.name} is {node.state} and cannot be uncordoned now.")
    return node


def node_drain(*, node: Node, actor=None) -> Node:
    """No new work; the jobs running there finish (or reach max_runtime_s), then the pass marks the node
    CORDONED (drained) and it can be taken down."""
    if node.state == NodeState.DRAINING:
        return node
    if node.state == NodeState.LOST:
        raise _node_conflict(f"Node {node.name} is LOST; there is nothing running there to drain.")
    node = _set_node_state(
        node,
        NodeState.DRAINING,
        [NodeState.READY, NodeState.CORDONED],
        "node draining",
        action="drain",
        actor=actor,
    )
    if node.state != NodeState.DRAINING:
        raise _node_conflict(f"Node {node.name} is {node.state} and cannot be drained now.")
    return node


# --- read-outs ------------------------------------------------------------------------------------


def node_grid(*, now=None, names: list[str] | None = None) -> list[dict]:
    """Every node (or those `names`: a page of them) with its GPUs and who holds each (share, job,
    borrowed as the policy counts it now), for the dashboard's grid. A constant number of queries: the
    live picture's (one small query while it is cached) and two that read only the nodes shown."""
    from django.conf import settings

    from jobs.models import GpuClaim
    from quotas.models import Share
    from quotas.usage import live_picture, share_colours

    now = now or timezone.now()
    # Who is borrowed is the whole cluster's business (each share's usage against its capacity): the
    # pages' shared live picture has it, so the grid reads only the nodes it shows.
    live = live_picture()
    borrowed, hatched = live.borrowed, live.hatched
    colours = share_colours(Share.objects.values_list("name", flat=True))
    claims = GpuClaim.objects.all() if names is None else GpuClaim.objects.filter(gpu__node__name__in=names)
    held = {
        gpu_id: (attempt_id, job_id, share, job_name)
        for gpu_id, attempt_id, job_id, share, job_name in claims.values_list(
            "gpu_id", "attempt_id", "attempt__job_id", "attempt__job__share__name", "attempt__job__name"
        ).order_by("gpu__node__name", "gpu__index")
    }
    shown: dict[int, int] = {}  # attempt id -> GPUs of it hatched so far
    grid = []
    nodes = Node.objects.all() if names is None else Node.objects.filter(name__in=names)
    for node in nodes.prefetch_related("gpus").order_by("name"):
        gpus = []
        for gpu in node.gpus.all():
            holder = held.get(gpu.pk)
            hatch = False
            if holder:
                hatch = shown.get(holder[0], 0) < hatched.get(holder[0], 0)
                shown[holder[0]] = shown.get(holder[0], 0) + hatch
            gpus.append(
                {
                    "index": gpu.index,
                    "model": gpu.model,
                    "share": holder[2] if holder else None,
                    "job_id": holder[1] if holder else None,
                    "job_name": holder[3] if holder else "",
                    "borrowed": hatch,
                    "job_borrowed": bool(holder and holder[0] in borrowed),
                    "colour": colours.get(holder[2]) if holder else None,
                }
            )
        age = (now - node.last_heartbeat).total_seconds() if node.last_heartbeat else None
        grid.append(
            {
                "node": node,
                "gpus": gpus,
                "used": sum(1 for g in gpus if g["share"]),
                "heartbeat_age": None if age is None else max(0, int(age)),
                "stale": age is None or age > 3 * settings.HEARTBEAT_INTERVAL_S,
            }
        )
    return grid
