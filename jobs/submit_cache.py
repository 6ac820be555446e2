"""What a submit checks that seldom changes, kept in the cache: the node shapes (which requests could
ever fit) and the teams a user belongs to. A submit reads both with one `get_many` instead of two
queries. (The share itself is read from the database: whether it is enabled must be exact, and a
cached row would outlive a database that is emptied and refilled under the same names.)

Invalidation: any change to a node's GPU type, to the set of GPU rows or to a membership deletes the
keys at once and again after its transaction commits (so a submit that re-filled the cache from the old
rows in between cannot leave it stale). The keys also expire after CACHE_TTL_S, a bound on staleness if
a write ever bypasses the signals (a queryset `update()` of a node's GPU type). Receivers are connected in
JobsConfig.ready().
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.cache import cache
from django.db import transaction

log = logging.getLogger(__name__)

PREFIX = "gpuquota:submit:"  # the tests give each test a prefix of its own
CACHE_TTL_S = 300


def shapes_key() -> str:
    return f"{PREFIX}shapes"


def teams_key(user_id: int) -> str:
    return f"{PREFIX}teams:{user_id}"


def _get_many(keys: list[str]) -> dict[str, Any]:
    try:
        return cache.get_many(keys)
    except Exception:  # the cache is a shortcut: without it, ask the database
        log.warning("submit cache unavailable", exc_info=True)
        return {}


def _set_many(values: dict[str, Any]) -> None:
    try:
        cache.set_many(values, timeout=CACHE_TTL_S)
    except Exception:
        log.warning("submit cache unavailable", exc_info=True)


def _delete(keys: list[str]) -> None:
    try:
        cache.delete_many(keys)
    except Exception:
        log.warning("could not invalidate the submit cache (%s); it expires in %s s", keys, CACHE_TTL_S)


def lookup(user_id: int | None) -> tuple[dict[str, dict[int, int]], list[int] | None]:
    """(node shapes, the user's team ids) from the cache, loading and storing what is missing.
    Team ids are None for an anonymous user."""
    from jobs.services import load_node_shapes, load_team_ids

    keys = [shapes_key()] + ([teams_key(user_id)] if user_id is not None else [])
    got = _get_many(keys)
    missing: dict[str, Any] = {}
    shapes = got.get(keys[0])
    if shapes is None:
        shapes = missing[keys[0]] = load_node_shapes()
    teams = None
    if user_id is not None:
        teams = got.get(teams_key(user_id))
        if teams is None:
            teams = missing[teams_key(user_id)] = load_team_ids(user_id)
    if missing:
        _set_many(missing)
    return shapes, teams


def forget(keys: list[str]) -> None:
    """Drop cached values now and once more after the current transaction commits."""
    _delete(keys)
    transaction.on_commit(lambda: _delete(keys))


# --- receivers (connected in JobsConfig.ready) -------------------------------------------------------


def node_saved(sender, instance, created=False, update_fields=None, **kwargs) -> None:
    if created or update_fields is None or "gpu_type" in update_fields:
        forget([shapes_key()])


def gpu_saved(sender, instance, created=False, update_fields=None, **kwargs) -> None:
    if created or update_fields is None or "node" in update_fields or "node_id" in update_fields:
        forget([shapes_key()])


def shapes_deleted(sender, instance, **kwargs) -> None:
    forget([shapes_key()])


def membership_changed(sender, instance, **kwargs) -> None:
    forget([teams_key(instance.user_id)])


def connect() -> None:
    from django.db.models.signals import post_delete, post_save

    from gpunodes.models import Gpu, Node
    from quotas.models import Membership

    post_save.connect(node_saved, sender=Node, dispatch_uid="submit_cache.node_saved")
    post_delete.connect(shapes_deleted, sender=Node, dispatch_uid="submit_cache.node_deleted")
    post_save.connect(gpu_saved, sender=Gpu, dispatch_uid="submit_cache.gpu_saved")
    post_delete.connect(shapes_deleted, sender=Gpu, dispatch_uid="submit_cache.gpu_deleted")
    post_save.connect(membership_changed, sender=Membership, dispatch_uid="submit_cache.membership_saved")
    post_delete.connect(membership_changed, sender=Membership, dispatch_uid="submit_cache.membership_deleted")
