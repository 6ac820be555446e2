"""The scheduling pass: lock → housekeeping → snapshot → policy.plan() → apply → dispatch after commit.

One pass at a time: a PostgreSQL advisory transaction lock, and on SQLite the IMMEDIATE transaction
(config/settings.py) that takes the database's write lock up front. The snapshot is read in a constant
number of queries whatever the number of jobs; the plan is applied with compare-and-set updates in the
same transaction, and the messages to the GPU hosts are sent only once it has committed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, F, FloatField, Func, Q, Sum
from django.utils import timezone

from gpunodes.choices import HOLDING_STATES, GpuHealth, NodeState
from gpunodes.dispatch import start_attempt, start_payloads
from gpunodes.models import Gpu, Node
from gpunodes.rendezvous import choose_port, node_address, port_range
from jobs import lifecycle
from jobs.choices import ATTEMPT_ACTIVE_STATES, AttemptState, EventKind, JobState, Outcome
from jobs.limits import effective_grace
from jobs.models import Attempt, GpuClaim, Job, JobEvent
from jobs.transitions import transition
from quotas import fairshare, hearing
from quotas.engine import policy
from quotas.models import SchedulerPass, Share, ShareCapacity
from quotas.triggers import clear_pending, request_pass_at

log = logging.getLogger(__name__)

PASS_LOCK_KEY = 0x6770_7571  # "gpuq": the advisory lock id of the pass
KEEP_PASS_RECORDS = 2000


@dataclass
class PassResult:
    admitted: list[int] = field(default_factory=list)  # job ids
    preempted: list[int] = field(default_factory=list)  # attempt ids
    ended: list[int] = field(default_factory=list)  # attempt ids ended by housekeeping
    lost_nodes: list[str] = field(default_factory=list)
    hearing_since: datetime | None = None
    # Jobs that wait for protection (rule 10), and when the first window that matters to one ends: a
    # pass is asked for then (nothing else is sure to come at that instant).
    protected: list[int] = field(default_factory=list)
    recheck_at: float | None = None
    queued: int = 0
    running: int = 0
    duration_ms: float = 0.0
    plan_ms: float = 0.0


def _lock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [PASS_LOCK_KEY])
    # SQLite: the atomic block began with BEGIN IMMEDIATE, which already holds the write lock.


class Epoch(Func):
    """A timestamp column as Unix seconds, computed by the database: parsing 100k datetimes in Python
    was most of the snapshot's time."""

    output_field = FloatField()

    def as_postgresql(self, compiler, conn, **extra):
        return self.as_sql(compiler, conn, template="EXTRACT(EPOCH FROM %(expressions)s)::float8", **extra)

    def as_sqlite(self, compiler, conn, **extra):
        return self.as_sql(
            compiler, conn, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)", **extra
        )


# --- housekeeping --------------------------------------------------------------------------------


def mark_lost_nodes(now: datetime, since: datetime | None) -> tuple[list[str], list[int]]:
    """Nodes without a heartbeat for NODE_LOST_AFTER_S while the control side heard others (`since`:
    see quotas/hearing.py) become LOST; their attempts end as NODE_LOST and their jobs go back to the
    queue with their original submit time."""
    cutoff = hearing.lost_cutoff(now, since)
    if cutoff is None:
        return [], []
    stale = list(
        Node.objects.filter(state__in=list(HOLDING_STATES), last_heartbeat__lt=cutoff).values_list(
            "pk", "name"
        )
    )
    ended: list[int] = []
    for pk, name in stale:
        if not Node.objects.filter(pk=pk, state__in=list(HOLDING_STATES)).update(
            state=NodeState.LOST, state_changed_at=now
        ):
            continue
        log.warning("node %s is LOST (no heartbeat since %s)", name, cutoff)
        ended += end_attempts_on_node(pk, name, f"node {name} stopped heartbeating", now)
    return [name for _, name in stale], ended


