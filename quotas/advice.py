"""The advisor's Django side (issue 38): the last 1-4 weeks replayed with variants of the layout, each
replay a Celery task on the `whatif` queue, the answer a trade-off an admin chooses from.

A run: the request builds the window's scenario once (quotas.whatif.build_scenario, the what-if's own
reading of the history: its window edges, its pending temporary changes) and keeps it in the cache under
its digest; stage 1's variants (quotas.advise.moves: today's layout and one move at a time) are sent as
a group of tasks, one replay each. The part that finishes stage 1 (a lock in the cache: exactly one)
sends stage 2 (the improving moves combined); the one that finishes stage 2 writes the answer
(quotas.advise.answer). No Celery chord: the join is the cache's part states, so a worker lost
mid-replay (the task is acknowledged late and re-delivered to another worker: at once when a pool
process died, after WHATIF_VISIBILITY_TIMEOUT_S when its host went away) or one worker doing every
part ends the same; a stage's lock names the part that took it, so that part's task, delivered again,
finishes a stage its lost worker left half done. A replay's figures are cached under the scenario's digest and the variant
(quotas.advise.cache_key): the same window and variant are never replayed twice.

Choosing a point makes a layout plan (quotas.layout.plan, with its what-if): never a silent change.
"""

from __future__ import annotations

import logging
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.utils import timezone

from quotas import advise, whatif
from quotas.engine import scenario as sc

log = logging.getLogger(__name__)

PREFIX = "gpuquota:advice:"
TASK = "quotas.tasks.advice_replay"  # by name: quotas.tasks imports this module
TTL_S = 6 * 3600
MAX_WEEKS = 4
QUEUED, REPLAYING, DONE, FAILED, CANCELLED = "queued", "replaying", "done", "failed", "cancelled"

_parsed: dict[str, sc.Scenario] = {}  # digest -> scenario: a worker parses a run's window once


def _run_key(run_id: str) -> str:
    return f"{PREFIX}run:{run_id}"


def _part_key(run_id: str, index: int) -> str:
    return f"{PREFIX}run:{run_id}:part:{index}"


def _scenario_key(digest: str) -> str:
    return f"{PREFIX}scenario:{digest}"


def start(*, weeks: int, actor=None, now: datetime | None = None) -> str:
    """Build the window's scenario, store it, send stage 1's replays. Returns the run's id."""
    if not 1 <= weeks <= MAX_WEEKS:
        raise ValueError(f"weeks must be 1 to {MAX_WEEKS}")
    now = now or timezone.now()
    scenario, left_out, window_start = whatif.build_scenario(now=now, window=timedelta(weeks=weeks))
    scenario = whatif.with_pending_reverts(scenario, whatif.pending_reverts(now))
    window_s = whatif.window_seconds(scenario, window_start, now)
    digest = whatif.scenario_digest(scenario, window_s)
    cache.set(_scenario_key(digest), scenario.to_dict(), TTL_S)
    _parsed.clear()
    _parsed[digest] = scenario
    variants = [[], *([m] for m in advise.moves(scenario))]
    run_id = uuid.uuid4().hex
    spec = {
        "id": run_id,
        "digest": digest,
        "weeks": weeks,
        "window_s": window_s,
        "window_start": window_start.isoformat(),
        "now": now.isoformat(),
        "jobs": len(scenario.jobs),
        "left_out": left_out,
        "variants": variants,
        "stage1": len(variants),
        "created": time.time(),
        "by": getattr(actor, "username", ""),
    }
    cache.set(_run_key(run_id), spec, TTL_S)
    for index in range(len(variants)):
        _enqueue(run_id, index)
    return run_id


def _enqueue(run_id: str, index: int) -> None:
    whatif.send_replay(TASK, run_id, index)


def _scenario(digest: str) -> sc.Scenario:
    if digest not in _parsed:
        data = cache.get(_scenario_key(digest))
        if data is None:
            raise LookupError("the run's window is no longer in the cache (it expired)")
        _parsed.clear()
        _parsed[digest] = sc.parse(data)
    return _parsed[digest]


def _replay(spec: dict[str, Any], variant: list[dict]) -> tuple[dict[str, Any], int]:
    """The replay's figures and how many of its replay processes were lost on the way. Eager (tests, a
    one-process setup) or in a prefork pool's process: here. On a worker of threads (the what-if's
    pool): in a spawned process kept between replays, so that a worker's threads replay side by side
    (no GIL shared) and the worker's control threads stay free."""
    import multiprocessing

    from config.celery import app

    # A prefork pool's process is daemonic: it may start no process (multiprocessing refuses), and it is
    # a process of its own already, apart from the worker's control threads.
    if app.conf.task_always_eager or multiprocessing.current_process().daemon:
        scenario = advise.apply(_scenario(spec["digest"]), variant)
        return advise.evaluate(scenario, window_s=spec["window_s"]), 0
    from concurrent.futures.process import BrokenProcessPool

    data = cache.get(_scenario_key(spec["digest"]))
    if data is None:
        raise LookupError("the run's window is no longer in the cache (it expired)")
    for attempt in (1, 2):
        try:
            point = (
                _process_pool()
                .submit(advise.replay_one, spec["digest"], data, variant, spec["window_s"])
                .result()
            )
            return point, attempt - 1
        except BrokenProcessPool:
            _reset_pool()  # a replay process died (memory, a kill): a fresh one, once
            if attempt == 2:
                raise
            log.warning("advice replay process lost: replaying again in a fresh one")
    raise AssertionError("unreachable")


