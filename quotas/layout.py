"""Changing the quota layout: plan, then apply. The one path by which shares change.

A plan (`plan`) reads a whole layout (quotas.layoutdoc), checks it against the database (users, the
shares there now and their jobs), and keeps: the layout it is to become, the hash of the layout it
started from, the diff share by share and field by field, what it does now (running jobs that become
borrowed, queued jobs that could never run any more, over-commit per GPU type), its temporary changes,
and a what-if run that replays last week with it (quotas.whatif). `apply` applies exactly that, in
one transaction under the layout lock, or refuses when the layout changed since the plan; it keeps the
result as a numbered version (`LayoutVersion`, the whole layout and the diff) with one audit entry
holding the whole diff. A change with `until:` is set back at that time by `revert_due` (a beat task),
once, each field only if it still holds the value the change gave it. `plan_rollback` plans the
layout of an earlier version like any other layout. The one-share form and API (quotas.services) are
plans of one share's change, applied at once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from quotas import layoutdoc, triggers, whatif
from quotas.engine import policy
from quotas.layoutdoc import DISABLED, ENABLED, Layout, ShareSpec, TeamSpec
from quotas.models import (
    AuditEntry,
    FairShareHistory,
    FairSharing,
    Group,
    LayoutPlan,
    LayoutVersion,
    Membership,
    PlanState,
    Share,
    ShareCapacity,
    Team,
    TemporaryChange,
    TemporaryState,
    VersionKind,
)

log = logging.getLogger(__name__)

LOCK_KEY = 0x6770_716C  # "gpql": the advisory lock id of layout changes
NEVER_RUNNABLE_LISTED = 20  # jobs named per group of queued jobs a plan leaves never runnable
BORROWED_LISTED = 50


class LayoutConflict(Exception):
    """The plan cannot be applied as it is (HTTP 409): the layout changed since, it was applied, ..."""


def _conflict(message: str) -> Exception:
    # jobs.services.Conflict is what the API and pages answer with 409.
    from jobs.services import Conflict

    return Conflict(message)


def lock() -> None:
    """Serialise layout changes (plans applied, reverts, team edits): a PostgreSQL advisory lock for
    the transaction; on SQLite the IMMEDIATE transaction already holds the database's write lock."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])


# --- the live layout ---------------------------------------------------------------------------------


@dataclass
class Live:
    """The layout as the database has it now, with the row ids apply needs."""

    layout: Layout
    share_ids: dict[str, int]
    team_ids: dict[str, int]
    group_ids: dict[str, int] = field(default_factory=dict)

    @property
    def share_names(self) -> dict[int, str]:
        return {pk: name for name, pk in self.share_ids.items()}


def load_live() -> Live:
    """The live layout, in a handful of queries whatever its size (six)."""
    teams = list(Team.objects.values_list("pk", "slug", "name"))
    slugs = {pk: slug for pk, slug, _ in teams}
    from directory import layoutdb  # the teams' directory groups (issue 40)

    # The memberships the directory made follow its groups, not the document: left out of `members`.
    directory_made = layoutdb.directory_made()
    members: dict[int, list[tuple[str, str]]] = {}
    for team_id, username, role in Membership.objects.values_list("team_id", "user__username", "role"):
        if (team_id, username) not in directory_made:
            members.setdefault(team_id, []).append((username, role))
    team_groups = layoutdb.load(slugs)
    capacity: dict[int, dict[str, int]] = {}
    for share_id, gpu_type, n in ShareCapacity.objects.values_list("share_id", "gpu_type", "max_gpus"):
        if n:
            capacity.setdefault(share_id, {})[gpu_type] = n
    layout = Layout()
    for pk, slug, name in sorted(teams, key=lambda t: t[1]):
        layout.teams[slug] = TeamSpec(
            slug=slug,
            name=name,
            members=tuple(sorted(members.get(pk, ()))),
            directory=team_groups.get(slug, ()),
        )
    share_ids = {}
    columns = (*layoutdoc.VALUE_FIELDS, "group__name", "weight")
    for row in Share.objects.order_by("name").values_list("pk", "name", "team_id", *columns):
        pk, name, team_id, *values = row
        fields = dict(zip(layoutdoc.VALUE_FIELDS, values, strict=False))
        fields["capacity"] = dict(sorted(capacity.get(pk, {}).items()))
        group, weight = values[-2:]
        layout.shares[name] = ShareSpec(
            name=name,
            team=slugs[team_id],
            values={
                **{f: fields[f] for f in layoutdoc.FIELDS_BY_NAME},
                "group": group,
                "weight": layoutdoc.weight_value(weight),
            },
        )
        share_ids[name] = pk
    group_ids = {}
    for pk, name, parent, weight, borrow, lend in Group.objects.order_by("name").values_list(
        "pk", "name", "parent__name", "weight", "borrow_limit", "lend_limit"
    ):
        layout.groups[name] = layoutdoc.GroupSpec(
            name=name,
            parent=parent,
            weight=layoutdoc.weight_value(weight),
            borrow_limit=borrow,
            lend_limit=lend,
        )
        group_ids[name] = pk
    fair = FairSharing.current()
    layout.settings = {
        "fair_share_half_life_s": fair.fair_share_half_life_s,
        "fair_reclaim": fair.fair_reclaim,
    }
    return Live(
        layout=layout,
        share_ids=share_ids,
        team_ids={slug: pk for pk, slug, _ in teams},
        group_ids=group_ids,
    )


def current_version() -> int | None:
    return LayoutVersion.objects.aggregate(n=Max("number"))["n"]


def pending_changes(share_names: Sequence[str] | None = None):
    qs = TemporaryChange.objects.filter(state=TemporaryState.PENDING).select_related("share", "version")
    if share_names is not None:
        qs = qs.filter(share__name__in=list(share_names))
    return list(qs.order_by("until", "id"))


def temporary_words(change: TemporaryChange) -> str:
    """ "until 2026-12-04 18:00 UTC (version 7): capacity.a100 goes back to 32"."""
    backs = ", ".join(
        f"{path} goes back to {layoutdoc.value_words(b)}" for path, (b, _a) in change.fields.items()
    )
    when = timezone.localtime(change.until).strftime("%Y-%m-%d %H:%M %Z")
    return f"until {when} (version {change.version.number}): {backs}"


# --- export ------------------------------------------------------------------------------------------