def _hearing_since(now: datetime) -> datetime | None:
    """Carry the previous pass's `hearing_since` on, or start/stop it (quotas/hearing.py); a change is
    logged: a control side that hears no node declares none LOST, however long the silence."""
    previous = (
        SchedulerPass.objects.order_by("-started_at").values_list("started_at", "hearing_since").first()
    )
    since = hearing.hearing_since(now, previous)
    was = previous is not None and previous[1] is not None
    if was and since is None:
        log.warning(
            "no heartbeat from any node for %.0f s (broker, database or control worker down?): "
            "no node is declared LOST until heartbeats arrive again",
            hearing.gap_s(),
        )
    elif previous is not None and since == now:
        silence = hearing.silence_before(now)
        if silence is None:  # the cluster's start: nothing ran unheard
            log.info(
                "heartbeats heard: a node is declared LOST once silent for NODE_LOST_AFTER_S (%d s)",
                settings.NODE_LOST_AFTER_S,
            )
        else:
            log.warning(
                "heartbeats heard again after %.0f s without any: every node has NODE_LOST_AFTER_S (%d s) "
                "to check in before it can be declared LOST",
                silence,
                settings.NODE_LOST_AFTER_S,
            )
    return since


def end_attempts_on_node(node_pk: int, node_name: str, reason: str, now: datetime) -> list[int]:
    ended = []
    for attempt_id, number in Attempt.objects.filter(
        state__in=list(ATTEMPT_ACTIVE_STATES), nodes=node_pk
    ).values_list("pk", "number"):
        if lifecycle.end_attempt(attempt_id, number, outcome=Outcome.NODE_LOST, reason=reason, at=now):
            ended.append(attempt_id)
    return ended


def expire_stops(now: datetime) -> list[int]:
    """A stopping attempt whose host has not confirmed within grace + PREEMPT_ACK_TIMEOUT_S frees its
    GPUs anyway once every host of it has let its lease lapse (its copy is fenced: gpunodes.services
    lease_cutoff), so that a dead host cannot hold a beneficiary back forever. A host still heard runs
    it until it says otherwise (its heartbeat: gpunodes.services.node_heartbeat sends the stop again),
    whatever its disk: the job never runs again elsewhere while its old copy may still run (issue 41)."""
    from gpunodes.leases import lease_cutoff

    cutoff = now - timedelta(seconds=settings.PREEMPT_ACK_TIMEOUT_S)
    ended = []
    for attempt_id, number in (
        Attempt.objects.filter(state=AttemptState.STOPPING, stop_deadline__lt=cutoff)
        .exclude(nodes__last_heartbeat__gte=lease_cutoff(now))
        .values_list("pk", "number")
        .distinct()
    ):
        if lifecycle.end_attempt(
            attempt_id,
            number,
            outcome=Outcome.PREEMPTED,
            reason="the host did not confirm the stop, and its lease has lapsed since",
            at=now,
        ):
            ended.append(attempt_id)
    return ended


def finish_drains(now: datetime) -> int:
    """A draining node with nothing left running is marked CORDONED (drained)."""
    return (
        Node.objects.filter(state=NodeState.DRAINING)
        .exclude(attempts__state__in=list(ATTEMPT_ACTIVE_STATES))
        .update(state=NodeState.CORDONED, state_changed_at=now)
    )


# --- snapshot ------------------------------------------------------------------------------------


@dataclass
class Loaded:
    snapshot: policy.Snapshot
    gpu_ids: dict[tuple[str, int], int]  # (node name, index) -> Gpu pk
    node_ids: dict[str, int]
    # attempt id -> (number, the job's preemption grace, capped at MAX_PREEMPTION_GRACE_S)
    attempt_numbers: dict[int, tuple[int, int]]
    # (share, gpu type) -> (queued jobs, queued GPUs); filled also when the queue itself was not loaded
    queued_totals: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    # The engine numbers a node's GPUs 0..n-1. Where a node's usable GPUs (HEALTHY, or still held by an
    # attempt) are not simply 0..n-1 (a GPU in the middle failed), its GPU indexes in the engine's order.
    engine_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # Where each node's peers reach it (gpunodes.rendezvous.node_address), and the rendezvous ports of
    # the live attempts whose rank 0 it is.
    addresses: dict[str, str | None] = field(default_factory=dict)
    ports_in_use: dict[str, set[int]] = field(default_factory=dict)

    def real_gpus(self, node: str, indexes) -> tuple[int, ...]:
        """The node's GPU indexes for the engine's `indexes`."""
        table = self.engine_gpus.get(node)
        return tuple(indexes) if table is None else tuple(table[i] for i in indexes)

    def real_placement(self, placement) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple((node, self.real_gpus(node, indexes)) for node, indexes in placement)


