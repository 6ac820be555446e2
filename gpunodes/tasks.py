"""Control-side tasks of the gpunodes app: heartbeats (registration, liveness, the reports of the
agent's outbox and their acknowledgement, reconciliation).
Nodes that stop heartbeating are marked LOST by the scheduling pass itself (quotas/scheduler.py)."""

import logging
import math

from celery import shared_task

from gpunodes import services

log = logging.getLogger(__name__)

# Report and message names, by name: the control side never imports the agent's code.
STARTED = "jobs.tasks.attempt_started"
FINISHED = "jobs.tasks.attempt_finished"
CHECKPOINT = "jobs.tasks.attempt_checkpoint"
OUTBOX_ACK = "gpunodes.agent.tasks.outbox_ack"
MAX_REPORTS = 1000  # one heartbeat's worth (the agent sends at most outbox.BATCH)
MAX_GAPS = 100  # log gaps asked for in one ack (the rest with the next heartbeats)
_WARNED_NEWER: set[tuple[str, frozenset]] = set()  # (node, unknown heartbeat fields) already logged
MAX_WARNED_NEWER = 1000  # a node that makes up new fields at every heartbeat grows it no further


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
    address: str | None = None,
    unhealthy: list[dict] | None = None,
    rechecked: list[list[int]] | None = None,
    node_state: str = "",
    **newer: object,
) -> dict:
    """`newer`: fields of an agent newer than this control side (a rolling upgrade reaches the hosts
    first): ignored with a warning, once per node and set of fields, instead of failing every heartbeat
    of that host (a TypeError here would have it declared LOST and its jobs re-queued). A heartbeat with
    a field out of bounds (services.parse_heartbeat) is refused whole, and logged."""
    from django.core.exceptions import ValidationError

    from gpunodes.choices import NodeState
    from gpunodes.models import node_name_validator
    from gpunodes.signing import refused
    from quotas.models import gpu_type_validator

    try:
        node_name_validator(name)
        gpu_type_validator(gpu_type)
    except (ValidationError, TypeError):
        refused("an unknown node", "malformed node name or GPU type", f"{name!r:.80}, {gpu_type!r:.40}")
        return {"refused": True}
    try:
        gpus, running, sent_at = services.parse_heartbeat(
            inventory=inventory,
            running=running,
            boot_id=boot_id,
            hostname=hostname,
            agent_version=agent_version,
            labels=labels,
            sent_at=sent_at,
        )
        address = services.parse_address(address)
        faults, tokens = services.parse_gpu_health(unhealthy, rechecked, gpus)
        if not isinstance(join_token, str) or not all(isinstance(x or [], list) for x in (outbox, finished)):
            raise services.Malformed("join_token must be a string, outbox and finished lists")
        if node_state not in ("", *NodeState.values):
            raise services.Malformed(f"node_state must be a node state, got {node_state!r:.40}")
    except services.Malformed as e:
        refused(f"node {name}", "malformed heartbeat", str(e))
        return {"refused": True}
    if newer and (name, frozenset(newer)) not in _WARNED_NEWER and len(_WARNED_NEWER) < MAX_WARNED_NEWER:
        _WARNED_NEWER.add((name, frozenset(newer)))
        log.warning(
            "the heartbeat of %s carries fields this control side does not know (%s): its agent is newer;"
            " they are ignored until the control side is upgraded",
            name,
            ", ".join(sorted(newer)),
        )
    # `finished`: what agents without an outbox repeat (their recent finished reports, no ids).
    reports = list(outbox or []) + [{"name": FINISHED, "kwargs": r} for r in finished or ()]
    recorded, relog = [], []
    if reports:
        from gpunodes.models import Node

        # Before the reconciliation (a restarted host's reports are its last word on what ended); only
        # from a node that was accepted.
        if Node.objects.filter(name=name).exclude(state=NodeState.PENDING).exists():
            recorded, relog = apply_reports(name, reports)
    result = services.node_heartbeat(
        name=name,
        gpu_type=gpu_type,
        inventory=gpus,
        running=running,
        boot_id=boot_id,
        agent_version=agent_version,
        hostname=hostname,
        labels=labels,
        sent_at=sent_at,
        join_token=join_token,
        address=address,
        unhealthy=faults,
        rechecked=tokens,
        believed=node_state,
    )
    if (recorded or relog) and isinstance(outbox_epoch, str) and outbox_epoch:
        # Applied (each report committed on its own): the agent may forget them. A lost ack costs only
        # a repeat with the next heartbeat.
        try:
            send_outbox_ack(name, outbox_epoch, recorded, relog)
        except Exception:
            log.exception("could not acknowledge %d outbox report(s) of %s", len(recorded), name)
    return result


