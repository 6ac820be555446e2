"""The advisor: "utilisation or reservation?" answered by replaying a scenario (the cluster's own history)
with variants of its layout, and showing the trade-off (issue 38).

Pure: imports nothing from Django (quotas.advice runs the same replays as Celery tasks). Run it as
``python -m quotas.advise SCENARIO.json --out ADVICE.json [--jobs N] [--window-s S]``.

The search, far fewer replays than every combination:
1. today's layout, then one move at a time from it ("moves"): per share with capacity its other
   strategies (RESERVE / LEND / LEND_AND_BORROW), for a LEND_AND_BORROW share a borrow limit (none ->
   its own capacity, a limit -> none), `min_runtime_s` (0 -> 600 s, else -> 0), its weight doubled where
   the share is in a group of the organisation tree; and the cluster's fair-sharing settings (half-life
   0 -> a day, else -> 0; fair_reclaim toggled).
2. the improving moves combined: at most one move per share or setting (the best of its own), added in
   order of their utilisation gain (one replay per prefix: {m1}, {m1, m2}, ...), and the moves that
   improve utilisation without raising owners' p95 wait all together.
Every point is a replay; the answer says how many.

The figures of a point, over the window the scenario stands for (quotas.engine.measures):
- utilisation: GPU-seconds held within the window / READY GPU-seconds within it, in percent;
- owners' p95 wait: over the jobs first admitted on their own share's capacity (ADMITTED_OWN), submit to
  first start; a job that never started counts as waiting until the cut when its own share's capacity
  could hold it (it was the owners' job the layout kept waiting), so a layout that starves owners does
  not look fast;
- lost GPU-seconds: work lost to pre-emptions (the simulator's count);
- never started: jobs that never started in the replay (counted and shown, never dropped);
- per week of the window: utilisation and owners' p95, whose spread says how sure the figure is.

The frontier: the points no other point beats on both utilisation (higher) and owners' p95 wait (lower),
ties broken by lost work. "recommended" (null: keep today's layout): the frontier point with the highest utilisation whose owners'
p95 wait is no worse than today's and whose useful utilisation (GPU-time held less the work thrown away
by pre-emptions) is no lower than today's (null: keep today's layout, see the margin below). The
second condition came from the held-out test on ITP (bench/RESULTS.md): without it a fair_reclaim that
added 0.1% utilisation by pre-empting and re-running work was recommended. And a change is recommended
over today's only for at least MARGIN_UTILISATION points of utilisation (the held-out test again: a
gain of 0.0 points in sample was a loss of 2.8 points on the next days).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from quotas.engine import measures, policy
from quotas.engine import scenario as sc

STRATEGIES = (policy.RESERVE, policy.LEND, policy.LEND_AND_BORROW)
MIN_RUNTIME_TRY_S = 600
HALF_LIFE_TRY_S = 86400
WEEK_S = 7 * 86400
FIGURES = ("utilisation", "useful_utilisation", "owners_p95_wait_s", "lost_gpu_seconds", "never_started")
# A change is recommended over today's layout only for at least this many points of utilisation: on
# ITP days 14-17 a borrow limit that gained 0.0 points (and 1 s of owners' p95) in sample cost 2.8
# points on the next days (bench/RESULTS.md, bench 14); below the margin the evidence is noise.
MARGIN_UTILISATION = 0.5
RULE = (
    "the frontier point with the highest utilisation whose owners' p95 wait is no worse than today's and "
    "whose useful utilisation (held less the work lost to pre-emptions) is no lower than today's, if it "
    f"gains at least {MARGIN_UTILISATION} points of utilisation; else today's layout"
)
SETTINGS_TARGET = "settings"  # a move's target when it changes the cluster's fair-sharing settings
FIELDS = ("strategy", "borrow_limit", "min_runtime_s", "weight", "fair_share_half_life_s", "fair_reclaim")


# --- moves and variants --------------------------------------------------------------------------------


def move(target: str, field: str, old: Any, new: Any) -> dict[str, Any]:
    return {"target": target, "field": field, "from": old, "to": new}


def moves(scenario: sc.Scenario) -> list[dict[str, Any]]:
    """Stage 1: one move per entry, each from today's layout (see the module docstring)."""
    out = []
    for share in sorted(scenario.shares, key=lambda s: s.name):
        if share.state != sc.ENABLED or not any(share.capacity.values()):
            continue  # a strategy or a limit means nothing to a share with no GPUs of its own
        for strategy in STRATEGIES:
            if strategy != share.strategy:
                out.append(move(share.name, "strategy", share.strategy, strategy))
        if share.strategy == policy.LEND_AND_BORROW:
            own = sum(share.capacity.values())
            new = own if share.borrow_limit == policy.UNLIMITED else policy.UNLIMITED
            out.append(move(share.name, "borrow_limit", share.borrow_limit, new))
        out.append(
            move(
                share.name,
                "min_runtime_s",
                share.min_runtime_s,
                0 if share.min_runtime_s else MIN_RUNTIME_TRY_S,
            )
        )
        if share.group is not None:
            out.append(move(share.name, "weight", share.weight, share.weight * 2))
    for group in sorted(scenario.groups, key=lambda g: g.name):  # a group's weight among its siblings
        out.append(move(group.name, "weight", group.weight, group.weight * 2))
    settings = scenario.settings
    half_life = settings.fair_share_half_life_s
    out.append(
        move(SETTINGS_TARGET, "fair_share_half_life_s", half_life, 0 if half_life else HALF_LIFE_TRY_S)
    )
    out.append(move(SETTINGS_TARGET, "fair_reclaim", settings.fair_reclaim, not settings.fair_reclaim))
    return out


