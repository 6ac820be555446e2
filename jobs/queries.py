"""Reads the submit path needs before anything is cached (jobs.submit_cache loads them, the services
use them): node shapes, a user's teams, a share by name."""

from __future__ import annotations

from django.db import connections, router
from django.db.models import Count

from gpunodes.models import Node
from quotas.models import Membership, Share


def load_node_shapes() -> dict[str, dict[int, int]]:
    """Known node shapes from the database: {gpu_type: {gpus per node: number of nodes}}, over every
    registered node (READY or not): a request none of them could ever hold is refused at submit time."""
    shapes: dict[str, dict[int, int]] = {}
    qs = Node.objects.annotate(n=Count("gpus")).filter(n__gt=0)
    for t, n in qs.values_list("gpu_type", "n"):
        shapes.setdefault(t, {})
        shapes[t][n] = shapes[t].get(n, 0) + 1
    return shapes


def load_team_ids(user_id: int) -> list[int]:
    return list(Membership.objects.filter(user_id=user_id).values_list("team_id", flat=True))


def share_by_name(name: str) -> Share | None:
    """The share named so, with its team, by one hand-written join: building the same query through
    the ORM costs more CPU than the rest of a submit's database work (the submit path asks this for
    every job)."""
    from quotas.models import Team

    conn = connections[router.db_for_read(Share)]
    qn = conn.ops.quote_name
    share_fields, team_fields = list(Share._meta.concrete_fields), list(Team._meta.concrete_fields)
    sql = (
        f"SELECT {', '.join('s.' + qn(f.column) for f in share_fields)}, "
        f"{', '.join('t.' + qn(f.column) for f in team_fields)} "
        f"FROM {qn(Share._meta.db_table)} s JOIN {qn(Team._meta.db_table)} t "
        f"ON t.{qn(Team._meta.pk.column)} = s.{qn(Share._meta.get_field('team').column)} "
        f"WHERE s.{qn(Share._meta.get_field('name').column)} = %s"
    )
    with conn.cursor() as cursor:
        cursor.execute(sql, [name])
        row = cursor.fetchone()
    if row is None:
        return None
    share = Share.from_db(conn.alias, None, _from_db(share_fields, row[: len(share_fields)], conn))
    share.team = Team.from_db(conn.alias, None, _from_db(team_fields, row[len(share_fields) :], conn))
    return share


def _from_db(fields, values, conn) -> list:
    """Column values as the ORM would hand them to a model (its database converters applied)."""
    out = []
    for field, value in zip(fields, values, strict=True):
        col = field.get_col(field.model._meta.db_table)
        for convert in [*conn.ops.get_db_converters(col), *field.get_db_converters(conn)]:
            value = convert(value, col, conn)
        out.append(value)
    return out