def _report_key(report: dict) -> tuple[int | None, str, int, int] | None:
    """(outbox id, task name, attempt id, number) of a well-formed report, else None."""
    kwargs = report.get("kwargs") if isinstance(report, dict) else None
    entry_id = report.get("id") if isinstance(report, dict) else None
    if not isinstance(kwargs, dict) or report.get("name") not in (STARTED, FINISHED, CHECKPOINT):
        return None
    a, n = kwargs.get("attempt_id"), kwargs.get("number")
    if type(a) is not int or type(n) is not int or (entry_id is not None and type(entry_id) is not int):
        return None
    if report["name"] == CHECKPOINT and not (
        type(kwargs.get("at")) in (int, float) and math.isfinite(kwargs["at"])
    ):
        return None  # a checkpoint without its time
    return entry_id, report["name"], a, n


def apply_reports(node: str, reports: list[dict]) -> tuple[list[int], list[list[int]]]:
    """Apply the reports a heartbeat carries (the agent's outbox, oldest first), as if each had
    arrived on its own: a report lost with the broker is not lost for good. Applying one twice changes
    nothing (compare-and-set on the attempt number); only those about attempts still live are
    applied (one query for the rest), and each counts for the heartbeat's sender, whatever it says.
    Returns the outbox ids recorded (applied, or found moot: the attempt is over, or malformed), and
    the log gaps to ask for: [id, start, end] of an end whose log this side does not hold whole (its
    id is held back until it does)."""
    from jobs.choices import AttemptState
    from jobs.models import Attempt
    from jobs.tasks import attempt_checkpoint, attempt_finished, attempt_started

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
            kwargs = r["kwargs"]
            if task == STARTED:
                attempt_started(attempt_id=attempt_id, number=number, node=node, pull_s=kwargs.get("pull_s"))
            elif task == CHECKPOINT:
                count = kwargs.get("count")
                attempt_checkpoint(
                    attempt_id=attempt_id,
                    number=number,
                    node=node,
                    at=kwargs["at"],
                    count=count if type(count) is int else 0,
                )
            else:
                from jobs.lifecycle import attempt_words

                log.info(
                    "applying a repeated finished report of %s from %s",
                    attempt_words(attempt_id, number),
                    node,
                )
                exit_code = kwargs.get("exit_code")
                checkpoint_at, count = kwargs.get("checkpoint_at"), kwargs.get("checkpoints")
                attempt_finished(
                    attempt_id=attempt_id,
                    number=number,
                    node=node,  # the heartbeat's sender, whatever the report says
                    how=str(kwargs.get("how", "exited")),
                    exit_code=exit_code if type(exit_code) is int else None,
                    detail=str(kwargs.get("detail", "")),
                    checkpoint_at=_number(checkpoint_at) if checkpoint_at is not None else None,
                    checkpoints=count if type(count) is int else 0,
                    gpu_faults=kwargs.get("gpu_faults")
                    if isinstance(kwargs.get("gpu_faults"), list)
                    else None,
                    ended_at=_number(kwargs["ended_at"]) if "ended_at" in kwargs else None,
                )
                live.discard((attempt_id, number))  # ended (or refused): a later copy is moot
        entry_id = r.get("id") if isinstance(r, dict) else None
        if type(entry_id) is int and entry_id > 0:
            recorded.append(entry_id)
    gaps = _log_gaps(node, [(r, key) for r, key in keyed if key and key[0] and key[1] == FINISHED])
    relog = [[entry_id, start, end] for entry_id, holes in gaps.items() for start, end in holes]  # [] waits
    return [i for i in recorded if i not in gaps], relog[:MAX_GAPS]