def readable_teams(user) -> list[str] | None:
    """The teams whose part of the layout `user` may read: None for all (an admin), else the teams it
    manages. Raises PermissionDenied for anyone else."""
    from quotas.choices import Role

    if user.is_superuser:
        return None
    managed = list(
        Membership.objects.filter(user=user, role=Role.MANAGER).values_list("team__slug", flat=True)
    )
    if not managed:
        raise PermissionDenied(
            "Only admins and team managers read the layout (a manager its own team's part)."
        )
    return sorted(managed)


def export_data(*, user) -> dict[str, Any]:
    """The layout document (an admin's: whole; a team manager's: its teams' part)."""
    part = readable_teams(user)
    return load_live().layout.to_data(team_part=part)


def export_yaml(*, user) -> str:
    """The layout as YAML, each share's pending temporary changes as comments under it."""
    data = export_data(user=user)
    notes: dict[str, list[str]] = {}
    for change in pending_changes([s["name"] for s in data["shares"]]):
        notes.setdefault(change.share.name, []).append("temporary: " + temporary_words(change))
    version = current_version()
    header = list(layoutdoc.HEADER)
    stamp = timezone.localtime().strftime("%Y-%m-%d %H:%M %Z")
    header.insert(0, f"Exported {stamp}" + (f", layout version {version}." if version else "."))
    if layoutdoc.TEAM_PART_KEY in data:
        header = [
            f"Exported {stamp}: the part of the layout of team(s) {', '.join(data[layoutdoc.TEAM_PART_KEY])}, "
            "to read (an admin plans changes from the whole layout)."
        ]
    return layoutdoc.render_yaml(data, notes=notes, header=header)


# --- plan --------------------------------------------------------------------------------------------


def _invalid(errors: layoutdoc.Errors) -> ValidationError:
    return ValidationError({path: messages for path, messages in errors.items()})


def check(source: Any, *, now: datetime, live: Live | None = None) -> tuple[Layout, Live]:
    """The layout `source` describes, checked whole (the document, then against the database). Raises
    ValidationError({path: [message]}) with every problem found."""
    data, errors = layoutdoc.read(source)
    if errors:
        raise _invalid(errors)
    target, errors = layoutdoc.parse(data, now=now)
    live = live or load_live()
    _check_against_database(errors, live, target)
    if errors:
        raise _invalid(errors)
    return target, live


def _check_against_database(errors: layoutdoc.Errors, live: Live, target: Layout) -> None:
    from jobs.choices import JOB_OPEN_STATES
    from jobs.models import Job

    current = live.layout
    wanted = {user for team in target.teams.values() for user, _ in team.members}
    known = set(get_user_model().objects.filter(username__in=list(wanted)).values_list("username", flat=True))
    for team in target.teams.values():
        for user, _ in team.members:
            if user not in known:
                path = f"teams[{team.index}].members[{team.positions.get(user, '?')}].user"
                layoutdoc.add_error(errors, path, f'no user named "{user}"')
    for spec in target.shares.values():
        path = f"shares[{spec.index}]"
        if spec.previous_name:
            if spec.previous_name in current.shares and spec.name in current.shares:
                layoutdoc.add_error(
                    errors,
                    f"{path}.name",
                    f'a share named "{spec.name}" exists now: "{spec.previous_name}" cannot be renamed onto it '
                    "(rename or remove that share in a plan of its own first)",
                )
            elif spec.previous_name not in current.shares:  # whether or not `name` exists: never ignored
                layoutdoc.add_error(
                    errors,
                    f"{path}.previous_name",
                    f'no share is named "{spec.previous_name}" now: nothing to rename',
                )
    matched = layoutdoc.matches(current, target)
    taken = {m for m in matched.values() if m}
    removed = [name for name in current.shares if name not in taken and name not in target.unread]
    if removed:
        ids = [live.share_ids[n] for n in removed]
        counts = {
            row["share_id"]: row
            for row in Job.objects.filter(share_id__in=ids)
            .values("share_id")
            .annotate(total=Count("id"), open=Count("id", filter=Q(state__in=list(JOB_OPEN_STATES))))
        }
        for name in removed:
            row = counts.get(live.share_ids[name], {"total": 0, "open": 0})
            state = current.shares[name].values["state"]
            if state != DISABLED or row["total"]:
                why = []
                if state != DISABLED:
                    why.append(
                        "it is ENABLED (disable it first, in a plan of its own, so it takes no new jobs)"
                    )
                if row["open"]:
                    why.append(
                        f"it has {row['open']} job(s) queued or running (let them finish, or cancel them)"
                    )
                if row["total"] - row["open"]:
                    why.append(
                        f"it has {row['total'] - row['open']} finished job(s), its history (keep it in the layout, DISABLED)"
                    )
                layoutdoc.add_error(
                    errors,
                    "shares",
                    f'share "{name}" cannot be removed (it is left out): a share is removed only once drained '
                    f"(DISABLED and without jobs), and {'; and '.join(why)}",
                )


def _share_view(name: str, spec: ShareSpec) -> policy.ShareView:
    known = {f.name for f in dataclasses.fields(policy.ShareView)}
    extra = {f: spec.values[f] for f in layoutdoc.VALUE_FIELDS if f in known and f != "state"}
    tree = {f: spec.values.get(f, d) for f, d in layoutdoc.TREE_DEFAULTS.items() if f in known}
    return policy.ShareView(name=name, capacity=spec.capacity, **extra, **tree)


