"""What a submit checks that seldom changes, kept in the cache: the node shapes (which requests could
ever fit) and the teams a user belongs to. A submit reads both with one `get_many` instead of two
queries.

The quick submit path (jobs.api.fast_submit) also keeps each share's row, its team's and its capacities
here (`share_key`), and reads them in the same round trip as the throttle. A cached share may be stale
(whether it is enabled must be exact, and a row would outlive a database emptied and refilled under the
same names): it is never trusted on its own. The insert checks the share's facts in the same statement
(jobs.services.insert_job_with_event) and writes nothing when they changed; the path then forgets the
key and the full stack decides from the database. Share, team and capacity changes forget the key too,
so a stale one is seldom read.

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


def share_key(name: str) -> str:
    return f"{PREFIX}share:{name}"


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
    from jobs.queries import load_node_shapes, load_team_ids

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


def loads(raw: bytes) -> Any:
    """A value read from Redis by the quick path's script, as the cache would return it."""
    from django.core.cache import caches

    return caches["default"]._cache._serializer.loads(raw)


def load_share(name: str):
    """(share with its team, {gpu type: capacity}) from the database, stored for the quick path; None
    when no share has that name."""
    from jobs.queries import share_by_name

    share = share_by_name(name)
    if share is None:
        return None
    capacities = dict(share.capacities.values_list("gpu_type", "max_gpus"))
    _set_many({share_key(name): (_values(share), _values(share.team), capacities)})
    return share, capacities


def cached_share(value):
    """(share with its team, capacities) from a value load_share stored."""
    from django.db import router

    from quotas.models import Share, Team

    share_values, team_values, capacities = value
    alias = router.db_for_read(Share)
    share = Share.from_db(alias, None, list(share_values))
    share.team = Team.from_db(alias, None, list(team_values))
    return share, capacities


def _values(obj) -> tuple:
    return tuple(getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields)


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


def share_changed(sender, instance, **kwargs) -> None:
    forget([share_key(instance.name)])


def team_changed(sender, instance, **kwargs) -> None:
    from quotas.models import Share

    forget(
        [share_key(name) for name in Share.objects.filter(team_id=instance.pk).values_list("name", flat=True)]
    )


def capacity_changed(sender, instance, **kwargs) -> None:
    from quotas.models import Share

    name = Share.objects.filter(pk=instance.share_id).values_list("name", flat=True).first()
    if name is not None:
        forget([share_key(name)])


def connect() -> None:
    from django.db.models.signals import post_delete, post_save

    from gpunodes.models import Gpu, Node
    from quotas.models import Membership, Share, ShareCapacity, Team

    post_save.connect(node_saved, sender=Node, dispatch_uid="submit_cache.node_saved")
    post_delete.connect(shapes_deleted, sender=Node, dispatch_uid="submit_cache.node_deleted")
    post_save.connect(gpu_saved, sender=Gpu, dispatch_uid="submit_cache.gpu_saved")
    post_delete.connect(shapes_deleted, sender=Gpu, dispatch_uid="submit_cache.gpu_deleted")
    post_save.connect(membership_changed, sender=Membership, dispatch_uid="submit_cache.membership_saved")
    post_delete.connect(membership_changed, sender=Membership, dispatch_uid="submit_cache.membership_deleted")
    # Only for freshness: the quick path's insert checks a cached share itself.
    for model, receiver in ((Share, share_changed), (Team, team_changed), (ShareCapacity, capacity_changed)):
        name = model.__name__.lower()
        post_save.connect(receiver, sender=model, dispatch_uid=f"submit_cache.{name}_saved")
        post_delete.connect(receiver, sender=model, dispatch_uid=f"submit_cache.{name}_deleted")