def variant_key(variant: Sequence[Mapping[str, Any]]) -> str:
    """A variant (a list of moves) named independently of its order: the cache key's second half."""
    return json.dumps(sorted((m["target"], m["field"], m["to"]) for m in variant), default=str)


def apply(scenario: sc.Scenario, variant: Sequence[Mapping[str, Any]]) -> sc.Scenario:
    """The scenario with the variant's moves applied to its layout (jobs, nodes and events unchanged)."""
    shares = {s.name: s for s in scenario.shares}
    groups = {g.name: g for g in scenario.groups}
    settings = scenario.settings
    for m in variant:
        if m["target"] == SETTINGS_TARGET:
            settings = dataclasses.replace(settings, **{m["field"]: m["to"]})
            continue
        if m["target"] in groups:  # names of groups and shares never collide (validate_tree)
            groups[m["target"]] = dataclasses.replace(groups[m["target"]], **{m["field"]: m["to"]})
            continue
        changes = {m["field"]: m["to"]}
        if m["field"] == "strategy" and m["to"] != policy.LEND_AND_BORROW:
            changes["borrow_limit"] = policy.UNLIMITED  # only a LEND_AND_BORROW share has a borrow limit
        shares[m["target"]] = dataclasses.replace(shares[m["target"]], **changes)
    return dataclasses.replace(
        scenario,
        shares=tuple(shares[s.name] for s in scenario.shares),
        groups=tuple(groups[g.name] for g in scenario.groups),
        settings=settings,
    )


def layout_of(scenario: sc.Scenario) -> dict[str, Any]:
    """The layout in SCENARIO.md's format (it drops into a scenario): shares, groups, settings."""
    data = scenario.to_dict()
    return {
        "shares": data["shares"],
        "groups": data.get("groups", []),
        "settings": {
            "fair_share_half_life_s": scenario.settings.fair_share_half_life_s,
            "fair_reclaim": scenario.settings.fair_reclaim,
        },
    }


# --- one replay's figures ------------------------------------------------------------------------------


def _p95(values: list[int]) -> int | None:
    return measures.nearest_rank(sorted(values), 95)


