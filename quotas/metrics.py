"""Prometheus metrics at /metrics: what the scheduler holds, lends and decides, read from the database.

Every value is computed at scrape time from the database, so any web process answers the same and
nothing is lost when a process restarts. A scrape costs a constant number of queries whatever the number
of jobs: the pass's own snapshot (`scheduler.load_snapshot`, six queries) for the share gauges, so the
numbers are the ones the dashboard, the API and the policy see (`policy.usage` / `policy.lending`), plus
one aggregate query each for nodes (and their GPUs by health), GPU failures, admissions, pre-emptions,
lost work, waits and passes, and one for whether the control side hears the nodes (quotas/hearing.py).

Counters and histograms are aggregates over rows that are kept: attempts (admissions, pre-emptions,
lost work, waits) are never pruned, so those only grow; `gpuquota_pass_duration_seconds` covers the retained
`SchedulerPass` rows (the last `scheduler.KEEP_PASS_RECORDS`, pruned hourly), so its count drops back at
each prune, which Prometheus reads as a counter reset.

Access: a bearer token (`METRICS_TOKEN`, `Authorization: Bearer ...`) or a client address in
`METRICS_ALLOWED_IPS` (addresses or networks, matched against REMOTE_ADDR). With neither set the
endpoint answers 403, so nothing is exposed by accident.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpunodes.choices import HOLDING_STATES, GpuFailureReason, GpuHealth, NodeState
from gpunodes.models import GpuFailure, Node
from jobs.choices import LostCause
from jobs.models import Attempt
from quotas.engine import policy
from quotas.hearing import hearing
from quotas.models import SchedulerPass
from quotas.scheduler import load_snapshot

PASS_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
WAIT_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200, 21600, 86400)
MODES = ("own", "borrowed")
PREEMPTION_REASONS = (policy.RECLAIM, policy.PRIORITY)


def _buckets(counts: list[int], total: int, bounds: tuple[float, ...]) -> list[tuple[str, int]]:
    """Cumulative (le, count) pairs as prometheus_client wants them, +Inf last."""
    return [*((floatToGoString(b), c) for b, c in zip(bounds, counts, strict=True)), ("+Inf", total)]


class GpuquotaCollector(Collector):
    """Yields every gpuquota metric family from one read of the database."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        loaded = load_snapshot(now, queued=False)  # the queue's totals suffice: one aggregate, not 100k rows
        snapshot = loaded.snapshot
        shares = sorted({s.name for s in snapshot.shares})
        yield from self._shares(snapshot, loaded.queued_totals)
        yield from self._organisation(loaded)
        yield from self._decisions(shares)
        yield from self._waits(shares)
        yield from self._passes()
        yield from self._nodes(now)
        yield from self._gpu_failures()
        yield from self._hearing(now)

    # -- shares: the policy's own accounting of the pass's snapshot ----------------------------------

    def _shares(
        self, snapshot: policy.Snapshot, queued_totals: dict[tuple[str, str], tuple[int, int]]
    ) -> Iterator[Metric]:
        labels = ["share", "gpu_type"]
        gauges = {
            "capacity": GaugeMetricFamily(
                "gpuquota_share_capacity_gpus", "Own (guaranteed) GPUs of the share", labels=labels
            ),
            "own": GaugeMetricFamily(
                "gpuquota_share_own_gpus", "GPUs the share uses within its capacity", labels=labels
            ),
            "borrowed": GaugeMetricFamily(
                "gpuquota_share_borrowed_gpus", "GPUs the share uses over its capacity", labels=labels
            ),
            "lent": GaugeMetricFamily(
                "gpuquota_share_lent_gpus",
                "The share's part of all borrowed GPUs (SEMANTICS 'Lent'; may be fractional)",
                labels=labels,
            ),
        }
        keys: set[tuple[str, str]] = set()
        for share, by_type in policy.usage(snapshot).items():
            for gpu_type, u in by_type.items():
                keys.add((share, gpu_type))
                for field, gauge in gauges.items():
                    gauge.add_metric([share, gpu_type], getattr(u, field))
        yield from gauges.values()

        lending = GaugeMetricFamily(
            "gpuquota_lending_gpus",
            "GPUs each borrower draws from each lender (proportional, SEMANTICS 'Lent')",
            labels=["gpu_type", "lender", "borrower"],
        )
        for gpu_type, pairs in policy.lending(snapshot).items():
            for (lender, borrower), gpus in pairs.items():
                lending.add_metric([gpu_type, lender, borrower], gpus)
        yield lending

        queued = {key: jobs for key, (jobs, _) in queued_totals.items()}
        running: dict[tuple[str, str], int] = {}
        preempting: dict[tuple[str, str], int] = {}
        for run in snapshot.running:
            key = (run.share, run.gpu_type)
            into = preempting if run.preempting else running
            into[key] = into.get(key, 0) + 1
        keys = (keys - {(policy.UNASSIGNED, t) for _, t in keys}) | queued.keys() | running.keys()
        keys |= preempting.keys()
        for name, doc, values in (
            ("gpuquota_queued_jobs", "Jobs waiting in the share's queue", queued),
            ("gpuquota_running_jobs", "Jobs holding GPUs (admitted or running, not pre-empting)", running),
            ("gpuquota_preempting_jobs", "Jobs in their pre-emption grace period", preempting),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            for key in sorted(keys):
                gauge.add_metric(list(key), values.get(key, 0))
            yield gauge

    # -- the organisation tree: fair-share values, what groups take from and lend outside -------------

    def _organisation(self, loaded) -> Iterator[Metric]:
        from quotas import organisation

        value = GaugeMetricFamily(
            "gpuquota_fair_share_value",
            "(GPUs taken from outside + borrowing history) / (weight x capacity): the lowest borrows first",
            labels=["share", "gpu_type"],
        )
        taken = GaugeMetricFamily(
            "gpuquota_group_taken_from_outside_gpus",
            "GPUs the group's subtree takes from outside itself",
            labels=["group", "gpu_type"],
        )
        lent = GaugeMetricFamily(
            "gpuquota_group_lent_outside_gpus",
            "GPUs of the group's subtree that shares outside it use (may be fractional)",
            labels=["group", "gpu_type"],
        )
        for node in organisation.load(loaded=loaded, words=False).nodes:
            r = node.row
            if r.kind == "share":
                value.add_metric([r.name, r.gpu_type], r.fair_share_value)
            else:
                taken.add_metric([r.name, r.gpu_type], r.taken_from_outside)
                lent.add_metric([r.name, r.gpu_type], r.lent_outside)
        yield from (value, taken, lent)

    # -- decisions: counters over attempts -----------------------------------------------------------

    def _decisions(self, shares: list[str]) -> Iterator[Metric]:
        admissions = CounterMetricFamily(
            "gpuquota_admissions",
            "Attempts admitted, by share and mode (own capacity or borrowed)",
            labels=["share", "mode"],
        )
        counts = {(s, m): 0 for s in shares for m in MODES}
        for share, borrowed, n in (
            Attempt.objects.values_list("job__share__name", "borrowed")
            .annotate(n=Count("pk"))
            .values_list("job__share__name", "borrowed", "n")
            .order_by()
        ):
            key = (share, MODES[1] if borrowed else MODES[0])
            counts[key] = counts.get(key, 0) + n
        for (share, mode), n in sorted(counts.items()):
            admissions.add_metric([share, mode], n)
        yield admissions

        preemptions = CounterMetricFamily(
            "gpuquota_preemptions",
            "Attempts pre-empted, by the victim's share and reason (RECLAIM or PRIORITY)",
            labels=["share", "reason"],
        )
        counts = {(s, r): 0 for s in shares for r in PREEMPTION_REASONS}
        for share, reason, n in (
            Attempt.objects.exclude(preemption_reason="")
            .values_list("job__share__name", "preemption_reason")
            .annotate(n=Count("pk"))
            .values_list("job__share__name", "preemption_reason", "n")
            .order_by()
        ):
            counts[(share, reason)] = counts.get((share, reason), 0) + n
        for (share, reason), n in sorted(counts.items()):
            preemptions.add_metric([share, reason], n)
        yield preemptions

        lost = CounterMetricFamily(
            "gpuquota_lost_gpu_seconds",
            "GPU-seconds of work thrown away when attempts stopped before they succeeded (GPUs x time since "
            "their safe point: the later of their start and their last checkpoint), by the attempt's share "
            "and the cause (reclaim, priority, node_lost, fenced, gpu_failed)",
            labels=["share", "cause"],
        )
        seconds = {(s, c): 0.0 for s in shares for c in LostCause.values}
        for share, cause, total in (
            Attempt.objects.exclude(lost_cause="")
            .values_list("job__share__name", "lost_cause")
            .annotate(total=Sum("gpu_seconds_lost"))
            .values_list("job__share__name", "lost_cause", "total")
            .order_by()
        ):
            seconds[(share, cause)] = seconds.get((share, cause), 0.0) + (total or 0.0)
        for (share, cause), total in sorted(seconds.items()):
            lost.add_metric([share, cause], total)
        yield lost

    # -- histograms --------------------------------------------------------------------------------------

    def _waits(self, shares: list[str]) -> Iterator[Metric]:
        """First attempts only: from submission to the start the host reported (SCENARIO's wait_s)."""
        wait = ExpressionWrapper(F("started_at") - F("job__submitted_at"), output_field=DurationField())
        buckets = {
            f"le{i}": Count("pk", filter=Q(wait__lte=timedelta(seconds=b)))
            for i, b in enumerate(WAIT_BUCKETS_S)
        }
        rows = (
            Attempt.objects.filter(number=1, started_at__isnull=False)
            .annotate(wait=wait)
            .values("job__share__name")
            .annotate(n=Count("pk"), total=Sum("wait"), **buckets)
            .order_by()
        )
        family = HistogramMetricFamily(
            "gpuquota_wait_seconds", "From submission to the start of a job's first attempt", labels=["share"]
        )
        seen = set()
        for row in rows:
            share = row["job__share__name"]
            seen.add(share)
            counts = [row[f"le{i}"] for i in range(len(WAIT_BUCKETS_S))]
            total = row["total"]
            family.add_metric(
                [share],
                _buckets(counts, row["n"], WAIT_BUCKETS_S),
                total.total_seconds() if total is not None else 0.0,
            )
        for share in shares:
            if share not in seen:
                family.add_metric([share], _buckets([0] * len(WAIT_BUCKETS_S), 0, WAIT_BUCKETS_S), 0.0)
        yield family

    def _passes(self) -> Iterator[Metric]:
        row = SchedulerPass.objects.aggregate(
            n=Count("pk"),
            total=Sum("duration_ms"),
            last=Max("started_at"),
            **{
                f"le{i}": Count("pk", filter=Q(duration_ms__lte=b * 1000))
                for i, b in enumerate(PASS_BUCKETS_S)
            },
        )
        family = HistogramMetricFamily(
            "gpuquota_pass_duration_seconds",
            "Duration of the scheduling passes still on record (lock, snapshot, plan, apply)",
        )
        counts = [row[f"le{i}"] for i in range(len(PASS_BUCKETS_S))]
        family.add_metric([], _buckets(counts, row["n"], PASS_BUCKETS_S), (row["total"] or 0.0) / 1000)
        yield family
        last = GaugeMetricFamily(
            "gpuquota_last_pass_timestamp_seconds", "When the latest scheduling pass started (epoch)"
        )
        last.add_metric([], row["last"].timestamp() if row["last"] else 0.0)
        yield last

    # -- nodes --------------------------------------------------------------------------------------------

    def _nodes(self, now: datetime) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "gpuquota_node_up",
            "1 if the node is registered, not LOST and heartbeating within NODE_LOST_AFTER_S",
            labels=["node", "gpu_type"],
        )
        schedulable = GaugeMetricFamily(
            "gpuquota_node_schedulable",
            "1 if the node is READY (takes new work)",
            labels=["node", "gpu_type"],
        )
        gpus = GaugeMetricFamily(
            "gpuquota_node_gpus",
            "GPUs of the node: used (claimed by an attempt), free (unclaimed and healthy on a READY node), "
            "unhealthy (unclaimed and found broken, or waiting for a re-check) or unavailable (unclaimed "
            "and healthy on a cordoned, draining or lost node)",
            labels=["node", "gpu_type", "state"],
        )
        fresh = now - timedelta(seconds=settings.NODE_LOST_AFTER_S)
        self._latest_heartbeat = None
        broken = ~Q(gpus__health=GpuHealth.HEALTHY) & Q(gpus__claim__isnull=True)
        health = {h: Count("gpus", filter=Q(gpus__health=h), distinct=True) for h in GpuHealth.values}
        by_health: dict[tuple[str, str], int] = {}
        for name, gpu_type, state, heartbeat, total, used, unhealthy, *counts in (
            Node.objects.annotate(
                total=Count("gpus", distinct=True),
                used=Count("gpus__claim", distinct=True),
                unhealthy=Count("gpus", filter=broken, distinct=True),
                **health,
            )
            .values_list("name", "gpu_type", "state", "last_heartbeat", "total", "used", "unhealthy", *health)
            .order_by("name")
        ):
            for h, n in zip(health, counts, strict=True):
                by_health[(gpu_type, h)] = by_health.get((gpu_type, h), 0) + n
            alive = state in HOLDING_STATES and heartbeat is not None and heartbeat >= fresh
            if heartbeat is not None and (
                self._latest_heartbeat is None or heartbeat > self._latest_heartbeat
            ):
                self._latest_heartbeat = heartbeat
            up.add_metric([name, gpu_type], 1 if alive else 0)
            ready = state == NodeState.READY
            schedulable.add_metric([name, gpu_type], 1 if ready else 0)
            idle = total - used - unhealthy
            gpus.add_metric([name, gpu_type, "used"], used)
            gpus.add_metric([name, gpu_type, "free"], idle if ready else 0)
            gpus.add_metric([name, gpu_type, "unhealthy"], unhealthy)
            gpus.add_metric([name, gpu_type, "unavailable"], 0 if ready else idle)
        yield up
        yield schedulable
        yield gpus
        states = GaugeMetricFamily(
            "gpuquota_gpus",
            "GPUs by health: healthy (capacity), unhealthy (found broken by its agent) or checking (marked "
            "healthy by an admin, waiting for its agent's re-check); neither of the last two is capacity",
            labels=["gpu_type", "state"],
        )
        for gpu_type, h in sorted(by_health):
            states.add_metric([gpu_type, h.lower()], by_health[(gpu_type, h)])
        yield states

    def _gpu_failures(self) -> Iterator[Metric]:
        """The GPU failures on record, by reason (every reason, 0 included)."""
        failures = CounterMetricFamily(
            "gpuquota_gpu_failures",
            "GPUs found broken by their agents, by reason (xid, ecc, retired_pages, row_remap, off_bus, "
            "stuck_process)",
            labels=["reason"],
        )
        by_reason = dict(
            GpuFailure.objects.values_list("reason")
            .annotate(n=Count("pk"))
            .values_list("reason", "n")
            .order_by()
        )
        for reason in GpuFailureReason.values:
            failures.add_metric([reason], by_reason.get(reason, 0))
        yield failures

    def _hearing(self, now: datetime) -> Iterator[Metric]:
        heard = hearing(now, latest=self._latest_heartbeat)
        silence = GaugeMetricFamily(
            "gpuquota_heartbeat_silence_seconds",
            "Seconds since the control side heard a heartbeat from any node (0 before any node registered)",
        )
        silence.add_metric([], heard.silence_s)
        yield silence
        suspended = GaugeMetricFamily(
            "gpuquota_node_loss_suspended",
            "1 while a silent node would not be declared LOST: no heartbeat from any node (or no pass) "
            "lately, or heard again for less than NODE_LOST_AFTER_S after such an outage",
        )
        suspended.add_metric([], 1 if heard.suspended else 0)
        yield suspended


def render() -> bytes:
    """The metrics in Prometheus' text format, from a registry of their own (one per scrape)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuquotaCollector())
    return generate_latest(registry)


def _allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return True
    if settings.METRICS_ALLOWED_IPS:
        try:
            addr = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
        except ValueError:
            return False
        return any(addr in ipaddress.ip_network(net, strict=False) for net in settings.METRICS_ALLOWED_IPS)
    return False


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not _allowed(request):
        if not settings.METRICS_TOKEN and not settings.METRICS_ALLOWED_IPS:
            why = "metrics are off: set METRICS_TOKEN or METRICS_ALLOWED_IPS\n"
        else:
            why = "forbidden\n"
        return HttpResponse(why, status=403, content_type="text/plain")
    return HttpResponse(render(), content_type=CONTENT_TYPE_LATEST)
