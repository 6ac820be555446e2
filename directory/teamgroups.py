"""A team's directory groups in the layout document (pure: no Django), `members_from` and
`managers_from`: lists of "oidc:NAME", the groups claim's values whose members are the team's members
or managers (directory.sync applies them at each sign-in). quotas.layoutdoc calls these for a team."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Mapping
from typing import Any

KEYS = ("members_from", "managers_from")
PREFIX = "oidc:"
MAX_GROUPS = 100  # per key and team
MAX_LENGTH = 255  # a group's name, after the prefix (directory.sync.MAX_GROUP_LENGTH)

# (("managers_from", ("oidc:a",)), ("members_from", ("oidc:b", "oidc:c"))): only keys with groups.
TeamGroups = tuple[tuple[str, tuple[str, ...]], ...]


def _problem(value: Any) -> str | None:
    if not isinstance(value, str):
        return f'must be a directory group such as "oidc:vision-researchers" (got {type(value).__name__})'
    if not value.startswith(PREFIX):
        return f'must start with "{PREFIX}" (the groups claim of the sign-in), e.g. "oidc:{value}"'
    name = value[len(PREFIX) :]
    if not name or len(name) > MAX_LENGTH:
        return f"the group's name must be 1 to {MAX_LENGTH} characters"
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        return "use printable characters only"
    return None


def parse(item: Mapping[str, Any], path: str, add_error: Callable[[str, str], None]) -> TeamGroups:
    """The team's groups from its mapping in the document; each problem at its own path
    (``teams[2].members_from[1]``)."""
    out = []
    for key in KEYS:
        raw = item.get(key)
        if raw is None:
            continue
        if not isinstance(raw, list):
            add_error(f"{path}.{key}", 'must be a list of directory groups, e.g. ["oidc:vision-researchers"]')
            continue
        if len(raw) > MAX_GROUPS:
            add_error(f"{path}.{key}", f"at most {MAX_GROUPS} groups (it has {len(raw)})")
            continue
        seen: set[str] = set()
        for j, value in enumerate(raw):
            problem = _problem(value)
            if problem is None and value in seen:
                problem = f'"{value}" is listed twice'
            if problem:
                add_error(f"{path}.{key}[{j}]", problem)
                continue
            seen.add(value)
        if seen:
            out.append((key, tuple(sorted(seen))))
    return tuple(sorted(out))


def data(groups: TeamGroups) -> dict[str, list[str]]:
    """For the document: only keys that have groups (a layout without any exports and hashes as before)."""
    return {key: list(values) for key, values in sorted(groups, key=lambda kv: KEYS.index(kv[0]))}


def from_data(team: Mapping[str, Any]) -> TeamGroups:
    return tuple(sorted((key, tuple(team[key])) for key in KEYS if team.get(key)))


def flat(groups: TeamGroups) -> dict[str, str]:
    """What the diff compares: each key as one value ("oidc:a, oidc:b")."""
    return {key: ", ".join(values) for key, values in groups}


def names(groups: TeamGroups) -> set[str]:
    return {g for _, values in groups for g in values}
