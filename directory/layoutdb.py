"""The layout's directory groups in the database (quotas.layout calls these): each team's members_from /
managers_from read and written, the memberships the directory made kept out of the layout's `members`
(they follow the directory, not the document), the plan's warning for a group no sign-in has named yet,
and, once a layout is applied, every known directory user's memberships made to follow the new mapping
from the groups of their last sign-in (not at their next sign-in only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from directory import teamgroups
from directory.models import DirectoryGroup, DirectoryMembership, Identity, TeamDirectory


def load(slugs: Mapping[int, str]) -> dict[str, teamgroups.TeamGroups]:
    """slug -> the team's groups (teams without any left out)."""
    out = {}
    for team_id, members_from, managers_from in TeamDirectory.objects.values_list(
        "team_id", "members_from", "managers_from"
    ):
        groups = teamgroups.from_data({"members_from": members_from, "managers_from": managers_from})
        if groups and team_id in slugs:
            out[slugs[team_id]] = groups
    return out


def directory_made() -> set[tuple[int, str]]:
    """(team id, username) of each membership the directory made."""
    return set(DirectoryMembership.objects.values_list("team_id", "user__username"))


def write(team_ids: Mapping[str, int], current: Mapping[str, Any], target: Mapping[str, Any]) -> bool:
    """Make the database hold the target's team groups (TeamSpecs by slug); returns whether any changed."""
    changed = False
    for slug, spec in target.items():
        old = current[slug].directory if slug in current else ()
        if spec.directory == old:
            continue
        changed = True
        fields = teamgroups.data(spec.directory)
        if fields:
            TeamDirectory.objects.update_or_create(
                team_id=team_ids[slug],
                defaults={
                    "members_from": fields.get("members_from", []),
                    "managers_from": fields.get("managers_from", []),
                },
            )
        else:
            TeamDirectory.objects.filter(team_id=team_ids[slug]).delete()
    return changed or any(current[slug].directory for slug in current if slug not in target)


def resync() -> None:
    """Every directory user's memberships as the mapping now says, from their last sign-in's groups."""
    from directory.sync import sync_memberships

    for identity in Identity.objects.select_related("user"):
        sync_memberships(user=identity.user, groups=identity.groups, seen=False)


def warnings(target_teams: Mapping[str, Any]) -> list[str]:
    """A group no sign-in has named yet: maybe misspelt, maybe nobody in it has signed in yet."""
    wanted = {
        g: slug for slug, spec in sorted(target_teams.items()) for g in teamgroups.names(spec.directory)
    }
    if not wanted:
        return []
    seen = set(DirectoryGroup.objects.filter(name__in=list(wanted)).values_list("name", flat=True))
    return [
        f'team {slug}: no sign-in has named the directory group "{group}" yet (check its spelling, and '
        f"OIDC_GROUPS_CLAIM); its members join the team at their sign-in"
        for group, slug in sorted(wanted.items())
        if group not in seen
    ]
