"""The audit log of admin changes to shares, teams, nodes and GPUs (and of the GPUs' health as their
agents report it): who, when, what changed (each field, before -> after), with the whole records before
and after kept for the API.

Services record through `record_audit` inside their own transaction, so a change that rolls back leaves
no entry, and an entry never exists without its change. Whichever door a change came through (API,
dashboard, Django admin), the services or the admin hooks pass the acting user along; a change made by
the system itself (a node drained by the pass, a script) has no actor. A change of the layout (shares,
through quotas.layout) is one entry per applied version, holding its whole diff.
"""

from __future__ import annotations

from typing import Any

from quotas.models import AuditEntry, Share, Team

MAX_REPR = 200


def object_type(obj: Any) -> str:
    from gpunodes.models import Gpu, Node

    if isinstance(obj, Share):
        return "share"
    if isinstance(obj, Team):
        return "team"
    if isinstance(obj, Node):
        return "node"
    if isinstance(obj, Gpu):
        return "gpu"
    return type(obj).__name__.lower()


def snapshot(obj: Any) -> dict[str, Any]:
    """The audited fields of a share, team, node or GPU as they are in the database now (JSON-able).
    Read from the database, not from the instance: a caller may have changed the instance already."""
    from gpunodes.models import Gpu, Node

    if obj is None or obj.pk is None:
        return {}
    if isinstance(obj, Share):
        row = Share.objects.filter(pk=obj.pk).select_related("team").prefetch_related("capacities").first()
        if row is None:
            return {}
        return {
            "name": row.name,
            "team": row.team.slug,
            "description": row.description,
            "strategy": row.strategy,
            "borrow_limit": row.borrow_limit,
            "in_share_preemption": row.in_share_preemption,
            "min_runtime_s": row.min_runtime_s,
            "state": row.state,
            "capacity": dict(sorted(row.capacity_map().items())),
        }
    if isinstance(obj, Team):
        row = Team.objects.filter(pk=obj.pk).first()
        if row is None:
            return {}
        members = row.memberships.select_related("user").order_by("user__username")
        return {
            "name": row.name,
            "slug": row.slug,
            "members": [{"username": m.user.get_username(), "role": m.role} for m in members],
        }
    if isinstance(obj, Node):
        row = Node.objects.filter(pk=obj.pk).first()
        if row is None:
            return {}
        return {
            "name": row.name,
            "gpu_type": row.gpu_type,
            "state": row.state,
            "hostname": row.hostname,
            "labels": row.labels,
        }
    if isinstance(obj, Gpu):
        row = Gpu.objects.filter(pk=obj.pk).select_related("node").first()
        if row is None:
            return {}
        return {
            "name": str(row),
            "uuid": row.uuid,
            "health": row.health,
            "reason": row.health_reason,
            "detail": row.health_detail,
        }
    raise TypeError(f"{type(obj).__name__} is not audited")


def _flat(record: dict[str, Any]) -> dict[str, Any]:
    """A snapshot as {field: value}: a mapping field per key ("capacity.a10g"), members per user."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        elif isinstance(value, list) and all(isinstance(v, dict) and "username" in v for v in value):
            out.update({f"{key}.{v['username']}": v.get("role") for v in value})
        else:
            out[key] = value
    return out


def field_changes(label: str, before: dict[str, Any], after: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed from `before` to `after`, field by field: [{"object", "field", "before", "after"}]."""
    b, a = _flat(before), _flat(after)
    return [
        {"object": label, "field": key, "before": b.get(key), "after": a.get(key)}
        for key in dict.fromkeys([*b, *a])
        if b.get(key) != a.get(key)
    ]


def record_audit(
    actor: Any, action: str, obj: Any, before: dict | None = None, after: dict | None = None
) -> AuditEntry | None:
    """Write one audit entry. `actor` is a user (or None for the system); `before`/`after` are
    snapshots (see `snapshot`). An update that changed nothing is not recorded."""
    before, after = dict(before or {}), dict(after or {})
    if action == "update" and before == after:
        return None
    user = actor if getattr(actor, "is_authenticated", False) else None
    name = str(after.get("name") or before.get("name") or obj)[:MAX_REPR]
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user is not None else "",
        action=action[:32],
        object_type=object_type(obj),
        object_id=str(obj.pk if obj.pk is not None else before.get("name", "")),
        object_repr=name,
        before=before,
        after=after,
        changes=field_changes(f"{object_type(obj)} {name}", before, after),
    )