def evaluate(scenario: sc.Scenario, *, window_s: float) -> dict[str, Any]:
    """Replay the scenario with the production policy; the figures of its point (module docstring)."""
    from quotas.engine import simulate  # here: a pool worker imports it once, on its first replay

    result = simulate.simulate(scenario)
    cut = measures.cut_of(scenario, result)
    shares = {s.name: s for s in scenario.shares}
    owners: dict[str, list[tuple[int, int]]] = {}  # share -> [(submit, wait)]
    never = 0
    for record in result.jobs.values():
        if record.spec.id in result.rejected:
            continue
        spec = record.spec
        if record.first_start is None:
            if record.final != measures.QUEUED:
                continue  # cancelled before it started: nobody waited for it
            never += 1
            own = shares.get(spec.share)
            if own is not None and own.capacity.get(spec.gpu_type, 0) >= spec.gpus:
                owners.setdefault(spec.share, []).append((spec.submit_at, max(0, cut - spec.submit_at)))
        elif record.attempts and record.attempts[0].reason == policy.ADMITTED_OWN:
            owners.setdefault(spec.share, []).append((spec.submit_at, record.first_start - spec.submit_at))
    every = [w for waits in owners.values() for _, w in waits]
    weeks = []
    for start in range(0, max(1, math.ceil(window_s / WEEK_S)) * WEEK_S, WEEK_S):
        end = min(window_s, start + WEEK_S)
        if end - start < 86400 and start:  # a stub of less than a day says nothing about a week
            continue
        weeks.append(
            {
                "from_s": start,
                "to_s": int(end),
                "utilisation": _utilisation_between(scenario, result, cut, start, end),
                "owners_p95_wait_s": _p95([w for ws in owners.values() for t, w in ws if start <= t < end]),
            }
        )
    lost = result.cluster.get("lost_gpu_seconds") or 0
    lost = int(sum(lost.values()) if isinstance(lost, Mapping) else lost)
    utilisation = measures.utilisation(scenario, result, window_s)
    ready = _utilisation_between(scenario, result, cut, 0, window_s, ready_only=True)
    held = _utilisation_between(scenario, result, cut, 0, window_s, unrounded=True)
    return {
        "utilisation": utilisation,
        # Held GPU-time less the work thrown away by pre-emptions: what the cluster got done.
        # Two decimals: a small gain bought by a larger loss must not round to a tie.
        "useful_utilisation": round(held - (100 * lost / ready if ready else 0.0), 2),
        "owners_p95_wait_s": _p95(every),
        "owners_jobs": len(every),
        "lost_gpu_seconds": lost,
        "never_started": never,
        "never_started_words": measures.never_started(scenario, result, limit=5),
        # every share, one without owners' jobs too (None): "what changes for whom" names it
        "shares": {
            s.name: {"owners_p95_wait_s": _p95([w for _, w in owners.get(s.name, [])])}
            for s in sorted(scenario.shares, key=lambda s: s.name)
        },
        "weeks": weeks,
    }


def _utilisation_between(
    scenario: sc.Scenario,
    result: Any,
    cut: int,
    start: float,
    end: float,
    *,
    ready_only: bool = False,
    unrounded: bool = False,
) -> float:
    """Percent of the READY GPU-seconds in [start, end) held by attempts (ready_only: those seconds)."""
    busy = sum(
        a.gpus * max(0.0, min(a.end if a.end is not None else cut, end) - max(a.start, start))
        for r in result.jobs.values()
        for a in r.attempts
    )
    capacity = sum(
        n.gpus * max(0.0, min(end, n.lost_at if n.lost_at is not None else end) - max(start, n.ready_at))
        for n in scenario.nodes
    )
    if ready_only:
        return capacity
    if unrounded:
        return 100 * busy / capacity if capacity else 0.0
    return round(100 * busy / capacity, 1) if capacity else 0.0


# --- stage 2, the frontier, the answer -----------------------------------------------------------------


def _wait(point: Mapping[str, Any]) -> float:
    w = point["owners_p95_wait_s"]
    return 0.0 if w is None else float(w)


def dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """a is at least as good as b on utilisation and owners' p95 wait (and lost work), better on one."""
    ge = (a["utilisation"], -_wait(a), -a["lost_gpu_seconds"])
    lb = (b["utilisation"], -_wait(b), -b["lost_gpu_seconds"])
    return all(x >= y for x, y in zip(ge, lb, strict=True)) and ge != lb


def improves(point: Mapping[str, Any], today: Mapping[str, Any]) -> bool:
    return not dominates(today, point) and (
        point["utilisation"] > today["utilisation"] or _wait(point) < _wait(today)
    )


def combined(today: Mapping[str, Any], singles: Sequence[tuple[dict, Mapping[str, Any]]]) -> list[list[dict]]:
    """Stage 2: variants combining the improving single moves (module docstring). `singles` is
    [(move, its point)]. No variant twice, none of one move (stage 1 replayed those)."""
    best: dict[str, tuple[dict, Mapping[str, Any]]] = {}
    for m, point in singles:
        if not improves(point, today):
            continue
        held = best.get(m["target"])
        if held is None or (point["utilisation"], -_wait(point)) > (held[1]["utilisation"], -_wait(held[1])):
            best[m["target"]] = (m, point)
    ranked = sorted(best.values(), key=lambda mp: (-mp[1]["utilisation"], _wait(mp[1]), variant_key([mp[0]])))
    out, seen = [], set()

    def add(variant: list[dict]) -> None:
        key = variant_key(variant)
        if len(variant) > 1 and key not in seen:
            seen.add(key)
            out.append(variant)

    for n in range(2, len(ranked) + 1):
        add([m for m, _ in ranked[:n]])
    add([m for m, p in ranked if p["utilisation"] > today["utilisation"] and _wait(p) <= _wait(today)])
    return out


