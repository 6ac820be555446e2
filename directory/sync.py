"""Memberships that follow the directory: at every sign-in the user's groups claim decides, for each team
with members_from / managers_from, whether they are a manager, a member or neither of it. What the
directory added it takes away again; a membership listed in the layout by hand it leaves alone. Each
team changed is one audit entry (action "directory", the system as its actor)."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from directory.models import DirectoryGroup, DirectoryMembership, TeamDirectory
from quotas.audit import record_audit, snapshot
from quotas.choices import Role
from quotas.models import Membership, Team

PREFIX = "oidc:"
MAX_GROUPS = 1000  # a claim longer than this is cut (a token is not a database)
MAX_GROUP_LENGTH = 255


def group_names(claim: object) -> list[str]:
    """The groups claim as "oidc:NAME"s: a list of strings (or one string); anything else is no group."""
    if isinstance(claim, str):
        claim = [claim]
    if not isinstance(claim, list):
        return []
    names = {
        f"{PREFIX}{g}" for g in claim[:MAX_GROUPS] if isinstance(g, str) and 0 < len(g) <= MAX_GROUP_LENGTH
    }
    return sorted(names)


def wanted_roles(groups: Iterable[str]) -> dict[int, str]:
    """team id -> the role these groups give in it (manager over member)."""
    have = set(groups)
    out: dict[int, str] = {}
    for team_id, members_from, managers_from in TeamDirectory.objects.values_list(
        "team_id", "members_from", "managers_from"
    ):
        if have & set(managers_from):
            out[team_id] = Role.MANAGER
        elif have & set(members_from):
            out[team_id] = Role.MEMBER
    return out


@transaction.atomic
def sync_memberships(*, user, groups: list[str], seen: bool = True) -> list[str]:
    """Make the user's directory memberships what `groups` say (`seen`: a sign-in's claim, whose groups
    are noted as known); returns what changed, in words."""
    from jobs import submit_cache

    if seen:
        now = timezone.now()
        for name in groups:
            DirectoryGroup.objects.update_or_create(name=name, defaults={"last_seen": now})
    wanted = wanted_roles(groups)
    granted = dict(DirectoryMembership.objects.filter(user=user).values_list("team_id", "role"))
    manual = set(
        Membership.objects.filter(user=user)
        .exclude(team_id__in=list(granted))
        .values_list("team_id", flat=True)
    )
    changed: list[str] = []
    for team in Team.objects.filter(pk__in=set(wanted) | set(granted)).order_by("slug"):
        role, had = wanted.get(team.pk), granted.get(team.pk)
        if team.pk in manual or role == had:
            continue  # a hand-made membership is the layout's, not the directory's
        before = snapshot(team)
        if role is None:
            Membership.objects.filter(team=team, user=user).delete()
            DirectoryMembership.objects.filter(team=team, user=user).delete()
            changed.append(f"left {team.slug}")
        elif had is None:
            Membership.objects.create(team=team, user=user, role=role)
            DirectoryMembership.objects.create(team=team, user=user, role=role)
            changed.append(f"joined {team.slug} as {role}")
        else:
            Membership.objects.filter(team=team, user=user).update(role=role)
            DirectoryMembership.objects.filter(team=team, user=user).update(role=role)
            changed.append(f"is {role} of {team.slug}")
        record_audit(None, "directory", team, before, snapshot(team))
    if changed:
        submit_cache.forget([submit_cache.teams_key(user.pk)])
    return changed
