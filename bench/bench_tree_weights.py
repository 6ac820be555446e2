"""Benchmark 13b (issue 37, item 5): how borrowed capacity splits between the shares that wait to borrow,
measured on the ITP trace with the pure simulator, no database.

Set-up: bench 13's (bench/bench_tree.py): 168 x 8 `a100`, the trace's 10 virtual clusters as shares
(capacity by GPU-hours), dealt by capacity rank into dept-a (weight 2), dept-b (1) and dept-c (1); every
share weight 1; no limits; grace 30 s; half the jobs checkpointing every 1,800 s; fair reclaim off. The
week is the trace's busiest: the 7 whole days with the most GPU-hours submitted (days 49-56), with the
2 days before it replayed first (so the week does not start on an empty cluster) and not measured.

1. Weights. The replay's own record (each job's queue stays, the timeline of own and borrowed GPUs per
   share) is swept instant by instant. A share **waits to borrow** while one of its queued jobs does not
   fit its own capacity beside what it uses (the organisation view's definition), a group while one of
   its shares does. At each level of the tree (the departments under the cluster; the shares inside one
   department) and for each set of two or more siblings that wait together, each one's GPU-hours
   **taken from outside itself** (the engine's net: quotas.engine.tree.nets) over the time that set
   waited are divided by the set's total, and compared with two expected splits: by weight alone
   (w / sum w) and by the contract's fair-share value, which divides by weight x capacity, so that
   equal values mean taken in proportion to w x capacity. The figure is, per set, the worst member's
   |observed - expected| / expected, averaged over the sets by their GPU-hours, and the share of the
   GPU-hours in sets whose every member is within 10%. Also split the same way: only the time when
   every member waits for at least SATURATED GPUs of jobs, and the GPU-hours of the borrowed attempts
   admitted while the set waited (the decisions rather than what is held).
2. Memory. The same week with `fair_share_half_life_s` = 1 day, history recomputed along the replay
   with the engine's accumulator (tree.FairShareHistory). At each pass that admits borrowed jobs while
   two siblings wait, one whose history is under 0.5 GPU (it took almost nothing from outside for
   days) and one whose history is 5 GPUs or more (it borrowed all week): what the idle one got at that
   pass against its weighted part, and what the busy one got.

   `--starvation-s 1000000000` turns rule 6's reservations for starving heads off (before commit
   f43a4f4 a starving head of a busy share went ahead of rule 5's order and took the node that freed;
   see bench/RESULTS.md).

`--fair-reclaim` replays the week for item 1 twice, one after the other, fair reclaim (rule 11) off and
then on, with bench 15's set-up otherwise (bench/bench_fair_reclaim.py: the same departments, weights,
half-life 0, victims by safe point, half the jobs checkpointing), and prints the split figures side by
side with the GPU-hours lost to `fair_share` in the measured days (pre-emptions that ended in them).

    python bench/bench_tree_weights.py [--days FIRST LAST] [--warmup DAYS] [--only weights|memory]
                                       [--starvation-s S] [--fair-reclaim]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_tree import DEPARTMENTS, in_departments, itp_data  # noqa: E402
from quotas.engine import policy  # noqa: E402
from quotas.engine import scenario as sc  # noqa: E402
from quotas.engine.simulate import simulate  # noqa: E402
from quotas.engine.tree import FairShareHistory, Tree, fair_share_value, nets  # noqa: E402

DAY = 86_400
GPU_TYPE = "a100"
BUSIEST_WEEK = (49, 56)  # days of the trace (the most GPU-hours submitted in 7 whole days)
WARMUP_DAYS = 2
TOLERANCE = 0.10
IDLE_HISTORY = 0.5  # GPUs: "idle for days"
BUSY_HISTORY = 5.0  # GPUs: "borrowed all week"
SATURATED = 16  # GPUs of waiting jobs: a member that could take two whole nodes more


def scenario(
    first_day: int,
    last_day: int,
    warmup_days: int,
    half_life_s: int = 0,
    starvation_s: int | None = None,
    fair_reclaim: bool = False,
) -> sc.Scenario:
    """The ITP jobs submitted from (first_day - warmup_days) to last_day, re-based to 0, in bench 13's tree."""
    data = itp_data(((first_day - warmup_days) * DAY, last_day * DAY), gpu_type=GPU_TYPE)
    settings = {"fair_reclaim": fair_reclaim, "fair_share_half_life_s": half_life_s}
    if starvation_s is not None:
        settings["starvation_s"] = starvation_s
    return sc.parse(in_departments(data, **settings))


