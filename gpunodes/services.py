"""Node verbs: register an inventory, join (PENDING until accepted), accept, cordon, uncordon, drain; a
GPU's health as its agent reports it, and an admin's mark-healthy."""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gpunodes.addresses import valid_address
from gpunodes.choices import GpuFailureReason, GpuHealth, NodeState
from gpunodes.models import Gpu, GpuFailure, Node
from gpunodes.signing import refused

log = logging.getLogger(__name__)


def start_resend_after_s() -> float:
    """How long an admitted attempt may wait for its host to report it running before the heartbeat
    sends its start again (a few heartbeats: long enough for a start still in the queue)."""
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


# What one heartbeat may register (a host reports its own inventory; a PENDING one too): bounded, so
# that no agent, accepted or not, can grow the database or fail its own heartbeats on a column's size.
MAX_GPUS_PER_NODE = 64
MAX_RUNNING = 4096  # attempts one heartbeat may report running
MAX_LABELS = 32
GPU_FIELDS = frozenset({"index", "uuid", "model", "memory_mb"})


class Malformed(ValueError):
    """A heartbeat field that is not what an agent sends: names the field (the refusal's cause)."""


def _text(what: str, value, limit: int, *, empty: bool = True) -> str:
    if not isinstance(value, str) or len(value) > limit or (not empty and not value):
        raise Malformed(f"{what} must be a string of {'' if empty else '1 to '}at most {limit} characters")
    return value


def parse_inventory(inventory) -> list[GpuInfo]:
    """The GPUs a heartbeat reports, checked against what the GPU rows hold."""
    if not isinstance(inventory, list):
        raise Malformed("the inventory must be a list of GPUs")
    if len(inventory) > MAX_GPUS_PER_NODE:
        raise Malformed(f"{len(inventory)} GPUs reported, at most {MAX_GPUS_PER_NODE} per node")
    gpus: list[GpuInfo] = []
    for g in inventory:
        if not isinstance(g, dict) or not {"index", "uuid"} <= set(g) <= GPU_FIELDS:
            raise Malformed(f"a GPU must have the fields {', '.join(sorted(GPU_FIELDS))} and no other")
        index, memory = g["index"], g.get("memory_mb", 0)
        if (
            type(index) is not int
            or not 0 <= index < MAX_GPUS_PER_NODE
            or any(x.index == index for x in gpus)
        ):
            raise Malformed(f"a GPU index must be a distinct int from 0 to {MAX_GPUS_PER_NODE - 1}")
        if type(memory) is not int or not 0 <= memory < 2**31:
            raise Malformed("a GPU's memory_mb must be an int from 0 to 2^31 - 1")
        uuid = _text("a GPU uuid", g["uuid"], 64, empty=False)
        gpus.append(GpuInfo(index, uuid, _text("a GPU model", g.get("model", ""), 100), memory))
    if len({g.uuid for g in gpus}) != len(gpus):
        raise Malformed("a GPU uuid must be distinct")
    return gpus


def parse_heartbeat(
    *, inventory, running, boot_id, hostname, agent_version, labels, sent_at
) -> tuple[list[GpuInfo], list[tuple[int, int]], float | None]:
    """A heartbeat's fields, checked: (GPUs, running [(attempt id, number)], sent_at). Raises Malformed."""
    gpus = parse_inventory(inventory)
    if not isinstance(running, list) or len(running) > MAX_RUNNING:
        raise Malformed(f"running must list at most {MAX_RUNNING} [attempt id, number] pairs of ints")
    pairs = []
    for r in running:
        if not (isinstance(r, list | tuple) and len(r) == 2 and all(type(x) is int for x in r)):
            raise Malformed(f"running must list at most {MAX_RUNNING} [attempt id, number] pairs of ints")
        pairs.append((r[0], r[1]))
    _text("boot_id", boot_id, 64)
    _text("hostname", hostname, 255)
    _text("agent_version", agent_version, 32)
    if labels is not None and not (
        isinstance(labels, dict)
        and len(labels) <= MAX_LABELS
        and all(
            isinstance(k, str) and 0 < len(k) <= 63 and isinstance(v, str) and len(v) <= 255
            for k, v in labels.items()
        )
    ):
        raise Malformed(f"labels must map at most {MAX_LABELS} names (63 characters) to strings (255)")
    if sent_at is not None and (type(sent_at) not in (int, float) or not math.isfinite(sent_at)):
        raise Malformed("sent_at must be a number")
    return gpus, pairs, sent_at