def now_effects(live: Live, target: Layout) -> dict[str, Any]:
    """What the plan does to the cluster now: running jobs that become borrowed (reclaimable), queued
    jobs that could never run any more, over-commit per GPU type. A constant number of queries."""
    from jobs.choices import JobState
    from jobs.models import Attempt, Job
    from quotas.scheduler import load_snapshot

    current = live.layout
    matched = layoutdoc.matches(current, target)
    renamed = {was: name for name, was in matched.items() if was}
    # The planned shares under the names running and queued jobs carry now.
    planned = {(was or name): target.shares[name] for name, was in matched.items()}
    snapshot = load_snapshot(queued=False).snapshot
    views = [_share_view(name, spec) for name, spec in planned.items()]
    views += [  # removed: no jobs, and out of the tree (their group may go with them)
        replace(_share_view(n, s), group=None) for n, s in current.shares.items() if n not in planned
    ]
    current_views = [_share_view(n, s) for n, s in current.shares.items()]
    snapshot = replace(snapshot, shares=tuple(current_views), groups=tuple(current.groups.values()))
    planned_snapshot = replace(snapshot, shares=tuple(views), groups=tuple(target.groups.values()))
    before = policy.borrowed_attempts(snapshot)
    after = policy.borrowed_attempts(planned_snapshot)
    newly, freed = sorted(after - before), sorted(before - after)
    borrowed = []
    if newly:
        rows = (
            Attempt.objects.filter(pk__in=newly[:BORROWED_LISTED])
            .select_related("job__share", "job__submitted_by")
            .only(
                "job__id",
                "job__name",
                "job__gpus",
                "job__gpu_type",
                "job__share__name",
                "job__submitted_by__username",
            )
        )
        for a in rows:
            share = renamed.get(a.job.share.name, a.job.share.name)
            borrowed.append(
                {
                    "job": a.job.pk,
                    "name": a.job.name,
                    "share": share,
                    "user": a.job.submitted_by.username,
                    "gpus": a.job.gpus,
                    "gpu_type": a.job.gpu_type,
                    "words": f"job {a.job.pk} {a.job.name or ''} ({a.job.gpus} {a.job.gpu_type}, "
                    f"{a.job.submitted_by.username}) runs beyond {share}'s new capacity: borrowed from now on, "
                    "so reclaimable when another share needs its GPUs (it is not stopped for this alone)".replace(
                        "  ", " "
                    ),
                }
            )
        borrowed.sort(key=lambda b: b["job"])

    # Queued (and held) jobs, by share, type and size: which sizes can the planned share never hold?
    names = live.share_names
    groups = (
        Job.objects.filter(state__in=[JobState.QUEUED, JobState.HELD])
        .values_list("share_id", "gpu_type", "gpus")
        .annotate(n=Count("id"))
    )
    never: list[dict[str, Any]] = []
    lookups = Q(pk__in=[])
    for share_id, gpu_type, gpus, n in groups:
        was = names.get(share_id)
        spec = planned.get(was)
        if spec is None:
            continue
        new_name = spec.name
        why_after = policy.never_fits(_share_view(new_name, spec), gpu_type, gpus)
        why_before = policy.never_fits(_share_view(was, current.shares[was]), gpu_type, gpus)
        if why_after and not why_before:
            never.append(
                {
                    "share": new_name,
                    "share_id": share_id,
                    "gpu_type": gpu_type,
                    "gpus": gpus,
                    "count": n,
                    "why": why_after,
                    "jobs": [],
                }
            )
            lookups |= Q(share_id=share_id, gpu_type=gpu_type, gpus=gpus)
    if never:
        by_key = {(g["share_id"], g["gpu_type"], g["gpus"]): g for g in never}
        for pk, name, share_id, gpu_type, gpus, user in (
            Job.objects.filter(lookups, state__in=[JobState.QUEUED, JobState.HELD])
            .order_by("pk")
            .values_list("pk", "name", "share_id", "gpu_type", "gpus", "submitted_by__username")[:500]
        ):
            group = by_key[(share_id, gpu_type, gpus)]
            if len(group["jobs"]) < NEVER_RUNNABLE_LISTED:
                group["jobs"].append({"job": pk, "name": name, "user": user})
        for g in never:
            g.pop("share_id")
            listed = ", ".join(f"{j['job']} {j['name']}".strip() for j in g["jobs"])
            more = g["count"] - len(g["jobs"])
            g["words"] = (
                f"{g['count']} queued job{'s' if g['count'] != 1 else ''} of {g['share']} need "
                f"{g['gpus']} {g['gpu_type']} each: {g['why']} (job{'s' if g['count'] != 1 else ''} {listed}"
                + (f" and {more} more" if more > 0 else "")
                + "); they stay queued, and each is told so (an event on the job) when the plan is applied"
            )
        never.sort(key=lambda g: (g["share"], g["gpu_type"], g["gpus"]))

    ready: dict[str, int] = {}
    for node in snapshot.nodes:
        if node.schedulable:
            ready[node.gpu_type] = ready.get(node.gpu_type, 0) + node.gpus
    overcommit = []
    held_before, held_after = _assigned(current), _assigned(target)
    for gpu_type in sorted(set(held_before) | set(held_after)):
        b, a, r = held_before.get(gpu_type, 0), held_after.get(gpu_type, 0), ready.get(gpu_type, 0)
        if a > r:
            was = f" (now {b})" if b != a else " (as now)"
            overcommit.append(
                {
                    "gpu_type": gpu_type,
                    "assigned": a,
                    "was": b,
                    "ready": r,
                    "words": f"{gpu_type}: the shares would hold {a} GPUs{was}, {r} are READY"
                    + (f", over-committed by {a - r}" if r else ": no READY node has this type")
                    + "; guarantees hold only as far as the hardware exists",
                }
            )
    return {
        "borrowed": borrowed,
        "borrowed_total": len(newly),
        "no_longer_borrowed": len(freed),
        "never_runnable": never,
        "overcommit": overcommit,
        "uncovered": uncovered_by(snapshot, planned_snapshot, after)
        if current.groups or target.groups
        else [],
    }


def _shortfalls(snapshot) -> tuple[Any, dict[tuple[str | None, str], tuple[int, int, int]]]:
    """The snapshot's tree and, per (group or None for the top, type), (shortfall, taken from outside,
    what its borrow limit allows) (SEMANTICS "the cover, per level")."""
    from quotas.engine.tree import NO_LIMIT, Tree, nets
    from quotas.engine.views import UNASSIGNED, ShareView, usage

    u = usage(snapshot, count_preempting=False)
    shares = list(snapshot.shares)
    known = {s.name for s in shares}
    shares += [
        ShareView(name=n, capacity={}, borrow_limit=0) for n in sorted(u.keys() - known - {UNASSIGNED})
    ]
    tree = Tree.build(snapshot.groups, shares)
    out = {}
    for gpu_type in sorted({t for by_type in u.values() for t in by_type}):
        used = {name: by_type[gpu_type].used for name, by_type in u.items() if gpu_type in by_type}
        pool = u.get(UNASSIGNED, {}).get(gpu_type)
        n = nets(tree, gpu_type, used, pool.capacity if pool is not None else 0)
        for key, short in n.shortfall.items():
            if key is None:
                out[(None, gpu_type)] = (short, -min(0, n.top), 0)
            else:
                cap = tree.borrow_cap(key, gpu_type)
                out[(key, gpu_type)] = (short, n.taken.get(key, 0), -1 if cap >= NO_LIMIT else cap)
    return tree, out