def queue_changes(result, end: int) -> list[tuple[int, str, int, int]]:
    """(time, share, gpus, +1 queued / -1 left the queue) for every queue stay of every job."""
    out = []
    for rec in result.jobs.values():
        share, gpus = rec.spec.share, rec.spec.gpus
        since = rec.spec.submit_at
        for a in rec.attempts:
            if since is not None and a.start > since:
                out += [(since, share, gpus, +1), (a.start, share, gpus, -1)]
            since = a.end if a.outcome in ("PREEMPTED", "NODE_LOST") else None  # back in the queue
        if since is not None and rec.final == "QUEUED" and since < end:
            out += [(since, share, gpus, +1), (end, share, gpus, -1)]
    return sorted(out)


class Sweep:
    """The replay instant by instant: per interval [t, t_next) the GPUs each share uses, which shares and
    groups wait to borrow, and the engine's nets (what each node takes from outside)."""

    def __init__(self, scen: sc.Scenario, result) -> None:
        self.scen = scen
        self.result = result
        views = [
            policy.ShareView(s.name, dict(s.capacity), s.strategy, group=s.group, weight=s.weight)
            for s in scen.shares
        ]
        self.tree = Tree.build([g.spec() for g in scen.groups], views)
        self.capacity = self.tree.capacity(GPU_TYPE)
        self.borrowers = {s.name for s in scen.shares if s.strategy == policy.LEND_AND_BORROW}

    def intervals(self):
        """Yield (t, t_next, used, waiting nodes, nets) for every interval where something holds."""
        tl = self.result.timeline
        end = tl.end
        changes: list[tuple[int, int, str, str, float]] = []  # (t, kind 0, share, metric, value)
        for (share, gpu_type, metric), (times, values) in tl.series.items():
            if gpu_type != GPU_TYPE or metric not in ("own", "borrowed", "capacity"):
                continue
            if metric == "capacity" and share != policy.UNASSIGNED:
                continue
            for t, v in zip(times, values, strict=True):
                changes.append((t, 0, share, metric, v))
        for t, share, gpus, delta in queue_changes(self.result, end):
            changes.append((t, 1, share, str(gpus), delta))
        changes.sort(key=lambda c: c[0])
        own: dict[str, float] = defaultdict(float)
        borrowed: dict[str, float] = defaultdict(float)
        pool = 0
        queued: dict[str, Counter] = defaultdict(Counter)
        i = 0
        while i < len(changes):
            t = changes[i][0]
            while i < len(changes) and changes[i][0] == t:
                _, kind, share, what, value = changes[i]
                if kind == 0:
                    if what == "own":
                        own[share] = value
                    elif what == "borrowed":
                        borrowed[share] = value
                    else:
                        pool = int(value)
                else:
                    queued[share][int(what)] += int(value)
                    if queued[share][int(what)] <= 0:
                        del queued[share][int(what)]
                i += 1
            t_next = changes[i][0] if i < len(changes) else end
            if t_next <= t:
                continue
            used = {s: int(own[s] + borrowed[s]) for s in set(own) | set(borrowed)}
            waiting: set[str] = set()
            # Per node: (its smallest job that waits to borrow, the GPUs of all of them): what it could
            # take of freed GPUs.
            demand: dict[str, tuple[int, int]] = {}
            for share, sizes in queued.items():
                if share not in self.borrowers:
                    continue
                room = self.capacity[share] - used.get(share, 0)
                wait = [(g, c) for g, c in sizes.items() if g > room and c > 0]
                if not wait:
                    continue
                smallest, total = min(g for g, _ in wait), sum(g * c for g, c in wait)
                for node in self.tree.path(share):
                    waiting.add(node)
                    was = demand.get(node)
                    demand[node] = (
                        (smallest, total) if was is None else (min(was[0], smallest), was[1] + total)
                    )
            yield t, t_next, used, waiting, nets(self.tree, GPU_TYPE, used, pool), demand