def load_snapshot(now: datetime | None = None, *, queued: bool = True) -> Loaded:
    """Everything the policy needs, in six queries, whatever the number of jobs. With queued=False the
    queue is left out (usage and lending do not depend on it) and only its totals per share and type are
    read, by one aggregate: what pages and metrics need, at a fraction of the cost with a long queue.

    A GPU that is not HEALTHY (gpunodes.choices.GpuHealth) is no capacity: the engine sees the node
    without it, unless an attempt still holds it (it is then freed as any other, when that attempt
    ends). The engine numbers the rest 0..n-1 (Loaded.engine_gpus translates)."""
    now = now or timezone.now()
    node_rows = list(
        Node.objects.filter(state__in=list(HOLDING_STATES)).values_list(
            "pk", "name", "gpu_type", "state", "address", "hostname"
        )
    )
    node_ids = {name: pk for pk, name, *_ in node_rows}
    addresses = {name: node_address(address, hostname) for _, name, _, _, address, hostname in node_rows}
    gpu_ids: dict[tuple[str, int], int] = {}
    indexes: dict[str, list[int]] = {}
    for pk, node_name, index, health, claim in Gpu.objects.filter(
        node_id__in=list(node_ids.values())
    ).values_list("pk", "node__name", "index", "health", "claim"):
        gpu_ids[(node_name, index)] = pk
        if health == GpuHealth.HEALTHY or claim is not None:
            indexes.setdefault(node_name, []).append(index)
    engine_gpus: dict[str, tuple[int, ...]] = {}
    engine_index: dict[str, dict[int, int]] = {}
    for name, usable in indexes.items():
        usable.sort()
        if usable != list(range(len(usable))):
            engine_gpus[name] = tuple(usable)
            engine_index[name] = {real: i for i, real in enumerate(usable)}
    nodes = tuple(
        policy.NodeView(
            name=name,
            gpu_type=gpu_type,
            gpus=len(indexes.get(name, ())),
            schedulable=state == NodeState.READY,
        )
        for _, name, gpu_type, state, *_ in node_rows
        if indexes.get(name)
    )

    def engine_placement(placement) -> tuple:
        return tuple(
            (
                p["node"],
                tuple(
                    engine_index[p["node"]].get(i, i) if p["node"] in engine_index else i for i in p["gpus"]
                ),
            )
            for p in placement
        )

    capacities: dict[int, dict[str, int]] = {}
    shares_rows = list(
        Share.objects.values_list(
            "pk",
            "name",
            "strategy",
            "borrow_limit",
            "in_share_preemption",
            "min_runtime_s",
            "group__name",
            "weight",
        )
    )
    for share_id, gpu_type, max_gpus in ShareCapacity.objects.values_list("share_id", "gpu_type", "max_gpus"):
        capacities.setdefault(share_id, {})[gpu_type] = max_gpus
    shares = tuple(
        policy.ShareView(
            name=name,
            capacity=capacities.get(pk, {}),
            strategy=strategy,
            borrow_limit=limit,
            in_share_preemption=isp,
            min_runtime_s=min_runtime,
            group=group,
            weight=weight,
        )
        for pk, name, strategy, limit, isp, min_runtime, group, weight in shares_rows
    )
    # the organisation tree, its settings and history (a flat layout: none)
    shares, tree = fairshare.checked(shares, fairshare.tree_inputs())

    running = []
    attempt_numbers = {}
    ports_in_use: dict[str, set[int]] = {}
    share_names = {pk: name for pk, name, *_ in shares_rows}
    active = Attempt.objects.filter(state__in=list(ATTEMPT_ACTIVE_STATES)).annotate(
        submitted_s=Epoch("job__submitted_at"),
        started_s=Epoch("started_at"),
        admitted_s=Epoch("admitted_at"),
        checkpoint_s=Epoch("last_checkpoint_at"),
    )
    for row in active.values_list(
        "pk",
        "number",
        "job_id",
        "job__share_id",
        "job__gpu_type",
        "job__priority",
        "submitted_s",
        "admitted_s",
        "started_s",
        "placement",
        "borrowed",
        "state",
        "preempted_by_id",
        "job__preemption_grace_s",
        "rendezvous_port",
        "checkpoint_s",
    ):
        (
            pk,
            number,
            job_id,
            share_id,
            gpu_type,
            prio,
            submitted,
            admitted,
            started,
            placement,
            borrowed,
            state,
            beneficiary,
            grace,
            port,
            checkpoint,
        ) = row
        attempt_numbers[pk] = (number, effective_grace(grace))
        if port is not None and placement:
            ports_in_use.setdefault(placement[0]["node"], set()).add(port)
        running.append(
            policy.RunningView(
                attempt_id=pk,
                job_id=job_id,
                share=share_names[share_id],
                gpu_type=gpu_type,
                priority=prio,
                submitted_at=submitted,
                started_at=started or admitted or 0.0,
                placement=engine_placement(placement),
                borrowed=borrowed,
                preempting=state == AttemptState.STOPPING,
                beneficiary_job_id=beneficiary if state == AttemptState.STOPPING else None,
                last_checkpoint_at=checkpoint,  # the safe point's other half (SEMANTICS "Checkpoints")
            )
        )

    taken: dict[int, int] = {}
    if tree.get("fair_reclaim") and (running or queued):
        # Fair reclaim leaves a job alone once it took the job's earlier attempts often enough (rule 11's
        # bound per job, quotas/engine/fairshare.py): how many it took, per job that runs now and, for
        # the forecast's replay (the attempt it gets next carries the count), per queued job; one query.
        whose = Q(job_id__in={r.job_id for r in running})
        if queued:
            whose |= Q(job__state=JobState.QUEUED)
        taken = dict(
            Attempt.objects.filter(whose, preemption_reason=policy.FAIR_SHARE)
            .exclude(state__in=list(ATTEMPT_ACTIVE_STATES))
            .values("job_id")
            .annotate(n=Count("*"))
            .values_list("job_id", "n")
            .order_by()
        )
        if taken:
            running = [replace(r, fair_reclaims=taken[r.job_id]) if r.job_id in taken else r for r in running]
    queue = Job.objects.filter(state=JobState.QUEUED)
    if not queued:
        totals = {
            (share_names[share_id], gpu_type): (n, gpus)
            for share_id, gpu_type, n, gpus in queue.values("share_id", "gpu_type")
            .annotate(n=Count("*"), g=Sum("gpus"))
            .values_list("share_id", "gpu_type", "n", "g")
            .order_by()
        }
        snapshot = policy.Snapshot(
            now=now.timestamp(),
            nodes=nodes,
            shares=shares,
            running=tuple(running),
            queued=(),
            starvation_s=settings.STARVATION_S,
            **tree,
        )
        return Loaded(
            snapshot, gpu_ids, node_ids, attempt_numbers, totals, engine_gpus, addresses, ports_in_use
        )
    queued_views = tuple(
        policy.QueuedView(
            job_id=pk,
            share=share_names[share_id],
            gpu_type=gpu_type,
            gpus=gpus,
            priority=prio,
            submitted_at=submitted,
            beneficiary=beneficiary,
            fair_reclaims=taken.get(pk, 0),
        )
        for pk, share_id, gpu_type, gpus, prio, submitted, beneficiary in queue.annotate(
            submitted_s=Epoch("submitted_at")
        ).values_list("pk", "share_id", "gpu_type", "gpus", "priority", "submitted_s", "beneficiary")
    )
    snapshot = policy.Snapshot(
        now=now.timestamp(),
        nodes=nodes,
        shares=shares,
        running=tuple(running),
        queued=queued_views,
        starvation_s=settings.STARVATION_S,
        **tree,
    )
    sums: dict[tuple[str, str], list[int]] = {}
    for q in queued_views:
        acc = sums.setdefault((q.share, q.gpu_type), [0, 0])
        acc[0] += 1
        acc[1] += q.gpus
    totals = {key: (n, gpus) for key, (n, gpus) in sums.items()}
    return Loaded(snapshot, gpu_ids, node_ids, attempt_numbers, totals, engine_gpus, addresses, ports_in_use)