def uncovered_by(snapshot, planned_snapshot, borrowed_after) -> list[dict]:
    """The borrowed jobs a new tree (a limit lowered, a share moved, a capacity cut) leaves uncovered: per
    group (or the top level) whose shortfall the plan makes larger, its borrowed jobs. They go on; no
    new borrowing draws on that shortfall and owners take those GPUs back first (SEMANTICS "Groups")."""
    _, before = _shortfalls(snapshot)
    tree, after = _shortfalls(planned_snapshot)
    out = []
    for (group, gpu_type), (short, taken, allowed) in sorted(
        after.items(), key=lambda kv: (kv[0][1], kv[0][0] or "")
    ):
        if short <= before.get((group, gpu_type), (0, 0, 0))[0]:
            continue
        jobs = sorted(
            r.job_id
            for r in planned_snapshot.running
            if r.attempt_id in borrowed_after
            and r.gpu_type == gpu_type
            and (group is None or group in tree.path(r.share))
        )
        if group is None:
            head = (
                f"{gpu_type}: {short} borrowed GPUs more than the idle GPUs that the top level's lend "
                "limits leave to lend"
            )
        else:
            head = (
                f"group {group} may take {allowed} {gpu_type} from outside: {taken} taken, {short} uncovered"
            )
        listed = ", ".join(str(j) for j in jobs[:BORROWED_LISTED])
        more = len(jobs) - BORROWED_LISTED
        out.append(
            {
                "group": group,
                "gpu_type": gpu_type,
                "shortfall": short,
                "jobs": jobs[:BORROWED_LISTED],
                "words": head
                + (
                    f"; its borrowed jobs (job {listed}"
                    + (f" and {more} more" if more > 0 else "")
                    + ") go on"
                    if jobs
                    else ""
                )
                + ", no new borrowing draws on that shortfall, and owners take those GPUs back first",
            }
        )
    return out


def _assigned(layout: Layout) -> dict[str, int]:
    out: dict[str, int] = {}
    for spec in layout.shares.values():
        for gpu_type, n in spec.capacity.items():
            out[gpu_type] = out.get(gpu_type, 0) + n
    return out


def _temporary(changes: Sequence[Mapping[str, Any]], target: Layout) -> tuple[list[dict], list[str]]:
    """The plan's temporary changes ({share, until, fields: {path: [before, after]}}) and warnings for
    an `until` on a share the plan does not change."""
    by_name = {c["name"]: c for c in changes if c["kind"] == "share"}
    out, warnings = [], []
    for spec in target.shares.values():
        if spec.until is None:
            continue
        change = by_name.get(spec.name)
        if change is None:
            warnings.append(
                f"shares[{spec.index}].until: this plan changes nothing of {spec.name}, so nothing goes back "
                "(until is ignored)"
            )
            continue
        if change["action"] == "added":
            # A share added until then: its GPUs and its admission of new jobs end then (it stays, DISABLED,
            # without capacity; remove it in a later plan once drained).
            fields = {f"capacity.{t}": [0, n] for t, n in spec.capacity.items()}
            if spec.values["state"] == ENABLED:
                fields["state"] = [DISABLED, ENABLED]
        else:
            fields = {f["field"]: [f["before"], f["after"]] for f in change["fields"]}
        if fields:
            out.append({"share": spec.name, "until": spec.until.isoformat(), "fields": fields})
    return out, warnings


def _pending_warnings(live: Live, changes: Sequence[Mapping[str, Any]]) -> list[str]:
    """A pending temporary change whose fields this plan changes: its revert will leave them."""
    touched = {
        (c["renamed_from"] or c["name"]): {f["field"] for f in c["fields"]}
        for c in changes
        if c["kind"] == "share" and c["action"] != "added"
    }
    out = []
    for change in pending_changes(list(touched)):
        overlap = sorted(set(change.fields) & touched.get(change.share.name, set()))
        if overlap:
            out.append(
                f"{change.share.name} has a temporary change {temporary_words(change)}; this plan changes "
                f"{', '.join(overlap)}, so that revert will leave {'it' if len(overlap) == 1 else 'them'} as this plan sets"
            )
    return out


def whatif_variant(live: Live, target: Layout, temporary: Sequence[Mapping[str, Any]], now: datetime) -> dict:
    """The plan as the what-if replays it (quotas.whatif.with_layout): every share as planned, the
    renames, and each temporary change going back after as long as it lasts (from the replay's start)."""
    matched = layoutdoc.matches(live.layout, target)
    shares = [
        {
            "name": s.name,
            "team": s.team,
            **{f: s.values[f] for f in layoutdoc.FIELDS_BY_NAME},
            **{f: s.values.get(f, d) for f, d in layoutdoc.TREE_DEFAULTS.items()},
        }
        for s in target.shares.values()
    ]
    reverts = []
    for t in temporary:
        spec = target.shares[t["share"]]
        values = {f: spec.values[f] for f in layoutdoc.FIELDS_BY_NAME}
        values.update({f: spec.values.get(f, d) for f, d in layoutdoc.TREE_DEFAULTS.items()})
        capacity = dict(values["capacity"])
        for path, (before, _after) in t["fields"].items():
            if path.startswith("capacity."):
                capacity[path.split(".", 1)[1]] = before
            elif path in values:
                values[path] = before
        values["capacity"] = {k: v for k, v in sorted(capacity.items()) if v}
        seconds = math.ceil((datetime.fromisoformat(t["until"]) - now).total_seconds())
        reverts.append({"after_s": max(1, seconds), "share": spec.name, "set": values})
    return {
        "shares": shares,
        "renames": {was: name for name, was in matched.items() if was and was != name},
        "reverts": reverts,
        # the planned tree and fair-sharing settings: the what-if replays them too
        "groups": [layoutdoc.group_flat(g) | {"name": g.name} for g in target.groups.values()],
        "settings": dict(target.settings),
    }


