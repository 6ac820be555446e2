"""Benchmark 10: changing the layout (issue 28), on PostgreSQL.

A layout of 50 shares in 12 teams: the 6 of a seeded 20k-job week (`seed_history`, v100) and 44 more on
64 READY 8-GPU a10g nodes, with 2,000 jobs queued in them and what a scheduling pass admits of them
running. A plan changes 20 of the 50 shares (capacity, strategy, a description, one `until`), 4 of them
seeded ones, so the what-if replays a different week:
- plan: the document read and checked whole (against the database too), the diff, what it does now
  (running jobs that become borrowed, queued jobs that could never run, over-commit), stored; without
  the what-if. Target < 1 s.
- apply: the plan applied in one transaction (50 shares' layout, 20 changed), a version, an audit
  entry. Target < 1 s.
- what-if: the plan's replays of the 20k-job week, as is and with the plan, side by side as the
  whatif worker runs them (each in a process of its own; a thread per task stands in for the pool).
  Target < 15 s from the request to the result.
Each figure is the median of REPEATS alternating runs (a plan to the change, then one back).

Run with `python -m bench --only layout`, or call `run()`.
"""

from __future__ import annotations

import io
import statistics
import threading
import time

from bench.common import setup_django, wipe

JOBS = 20_000
REPEATS = 5
TEAMS = 6
EXTRA_SHARES = 44
QUEUED = 2_000