@dataclass(frozen=True)
class GpuFault:
    """A GPU its agent found broken (the heartbeat's `unhealthy`)."""

    index: int
    reason: str  # GpuFailureReason
    detail: str
    at: float  # when, by the host's clock


FAULT_FIELDS = frozenset({"index", "reason", "detail", "at"})


def parse_gpu_health(
    unhealthy, rechecked, gpus: Sequence[GpuInfo]
) -> tuple[dict[int, GpuFault], dict[int, int]]:
    """A heartbeat's GPU health, checked against its own inventory: ({index: fault} of the GPUs its
    agent holds broken, {index: token} of the re-checks it has done). None (an older agent): nothing."""
    indexes = {g.index for g in gpus}
    if unhealthy is None:
        unhealthy = []
    if not isinstance(unhealthy, list) or len(unhealthy) > MAX_GPUS_PER_NODE:
        raise Malformed(f"unhealthy must list at most {MAX_GPUS_PER_NODE} GPUs")
    faults: dict[int, GpuFault] = {}
    for f in unhealthy:
        if not isinstance(f, dict) or set(f) != FAULT_FIELDS:
            raise Malformed(
                f"an unhealthy GPU must have the fields {', '.join(sorted(FAULT_FIELDS))} and no other"
            )
        index, at = f["index"], f["at"]
        if type(index) is not int or index not in indexes or index in faults:
            raise Malformed("an unhealthy GPU index must be a distinct index of the inventory")
        if f["reason"] not in GpuFailureReason.values:
            raise Malformed(f"an unhealthy GPU reason must be one of {', '.join(GpuFailureReason.values)}")
        if type(at) not in (int, float) or not math.isfinite(at):
            raise Malformed("an unhealthy GPU's at must be a number")
        faults[index] = GpuFault(
            index, f["reason"], _text("an unhealthy GPU's detail", f["detail"], 300), float(at)
        )
    if rechecked is None:
        rechecked = []
    if not isinstance(rechecked, list) or len(rechecked) > MAX_GPUS_PER_NODE:
        raise Malformed(f"rechecked must list at most {MAX_GPUS_PER_NODE} [index, token] pairs")
    tokens: dict[int, int] = {}
    for r in rechecked:
        if not (
            isinstance(r, list | tuple)
            and len(r) == 2
            and all(type(x) is int for x in r)
            and r[0] in indexes
            and 0 < r[1] < 2**31
        ):
            raise Malformed("rechecked must list [index, token] pairs of the inventory's GPUs")
        tokens[r[0]] = r[1]
    return faults, tokens


def parse_address(address) -> str:
    """A heartbeat's `address` (where the node's peers reach it): "" from an agent that sends none."""
    if address is None or address == "":
        return ""
    if not valid_address(address):
        raise Malformed("address must be an IP address or a host name")
    return address


def sync_gpus(node: Node, gpus: Sequence[GpuInfo]) -> None:
    """Make the node's GPU rows match its inventory. GPUs the host no longer reports are removed unless
    an attempt still holds them."""
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


def _lock_node(
    *, name: str, gpu_type: str, hostname: str, agent_version: str, labels, state: str
) -> tuple[Node, bool]:
    """The node's row, locked (created with `state` if new): (node, created)."""
    return Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={
            "gpu_type": gpu_type,
            "state": state,
            "hostname": hostname,
            "agent_version": agent_version,
            "labels": labels or {},
        },
    )