# --- apply ---------------------------------------------------------------------------------------


def _admission_reason(adm: policy.Admission, placement) -> str:
    where = "; ".join(f"{node} GPUs {','.join(map(str, idx))}" for node, idx in placement)
    if adm.borrowed:
        lenders = ", ".join(adm.lenders) or "idle capacity"
        return f"{policy.ADMITTED_BORROWED} from {lenders} on {where}"
    return f"{policy.ADMITTED_OWN} on {where}"


def apply_admissions(loaded: Loaded, admissions: tuple[policy.Admission, ...], now: datetime) -> list[dict]:
    """Claim the GPUs and create the attempts, in bulk, each with its rendezvous port (rank 0's host and a
    port no live attempt there holds, never the job's previous attempt's). Returns the start messages
    to send."""
    if not admissions:
        return []
    by_job = {a.job_id: a for a in admissions}
    # The engine's GPU numbers, as the node's (a node whose GPU in the middle failed).
    where = {a.job_id: loaded.real_placement(a.placement) for a in admissions}
    # Lock the rows and re-check their state: a job cancelled since the snapshot is not admitted.
    rows = list(
        Job.objects.select_for_update()
        .filter(pk__in=list(by_job), state=JobState.QUEUED)
        .values_list(
            "pk",
            "attempt_count",
            "command",
            "env",
            "use_shell",
            "max_runtime_s",
            "preemption_grace_s",
            "submitted_by_id",
            "reclaim_needed_at",
            "image",
            "mounts",
        )
    )
    if not rows:
        return []
    ok = [r[0] for r in rows]
    previous_port = dict(
        Attempt.objects.filter(job_id__in=[pk for pk, count, *_ in rows if count])
        .exclude(rendezvous_port=None)
        .order_by("job_id", "number")
        .values_list("job_id", "rendezvous_port")
    )  # the latest attempt's, ordered last
    ports = port_range()
    port_of = {}
    for pk, *_ in rows:
        rank0 = where[pk][0][0]
        port_of[pk] = choose_port(loaded.ports_in_use.get(rank0, ()), previous_port.get(pk), ports)
        loaded.ports_in_use.setdefault(rank0, set()).add(port_of[pk])
    Job.objects.filter(pk__in=ok, state=JobState.QUEUED).update(
        state=JobState.ADMITTED,
        attempt_count=F("attempt_count") + 1,
        beneficiary=False,
        reclaim_needed_at=None,  # handed to the attempt: its owner's wait ends at its start
        state_reason="admitted",
        updated_at=now,
    )
    attempts = Attempt.objects.bulk_create(
        [
            Attempt(
                job_id=pk,
                number=count + 1,
                state=AttemptState.ADMITTED,
                placement=[{"node": n, "gpus": list(idx)} for n, idx in where[pk]],
                borrowed=by_job[pk].borrowed,
                reason=by_job[pk].reason,
                lenders=list(by_job[pk].lenders),
                admitted_at=now,
                rendezvous_port=port_of[pk],
                reclaim_needed_at=reclaim_needed_at,
            )
            for pk, count, *_, reclaim_needed_at, _image, _mounts in rows
        ]
    )
    claims, through, events, messages = [], [], [], []
    for attempt, (pk, count, command, env, use_shell, max_runtime, grace, user, _, image, mounts) in zip(
        attempts, rows, strict=True
    ):
        adm = by_job[pk]
        for node, idx in where[pk]:
            through.append(Attempt.nodes.through(attempt_id=attempt.pk, node_id=loaded.node_ids[node]))
            claims += [
                GpuClaim(attempt=attempt, gpu_id=loaded.gpu_ids[(node, i)], claimed_at=now) for i in idx
            ]
        messages += start_payloads(
            attempt_id=attempt.pk,
            number=count + 1,
            job_id=pk,
            placement=where[pk],
            command=command,
            env=env,
            use_shell=use_shell,
            max_runtime_s=max_runtime,
            grace_s=effective_grace(grace),
            rendezvous_port=port_of[pk],
            addresses=loaded.addresses,
            admitted_at=now,
            user=user,
            image=image,
            mounts=mounts,
        )
        events.append(
            JobEvent(
                job_id=pk,
                attempt_number=count + 1,
                at=now,
                kind=EventKind.ADMITTED,
                reason=_admission_reason(adm, where[pk])[:300],
                detail={
                    "borrowed": adm.borrowed,
                    "lenders": list(adm.lenders),
                    "placement": [{"node": n, "gpus": list(i)} for n, i in where[pk]],
                    "rendezvous_port": port_of[pk],
                },
            )
        )
    GpuClaim.objects.bulk_create(claims)  # a GPU claimed twice violates the unique index: rollback
    Attempt.nodes.through.objects.bulk_create(through)
    JobEvent.objects.bulk_create(events)
    return messages


