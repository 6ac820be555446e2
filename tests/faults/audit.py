"""The SEMANTICS.md invariants, checked on the database (after every fault test, and inside them).

Read as one snapshot (REPEATABLE READ on PostgreSQL), so it may run while the cluster is still busy:
every state change of gpuquota is one transaction, so a consistent snapshot must satisfy all of this.

- no GPU is held twice, no node has more GPUs in use than it has, an attempt holds exactly the GPUs of
  its placement, and only live attempts hold GPUs (no GPU held by a finished attempt);
- a job holding GPUs has exactly one live attempt, its current one; attempts are numbered 1..n, never
  overlap in time, and each was admitted with its event (no half-applied plan);
- a share's usage never exceeds capacity + borrow cap; RESERVE and LEND shares never borrow;
- optionally (`cover=True`, for a settled cluster): per type, borrowed ≤ idle-lendable.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db import connection, transaction

from gpunodes.choices import GpuHealth
from jobs.choices import ATTEMPT_ACTIVE_STATES, JOB_ACTIVE_STATES, AttemptState, EventKind, JobState

# The pass stamps an admission with the time it took its lock; an attempt that ended (committed)
# while that pass ran can show an end a moment after the next attempt's admission. What rules out
# two attempts at once is that attempt n is ENDED before n+1 exists (checked, and a unique index).
CLOCK_SLACK_S = 2.0


class InvariantBroken(AssertionError):
    pass


def check_invariants(*, cover: bool = False) -> dict:
    """Raise InvariantBroken listing every broken invariant; return a few counts."""
    outermost = not connection.in_atomic_block  # inside a test's transaction it is one snapshot anyway
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        problems, counts = _check(cover)
    if problems:
        raise InvariantBroken("invariants broken:\n  " + "\n  ".join(problems[:50]))
    return counts


def _check(cover: bool) -> tuple[list[str], dict]:
    from gpunodes.models import Gpu
    from jobs.models import Attempt, GpuClaim, Job, JobEvent
    from quotas.engine import policy
    from quotas.scheduler import load_snapshot

    problems: list[str] = []
    live_states = [s.value for s in ATTEMPT_ACTIVE_STATES]

    # --- GPUs ----------------------------------------------------------------------------------
    claims = list(GpuClaim.objects.values_list("gpu_id", "attempt_id", "attempt__state"))
    for gpu, n in Counter(g for g, _, _ in claims).items():
        if n > 1:
            problems.append(f"GPU {gpu} is held by {n} attempts")
    for gpu, attempt, state in claims:
        if state not in live_states:
            problems.append(f"GPU {gpu} is held by attempt {attempt}, which is {state}")
    # No GPU is handed out once it was found broken (issue 29): a claim on a GPU that is not healthy is
    # older than its failure.
    for gpu, attempt, claimed, health, since in GpuClaim.objects.exclude(
        gpu__health=GpuHealth.HEALTHY
    ).values_list("gpu_id", "attempt_id", "claimed_at", "gpu__health", "gpu__health_changed_at"):
        if since is not None and claimed > since:
            problems.append(f"GPU {gpu} ({health} since {since}) was given to attempt {attempt} at {claimed}")
    gpu_key = {pk: (node, index) for pk, node, index in Gpu.objects.values_list("pk", "node__name", "index")}
    held: dict[int, set] = defaultdict(set)
    for gpu, attempt, _ in claims:
        held[attempt].add(gpu_key[gpu])
    per_node = Counter(gpu_key[g][0] for g, _, _ in claims)
    sizes = Counter(node for node, _ in gpu_key.values())
    for node, used in per_node.items():
        if used > sizes[node]:
            problems.append(f"node {node} has {used} GPUs in use of {sizes[node]}")

    # --- attempts and jobs --------------------------------------------------------------------
    attempts = defaultdict(list)
    for row in Attempt.objects.values_list(
        "pk", "job_id", "number", "state", "placement", "admitted_at", "ended_at", "outcome"
    ).order_by("job_id", "number"):
        attempts[row[1]].append(row)
    admitted_events = set(
        JobEvent.objects.filter(kind=EventKind.ADMITTED).values_list("job_id", "attempt_number")
    )
    submitted_events = set(JobEvent.objects.filter(kind=EventKind.SUBMITTED).values_list("job_id", flat=True))
    jobs = list(Job.objects.values_list("pk", "state", "attempt_count"))
    for job_id, state, attempt_count in jobs:
        rows = attempts.get(job_id, [])
        if job_id not in submitted_events:
            problems.append(f"job {job_id} has no SUBMITTED event")
        numbers = [r[2] for r in rows]
        if numbers != list(range(1, len(rows) + 1)) or len(rows) != attempt_count:
            problems.append(f"job {job_id}: attempts {numbers}, attempt_count {attempt_count}")
        live = [r for r in rows if r[3] in live_states]
        if len(live) > 1:
            problems.append(f"job {job_id} has {len(live)} live attempts")
        if state in JOB_ACTIVE_STATES and (len(live) != 1 or live[0][2] != attempt_count):
            problems.append(f"job {job_id} is {state} without its current attempt live")
        if live and state not in JOB_ACTIVE_STATES and state != JobState.CANCELLED:
            problems.append(f"job {job_id} is {state} but attempt {live[0][2]} is {live[0][3]}")
        if (
            live
            and live[0][3] == AttemptState.STOPPING
            and state
            not in (
                JobState.PREEMPTING,
                JobState.CANCELLED,
            )
        ):
            problems.append(f"job {job_id} is {state} while its attempt is stopping")
        for earlier, later in zip(rows, rows[1:], strict=False):
            if earlier[3] in live_states:
                problems.append(f"job {job_id}: attempt {earlier[2]} is live while {later[2]} exists")
            elif earlier[6] and later[5] and (earlier[6] - later[5]).total_seconds() > CLOCK_SLACK_S:
                problems.append(f"job {job_id}: attempts {earlier[2]} and {later[2]} overlap in time")
        for pk, _, number, a_state, placement, _, _, outcome in rows:
            if (job_id, number) not in admitted_events:
                problems.append(f"job {job_id} attempt {number} has no ADMITTED event")
            if a_state in live_states:
                want = {(p["node"], i) for p in placement for i in p["gpus"]}
                if held.get(pk, set()) != want:
                    problems.append(
                        f"attempt {pk} holds {sorted(held.get(pk, ()))}, placed on {sorted(want)}"
                    )
            elif held.get(pk):
                problems.append(f"ended attempt {pk} ({outcome}) still holds GPUs")

    # --- shares (the policy's own accounting of one snapshot) ------------------------------------
    snapshot = load_snapshot().snapshot
    shares = {s.name: s for s in snapshot.shares}
    for name, by_type in policy.usage(snapshot).items():
        share = shares.get(name)
        if share is None:
            continue
        for gpu_type, u in by_type.items():
            cap = policy._borrow_cap(share, u.capacity)
            if share.strategy in (policy.RESERVE, policy.LEND) and u.borrowed:
                problems.append(f"{share.strategy} share {name} borrows {u.borrowed} {gpu_type}")
            if cap is not None and u.used > u.capacity + cap:
                problems.append(f"share {name} uses {u.used} {gpu_type} > capacity {u.capacity} + cap {cap}")
    if cover:
        for gpu_type in {t for by_type in policy.usage(snapshot).values() for t in by_type}:
            rows = [
                (shares.get(n), u)
                for n, by_type in policy.usage(snapshot, count_preempting=False).items()
                for t, u in by_type.items()
                if t == gpu_type
            ]
            borrowed = sum(u.borrowed for _, u in rows)
            lendable = sum(
                u.idle for s, u in rows if s is None or s.strategy in (policy.LEND, policy.LEND_AND_BORROW)
            )
            if borrowed > lendable:
                problems.append(f"{gpu_type}: {borrowed} GPUs borrowed > {lendable} idle-lendable")

    states = Counter(state for _, state, _ in jobs)
    return problems, {"jobs": len(jobs), "claims": len(claims), **{str(k): v for k, v in states.items()}}