_pool = None


def _process_pool():
    global _pool
    if _pool is None:
        import atexit
        import multiprocessing
        import os
        from concurrent.futures import ProcessPoolExecutor

        size = int(os.environ.get("ADVICE_PROCESSES", "2"))  # the what-if worker's threads (Procfile.dev)
        _pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_pool.shutdown)
    return _pool


def _reset_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
    _pool = None


def run_part(run_id: str, index: int) -> str:
    """One replay (the task's body). Idempotent: a part with an answer is not replayed (the run is
    advanced again: its worker may have been lost between the two); a part found `replaying` (its
    worker was lost, the broker gave the task again) is replayed again, to the same figures, and counted
    as a retry."""
    import os
    import socket

    spec = cache.get(_run_key(run_id))
    if spec is None or index >= len(spec["variants"]):
        return "unknown run"
    key = _part_key(run_id, index)
    part = cache.get(key) or {"state": QUEUED}
    if part["state"] in (DONE, FAILED, CANCELLED):
        if part["state"] != CANCELLED:
            advance(run_id, index)
        return part["state"]
    if spec.get("cancelled"):
        cache.set(key, {"state": CANCELLED}, TTL_S)
        return CANCELLED
    tries = part.get("tries", 0) + 1
    if part["state"] == REPLAYING:
        log.warning(
            "advice replay %s/%s retried (try %s): its try on %s was lost",
            run_id,
            index,
            tries,
            part.get("on"),
        )
    t0 = time.monotonic()
    # Where it runs (host and pid): what a retry names, and what the live test stops.
    on = f"{socket.gethostname()}:{os.getpid()}"
    cache.set(key, {"state": REPLAYING, "tries": tries, "on": on}, TTL_S)
    variant = spec["variants"][index]
    replay_key = f"{PREFIX}replay:{advise.cache_key(spec['digest'], variant)}"
    try:
        point = cache.get(replay_key)
        reused = point is not None
        if point is None:
            point, lost = _replay(spec, variant)
            tries += lost
            cache.set(replay_key, point, TTL_S)
        part = {"state": DONE, "point": point, "reused": reused}
    except Exception as e:  # said on the page and in the API, the rest of the run goes on
        log.exception("advice replay %s/%s failed", run_id, index)
        part = {"state": FAILED, "error": f"the replay failed ({type(e).__name__}: {e})"}
    part["tries"], part["on"] = tries, on
    part["seconds"] = round(time.monotonic() - t0, 3)
    cache.set(key, part, TTL_S)
    advance(run_id, index)
    return part["state"]


def _parts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    keys = [_part_key(spec["id"], i) for i in range(len(spec["variants"]))]
    got = cache.get_many(keys)
    return [got.get(k) or {"state": QUEUED} for k in keys]


def _own_lock(key: str, index: int) -> bool:
    """Take a stage's lock for part `index`, or find it already its own: the part's task that took it
    and was lost before it finished the stage (stage 2 sent, the answer written) is delivered again and
    finishes it; any other part leaves it."""
    return cache.add(key, index, TTL_S) or cache.get(key) == index


def advance(run_id: str, index: int) -> None:
    """When a stage's parts are all done: send stage 2, or write the answer. Exactly once each (a lock,
    held by the part `index` that ended the stage)."""
    spec = cache.get(_run_key(run_id))
    if spec is None or spec.get("cancelled"):
        return
    stage2_lock = f"{PREFIX}run:{run_id}:stage2"
    if "stage2" in spec and not spec.get("stage2_sent"):
        # Its sender was lost between writing stage 2 and sending all of it: its task, delivered again,
        # sends it (a part sent twice is replayed once: run_part).
        if not _own_lock(stage2_lock, index):
            return
        _send_stage2(run_id, spec)
        if spec["stage2"]:
            return
    parts = _parts(spec)
    if any(p["state"] != DONE for p in parts):
        return  # some still to come, or a failed one: no advice
    if "stage2" not in spec:
        if not _own_lock(stage2_lock, index):
            return
        today = parts[0]["point"]
        singles = [(spec["variants"][i][0], parts[i]["point"]) for i in range(1, spec["stage1"])]
        stage2 = advise.combined(today, singles)
        spec["stage2"] = len(stage2)
        spec["variants"] = spec["variants"] + stage2
        cache.set(_run_key(run_id), spec, TTL_S)
        _send_stage2(run_id, spec)
        if stage2:
            return
        parts = _parts(spec)
    if "advice" in spec or not _own_lock(f"{PREFIX}run:{run_id}:answer", index):
        return
    scenario = _scenario(spec["digest"])
    points = [p["point"] for p in parts]
    tried = list(zip(spec["variants"][1:], points[1:], strict=True))
    spec = cache.get(_run_key(run_id)) or spec
    spec["advice"] = advise.answer(scenario, points[0], tried, replays=len(points), window_s=spec["window_s"])
    spec["finished"] = time.time()
    cache.set(_run_key(run_id), spec, TTL_S)