def plan(
    *,
    source: Any,
    actor=None,
    now: datetime | None = None,
    run_whatif: bool = True,
    rollback_to: int | None = None,
    store: bool = True,
) -> LayoutPlan:
    """Plan the layout `source` describes (see quotas.layoutdoc.read). Raises ValidationError({path:
    [message]}) with every problem. Returns the plan (saved unless store=False), with the what-if
    started when the plan changes something and run_whatif."""
    now = now or timezone.now()
    target, live = check(source, now=now)
    changes = layoutdoc.diff(live.layout, target)
    temporary, warnings = _temporary(changes, target)
    warnings += _pending_warnings(live, changes)
    from directory import layoutdb

    warnings += layoutdb.warnings(target.teams)  # a directory group no sign-in has named yet
    effects = (
        now_effects(live, target)
        if changes
        else {
            "borrowed": [],
            "borrowed_total": 0,
            "no_longer_borrowed": 0,
            "never_runnable": [],
            "overcommit": [],
            "uncovered": [],
        }
    )
    effects["warnings"] = warnings
    user = actor if getattr(actor, "is_authenticated", False) else None
    planned = LayoutPlan(
        created_by=user,
        created_by_name=user.get_username() if user else "",
        base_hash=live.layout.hash(),
        base_version=current_version(),
        rollback_to=rollback_to,
        document=layoutdoc.plan_data(target),
        diff=changes,
        effects=effects,
        temporary=temporary,
    )
    planned.created_at = now
    if changes and run_whatif:
        planned.whatif_run = whatif.start_layout(
            variant=whatif_variant(live, target, temporary, now),
            changed=[c["name"] for c in changes if c["kind"] == "share"],
            renames={c["renamed_from"]: c["name"] for c in changes if c.get("renamed_from")},
        )
    if store:
        planned.save()
    return planned


BEFORE_FIRST = 0  # `rollback 0`: the layout before version 1 (kept on version 1)


def rollback_words(number: int) -> str:
    return "the layout before version 1" if number == BEFORE_FIRST else f"version {number}"


def plan_rollback(*, number: int, actor=None, run_whatif: bool = True) -> LayoutPlan:
    """A plan back to the layout as version `number` left it, or with 0 to the layout before version 1
    (a plan like any other, with its effect)."""
    if number == BEFORE_FIRST:
        first = LayoutVersion.objects.filter(number=1).first()
        if first is None or first.before is None:
            raise ValidationError(
                {
                    "rollback": [
                        "no layout before version 1 on record"
                        + (
                            " (version 1 was applied before gpuquota kept it)"
                            if first
                            else " (no version yet)"
                        )
                    ]
                }
            )
        return plan(source=first.before, actor=actor, run_whatif=run_whatif, rollback_to=BEFORE_FIRST)
    version = LayoutVersion.objects.filter(number=number).first()
    if version is None:
        latest = current_version()
        raise ValidationError(
            {
                "rollback": [
                    f"no layout version {number}"
                    + (f" (versions 1 to {latest})" if latest else " (none yet)")
                ]
            }
        )
    return plan(source=version.document, actor=actor, run_whatif=run_whatif, rollback_to=number)


# --- apply -------------------------------------------------------------------------------------------


@dataclass
class Applied:
    plan: LayoutPlan
    version: LayoutVersion | None  # None: the plan changed nothing
    told: int = 0  # queued jobs told they can never run


def overcommit_added(planned: LayoutPlan) -> list[dict[str, Any]]:
    """The over-commits a plan adds to (its shares would hold more GPUs of a type than are READY, and
    more than they hold now): what the one-share form asks "Save anyway" for. An over-commit the plan
    leaves as it is needs no confirmation."""

    def adds(o: Mapping[str, Any]) -> bool:
        if "was" in o:
            return o["assigned"] > o["was"]
        return "(as now)" not in o.get("words", "")  # a plan made before "was" was kept

    return [o for o in (planned.effects or {}).get("overcommit") or () if adds(o)]


def apply(*, plan_id, actor=None, now: datetime | None = None, overcommit_ok: bool = False) -> Applied:
    """Apply a plan exactly as planned, in one transaction, or refuse (jobs.services.Conflict) when it
    was applied already, the layout changed since it was made, or one of its `until`s has passed. A plan
    that adds to an over-commit is applied only with `overcommit_ok` (ValidationError under "confirm"
    naming it), as the one-share form asks "Save anyway"."""
    now = now or timezone.now()
    with transaction.atomic():
        lock()
        planned = LayoutPlan.objects.select_for_update().filter(pk=plan_id).first()
        if planned is None:
            from django.http import Http404

            raise Http404("No such plan.")
        added = overcommit_added(planned) if planned.state == PlanState.PLANNED else []
        if added and not overcommit_ok:
            raise ValidationError(
                {
                    "confirm": [
                        "this plan over-commits "
                        + "; ".join(o["words"] for o in added)
                        + ". Nothing was applied: confirm to apply it anyway"
                    ]
                }
            )
        back = planned.rollback_to is not None  # 0 is the layout before version 1
        kind = VersionKind.ROLLBACK if back else VersionKind.APPLY
        note = f"rollback to {rollback_words(planned.rollback_to)}" if back else ""
        return _apply_locked(planned, actor=actor, now=now, kind=kind, note=note)


def _refuse_stale(planned: LayoutPlan) -> Exception:
    since = LayoutVersion.objects.filter(applied_at__gt=planned.created_at).order_by("-number").first()
    if since is not None:
        who = since.actor_name or "the system"
        what = f"version {since.number} was applied by {who} at {timezone.localtime(since.applied_at):%Y-%m-%d %H:%M:%S}"
    else:
        what = "it was changed outside a plan (a team edited, or the Django admin)"
    return _conflict(
        f"The layout changed since this plan was made ({what}): nothing was applied. Plan again from the "
        "layout as it is now."
    )