def levels(tree: Tree) -> dict[str | None, list[str]]:
    """Each group (None: the cluster) with its children: the levels where siblings compete."""
    return {parent: kids for parent, kids in tree.children.items() if len(kids) >= 2}


def weights_split(sweep: Sweep, measured_from: int) -> dict:
    """Per level and set of siblings that wait together: GPU-hours each took from outside, and the
    expected splits (weight; weight x capacity)."""
    tree = sweep.tree
    per_set: dict[tuple[str | None, frozenset], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    seconds: dict[tuple[str | None, frozenset], float] = defaultdict(float)
    saturated: dict[tuple[str | None, frozenset], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    # The decisions: borrowed GPU-hours of the attempts admitted while the set waited (the set of the
    # interval before the admission), by the member whose subtree they went to.
    admitted_h: dict[tuple[str | None, frozenset], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    starts: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for rec in sweep.result.jobs.values():
        for a in rec.attempts:
            if a.borrowed:
                end = a.end if a.end is not None else sweep.result.timeline.end
                starts[a.start].append((rec.spec.share, a.gpus * (end - a.start) / 3600))
    waited_before: set[str] = set()
    for t, t_next, _, waiting, n, demand in sweep.intervals():
        if t >= measured_from and t in starts:
            for parent, kids in levels(tree).items():
                wait = frozenset(k for k in kids if k in waited_before)
                if len(wait) < 2:
                    continue
                for share, hours in starts[t]:
                    for k in wait:
                        if k in tree.path(share):
                            admitted_h[(parent, wait)][k] += hours
                for k in wait:
                    admitted_h[(parent, wait)][k] += 0.0
        waited_before = waiting
        lo = max(t, measured_from)
        if t_next <= lo:
            continue
        dt = t_next - lo
        for parent, kids in levels(tree).items():
            wait = frozenset(k for k in kids if k in waiting)
            if len(wait) < 2:
                continue
            key = (parent, wait)
            seconds[key] += dt
            # Saturated: each member waits with at least SATURATED GPUs of jobs, so it could take more
            # of what frees than its part; the split then shows the rule, not the demand.
            full = all(demand[k][1] >= SATURATED for k in wait)
            for k in wait:
                per_set[key][k] += n.taken[k] * dt / 3600
                if full:
                    saturated[key][k] += n.taken[k] * dt / 3600
    return {
        "rows": _split_rows(tree, sweep.capacity, per_set, seconds),
        "saturated": _split_rows(tree, sweep.capacity, saturated, seconds),
        "admitted": _split_rows(tree, sweep.capacity, admitted_h, seconds),
    }


def _split_rows(tree: Tree, capacity, per_set, seconds) -> list[dict]:
    rows = []
    for (parent, members), taken in per_set.items():
        total = sum(taken.values())
        w = {k: tree.weight[k] for k in members}
        wc = {k: tree.weight[k] * max(1, capacity[k]) for k in members}
        for k in sorted(members):
            rows.append(
                {
                    "level": parent or "(cluster)",
                    "set": ", ".join(sorted(members)),
                    "hours_waiting": seconds[(parent, members)] / 3600,
                    "member": k,
                    "taken_h": taken[k],
                    "set_taken_h": total,
                    "observed": taken[k] / total if total else None,
                    "by_weight": w[k] / sum(w.values()),
                    "by_weight_capacity": wc[k] / sum(wc.values()),
                }
            )
    return rows


def summary(rows: list[dict], expected: str, level: str) -> tuple[float, float, float]:
    """Over the sets of one level ("top": the departments; "inside": shares in a department): (the mean
    over sets of the largest |observed - expected| / expected among a set's members, each set weighted
    by its GPU-hours; the fraction of GPU-hours in sets whose every member is within TOLERANCE; the
    GPU-hours)."""
    sets: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        if r["observed"] is not None and (r["level"] == "(cluster)") == (level == "top"):
            sets[(r["level"], r["set"])].append(r)
    err_sum = within = hours = 0.0
    for members in sets.values():
        total = members[0]["set_taken_h"]
        worst = max(abs(r["observed"] - r[expected]) / r[expected] for r in members)
        err_sum += worst * total
        within += total if worst <= TOLERANCE else 0.0
        hours += total
    return (err_sum / hours if hours else float("nan"), within / hours if hours else float("nan"), hours)


def memory_moments(sweep: Sweep, half_life_s: int, measured_from: int) -> list[dict]:
    """The passes that hand out borrowed GPUs while two siblings wait to borrow, one idle for days
    (history under IDLE_HISTORY) and one that borrowed all week (history BUSY_HISTORY or more), and the
    idle one could have used what was handed out (its smallest waiting job is no bigger than the
    biggest borrowed job admitted at that pass: a block that size was free). For each: what each got at
    that pass, against the idle one's weighted part of what was handed out (capped by what it waited
    for)."""
    tree = sweep.tree
    history = FairShareHistory(half_life_s)
    # Borrowed attempts admitted per instant: (share, GPUs).
    admitted: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for rec in sweep.result.jobs.values():
        for a in rec.attempts:
            if a.borrowed:
                admitted[a.start].append((rec.spec.share, a.gpus))
    out = []
    prev_taken: dict[tuple[str, str], float] = {}
    prev = None  # the interval before the pass at t: who waited, for what, with which nets
    for t, _t_next, _used, waiting, n, demand in sweep.intervals():
        values = history.advance(t, prev_taken)  # what the pass at t reads
        got = admitted.get(t)
        if got and prev is not None and t >= measured_from:
            waited, n_before, demand_before = prev
            for parent, kids in levels(tree).items():
                wait = [k for k in kids if k in waited]
                if len(wait) < 2:
                    continue
                hist = {k: values.get((k, GPU_TYPE), 0.0) for k in wait}
                to = {k: [g for share, g in got if k in tree.path(share)] for k in wait}
                handed = sum(sum(gs) for gs in to.values())
                if not handed:
                    continue
                w_total = sum(tree.weight[k] for k in wait)
                for i in (k for k in wait if hist[k] < IDLE_HISTORY):
                    for b in (k for k in wait if hist[k] >= BUSY_HISTORY):
                        biggest = max((g for k in wait for g in to[k]), default=0)
                        if demand_before[i][0] > biggest:
                            continue  # the idle one's jobs did not fit what was handed out
                        part = min(handed * tree.weight[i] / w_total, demand_before[i][1])
                        out.append(
                            {
                                "t": t,
                                "level": parent or "(cluster)",
                                "idle": i,
                                "idle_history": hist[i],
                                "idle_got": sum(to[i]),
                                "idle_part": part,
                                "idle_waited_gpus": demand_before[i][1],
                                "busy": b,
                                "busy_history": hist[b],
                                "busy_got": sum(to[b]),
                                "handed": handed,
                                "values": {
                                    k: fair_share_value(
                                        n_before.taken[k], hist[k], tree.weight[k], sweep.capacity[k]
                                    )
                                    for k in (i, b)
                                },
                            }
                        )
        prev = (waiting, n, demand)
        prev_taken = {(k, GPU_TYPE): v for k, v in n.taken.items() if v}
    return out


def lost_in_window(result, measured_from: int) -> dict[str, float]:
    """GPU-hours of work thrown away by pre-emptions that ended from `measured_from` on, by cause (the
    simulator's count: the work since the attempt's safe point; none where it saved when told to stop)."""
    cause = {"FAIR_SHARE": "fair_share", "RECLAIM": "reclaim", "PRIORITY": "priority"}
    lost: Counter = Counter()
    for rec in result.jobs.values():
        job = rec.spec
        for a in rec.attempts:
            if a.outcome != "PREEMPTED" or a.end is None or a.end < measured_from:
                continue
            if job.checkpoint_on_stop:
                continue
            ran = a.end - a.start
            every = job.checkpoint_every_s
            since = ran - ran // every * every if every else ran
            lost[cause.get(a.preemption_reason, str(a.preemption_reason))] += job.gpus * since / 3600
    return dict(lost)


def weights(first: int, last: int, warmup: int, starvation_s: int | None, fair_reclaim: bool) -> dict:
    """Replay the week once and print the split per set (item 1 of the module's docstring); returns the
    summaries per (what is split, level, expectation) and the work lost in the week."""
    measured_from = warmup * DAY
    scen = scenario(first, last, warmup, starvation_s=starvation_s, fair_reclaim=fair_reclaim)
    t0 = time.perf_counter()
    result = simulate(scen)
    print(
        f"replay without history, fair reclaim {'on' if fair_reclaim else 'off'}: "
        f"{time.perf_counter() - t0:.1f} s, {len(scen.jobs):,} jobs",
        flush=True,
    )
    sweep = Sweep(scen, result)
    if not fair_reclaim:
        for s in sorted(scen.shares, key=lambda s: (s.group, s.name)):
            print(f"  {s.group} > {s.name}: capacity {s.capacity[GPU_TYPE]}, weight {s.weight:g}")
    split = weights_split(sweep, measured_from)
    rows = split["rows"]
    print(
        f"{'level':10} {'set that waits':42} {'h':>6} {'member':8} {'GPU-h':>8} {'observed':>8} "
        f"{'weight':>7} {'w x cap':>7}"
    )
    for r in sorted(rows, key=lambda r: (r["level"] != "(cluster)", r["level"], -r["set_taken_h"])):
        if r["set_taken_h"] < 1:
            continue
        print(
            f"{r['level']:10} {r['set'][:42]:42} {r['hours_waiting']:6.1f} {r['member']:8} "
            f"{r['taken_h']:8,.0f} {r['observed']:8.1%} {r['by_weight']:7.1%} {r['by_weight_capacity']:7.1%}"
        )
    out: dict = {"summaries": {}, "lost_h": lost_in_window(result, measured_from)}
    for label, which in (
        ("all", rows),
        (f"saturated (each waits for >= {SATURATED} GPUs)", split["saturated"]),
        ("admitted while the set waited (GPU-h of those borrowed attempts)", split["admitted"]),
    ):
        print(label)
        for level in ("top", "inside"):
            for expected in ("by_weight", "by_weight_capacity"):
                err, within, hours = summary(which, expected, level)
                out["summaries"][(label, level, expected)] = (err, within, hours)
                print(
                    f"  {level:6} against {expected:18}: mean of the worst |observed - expected| / expected {err:.0%}, "
                    f"{within:.0%} of {hours:,.0f} GPU-h within {TOLERANCE:.0%}"
                )
    print(
        "GPU-h lost in the measured days: "
        + ", ".join(f"{c} {h:,.1f}" for c, h in sorted(out["lost_h"].items()))
        + "; whole replay, fair_share: "
        + f"{sum(d['lost_gpu_seconds'].get('fair_share', 0) for d in result.shares.values()) / 3600:,.1f}",
        flush=True,
    )
    return out


def side_by_side(off: dict, on: dict) -> None:
    """The split figures of the two replays next to each other."""
    print(f"fair reclaim off | on: mean worst error, GPU-h within {TOLERANCE:.0%} of GPU-h")
    for key in off["summaries"]:
        label, level, expected = key
        cells = []
        for fig in (off, on):
            err, within, hours = fig["summaries"].get(key, (float("nan"), float("nan"), 0.0))
            cells.append(f"{err:5.0%}, {within:4.0%} of {hours:8,.0f}")
        print(f"  {label[:24]:24} {level:6} {expected:18}: " + " | ".join(cells))
    print(
        f"  GPU-h lost to fair_share in the measured days: {off['lost_h'].get('fair_share', 0.0):,.1f} | "
        f"{on['lost_h'].get('fair_share', 0.0):,.1f}; to reclaim: {off['lost_h'].get('reclaim', 0.0):,.1f} | "
        f"{on['lost_h'].get('reclaim', 0.0):,.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", nargs=2, type=int, default=BUSIEST_WEEK, metavar=("FIRST", "LAST"))
    parser.add_argument("--warmup", type=int, default=WARMUP_DAYS, metavar="DAYS")
    parser.add_argument("--only", choices=("weights", "memory"))
    parser.add_argument(
        "--starvation-s",
        type=int,
        metavar="S",
        help="the scenario's starvation_s (default: the import's); a large one turns rule 6's node "
        "reservations for starving heads off",
    )
    parser.add_argument(
        "--fair-reclaim",
        action="store_true",
        help="the weights measurement twice, fair reclaim off then on (rule 11), side by side, with the "
        "GPU-hours lost to fair_share in the week (the memory measurement stays off)",
    )
    args = parser.parse_args(argv)
    first, last = args.days
    measured_from = args.warmup * DAY
    print(f"ITP days {first}-{last} (after {args.warmup} days replayed first), {dict(DEPARTMENTS)}")
    if args.only in (None, "weights"):
        runs = (False, True) if args.fair_reclaim else (False,)
        figures = {}
        for fair in runs:  # one after the other: the machine is shared
            figures[fair] = weights(first, last, args.warmup, args.starvation_s, fair)
        if args.fair_reclaim:
            side_by_side(figures[False], figures[True])
    if args.only in (None, "memory"):
        scen = scenario(first, last, args.warmup, half_life_s=DAY, starvation_s=args.starvation_s)
        t0 = time.perf_counter()
        result = simulate(scen)
        print(f"replay with a half-life of 1 day: {time.perf_counter() - t0:.1f} s")
        moments = memory_moments(Sweep(scen, result), DAY, measured_from)
        passes = sorted({m["t"] for m in moments})
        ahead = [m for m in moments if m["idle_got"] >= m["idle_part"] - 1e-9]
        first = [m for m in moments if m["idle_got"] >= m["idle_part"] - 1e-9 or not m["busy_got"]]
        print(
            f"passes that hand out borrowed GPUs while an idle-for-days sibling (history < {IDLE_HISTORY}) "
            f"and a busy one (>= {BUSY_HISTORY}) wait, the idle one's jobs fitting what is handed out: "
            f"{len(passes)} ({len(moments)} pairs)"
        )
        print(f"  the idle one got at least its weighted part at that pass: {len(ahead)} of {len(moments)}")
        print(f"  ... or the busy one got nothing: {len(first)} of {len(moments)}")
        for m in moments[:: max(1, len(moments) // 12)]:
            print(
                f"  t={m['t'] / DAY:5.2f} d {m['level']:9} idle {m['idle']} (history {m['idle_history']:.2f}, "
                f"value {m['values'][m['idle']]:.4f}, waits for {m['idle_waited_gpus']}) got {m['idle_got']} of "
                f"{m['handed']} (part {m['idle_part']:.1f}); busy {m['busy']} (history {m['busy_history']:.1f}, "
                f"value {m['values'][m['busy']]:.4f}) got {m['busy_got']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