def _send_stage2(run_id: str, spec: dict[str, Any]) -> None:
    for part_index in range(spec["stage1"], len(spec["variants"])):
        _enqueue(run_id, part_index)
    latest = cache.get(_run_key(run_id)) or spec  # a cancel meanwhile stays
    latest["stage2_sent"] = True
    cache.set(_run_key(run_id), latest, TTL_S)


def cancel(run_id: str) -> bool:
    """Stop the rest: parts not yet started end `cancelled`; one replaying finishes its replay."""
    spec = cache.get(_run_key(run_id))
    if spec is None:
        return False
    spec["cancelled"] = True
    cache.set(_run_key(run_id), spec, TTL_S)
    return True


def status(run_id: str) -> dict[str, Any] | None:
    """What the page, the API and the CLI show of a run (JSON-ready)."""
    spec = cache.get(_run_key(run_id))
    if spec is None:
        return None
    parts = _parts(spec)
    done = sum(1 for p in parts if p["state"] == DONE)
    failed = [p["error"] for p in parts if p["state"] == FAILED]
    if spec.get("cancelled"):
        state = CANCELLED
    elif failed:
        state = FAILED
    elif "advice" in spec:
        state = DONE
    else:
        state = REPLAYING
    timed = [p["seconds"] for p in parts if p["state"] == DONE and not p.get("reused")]
    # A replay made again because its worker (or its replay process) was lost: counted once in
    # replays_done, said here.
    retried = [i for i, p in enumerate(parts) if p.get("tries", 1) > 1]
    stage2_known = "stage2" in spec
    return {
        "id": run_id,
        "state": state,
        "finished": state != REPLAYING,
        "weeks": spec["weeks"],
        "window": {
            "start": spec["window_start"],
            "end": spec["now"],
            "length_s": spec["window_s"],
            "jobs": spec["jobs"],
            "left_out": spec["left_out"],
        },
        "stage": 2 if stage2_known and spec["stage2"] else 1,
        "replays_done": done,
        # Stage 2's size is known once stage 1 is in; until then the total is stage 1's.
        "replays_total": len(spec["variants"]),
        "replays_final": stage2_known,
        "replay_seconds_mean": round(sum(timed) / len(timed), 2) if timed else None,
        "seconds": round((spec.get("finished") or time.time()) - spec["created"], 1),
        "percent": int(100 * done / len(spec["variants"]))
        if stage2_known
        else int(50 * done / spec["stage1"]),
        "replays_retried": len(retried),
        "retries": [
            f"replay {i + 1} was made {parts[i]['tries']} times: a worker was lost mid-replay"
            for i in retried
        ],
        "errors": list(dict.fromkeys(failed)),
        "advice": spec.get("advice"),
    }


def plan_document(advice: dict[str, Any], index: int, live_document: dict[str, Any]) -> dict[str, Any]:
    """The layout document of a frontier point: today's document (quotas.layout.export_data) with the
    point's changes applied, share by share and setting by setting (everything else as it is)."""
    point = advice["frontier"][index]
    doc = {k: (list(v) if isinstance(v, list) else v) for k, v in live_document.items()}
    shares = {s["name"]: dict(s) for s in doc.get("shares", [])}
    groups = {g["name"]: dict(g) for g in doc.get("groups", [])}
    settings = dict(doc.get("settings") or {})
    for change in point["changes"]:
        if change["target"] == advise.SETTINGS_TARGET:
            settings[change["field"]] = change["to"]
            continue
        if change["target"] in groups:  # a group's weight (names of groups and shares never collide)
            groups[change["target"]][change["field"]] = change["to"]
            continue
        share = shares.get(change["target"])
        if share is None:
            raise LookupError(f"share {change['target']} is no longer in the layout")
        share[change["field"]] = change["to"]
        if change["field"] == "strategy" and change["to"] != "LEND_AND_BORROW":
            share["borrow_limit"] = -1  # only a LEND_AND_BORROW share has a borrow limit
    doc["shares"] = [shares[s["name"]] for s in doc.get("shares", [])]
    if groups:
        doc["groups"] = [groups[g["name"]] for g in doc["groups"]]
    if settings:
        doc["settings"] = settings
    return doc


def make_plan(*, run_id: str, index: int, actor):
    """A layout plan of a frontier point (quotas.layout.plan: checked whole, its what-if started)."""
    from quotas import layout

    st = status(run_id)
    if st is None or st["advice"] is None:
        raise LookupError("no finished advice run with this id (it may have expired)")
    if not 0 <= index < len(st["advice"]["frontier"]):
        raise IndexError(f"point must be 0 to {len(st['advice']['frontier']) - 1}")
    document = plan_document(st["advice"], index, layout.export_data(user=actor))
    return layout.plan(source=document, actor=actor)