def _cluster() -> None:
    """44 more shares in 6 more teams, 64 READY a10g nodes, 2,000 queued jobs and a pass's admissions."""
    from django.contrib.auth import get_user_model

    from gpunodes.services import fake_inventory, node_register
    from jobs.services import job_submit
    from quotas import scheduler
    from quotas.models import Membership, Share, ShareCapacity, Team

    user = get_user_model().objects.create_user("bench-user", password="x")
    for i in range(64):
        node_register(name=f"a10g-{i:02d}", gpu_type="a10g", gpus=fake_inventory(f"a10g-{i:02d}", 8))
    shares = []
    for t in range(TEAMS):
        team = Team.objects.create(name=f"Team {t}", slug=f"team-{t}")
        Membership.objects.create(team=team, user=user)
        for s in range(EXTRA_SHARES // TEAMS + (1 if t < EXTRA_SHARES % TEAMS else 0)):
            share = Share.objects.create(name=f"team-{t}-s{s}", team=team, strategy="LEND_AND_BORROW")
            ShareCapacity.objects.create(share=share, gpu_type="a10g", max_gpus=8 + (s % 3) * 4)
            shares.append(share)
    for i in range(QUEUED):
        job_submit(
            user=user,
            share=shares[i % len(shares)],
            gpus=(1, 2, 4, 8)[i % 4],
            gpu_type="a10g",
            command=["true"],
            max_runtime_s=3600,
        )
    scheduler.run_pass("bench")


def _changed(data: dict, step: int) -> dict:
    """20 of the 50 shares changed (4 seeded ones), back and forth with the step's parity: capacities,
    4 shares RESERVE with 4 GPUs (their queued 8-GPU jobs could never run) and back, descriptions, one
    `until`."""
    out = {**data, "shares": [dict(s) for s in data["shares"]]}
    seeded = [s for s in out["shares"] if s["name"].startswith("hist-")][:4]
    others = [s for s in out["shares"] if not s["name"].startswith("hist-")][:16]
    for i, s in enumerate(seeded + others):
        capacity = dict(s["capacity"])
        gpu_type = next(iter(capacity), "a10g")
        if i in (8, 9, 10, 11):
            s["strategy"] = "RESERVE" if step % 2 == 0 else "LEND_AND_BORROW"
            s["borrow_limit"] = -1
            capacity[gpu_type] = 4 if step % 2 == 0 else 8
        else:
            capacity[gpu_type] = max(0, capacity.get(gpu_type, 0) + (4 if step % 2 == 0 else -4))
        s["capacity"] = capacity
        if i % 5 == 0:
            s["description"] = f"bench step {step}"
        if i == 7:
            s["until"] = "7d"
    return out


def run(jobs: int = JOBS, repeats: int = REPEATS, timeout_s: float = 900.0) -> list[dict]:
    setup_django()
    from django.core.cache import cache
    from django.core.management import call_command
    from django.db import connection

    import gpunodes.dispatch
    from quotas import layout, whatif

    wipe()
    cache.delete(f"{whatif.PREFIX}window")  # a window another run pinned (its data is gone)
    gpunodes.dispatch.app.send_task = lambda *a, **k: None  # no agents: the pass's starts go nowhere
    t0 = time.perf_counter()
    call_command("seed_history", jobs=jobs, stdout=io.StringIO())
    _cluster()
    setup_s = time.perf_counter() - t0
    shares = len(layout.load_live().layout.shares)

    plan_s, apply_s, changed, effects = [], [], 0, {}
    for step in range(repeats * 2):
        data = _changed(layout.load_live().layout.to_data(), step)
        t = time.perf_counter()
        planned = layout.plan(source=data, run_whatif=False)
        plan_s.append(time.perf_counter() - t)
        changed = sum(1 for c in planned.diff if c["kind"] == "share")
        effects = effects or planned.effects  # the first plan's: to RESERVE (the next goes back)
        t = time.perf_counter()
        layout.apply(plan_id=planned.pk)
        apply_s.append(time.perf_counter() - t)

    threads: list[threading.Thread] = []

    def work(run_id: str, index: int) -> None:
        try:
            whatif.run_part(run_id, index, isolated=True)
        finally:
            connection.close()

    def enqueue(run_id: str, index: int) -> None:
        thread = threading.Thread(target=work, args=(run_id, index), daemon=True)
        threads.append(thread)
        thread.start()

    def what_if(step: int, more: int = 0):
        t = time.perf_counter()
        data = _changed(layout.load_live().layout.to_data(), step)
        seeded = next(s for s in data["shares"] if s["name"].startswith("hist-"))
        seeded["capacity"] = {t: n + more for t, n in seeded["capacity"].items()}
        planned = layout.plan(source=data, run_whatif=True)
        for thread in threads:
            thread.join(timeout_s)
        status = whatif.status(planned.whatif_run)
        assert status is not None and status.finished, "the what-if did not finish"
        return status, time.perf_counter() - t

    real_enqueue = whatif._enqueue
    whatif._enqueue = enqueue
    try:
        status, whatif_wall = what_if(0)
        again, _ = what_if(0, more=8)  # another plan of the same window: its as-is replay is read back
    finally:
        whatif._enqueue = real_enqueue
    parts = [p.get("seconds") for p in status.parts]
    replayed = status.parts[0].get("total") or 0
    wipe()
    full = jobs >= JOBS
    now_note = (
        f"{effects.get('borrowed_total', 0)} running jobs become borrowed, "
        f"{sum(g['count'] for g in effects.get('never_runnable', []))} queued never runnable, "
        f"{len(effects.get('overcommit', []))} over-committed types"
    )
    return [
        {
            "bench": "11 layout plan",
            "size": f"{shares} shares, {changed} changed, {QUEUED:,} queued; diff and now, stored",
            "n": len(plan_s),
            "median_s": statistics.median(plan_s),
            "p95_s": max(plan_s),
            "target": "< 1 s" if full else "",
            "met": statistics.median(plan_s) < 1.0 if full else None,
            "note": f"{now_note}; setup {setup_s:.0f} s",
        },
        {
            "bench": "11 layout apply",
            "size": f"{shares} shares, {changed} changed, one transaction",
            "n": len(apply_s),
            "median_s": statistics.median(apply_s),
            "p95_s": max(apply_s),
            "target": "< 1 s" if full else "",
            "met": statistics.median(apply_s) < 1.0 if full else None,
            "note": "a version, an audit entry, a temporary change",
        },
        {
            "bench": "11 layout what-if",
            "size": f"the whole change, {replayed:,} submissions in the 7-day window, both replays",
            "n": 1,
            "median_s": status.seconds,
            "p95_s": status.seconds,
            "target": "< 15 s to the result" if full else "",
            "met": (not status.failed and status.seconds < 15.0) if full else None,
            "note": f"replays {', '.join(f'{s:.1f} s' for s in parts if s is not None)} (side by side); "
            f"plan and replays {whatif_wall:.1f} s" + (f"; FAILED: {status.failed}" if status.failed else ""),
        },
        {
            "bench": "11 layout what-if again",
            "size": "another plan of the same window: one replay, the as-is one read back",
            "n": 1,
            "median_s": again.seconds,
            "p95_s": again.seconds,
            "target": "< 15 s to the result" if full else "",
            "met": (not again.failed and again.seconds < 15.0) if full else None,
            "note": f"reused: {[bool(p.get('reused')) for p in again.parts]}",
        },
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
