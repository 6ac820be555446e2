"""The organisation tree as production feeds it to the engine (SEMANTICS.md "Groups: the organisation
tree"): the groups, the cluster's fair-sharing settings and the stored fair-share history, read for each
pass (quotas.scheduler.load_snapshot), and the history advanced after each pass with the engine's
accumulator (quotas.engine.tree.FairShareHistory), so the next pass, the forecast and the pages read
the same values."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

from quotas.engine.tree import FairShareHistory as Accumulator
from quotas.engine.tree import GroupSpec, taken_from_outside, validate_tree
from quotas.models import FairShareHistory, FairSharing, Group

log = logging.getLogger(__name__)
HISTORY_PK = 1


def groups() -> tuple[GroupSpec, ...]:
    return tuple(
        GroupSpec(name=name, parent=parent, weight=weight, borrow_limit=borrow, lend_limit=lend)
        for name, parent, weight, borrow, lend in Group.objects.order_by("name").values_list(
            "name", "parent__name", "weight", "borrow_limit", "lend_limit"
        )
    )


def stored_history(half_life_s: float) -> Accumulator:
    """The history as the last pass left it (empty without a half-life, or where none was kept)."""
    data = FairShareHistory.objects.filter(pk=HISTORY_PK).values_list("data", flat=True).first()
    acc = Accumulator.from_dict(data) if data and half_life_s > 0 else Accumulator(half_life_s=half_life_s)
    acc.half_life_s = half_life_s  # the setting may have changed since
    return acc


def tree_inputs() -> dict[str, Any]:
    """The Snapshot's tree fields (groups, fair_share_half_life_s, fair_reclaim, history): two small
    queries (the groups; the settings with the stored history). A flat layout gives the engine's
    defaults, so it decides exactly as before."""
    from django.db.models import OuterRef, Subquery

    row = (
        FairSharing.objects.filter(pk=1)
        .annotate(stored=Subquery(FairShareHistory.objects.filter(pk=OuterRef("pk")).values("data")[:1]))
        .values_list("fair_share_half_life_s", "fair_reclaim", "stored")
        .first()
    )
    half_life, fair_reclaim, stored = row or (0, False, None)
    history: dict = {}
    if half_life > 0 and stored:
        if isinstance(stored, str):  # a JSON subquery comes back as text on some backends
            import json

            stored = json.loads(stored)
        history = dict(Accumulator.from_dict(stored).values)
    return {
        "groups": groups(),
        "fair_share_half_life_s": float(half_life),
        "fair_reclaim": fair_reclaim,
        "history": history,
    }


def checked(shares: tuple, inputs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """The shares and tree inputs as the pass may use them. The layout never writes an invalid tree,
    but the database can be edited around it (the Django admin: a share named like a group): then the
    pass goes on flat (no groups, every share under the cluster), as the engine treats a tree it cannot
    read, and says why in the log, rather than failing every pass."""
    problems = (
        validate_tree(inputs["groups"], shares) if inputs["groups"] or any(s.group for s in shares) else []
    )
    if not problems:
        return shares, inputs
    log.error(
        "the organisation tree in the database is not valid (%s): scheduling as if there were no groups "
        "until the layout is fixed",
        "; ".join(f"{path}: {message}" for path, message in problems[:5]),
    )
    flat = tuple(dataclasses.replace(s, group=None) for s in shares)
    return flat, {**inputs, "groups": ()}


def advance(snapshot, now: datetime) -> dict[tuple[str, str], float]:
    """After a pass: account what each share and group took from outside since the previous pass (as
    the pass's snapshot saw it) into the stored history; one row written. Nothing without a half-life
    (quotas.layout drops the stored history when it sets the half-life to 0, so switching it on again
    starts from nothing)."""
    half_life = snapshot.fair_share_half_life_s
    if half_life <= 0:  # the layout drops the stored history when it sets the half-life to 0
        return {}
    acc = stored_history(half_life)
    values = acc.advance(now.timestamp(), taken_from_outside(snapshot))
    FairShareHistory.objects.update_or_create(pk=HISTORY_PK, defaults={"data": acc.to_dict()})
    return values