def apply_preemptions(loaded: Loaded, preemptions: tuple[policy.Preemption, ...], now: datetime) -> list[int]:
    done = []
    for p in preemptions:
        number, grace = loaded.attempt_numbers[p.attempt_id]
        attempt = Attempt(pk=p.attempt_id, number=number)
        if p.reason == policy.RECLAIM:
            why = f"PREEMPTED_RECLAIM by job {p.beneficiary_job_id} of share {p.beneficiary_share}"
        elif p.reason == policy.FAIR_SHARE:  # rule 11: a borrower takes back towards its fair part
            why = f"PREEMPTED_FAIR_SHARE by job {p.beneficiary_job_id} of share {p.beneficiary_share}"
        else:
            why = f"PREEMPTED_PRIORITY by job {p.beneficiary_job_id}"
        if not lifecycle.request_stop(
            attempt, grace_s=grace, preempted_by=p.beneficiary_job_id, preemption_reason=p.reason, reason=why
        ):
            continue
        transition(
            p.job_id,
            from_states=[JobState.ADMITTED, JobState.RUNNING],
            to_state=JobState.PREEMPTING,
            event=EventKind.PREEMPTING,
            reason=why,
            attempt_number=number,
            detail={"reason": p.reason, "beneficiary": p.beneficiary_job_id, "grace_s": grace},
            preemption_count=F("preemption_count") + 1,
        )
        done.append(p.attempt_id)
    beneficiaries = {p.beneficiary_job_id for p in preemptions}
    if done and beneficiaries:
        Job.objects.filter(pk__in=list(beneficiaries), state=JobState.QUEUED).update(beneficiary=True)
        reclaimed_for = {p.beneficiary_job_id for p in preemptions if p.reason == policy.RECLAIM}
        mark_reclaim_needed(reclaimed_for, now)
    return done