def frontier(points: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the points no other point dominates, by utilisation ascending; equal figures once."""
    keep, seen = [], set()
    for i, p in enumerate(points):
        figures = (p["utilisation"], _wait(p), p["lost_gpu_seconds"])
        if figures in seen or any(dominates(q, p) for j, q in enumerate(points) if j != i):
            continue
        seen.add(figures)
        keep.append(i)
    return sorted(keep, key=lambda i: (points[i]["utilisation"], _wait(points[i])))


def duration_words(seconds: float | None) -> str:
    if seconds is None:
        return "none"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _value_words(field: str, value: Any) -> str:
    if field == "borrow_limit":
        return "no limit" if value == policy.UNLIMITED else f"{value} GPUs"
    if field in ("min_runtime_s", "fair_share_half_life_s"):
        return duration_words(value)
    if field == "fair_reclaim":
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def change_words(m: Mapping[str, Any], point: Mapping[str, Any], today: Mapping[str, Any]) -> str:
    """ "vision: RESERVE → LEND: +9.0% utilisation, vision's owners' p95 wait 40 s → 3 min"."""
    label = "cluster" if m["target"] == SETTINGS_TARGET else m["target"]
    what = (
        f"{m['field']} {_value_words(m['field'], m['from'])} → {_value_words(m['field'], m['to'])}"
        if m["field"] != "strategy"
        else f"{m['from']} → {m['to']}"
    )
    gain = point["utilisation"] - today["utilisation"]
    words = f"{label}: {what}: {gain:+.1f}% utilisation"
    if m["target"] in today["shares"] or m["target"] in point["shares"]:  # a share: its owners' wait
        before = today["shares"].get(m["target"], {}).get("owners_p95_wait_s")
        after = point["shares"].get(m["target"], {}).get("owners_p95_wait_s")
        words += f", {m['target']}'s owners' p95 wait {duration_words(before)} → {duration_words(after)}"
    else:
        words += f", all owners' p95 wait {duration_words(today['owners_p95_wait_s'])} → {duration_words(point['owners_p95_wait_s'])}"
    return words


def answer(
    scenario: sc.Scenario,
    today: Mapping[str, Any],
    tried: Sequence[tuple[list[dict], Mapping[str, Any]]],
    *,
    replays: int,
    window_s: float,
) -> dict[str, Any]:
    """ADVICE.json: the replays counted, today's point, the frontier (today included where nobody beats
    it), each point's layout and its changes in words, and the recommended index."""

    def entry(variant: list[dict], point: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "layout": layout_of(apply(scenario, variant)),
            **{k: point[k] for k in FIGURES},
            "owners_jobs": point["owners_jobs"],
            "never_started_words": point["never_started_words"],
            "weeks": point["weeks"],
            "spread": spread(point),
            "shares": point["shares"],
            "changes": [{**m, "words": change_words(m, point, today)} for m in variant],
            "today": not variant,
        }

    points = [([], today), *tried]
    indices = frontier([p for _, p in points])
    front = [entry(*points[i]) for i in indices]
    eligible = [
        i
        for i, f in enumerate(front)
        if f["today"]
        or (
            _wait(f) <= _wait(today)
            and f["useful_utilisation"] >= today["useful_utilisation"]
            and f["utilisation"] >= today["utilisation"] + MARGIN_UTILISATION
        )
    ]
    recommended = (
        max(eligible, key=lambda i: (front[i]["utilisation"], -_wait(front[i]))) if eligible else None
    )
    return {
        "replays": replays,
        "window_s": int(window_s),
        "jobs": len(scenario.jobs),
        "today": entry([], today),
        "frontier": front,
        "points": [
            {
                **{
                    k: p[k] for k in ("utilisation", "owners_p95_wait_s", "lost_gpu_seconds", "never_started")
                },
                "changes": [{**m, "words": change_words(m, p, today)} for m in v],
                "frontier": i in indices,
            }
            for i, (v, p) in enumerate(points)
        ],
        "recommended": recommended,
        "rule": RULE,
    }