def _apply_locked(
    planned: LayoutPlan, *, actor, now: datetime, kind: str, note: str = "", temporary: bool = True
) -> Applied:
    if planned.state == PlanState.APPLIED:
        number = planned.version.number if planned.version_id else None
        raise _conflict(
            "This plan was applied already"
            + (f" (version {number})." if number else " (it changed nothing).")
        )
    live = load_live()
    if live.layout.hash() != planned.base_hash:
        raise _refuse_stale(planned)
    target = layoutdoc.specs_from_data(planned.document)
    for t in planned.temporary if temporary else ():
        if datetime.fromisoformat(t["until"]) <= now:
            raise _conflict(
                f"{t['share']}'s change was to end at {t['until']}, which has passed: nothing was applied. Plan again."
            )
    changes = layoutdoc.diff(live.layout, target)
    if changes != planned.diff:  # cannot happen with the same hash; never apply what was not shown
        raise _conflict(
            "This plan no longer describes the change it showed: nothing was applied. Plan again."
        )
    user = actor if getattr(actor, "is_authenticated", False) else None
    planned.state = PlanState.APPLIED
    planned.applied_at = now
    if not changes:
        planned.save(update_fields=["state", "applied_at"])
        return Applied(plan=planned, version=None)
    try:
        with transaction.atomic():
            _write(live, target, now)
    except IntegrityError as e:  # a name taken meanwhile outside the lock (the Django admin)
        raise _conflict(f"The layout could not be written ({e}): nothing was applied. Plan again.") from e
    number = (current_version() or 0) + 1
    version = LayoutVersion.objects.create(
        number=number,
        before=live.layout.to_data() if number == 1 else None,
        actor=user,
        actor_name=user.get_username() if user else "",
        kind=kind,
        diff=changes,
        document=target.to_data(),
        hash=target.hash(),
        note=note[:400],
    )
    planned.version = version
    planned.save(update_fields=["state", "applied_at", "version"])
    if temporary and planned.temporary:
        ids = dict(
            Share.objects.filter(name__in=[t["share"] for t in planned.temporary]).values_list("name", "pk")
        )
        TemporaryChange.objects.bulk_create(
            TemporaryChange(
                version=version,
                share_id=ids.get(t["share"]),
                share_name=t["share"],
                until=datetime.fromisoformat(t["until"]),
                fields=t["fields"],
            )
            for t in planned.temporary
        )
    record_version(user, version, changes, planned.temporary if temporary else ())
    told = _tell_never_runnable(planned, version, now)
    transaction.on_commit(lambda: triggers.request_pass(f"layout version {version.number}"))
    return Applied(plan=planned, version=version, told=told)


def _write(live: Live, target: Layout, now: datetime) -> None:
    """Make the database hold `target` (live: what it holds now). Rows only where something changed."""
    current = live.layout
    User = get_user_model()
    team_ids = dict(live.team_ids)
    for slug, spec in target.teams.items():
        if slug not in current.teams:
            team_ids[slug] = Team.objects.create(slug=slug, name=spec.name).pk
        elif current.teams[slug].name != spec.name:
            Team.objects.filter(pk=team_ids[slug]).update(name=spec.name)
    usernames = {u for t in (*target.teams.values(), *current.teams.values()) for u, _ in t.members}
    users = dict(User.objects.filter(username__in=list(usernames)).values_list("username", "pk"))
    for slug, spec in target.teams.items():
        old = dict(current.teams[slug].members) if slug in current.teams else {}
        new = dict(spec.members)
        gone = [users[u] for u in old if u not in new]
        if gone:
            Membership.objects.filter(team_id=team_ids[slug], user_id__in=gone).delete()
        for u, role in new.items():
            if u not in old:
                Membership.objects.create(team_id=team_ids[slug], user_id=users[u], role=role)
            elif old[u] != role:
                Membership.objects.filter(team_id=team_ids[slug], user_id=users[u]).update(role=role)

    from directory import layoutdb

    if layoutdb.write(team_ids, current.teams, target.teams):
        layoutdb.resync()  # who signed in before has the teams the new mapping gives them, now
    group_ids = _write_groups(live, target)
    matched = layoutdoc.matches(current, target)
    taken = {m for m in matched.values() if m}
    removed = [live.share_ids[n] for n in current.shares if n not in taken]
    if removed:
        ShareCapacity.objects.filter(share_id__in=removed).delete()
        Share.objects.filter(pk__in=removed).delete()
    for name, spec in target.shares.items():
        was = matched[name]
        values = {f: spec.values[f] for f in layoutdoc.VALUE_FIELDS}
        values["group_id"] = group_ids.get(spec.values.get("group"))
        values["weight"] = spec.values.get("weight", 1)
        if was is None:
            share = Share.objects.create(name=name, team_id=team_ids[spec.team], **values)
            ShareCapacity.objects.bulk_create(
                ShareCapacity(share=share, gpu_type=t, max_gpus=n) for t, n in spec.capacity.items()
            )
            continue
        old = current.shares[was]
        pk = live.share_ids[was]
        columns = {f: v for f, v in values.items() if f in old.values and old.values[f] != v}
        if old.values.get("group") != spec.values.get("group"):
            columns["group_id"] = values["group_id"]
        if old.values.get("weight", 1) != values["weight"]:
            columns["weight"] = values["weight"]
        if was != name:
            columns["name"] = name
        if old.team != spec.team:
            columns["team_id"] = team_ids[spec.team]
        if columns:
            Share.objects.filter(pk=pk).update(updated_at=now, **columns)
        if old.capacity != spec.capacity:
            ShareCapacity.objects.filter(share_id=pk).exclude(gpu_type__in=list(spec.capacity)).delete()
            ShareCapacity.objects.filter(share_id=pk, max_gpus=0).delete()
            for gpu_type, n in spec.capacity.items():
                if old.capacity.get(gpu_type) != n:
                    updated = ShareCapacity.objects.filter(share_id=pk, gpu_type=gpu_type).update(max_gpus=n)
                    if not updated:
                        ShareCapacity.objects.create(share_id=pk, gpu_type=gpu_type, max_gpus=n)
            if not columns:
                Share.objects.filter(pk=pk).update(updated_at=now)
    gone_teams = [team_ids[slug] for slug in current.teams if slug not in target.teams]
    if gone_teams:
        Team.objects.filter(pk__in=gone_teams).delete()  # memberships go with them
    gone_groups = [live.group_ids[n] for n in current.groups if n not in target.groups]
    if gone_groups:  # their shares and children were moved above; parents cleared so none protects another
        Group.objects.filter(pk__in=gone_groups).update(parent=None)
        Group.objects.filter(pk__in=gone_groups).delete()
    if target.settings != current.settings:
        FairSharing.objects.update_or_create(pk=1, defaults=dict(target.settings))
        if not target.settings["fair_share_half_life_s"]:  # no history kept: none to resume from later
            FairShareHistory.objects.all().delete()
    _forget_cached(current, target, users)