def mark_reclaim_needed(job_ids, now: datetime) -> None:
    """The first pass, since a job last entered the queue, that reclaims GPUs for it or finds it
    waiting for protection starts its owner's wait for reclaimed GPUs (the usage page's figure)."""
    if job_ids:
        Job.objects.filter(
            pk__in=list(job_ids), state=JobState.QUEUED, reclaim_needed_at__isnull=True
        ).update(reclaim_needed_at=now)


def run_pass(trigger: str = "") -> PassResult:
    started = time.perf_counter()
    result = PassResult()
    messages: list[dict] = []
    clear_pending()  # before the snapshot: a change after this point asks for another pass
    with transaction.atomic():
        _lock()
        now = timezone.now()
        result.hearing_since = _hearing_since(now)
        result.lost_nodes, ended = mark_lost_nodes(now, result.hearing_since)
        result.ended = ended + expire_stops(now)
        finish_drains(now)
        loaded = load_snapshot(now)
        result.queued, result.running = len(loaded.snapshot.queued), len(loaded.snapshot.running)
        t0 = time.perf_counter()
        decided = policy.plan(loaded.snapshot)
        result.plan_ms = (time.perf_counter() - t0) * 1000
        fairshare.advance(loaded.snapshot, now)  # what each took from outside since the last pass
        messages = apply_admissions(loaded, decided.admissions, now)
        result.admitted = sorted({m["payload"]["job_id"] for m in messages})
        result.preempted = apply_preemptions(loaded, decided.preemptions, now)
        result.protected, result.recheck_at = sorted(decided.protected), decided.recheck_at
        mark_reclaim_needed(result.protected, now)
        result.duration_ms = (time.perf_counter() - started) * 1000
        SchedulerPass.objects.create(
            started_at=now,
            duration_ms=result.duration_ms,
            plan_ms=result.plan_ms,
            trigger=trigger[:64],
            queued=result.queued,
            running=result.running,
            admitted=len(result.admitted),
            preempted=len(result.preempted),
            ended=len(result.ended),
            hearing_since=result.hearing_since,
        )
        transaction.on_commit(lambda: [start_attempt(m["node"], m["payload"]) for m in messages])
        if result.recheck_at is not None:
            # Rule 10: the walk is made again when the first protection window that matters ends.
            at, waiting = result.recheck_at, len(result.protected)
            transaction.on_commit(
                lambda: request_pass_at(at, f"recheck: {waiting} job(s) wait for protection")
            )
    if result.admitted or result.preempted or result.ended:
        log.info(
            "pass (%s): %d admitted, %d pre-empted, %d ended, %d queued, %.1f ms (plan %.1f ms)",
            trigger or "beat",
            len(result.admitted),
            len(result.preempted),
            len(result.ended),
            result.queued,
            result.duration_ms,
            result.plan_ms,
        )
    return result


def prune_pass_records() -> int:
    cutoff = SchedulerPass.objects.order_by("-started_at").values_list("started_at", flat=True)[
        KEEP_PASS_RECORDS : KEEP_PASS_RECORDS + 1
    ]
    cutoff = list(cutoff)
    if not cutoff:
        return 0
    return SchedulerPass.objects.filter(started_at__lte=cutoff[0]).delete()[0]