def spread(point: Mapping[str, Any]) -> dict[str, Any]:
    """How sure the figure is: the lowest and highest of the week-by-week figures."""
    utils = [w["utilisation"] for w in point["weeks"]]
    waits = [w["owners_p95_wait_s"] for w in point["weeks"] if w["owners_p95_wait_s"] is not None]
    return {
        "weeks": len(point["weeks"]),
        "utilisation": [min(utils), max(utils)] if utils else None,
        "owners_p95_wait_s": [min(waits), max(waits)] if waits else None,
    }


# --- the search ----------------------------------------------------------------------------------------

Replayer = Callable[[Sequence[list[dict]]], list[Mapping[str, Any]]]


def search(scenario: sc.Scenario, *, window_s: float, replay_many: Replayer) -> dict[str, Any]:
    """Both stages; `replay_many` replays a list of variants (in order, however it spreads them)."""
    stage1 = [[], *([m] for m in moves(scenario))]
    points1 = replay_many(stage1)
    today, singles = points1[0], [(v[0], p) for v, p in zip(stage1[1:], points1[1:], strict=True)]
    stage2 = combined(today, singles)
    points2 = replay_many(stage2) if stage2 else []
    tried = [(v, p) for v, p in zip(stage1[1:], points1[1:], strict=True)]
    tried += list(zip(stage2, points2, strict=True))
    return answer(scenario, today, tried, replays=len(stage1) + len(stage2), window_s=window_s)


_WORKER: dict[str, Any] = {}


def _init_worker(data: dict[str, Any], window_s: float) -> None:
    _WORKER["digest"] = None
    _WORKER["scenario"] = sc.parse(data)
    _WORKER["window_s"] = window_s


def _replay_in_worker(variant: list[dict]) -> Mapping[str, Any]:
    return evaluate(apply(_WORKER["scenario"], variant), window_s=_WORKER["window_s"])


def replay_one(digest: str, data: Mapping[str, Any], variant: list[dict], window_s: float) -> dict[str, Any]:
    """One replay in a pool process (quotas.advice on a worker): the scenario parsed once per digest."""
    if _WORKER.get("digest") != digest:
        _init_worker(dict(data), window_s)
        _WORKER["digest"] = digest
    return evaluate(apply(_WORKER["scenario"], variant), window_s=window_s)


def local_replayer(scenario: sc.Scenario, *, window_s: float, jobs: int = 1) -> Replayer:
    """Replays in this process (jobs=1) or a process pool of `jobs` (the scenario sent once per worker)."""
    if jobs <= 1:
        return lambda variants: [evaluate(apply(scenario, v), window_s=window_s) for v in variants]
    from concurrent.futures import ProcessPoolExecutor

    def many(variants: Sequence[list[dict]]) -> list[Mapping[str, Any]]:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(variants)),
            initializer=_init_worker,
            initargs=(scenario.to_dict(), window_s),
        ) as pool:
            return list(pool.map(_replay_in_worker, variants))

    return many


def cache_key(digest: str, variant: Sequence[Mapping[str, Any]]) -> str:
    """A replay's result cache key: the scenario's digest and the variant (quotas.advice)."""
    return hashlib.sha256(f"{digest}|{variant_key(variant)}".encode()).hexdigest()


# --- command line --------------------------------------------------------------------------------------


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quotas.advise", description=__doc__.split("\n")[0])
    parser.add_argument("scenario", help="SCENARIO.json (../shared/spec/SCENARIO.md)")
    parser.add_argument("--out", help="where to write ADVICE.json (default: standard output)")
    parser.add_argument("--jobs", type=int, default=1, help="replays side by side (a process pool)")
    parser.add_argument(
        "--window-s",
        type=float,
        help="the seconds the scenario stands for (default: until its last job could end)",
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.jobs < 1:
        parser.error("--jobs: at least 1")
    try:
        scenario = sc.load(args.scenario)
    except sc.ScenarioError as e:
        for line in e.errors:
            print(f"{args.scenario}: {line}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print(f"{args.scenario}: {e}", file=sys.stderr)
        return 2
    window_s = args.window_s or measures.natural_window(scenario)
    started = time.monotonic()
    advice = search(
        scenario, window_s=window_s, replay_many=local_replayer(scenario, window_s=window_s, jobs=args.jobs)
    )
    advice["seconds"] = round(time.monotonic() - started, 2)
    text = json.dumps(advice, indent=1, sort_keys=True) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    rec = advice["recommended"]
    print(
        f"{advice['replays']} replays in {advice['seconds']} s; frontier of {len(advice['frontier'])} points; "
        f"recommended: {'today' if rec is None or advice['frontier'][rec]['today'] else rec}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