def _write_groups(live: Live, target: Layout) -> dict[str, int]:
    """The target's groups created or changed (parents set once all exist); returns name -> id. Groups
    the target leaves out are removed by _write once no share or group is under them."""
    current = live.layout
    ids = dict(live.group_ids)
    for name in target.groups:
        if name not in ids:
            ids[name] = Group.objects.create(name=name).pk
    for name, spec in target.groups.items():
        old = current.groups.get(name)
        if old is None or old != spec:
            Group.objects.filter(pk=ids[name]).update(
                parent_id=ids.get(spec.parent) if spec.parent else None,
                weight=spec.weight,
                borrow_limit=spec.borrow_limit,
                lend_limit=spec.lend_limit,
            )
    return ids


def _forget_cached(current: Layout, target: Layout, users: Mapping[str, int]) -> None:
    """The submit path's cached shares and users' teams (jobs.submit_cache) that this write changed:
    the queryset updates above send no signals."""
    from jobs import submit_cache

    keys = [
        submit_cache.share_key(name)
        for change in layoutdoc.diff(current, target)
        if change["kind"] == "share"
        for name in (change["name"], change["renamed_from"])
        if name
    ]
    for slug in set(current.teams) | set(target.teams):
        old = set(current.teams[slug].members) if slug in current.teams else set()
        new = set(target.teams[slug].members) if slug in target.teams else set()
        keys += [submit_cache.teams_key(users[u]) for u, _ in old ^ new if u in users]
    if keys:
        submit_cache.forget(keys)


def audit_changes(
    changes: Sequence[Mapping[str, Any]], temporary: Sequence[Mapping[str, Any]] = ()
) -> list[dict]:
    """A diff as the audit log keeps it: one row per field, {"object", "field", "before", "after"}."""
    ends = {t["share"]: t["until"] for t in temporary}
    rows = []
    for c in changes:
        label = f"{c['kind']} {c['name']} ({', '.join(c['labels'])})"
        if c["name"] in ends and c["kind"] == "share":
            label += f", until {ends[c['name']]}"
        for f in c["fields"] or [{"field": "", "before": None, "after": None}]:
            before = None if c["action"] == "added" else f["before"]
            after = None if c["action"] == "removed" else f["after"]
            rows.append({"object": label, "field": f["field"], "before": before, "after": after})
    return rows


def record_version(user, version: LayoutVersion, changes, temporary=()) -> AuditEntry:
    """The version's one audit entry: the whole diff, who, when."""
    from quotas.audit import MAX_REPR

    summary = layoutdoc.summary(changes)
    text = f"version {version.number}: {summary}" + (f" ({version.note})" if version.note else "")
    return AuditEntry.objects.create(
        actor=user,
        actor_name=user.get_username() if user else "",
        action=version.kind,
        object_type="layout",
        object_id=str(version.number),
        object_repr=text[:MAX_REPR],
        changes=audit_changes(changes, temporary),
    )


def _tell_never_runnable(planned: LayoutPlan, version: LayoutVersion, now: datetime) -> int:
    """Each queued job this version leaves never runnable gets an event saying so (from the plan's
    groups, re-read now: the queue moved since the plan)."""
    from jobs.choices import EventKind, JobState
    from jobs.models import Job, JobEvent

    groups = planned.effects.get("never_runnable") or []
    if not groups:
        return 0
    ids = dict(Share.objects.filter(name__in=[g["share"] for g in groups]).values_list("name", "pk"))
    events = []
    for g in groups:
        share_id = ids.get(g["share"])
        if share_id is None:
            continue
        for pk in Job.objects.filter(
            share_id=share_id,
            gpu_type=g["gpu_type"],
            gpus=g["gpus"],
            state__in=[JobState.QUEUED, JobState.HELD],
        ).values_list("pk", flat=True):
            events.append(
                JobEvent(
                    job_id=pk,
                    kind=EventKind.SHARE_CHANGED,
                    at=now,
                    reason=f"layout version {version.number}: {g['why']}"[:300],
                    detail={"version": version.number, "share": g["share"]},
                )
            )
    JobEvent.objects.bulk_create(events, batch_size=2000)
    return len(events)


# --- temporary changes -------------------------------------------------------------------------------


def revert_due(*, now: datetime | None = None) -> list[TemporaryChange]:
    """Set back every temporary change whose time has come (the beat task). Each in a transaction of
    its own; one that fails is logged and tried again at the next run."""
    now = now or timezone.now()
    done = []
    for pk in TemporaryChange.objects.filter(state=TemporaryState.PENDING, until__lte=now).values_list(
        "pk", flat=True
    ):
        try:
            change = revert(change_id=pk, now=now)
        except Exception:
            log.exception("the temporary change %s could not be set back; trying again at the next run", pk)
            continue
        if change is not None:
            done.append(change)
    return done


def revert(*, change_id: int, now: datetime | None = None) -> TemporaryChange | None:
    """Set back one temporary change, once: each field only if it still holds the value the change
    gave it (one changed again meanwhile is left as it is, and the outcome says so). Returns the
    change, or None when it was not pending (done by another run)."""
    now = now or timezone.now()
    with transaction.atomic():
        lock()
        change = (
            TemporaryChange.objects.select_for_update()
            .filter(pk=change_id, state=TemporaryState.PENDING)
            .select_related("version")
            .first()
        )
        if change is None:
            return None
        live = load_live()
        name = live.share_names.get(change.share_id) if change.share_id else None
        if name is None:
            return _finish(change, TemporaryState.SKIPPED, "nothing set back: the share was removed", now)
        spec = live.layout.shares[name]
        flat = spec.flat()
        flat["name"] = spec.name
        back: dict[str, Any] = {}
        left = []
        for path, (before, after) in change.fields.items():
            value = flat.get(path, layoutdoc.flat_default(path))
            if value == after:
                back[path] = before
            else:
                left.append(
                    f"{path} is {layoutdoc.value_words(value)} now, not the {layoutdoc.value_words(after)} this "
                    "change set: changed again meanwhile, left as it is"
                )
        if not back:
            return _finish(change, TemporaryState.SKIPPED, "nothing set back: " + "; ".join(left), now)
        data = live.layout.to_data()
        entry = next(s for s in data["shares"] if s["name"] == name)
        for path, value in back.items():
            if path.startswith("capacity."):
                entry["capacity"][path.split(".", 1)[1]] = value
            elif path == "name":
                entry["previous_name"], entry["name"] = name, value
            else:
                entry[path] = value
        try:
            target, _ = check(data, now=now, live=live)
        except ValidationError as e:
            problems = "; ".join(f"{k}: {' '.join(v)}" for k, v in e.message_dict.items())
            return _finish(
                change,
                TemporaryState.SKIPPED,
                f"nothing set back: the layout it would give is not valid ({problems})",
                now,
            )
        changes = layoutdoc.diff(live.layout, target)
        planned = LayoutPlan.objects.create(
            base_hash=live.layout.hash(),
            base_version=current_version(),
            document=layoutdoc.plan_data(target),
            diff=changes,
            effects={},
        )
        words = ", ".join(f"{p} → {layoutdoc.value_words(v)}" for p, v in back.items())
        applied = _apply_locked(
            planned,
            actor=None,
            now=now,
            kind=VersionKind.REVERT,
            note=f"the temporary change of version {change.version.number} to {change.share_name} ended",
            temporary=False,
        )
        change.revert_version = applied.version
        state = TemporaryState.PARTLY if left else TemporaryState.REVERTED
        outcome = f"set back at {timezone.localtime(now):%Y-%m-%d %H:%M:%S}: {words}" + (
            "; " + "; ".join(left) if left else ""
        )
        return _finish(change, state, outcome, now)