def log_settle_s() -> float:
    """How old an end report must be before its log is checked for gaps (a few heartbeats)."""
    from django.conf import settings

    return max(5.0, 3.0 * settings.HEARTBEAT_INTERVAL_S)


def _number(value) -> float:
    return float(value) if type(value) in (int, float) else -1.0


def _ranges(value) -> list[tuple[int, int]] | None:
    if not isinstance(value, list) or len(value) > 4:
        return None
    out = []
    for r in value:
        if not (isinstance(r, list) and len(r) == 2 and all(type(x) is int for x in r) and 0 <= r[0] < r[1]):
            return None
        out.append((r[0], r[1]))
    return out


def _log_gaps(node: str, finished: list[tuple[dict, tuple]]) -> dict[int, list[tuple[int, int]]]:
    """{outbox id: the byte ranges of its attempt's log, as the end report says they were shipped,
    that no stored chunk covers}. Only for attempts this node may write the log of (else the chunks
    sent again would be refused for ever). Two queries."""
    from jobs.models import Attempt, LogChunk, OctetLength

    wanted = {key[0]: (key[2], _ranges(r["kwargs"].get("log_ranges"))) for r, key in finished}
    wanted = {i: (a, ranges) for i, (a, ranges) in wanted.items() if ranges}
    # The last chunks of an end that just happened may still be on their way (the control worker runs
    # tasks side by side): its log is looked at a little later; until then its ack waits (no gaps).
    settle_s = log_settle_s()
    young = {key[0] for r, key in finished if not (_number(r.get("age_s")) >= settle_s)}
    out: dict[int, list[tuple[int, int]]] = {i: [] for i in wanted if i in young}
    wanted = {i: v for i, v in wanted.items() if i not in young}
    if not wanted:
        return out
    placements = dict(
        Attempt.objects.filter(pk__in={a for a, _ in wanted.values()}).values_list("pk", "placement")
    )
    mine = {a for a, p in placements.items() if any(x.get("node") == node for x in p or ())}
    held: dict[int, list[tuple[int, int]]] = {}
    cut = set()  # its output was cut for its team's budget (jobs.services.log_append): nothing is missing
    for attempt_id, offset, size, was_cut in (
        LogChunk.objects.filter(attempt_id__in=mine, node=node)
        .annotate(size=OctetLength("text"))
        .values_list("attempt_id", "offset", "size", "cut")
    ):
        held.setdefault(attempt_id, []).append((offset, size))
        if was_cut:
            cut.add(attempt_id)
    for entry_id, (attempt_id, ranges) in wanted.items():
        if (
            attempt_id in mine
            and attempt_id not in cut
            and (holes := uncovered(ranges, held.get(attempt_id, [])))
        ):
            out[entry_id] = holes[:MAX_GAPS]
    return out


def uncovered(ranges: list[tuple[int, int]], chunks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of the byte ranges [start, end) that no chunk (offset, size) covers, each gap ending
    where the next chunk begins (so what is sent again never overlaps what is held)."""
    gaps = []
    chunks = sorted(chunks)
    for start, end in ranges:
        at = start
        for offset, size in chunks:
            if offset < start or offset + size <= at:  # before the range: the cap's note, say
                continue
            if offset >= end:
                break
            if offset > at:
                gaps.append((at, offset))
            at = max(at, offset + size)
        if at < end:
            gaps.append((at, end))
    return gaps


def send_outbox_ack(node: str, epoch: str, ids: list[int], relog: list[list[int]] = ()) -> None:
    """Tell the node's agent which of its outbox entries the control side recorded (it drops them),
    and which log bytes it still lacks (it sends them again)."""
    from config.celery import app, node_queue

    kwargs = {"node": node, "epoch": epoch, "ids": ids, "relog": list(relog)}
    app.send_task(OUTBOX_ACK, kwargs=kwargs, queue=node_queue(node))