def _update_node(node: Node, *, gpu_type: str, hostname: str, agent_version: str, labels, state=None) -> None:
    changed = []
    for field, value in (("gpu_type", gpu_type), ("hostname", hostname), ("agent_version", agent_version)):
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
    `initial_state` applies only to a node created here, `state` to any."""
    meta = {"gpu_type": gpu_type, "hostname": hostname, "agent_version": agent_version, "labels": labels}
    node, created = _lock_node(name=name, state=state or initial_state or NodeState.READY, **meta)
    if not created:
        _update_node(node, state=state, **meta)
    sync_gpus(node, gpus)
    return node, created


def join_state(join_token: str = "") -> str:
    """The state a node heard of for the first time joins in: READY with the join token, or where new
    nodes are accepted at once (the embedded file broker); else PENDING until an admin accepts it."""
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
    address: str = "",
    unhealthy: dict[int, GpuFault] | None = None,
    rechecked: dict[int, int] | None = None,
    believed: str = "",
) -> dict:
    """Register or refresh a node from its agent's heartbeat, and reconcile what it runs:

    - a heartbeat sent before the last one applied (`sent_at`, the host's clock) is late: dropped. The
      boot id only tells a restart (a new one) from the same process, never which boot is older;
    - a new node joins PENDING (no work) until an admin accepts it, or READY with the join token (or on
      the embedded broker, join_state); a PENDING node's heartbeat is its join request, and changes
      nothing but its own row (no GPU rows until it is accepted);
    - a LOST node that heartbeats again is READY; cordoned/draining nodes stay so, and their agent is
      told (it refuses starts);
    - after an agent restart (a new boot id), attempts the host no longer reports are lost;
    - attempts the host runs that are over (or unknown) are to be stopped: returned in "stop" and sent;
    - lost messages are made good: an attempt the host runs but that is still ADMITTED here is marked
      started, and one ADMITTED for a while that the host does not run has its start sent again
      (returned in "resent");
    - the GPUs its agent found broken (`unhealthy`) leave capacity, and their attempts end GPU_FAILED
      (returned in "gpu_failed"); a GPU an admin marked healthy is so again once the agent's re-check
      (`rechecked`) agrees (apply_gpu_health).
    """
    from jobs import lifecycle
    from jobs.choices import ATTEMPT_ACTIVE_STATES, AttemptState, Outcome
    from jobs.models import Attempt
    from quotas.triggers import request_pass

    from .dispatch import preempt_attempt

    now = timezone.now()
    joining = join_state(join_token)
    meta = {"gpu_type": gpu_type, "hostname": hostname, "agent_version": agent_version, "labels": labels}
    with transaction.atomic():
        node, created = _lock_node(name=name, state=joining, **meta)
        if (
            not created
            and sent_at is not None
            and node.last_sent_at is not None
            and sent_at < node.last_sent_at
        ):
            # Sent before the last one applied: the last words of a previous agent process handled
            # after its successor's first heartbeat (several threads handle heartbeats), or a replay.
            refused(
                f"node {name}",
                "late heartbeat",
                f"sent {node.last_sent_at - sent_at:.1f} s before the last one applied",
                level=logging.INFO,
            )
            return {"state": node.state, "lost": [], "stop": [], "resent": [], "ignored": True}
        if not created:
            _update_node(node, **meta)
        heard = {"last_heartbeat": now, "boot_id": boot_id}
        if sent_at is not None:
            # Dated ahead of our clock, it holds the node's order for at most MESSAGE_CLOCK_SKEW_S.
            heard["last_sent_at"] = min(sent_at, time.time() + settings.MESSAGE_CLOCK_SKEW_S)
        if node.state == NodeState.PENDING:
            if joining != NodeState.READY:
                # A join request: its own row, and nothing else (no GPU rows) until an admin accepts it.
                if created:
                    log.warning(
                        "node %s (host %r) asked to join: PENDING until an admin accepts it", name, hostname
                    )
                Node.objects.filter(pk=node.pk).update(**heard)
                tell_agent(name, NodeState.PENDING)
                return {"state": NodeState.PENDING, "lost": [], "stop": [], "resent": [], "ignored": True}
            log.info("node %s joined with the join token", name)
            Node.objects.filter(pk=node.pk).update(state=NodeState.READY, state_changed_at=now)
            node.state = NodeState.READY
            created = True  # as good as new: READY from now on
        sync_gpus(node, inventory)
        previous_boot = node.boot_id  # read under the row lock
        came_back = created or node.state == NodeState.LOST
        fields = dict(heard)
        if came_back:
            fields.update(state=NodeState.READY, state_changed_at=now)
        if address and node.address != address:
            fields["address"] = address
        Node.objects.filter(pk=node.pk).update(**fields)

        reported = dict(running)
        live = {}
        admitted_at, started_at, deadline, gang = {}, {}, {}, set()
        for a_id, number, state, admitted, started, stop_deadline, placement in Attempt.objects.filter(
            state__in=list(ATTEMPT_ACTIVE_STATES), nodes=node.pk
        ).values_list("pk", "number", "state", "admitted_at", "started_at", "stop_deadline", "placement"):
            live[a_id] = (number, state)
            admitted_at[a_id], started_at[a_id], deadline[a_id] = admitted, started, stop_deadline
            if len(placement or ()) > 1:
                gang.add(a_id)
        lost = []
        if previous_boot and previous_boot != boot_id:
            for a_id, (number, state) in live.items():
                # ADMITTED ones are left alone: their start may still be waiting in the queue.
                forgotten = state != AttemptState.ADMITTED and reported.get(a_id) != number
                # Its processes died with the previous agent (its fence watchdog), after the last
                # heartbeat that said it ran: the end is dated then, not when the new agent speaks.
                ended = max(node.last_heartbeat or now, started_at[a_id] or admitted_at[a_id])
                if forgotten and lifecycle.end_attempt(
                    a_id,
                    number,
                    outcome=Outcome.NODE_LOST,
                    reason=f"the agent on {name} restarted and no longer runs it",
                    at=min(ended, now),
                    strike_node=name,
                ):
                    lost.append(a_id)
        # A stop its host has not confirmed past its grace and PREEMPT_ACK_TIMEOUT_S: the host that
        # still runs it is told again (the first stop may have been lost); one whose heartbeat no
        # longer lists it has said its copy is gone, and the attempt ends (a gang's waits for its end
        # report or its hosts' leases: one heartbeat speaks for one rank only).
        unconfirmed = now - timedelta(seconds=settings.PREEMPT_ACK_TIMEOUT_S)
        for a_id, (number, state) in live.items():
            if state != AttemptState.STOPPING or deadline[a_id] is None or deadline[a_id] >= unconfirmed:
                continue
            if reported.get(a_id) == number:
                transaction.on_commit(lambda a_id=a_id, n=number: preempt_attempt(name, a_id, n, 0))
            elif a_id not in gang and lifecycle.end_attempt(
                a_id,
                number,
                outcome=Outcome.PREEMPTED,
                reason=f"stopped: the agent on {name} no longer runs it (its end report did not arrive)",
                at=max(min(node.last_heartbeat or now, now), started_at[a_id] or admitted_at[a_id]),
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
        # After the reconciliation: an attempt it ends is stopped once, by fail_attempts_on.
        gpu_failed = apply_gpu_health(node, unhealthy or {}, rechecked or {}, now)
        if came_back or lost:
            transaction.on_commit(lambda: request_pass("node ready" if came_back else "node restarted"))
        # Told again where the agent believes another state (`believed`, what it was last told; "" from
        # an agent that does not say): a heartbeat that read the state before an un-cordon committed may
        # have told it CORDONED after the un-cordon told it READY, and it would refuse every start.
        told = NodeState.READY if came_back else node.state
        if came_back or node.state != NodeState.READY or (believed and believed != told):
            tell_agent(name, told)
    return {
        "state": NodeState.READY if came_back else node.state,
        "lost": lost,
        "stop": stop,
        "resent": resend,
        "gpu_failed": gpu_failed,
    }


# --- GPU health ------------------------------------------------------------------------------------


def _found_at(at: float) -> datetime:
    """When the agent found a fault, by its clock: never later than ours (plus the allowed skew)."""
    return datetime.fromtimestamp(max(0.0, min(at, time.time() + settings.MESSAGE_CLOCK_SKEW_S)), UTC)


def _gpu_unhealthy(node: Node, gpu: Gpu, fault: GpuFault, now) -> None:
    """A GPU leaves capacity: UNHEALTHY with its reason, a failure on record, an audit entry."""
    from quotas import audit

    before = audit.snapshot(gpu)
    Gpu.objects.filter(pk=gpu.pk).update(
        health=GpuHealth.UNHEALTHY,
        health_reason=fault.reason,
        health_detail=fault.detail[:300],
        health_changed_at=now,
    )
    GpuFailure.objects.create(
        node=node,
        gpu=gpu,
        index=gpu.index,
        uuid=gpu.uuid,
        reason=fault.reason,
        detail=fault.detail[:300],
        found_at=_found_at(fault.at),
    )
    audit.record_audit(None, "gpu_unhealthy", gpu, before, audit.snapshot(gpu))
    log.warning("GPU %d of %s is UNHEALTHY (%s): %s", gpu.index, node.name, fault.reason, fault.detail)


def apply_gpu_health(node: Node, faults: dict[int, GpuFault], rechecked: dict[int, int], now) -> list[int]:
    """What a heartbeat says of its node's GPUs (the node's row is locked: a node's heartbeats and an
    admin's mark-healthy of its GPUs take turns):

    - a HEALTHY GPU its agent lists broken becomes UNHEALTHY, and the attempts on it end GPU_FAILED at
      once (their processes were killed by the agent when it found the fault; every rank is told to stop);
    - an UNHEALTHY GPU stays so, listed or not (an agent restarted since forgets what it saw): only an
      admin brings it back (gpu_mark_healthy);
    - a GPU an admin marked healthy (CHECKING) waits for its agent's re-check, asked for again until the
      answer comes (`rechecked` names the token): HEALTHY if the GPU is not listed broken, else
      UNHEALTHY again.

    Returns the attempts ended."""
    from quotas import audit
    from quotas.triggers import request_pass

    from .dispatch import gpu_recheck

    broken, resend, changed = [], [], False
    for gpu in node.gpus.all():
        fault = faults.get(gpu.index)
        if gpu.health == GpuHealth.HEALTHY and fault is not None:
            _gpu_unhealthy(node, gpu, fault, now)
            broken.append((gpu, fault))
        elif gpu.health == GpuHealth.CHECKING:
            if rechecked.get(gpu.index) != gpu.recheck:
                resend.append((gpu.index, gpu.recheck))
            elif fault is not None:
                _gpu_unhealthy(node, gpu, fault, now)
                broken.append((gpu, fault))
            else:
                before = audit.snapshot(gpu)
                Gpu.objects.filter(pk=gpu.pk).update(
                    health=GpuHealth.HEALTHY, health_reason="", health_detail="", health_changed_at=now
                )
                audit.record_audit(None, "gpu_healthy", gpu, before, audit.snapshot(gpu))
                log.warning("GPU %d of %s re-checked by its agent: HEALTHY again", gpu.index, node.name)
                changed = True
    name = node.name
    for index, token in resend:
        transaction.on_commit(lambda index=index, token=token: gpu_recheck(name, index, token))
    ended = fail_attempts_on(node, broken) if broken else []
    if broken or changed:
        transaction.on_commit(lambda: request_pass("GPU health changed"))
    return ended


def gpu_faults_reported(node_name: str, faults) -> list[int]:
    """An end report says its attempt was killed because these GPUs of `node_name` failed: they leave
    capacity now (as the heartbeat naming them would do), before the attempt ends and its job is
    re-queued, so that the next pass never places it on them again. The report and the heartbeat
    travel apart and either may be taken first; whichever comes second finds the GPU UNHEALTHY already.
    A list that is not well formed, or names no GPU of the node's inventory, is ignored (logged): the
    heartbeat still carries the faults. Returns the attempts ended (this one among them)."""
    with transaction.atomic():
        node = Node.objects.select_for_update().filter(name=node_name).first()
        if node is None or not isinstance(faults, list):
            return []
        held = list(node.gpus.all())
        try:
            parsed, _ = parse_gpu_health(faults, None, [GpuInfo(g.index, g.uuid) for g in held])
        except Malformed as e:
            log.warning("ignoring the GPU faults of an end report of %s: %s", node_name, e)
            return []
        now = timezone.now()
        # Only a HEALTHY GPU changes here: one being re-checked (CHECKING) waits for the heartbeat's answer.
        broken = [(g, parsed[g.index]) for g in held if g.health == GpuHealth.HEALTHY and g.index in parsed]
        for gpu, fault in broken:
            _gpu_unhealthy(node, gpu, fault, now)
        if not broken:
            return []
        from quotas.triggers import request_pass

        transaction.on_commit(lambda: request_pass("GPU health changed"))
        return fail_attempts_on(node, broken)


def fail_attempts_on(node: Node, broken: list[tuple[Gpu, GpuFault]]) -> list[int]:
    """End the live attempts holding these broken GPUs as GPU_FAILED (their jobs are re-queued), and
    tell every host of each to stop it (a gang's other ranks too). Returns the attempts ended."""
    from jobs import lifecycle
    from jobs.choices import ATTEMPT_ACTIVE_STATES, Outcome
    from jobs.models import GpuClaim

    from .dispatch import preempt_attempt

    faults = {gpu.pk: fault for gpu, fault in broken}
    held: dict[int, tuple[int, list, GpuFault]] = {}
    for attempt_id, number, placement, gpu_id in GpuClaim.objects.filter(
        gpu_id__in=list(faults), attempt__state__in=list(ATTEMPT_ACTIVE_STATES)
    ).values_list("attempt_id", "attempt__number", "attempt__placement", "gpu_id"):
        held.setdefault(attempt_id, (number, placement, faults[gpu_id]))
    ended = []
    for attempt_id, (number, placement, fault) in sorted(held.items()):
        reason = f"GPU {fault.index} of {node.name} failed: {fault.detail}"
        if lifecycle.end_attempt(attempt_id, number, outcome=Outcome.GPU_FAILED, reason=reason):
            ended.append(attempt_id)
            for p in placement:
                transaction.on_commit(lambda n=p["node"], a=attempt_id, k=number: preempt_attempt(n, a, k, 0))
    return ended


def gpu_mark_healthy(*, node: Node, index: int, actor=None) -> Gpu:
    """An admin brings a GPU back (after a reset): it is re-checked by its agent before it takes work
    (CHECKING until the agent answers: apply_gpu_health). Its open failure records say who cleared them
    and when; the change is audited. A GPU that is HEALTHY already is left as it is; one CHECKING is asked
    to be re-checked again. Raises Gpu.DoesNotExist for an index the node does not have."""
    from quotas import audit

    from .dispatch import gpu_recheck

    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        gpu = node.gpus.get(index=index)
        if gpu.health == GpuHealth.HEALTHY:
            return gpu
        if gpu.health == GpuHealth.UNHEALTHY:
            now = timezone.now()
            before = audit.snapshot(gpu)
            gpu.recheck += 1
            Gpu.objects.filter(pk=gpu.pk).update(
                health=GpuHealth.CHECKING, health_changed_at=now, recheck=gpu.recheck
            )
            user = actor if getattr(actor, "is_authenticated", False) else None
            GpuFailure.objects.filter(gpu=gpu, cleared_at__isnull=True).update(
                cleared_at=now, cleared_by=user
            )
            audit.record_audit(actor, "gpu_mark_healthy", gpu, before, audit.snapshot(gpu))
            log.warning(
                "GPU %d of %s marked healthy by %s: its agent re-checks it before it takes work",
                index,
                node.name,
                user.get_username() if user is not None else "the system",
            )
        name, token = node.name, gpu.recheck
        transaction.on_commit(lambda: gpu_recheck(name, index, token))
    gpu.refresh_from_db()
    return gpu


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
                    "uuid": gpu.uuid,
                    "health": gpu.health,
                    "health_reason": gpu.get_health_reason_display() if gpu.health_reason else "",
                    "health_detail": gpu.health_detail,
                    "health_changed_at": gpu.health_changed_at,
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
                "unhealthy": sum(1 for g in gpus if g["health"] != GpuHealth.HEALTHY),
                "heartbeat_age": None if age is None else max(0, int(age)),
                "stale": age is None or age > 3 * settings.HEARTBEAT_INTERVAL_S,
            }
        )
    return grid