def _finish(change: TemporaryChange, state: str, outcome: str, now: datetime) -> TemporaryChange:
    change.state = state
    change.outcome = outcome[:400]
    change.done_at = now
    change.save(update_fields=["state", "outcome", "done_at", "revert_version"])
    if state == TemporaryState.SKIPPED:
        # Recorded even when nothing changed: the log says why the layout did not go back.
        AuditEntry.objects.create(
            action="revert",
            object_type="layout",
            object_id=str(change.version.number),
            object_repr=f"temporary change of version {change.version.number} to {change.share_name}: skipped"[
                :200
            ],
            changes=[
                {"object": f"share {change.share_name}", "field": path, "before": after, "after": after}
                for path, (_before, after) in change.fields.items()
            ],
            after={"outcome": change.outcome},
        )
    return change


# --- one share: the form and the API's share endpoints -----------------------------------------------


def share_document(
    live: Live, *, name: str | None, share: Mapping[str, Any] | None
) -> tuple[dict, int | None]:
    """The live layout's document with one share replaced (`name`: its name now; None: a new share),
    added, or left out (`share` None). Returns (document, the share's index in it)."""
    data = live.layout.to_data()
    shares = [s for s in data["shares"] if s["name"] != name]
    index = None
    if share is not None:
        entry = dict(share)
        if name is not None:
            # The share's place in the tree goes on unless the change names it: the one-share form and
            # the share API do not edit it (the layout does), and must not move a share out of its group.
            was = next((s for s in data["shares"] if s["name"] == name), {})
            for key in layoutdoc.TREE_DEFAULTS:
                if key not in entry and key in was:
                    entry[key] = was[key]
        if name is not None and entry.get("name", name) != name:
            entry["previous_name"] = name
        shares.append(entry)
        index = len(shares) - 1
    data["shares"] = shares
    return data, index


def change_share(
    *,
    name: str | None,
    share: Mapping[str, Any] | None,
    actor=None,
    dry_run: bool = False,
    run_whatif: bool = False,
) -> Applied | LayoutPlan:
    """Create (name None), change or remove (share None) one share, through a plan applied at once
    (or only planned, with dry_run; its what-if started with run_whatif). Raises
    ValidationError({field: [message]}) with the share's own field names, and Conflict when it cannot be
    removed."""
    with transaction.atomic():
        if not dry_run:
            lock()
        live = load_live()
        data, index = share_document(live, name=name, share=share)
        try:
            planned = plan(source=data, actor=actor, run_whatif=run_whatif, store=not dry_run)
        except ValidationError as e:
            raise _one_share_errors(e, index) from e
        if dry_run:
            return planned
        return _apply_locked(planned, actor=actor, now=timezone.now(), kind=VersionKind.APPLY)


def _one_share_errors(error: ValidationError, index: int | None) -> Exception:
    """A layout's errors as one share's: "shares[3].capacity.a10g" -> "capacity"; a removal refused
    -> Conflict (409)."""
    prefix = f"shares[{index}]." if index is not None else None
    fields: dict[str, list[str]] = {}
    for path, messages in error.message_dict.items():
        if prefix and path.startswith(prefix):
            rest = path[len(prefix) :]
            field = rest.split(".", 1)[0]
            if field == "capacity" and "." in rest:
                messages = [f"{rest.split('.', 1)[1]}: {m}" for m in messages]
            fields.setdefault("name" if field == "previous_name" else field, []).extend(messages)
        elif path == "shares" and index is None:
            return _conflict(" ".join(messages))
        else:
            fields.setdefault("__all__", []).extend(f"{path}: {m}" for m in messages)
    return ValidationError(fields)


# --- history -----------------------------------------------------------------------------------------


def versions(limit: int = 50) -> list[LayoutVersion]:
    return list(LayoutVersion.objects.order_by("-number")[:limit])


def share_history(name: str, *, limit: int = 10, scan: int = 200) -> list[dict[str, Any]]:
    """The recent versions that changed share `name` (under that name or a name it had), newest first,
    each with that share's part of the diff."""
    out = []
    names = {name}
    for version in LayoutVersion.objects.order_by("-number")[:scan]:
        for c in version.diff:
            if c["kind"] == "share" and (c["name"] in names or c.get("renamed_from") in names):
                if c.get("renamed_from"):
                    names.add(c["renamed_from"])
                out.append({"version": version, "change": c, "words": layoutdoc.describe(c)})
                break
        if len(out) >= limit:
            break
    return out


def plan_age_words(planned: LayoutPlan, now: datetime | None = None) -> str:
    seconds = ((now or timezone.now()) - planned.created_at).total_seconds()
    return (
        f"{int(seconds)} s"
        if seconds < 120
        else f"{int(seconds // 60)} min"
        if seconds < 7200
        else f"{int(seconds // 3600)} h"
    )


def expire_plans(*, keep: timedelta = timedelta(days=30)) -> int:
    """Plans never applied, older than `keep`, go (applied ones stay with their version)."""
    n, _ = LayoutPlan.objects.filter(state=PlanState.PLANNED, created_at__lt=timezone.now() - keep).delete()
    return n
