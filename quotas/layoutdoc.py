"""The quota layout as one document: every team with its members, every share with its settings.

This module owns the document: its fields (one table, `SHARE_FIELDS`: a new share setting is one line
there), their defaults and checks, reading it (YAML or JSON, comments allowed; every problem at once,
each with its path, e.g. ``shares[3].capacity.a10g``), writing it (YAML with comments, in a stable
order), the hash a plan keeps of the layout it started from, and the field-by-field diff of two
layouts. It reads no database: quotas.layout loads the live layout, checks what needs the database
(users, jobs) and applies plans.

A document describes the whole layout: a share or team left out is to be removed, a field left out has
its default. Two keys are directions for one plan, never part of the layout: a share's `previous_name`
(it is renamed) and `until` (what this plan changes of it goes back by itself at that time).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from typing import Any

from config.validators import REFUSED_CATEGORIES
from directory import teamgroups
from quotas.engine import policy
from quotas.engine.tree import GroupSpec, validate_tree

FORMAT = 1
MAX_BYTES = 1 << 20  # a layout of thousands of shares fits; a larger one is refused unread
MAX_ITEMS = 10_000  # teams, shares, members of a team
MAX_INT = 2**31 - 1
MAX_UNTIL = timedelta(days=366)

SHARE_NAME_RE = re.compile(r"[a-z0-9-]{1,63}")
GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
SLUG_RE = re.compile(r"[-a-zA-Z0-9_]{1,63}")
DURATION_RE = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?")
ROLES = ("member", "manager")
ENABLED, DISABLED = "ENABLED", "DISABLED"
STATES = (ENABLED, DISABLED)
NAME_RULE = "use 1 to 63 lower-case letters, digits or hyphens"

Errors = dict[str, list[str]]


def add_error(errors: Errors, path: str, message: str) -> None:
    errors.setdefault(path, []).append(message)


# --- the fields of a share ---------------------------------------------------------------------------

Check = Callable[[Any], tuple[Any, str | None]]


def _whole(low: int, what: str) -> Check:
    def check(value: Any) -> tuple[Any, str | None]:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_INT:
            return None, f"must be {what} (got {_shown(value)})"
        return value, None

    return check


def _choice(options: Sequence[str]) -> Check:
    def check(value: Any) -> tuple[Any, str | None]:
        if value not in options:
            return None, f"must be one of {', '.join(options)} (got {_shown(value)})"
        return value, None

    return check


def _boolean(value: Any) -> tuple[Any, str | None]:
    if not isinstance(value, bool):
        return None, f"must be true or false (got {_shown(value)})"
    return value, None


def _text(max_length: int) -> Check:
    def check(value: Any) -> tuple[Any, str | None]:
        if value is None:
            return "", None
        if not isinstance(value, str):
            return None, f"must be text (got {_shown(value)}; quote it)"
        if len(value) > max_length:
            return None, f"must be at most {max_length} characters (it has {len(value)})"
        if not _printable(value):
            return None, "use printable characters only: no control characters or invisible ones"
        return value, None

    return check


def _min_runtime(value: Any) -> tuple[Any, str | None]:
    from jobs.limits import MIN_RUNTIME  # MAX_MIN_RUNTIME_S, read when checked

    if MIN_RUNTIME.problem(value) is not None:
        return (
            None,
            f"must be {MIN_RUNTIME.low} to {MIN_RUNTIME.top:,} seconds, MAX_MIN_RUNTIME_S (got {_shown(value)})",
        )
    return value, None


def _image_rules(value: Any) -> tuple[Any, str | None]:
    """A share's allowed_images: registries or image prefixes its jobs may run (jobs/images.py)."""
    from jobs.images import prefix_problem

    if value is None:
        return [], None
    if not isinstance(value, list | tuple):
        return None, "must be a list of registries or image prefixes, e.g. [registry.example.com/ml/]"
    for item in value:
        if problem := prefix_problem(item):
            return None, problem
    return list(dict.fromkeys(value)), None


def _mount_rules(value: Any) -> tuple[Any, str | None]:
    """A share's allowed_mounts: host directories its container jobs may mount read-only (jobs/mounts.py)."""
    from jobs.mounts import rule_problem

    if value is None:
        return [], None
    if not isinstance(value, list | tuple):
        return None, "must be a list of host directories, e.g. [/datasets/vision]"
    for item in value:
        if problem := rule_problem(item):
            return None, problem
    return list(dict.fromkeys(value)), None


def _capacity(value: Any) -> tuple[Any, str | None]:
    # Checked per type by parse() (each type its own path); here only the shape.
    if value is None:
        return {}, None
    if not isinstance(value, Mapping):
        return None, "must be a mapping of GPU type to GPUs, e.g. {a10g: 4}"
    return value, None


@dataclass(frozen=True)
class Field:
    """A setting of a share: its name (a Share column of the same name unless `capacity`), its default,
    and its check (value -> (normalised value, None) or (None, what is wrong))."""

    name: str
    default: Any
    check: Check
    help: str = ""

    @property
    def is_capacity(self) -> bool:
        return self.name == "capacity"


# In document order. A new share setting (a Share column, and a field of the simulator's Share if it
# should count in the what-if) is one line here.
SHARE_FIELDS: tuple[Field, ...] = (
    Field("description", "", _text(200)),
    Field("capacity", {}, _capacity, "own (guaranteed) GPUs per type"),
    Field("strategy", policy.LEND_AND_BORROW, _choice(policy.STRATEGIES)),
    Field("borrow_limit", policy.UNLIMITED, _whole(-1, "-1 (no limit) or a percentage, 0 or more")),
    Field("in_share_preemption", False, _boolean),
    Field(
        "min_runtime_s", 0, _min_runtime, "seconds an attempt is protected from pre-emption after it starts"
    ),
    Field("state", ENABLED, _choice(STATES)),
    Field("allowed_images", [], _image_rules, "container images its jobs may run besides ALLOWED_IMAGES"),
    Field(
        "allowed_mounts",
        [],
        _mount_rules,
        "host directories its container jobs may mount read-only besides ALLOWED_MOUNTS",
    ),
)
FIELDS_BY_NAME = {f.name: f for f in SHARE_FIELDS}
OMITTED_WHEN_DEFAULT = frozenset({"allowed_images", "allowed_mounts"})
# The settings that are Share columns (capacity is its own table).
VALUE_FIELDS = tuple(f.name for f in SHARE_FIELDS if not f.is_capacity)
# A share's place in the organisation tree (SEMANTICS "Groups"): written only where it is not the
# default, so that a layout without groups reads, exports and hashes exactly as before them.
TREE_DEFAULTS: dict[str, Any] = {"group": None, "weight": 1}
SHARE_KEYS = ("name", "team", *FIELDS_BY_NAME, *TREE_DEFAULTS, "previous_name", "until")
TEAM_KEYS = ("slug", "name", "members", *teamgroups.KEYS)
MEMBER_KEYS = ("user", "role")
GROUP_KEYS = ("name", "parent", "weight", "borrow_limit", "lend_limit")
GROUP_DEFAULTS: dict[str, Any] = {"parent": None, "weight": 1, "borrow_limit": -1, "lend_limit": -1}
# The cluster's fair-sharing settings, as in a scenario (SCENARIO.md); left out of the document when
# they are the defaults.
SETTINGS_DEFAULTS: dict[str, Any] = {"fair_share_half_life_s": 0, "fair_reclaim": False}
SETTINGS_NAME = "fair-sharing"  # the diff's name for the settings block
TOP_KEYS = ("format", "settings", "teams", "groups", "shares")
TEAM_PART_KEY = "team_part"  # a manager's export of its own team: read it, never plan it


def flat_default(path: str) -> Any:
    """The value a flat path (ShareSpec.flat) has where a layout leaves it out."""
    if path.startswith("capacity."):
        return 0
    return TREE_DEFAULTS.get(path)


def weight_value(value: Any) -> Any:
    """A weight as the document writes it: 2, not 2.0 (the database keeps a float)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _printable(text: str) -> bool:
    return not any(unicodedata.category(c) in REFUSED_CATEGORIES for c in text)


# --- the layout --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TeamSpec:
    slug: str
    name: str
    members: tuple[tuple[str, str], ...] = ()  # (username, role), by username
    index: int | None = None  # its place in the document read (error paths)
    positions: Mapping[str, int] = field(default_factory=dict, compare=False)  # user -> place in members
    directory: teamgroups.TeamGroups = ()  # members_from / managers_from (directory/teamgroups.py)


@dataclass(frozen=True)
class ShareSpec:
    name: str
    team: str
    values: Mapping[str, Any]  # every SHARE_FIELDS value; capacity a {type: GPUs} without zeros
    previous_name: str | None = None
    until: datetime | None = None
    index: int | None = None

    @property
    def capacity(self) -> dict[str, int]:
        return dict(self.values["capacity"])

    def flat(self) -> dict[str, Any]:
        """{field path: value}: what the diff compares ("capacity.a10g" per type; group and weight only
        where they are not the default, see flat_default)."""
        out: dict[str, Any] = {"team": self.team}
        for f in SHARE_FIELDS:
            if f.is_capacity:
                out.update({f"capacity.{t}": n for t, n in self.values["capacity"].items()})
            else:
                out[f.name] = self.values[f.name]
        for key, default in TREE_DEFAULTS.items():
            if self.values.get(key, default) != default:
                out[key] = self.values[key]
        return out


@dataclass
class Layout:
    teams: dict[str, TeamSpec] = field(default_factory=dict)  # by slug
    shares: dict[str, ShareSpec] = field(default_factory=dict)  # by name
    # Names (and previous names) of share entries left out for their errors: not "removed".
    unread: set[str] = field(default_factory=set)
    # The organisation tree's groups by name, and the cluster's fair-sharing settings.
    groups: dict[str, GroupSpec] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=lambda: dict(SETTINGS_DEFAULTS))
    group_index: dict[str, int] = field(default_factory=dict, compare=False)  # its place (error paths)

    def to_data(self, *, team_part: Sequence[str] | None = None) -> dict[str, Any]:
        """The document (JSON-ready), teams by slug, groups and shares by name. `team_part`: only these
        teams, their shares and the groups above them, marked as a part (what a team manager may read).
        `settings` and `groups` only where they say something: a layout without them reads as before."""
        teams = sorted(self.teams.values(), key=lambda t: t.slug)
        shares = sorted(self.shares.values(), key=lambda s: s.name)
        groups = sorted(self.groups.values(), key=lambda g: g.name)
        data: dict[str, Any] = {"format": FORMAT}
        if team_part is not None:
            data[TEAM_PART_KEY] = sorted(team_part)
            teams = [t for t in teams if t.slug in team_part]
            shares = [s for s in shares if s.team in team_part]
            above = set()
            for s in shares:
                node = s.values.get("group")
                while node is not None and node in self.groups and node not in above:
                    above.add(node)
                    node = self.groups[node].parent
            groups = [g for g in groups if g.name in above]
        if self.settings != SETTINGS_DEFAULTS:
            data["settings"] = {k: self.settings.get(k, v) for k, v in SETTINGS_DEFAULTS.items()}
        data["teams"] = [team_data(t) for t in teams]
        if groups:
            data["groups"] = [group_data(g) for g in groups]
        data["shares"] = [share_data(s) for s in shares]
        return data

    def hash(self) -> str:
        return layout_hash(self.to_data())


def team_data(team: TeamSpec) -> dict[str, Any]:
    return {
        "slug": team.slug,
        "name": team.name,
        "members": [{"user": user, "role": role} for user, role in team.members],
        **teamgroups.data(team.directory),
    }


def group_data(group: GroupSpec) -> dict[str, Any]:
    """A group's entry: its name, then only what is not the default (as a share's group and weight)."""
    out: dict[str, Any] = {"name": group.name}
    for key, default in GROUP_DEFAULTS.items():
        value = getattr(group, key)
        if value != default:
            out[key] = weight_value(value) if key == "weight" else value
    return out


def group_flat(group: GroupSpec) -> dict[str, Any]:
    return {
        key: (weight_value(group.weight) if key == "weight" else getattr(group, key))
        for key in GROUP_DEFAULTS
    }


def share_data(share: ShareSpec, *, directions: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": share.name, "team": share.team}
    for f in SHARE_FIELDS:
        value = share.values[f.name]
        if f.name in OMITTED_WHEN_DEFAULT and value == f.default:
            continue  # a layout without images exports and hashes as before them
        out[f.name] = dict(sorted(value.items())) if f.is_capacity else value
    for key, default in TREE_DEFAULTS.items():
        value = share.values.get(key, default)
        if value != default:
            out[key] = weight_value(value) if key == "weight" else value
    if directions:
        if share.previous_name:
            out["previous_name"] = share.previous_name
        if share.until:
            out["until"] = share.until.isoformat()
    return out


def layout_hash(data: Mapping[str, Any]) -> str:
    text = json.dumps(
        {k: data[k] for k in TOP_KEYS if k in data}, sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(text.encode()).hexdigest()


# --- reading -----------------------------------------------------------------------------------------


def read(source: Any) -> tuple[Any, Errors]:
    """A document as data: `source` is YAML or JSON text (bytes or str), or data already decoded.
    Returns (data, errors); errors under the path "document" when it cannot be read at all."""
    if isinstance(source, bytes):
        if len(source) > MAX_BYTES:
            return None, {"document": [f"larger than {MAX_BYTES // 1024} KiB, the most a layout may be"]}
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError:
            return None, {"document": ["not UTF-8 text"]}
    if not isinstance(source, str) or isinstance(source, HugeNumber):
        return _checked(source)
    if len(source) > MAX_BYTES:
        return None, {"document": [f"larger than {MAX_BYTES // 1024} KiB, the most a layout may be"]}
    if not source.strip():
        return None, {"document": ["empty: give a layout (`gpuquota shares export` writes the current one)"]}
    import yaml

    try:
        data = yaml.load(source, Loader=_loader())  # noqa: S506 - a SafeLoader, see _loader
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = " ".join(str(p) for p in (e.context, e.problem) if p)
        return None, {"document": [f"not valid YAML: {problem}{where}"]}
    except yaml.YAMLError as e:
        return None, {"document": [f"not valid YAML: {e}"]}
    except RecursionError:
        return None, {"document": ["not a layout: nested too deeply"]}
    return _checked(data)


def _checked(data: Any) -> tuple[Any, Errors]:
    huge = [f"{path}: {value}" for path, value in _walk(data) if isinstance(value, HugeNumber)]
    return (None, {"document": huge}) if huge else (data, {})


class HugeNumber(str):
    """An integer the loader will not convert (Python refuses more than 4,300 digits; none is a layout
    value): kept as its size, for a 400 that names its field rather than a 500."""

    def __new__(cls, digits: int):
        return super().__new__(
            cls, f"a number of {digits:,} digits: at most {MAX_INT} ({len(str(MAX_INT))} digits)"
        )


def read_int(text: str) -> int | HugeNumber:
    """An integer of YAML or JSON text (json's parse_int): a HugeNumber past Python's digit limit."""
    try:
        return int(text)
    except ValueError:
        return HugeNumber(sum(c.isdigit() for c in text))


def _walk(data: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every value of decoded data with its path as the errors name it ("shares[1].capacity.a10g")."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _walk(value, f"{path}[{i}]")
    else:
        yield path or "document", data


_LOADER: type | None = None


def _loader() -> type:
    """PyYAML's safe loader (its C one where built), refusing aliases (a few lines of `*a` can stand
    for millions of nodes) and a key given twice in one mapping (YAML would keep the last silently)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class LayoutLoader(base):  # type: ignore[misc,valid-type]
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not allowed in a layout", event.start_mark
                )
            return super().compose_node(parent, index)

        def construct_yaml_int(self, node):
            try:
                return super().construct_yaml_int(node)
            except ValueError:  # past int's digit limit
                return read_int(node.value)

        def construct_mapping(self, node, deep=False):
            seen: set[str] = set()
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    if key_node.value in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f'"{key_node.value}" is given twice', key_node.start_mark
                        )
                    seen.add(key_node.value)
            return super().construct_mapping(node, deep)

    # The constructors are a table per class, filled in with the base's functions: point it at ours.
    LayoutLoader.add_constructor("tag:yaml.org,2002:int", LayoutLoader.construct_yaml_int)

    # The C loader composes in C (no compose_node to override): aliases are caught at construction.
    if base is not yaml.SafeLoader:

        class CheckedLoader(LayoutLoader):
            def construct_object(self, node, deep=False):
                if node in self.constructed_objects:
                    raise yaml.constructor.ConstructorError(
                        None, None, "aliases (*name) are not allowed in a layout", node.start_mark
                    )
                return super().construct_object(node, deep)

        _LOADER = CheckedLoader
    else:
        _LOADER = LayoutLoader
    return _LOADER


def _unknown(errors: Errors, path: str, key: Any, known: Sequence[str]) -> None:
    hint = difflib.get_close_matches(str(key), list(known), n=1)
    add_error(
        errors,
        f"{path}.{key}" if path else str(key),
        "unknown field" + (f' (did you mean "{hint[0]}"?)' if hint else f"; known: {', '.join(known)}"),
    )


def _items(errors: Errors, data: Mapping[str, Any], key: str) -> list[Any]:
    raw = data.get(key)
    if raw is None:
        if key not in data:
            add_error(errors, key, f"required: the list of every {key[:-1]} (an empty list: none)")
        return []
    if not isinstance(raw, list):
        add_error(errors, key, "must be a list")
        return []
    if len(raw) > MAX_ITEMS:
        add_error(errors, key, f"at most {MAX_ITEMS} {key}")
        return []
    return raw


def parse(data: Any, *, now: datetime) -> tuple[Layout, Errors]:
    """Check a decoded document and normalise it (defaults filled in, capacity without zeros). Every
    problem found is reported, each under its path. Checks that need the database (users, the shares
    there now, their jobs) are quotas.layout's."""
    errors: Errors = {}
    layout = Layout()
    if not isinstance(data, Mapping):
        add_error(errors, "document", "a layout is a mapping with `teams` and `shares`")
        return layout, errors
    if TEAM_PART_KEY in data:
        add_error(
            errors,
            TEAM_PART_KEY,
            "this is a team's part of the layout (what a team manager reads); plan the whole layout, as an "
            "admin exports it",
        )
    for key in data:
        if key not in TOP_KEYS and key != TEAM_PART_KEY:
            _unknown(errors, "", key, TOP_KEYS)
    if "format" in data and data["format"] != FORMAT:
        add_error(
            errors, "format", f"must be {FORMAT}, the only format there is (got {_shown(data['format'])})"
        )
    _parse_teams(errors, layout, _items(errors, data, "teams"))
    _parse_settings(errors, layout, data.get("settings"))
    raw_groups = _items(errors, data, "groups") if data.get("groups") is not None else []
    _parse_shares(errors, layout, _items(errors, data, "shares"), now)
    _parse_groups(errors, layout, raw_groups)
    return layout, errors


def _parse_settings(errors: Errors, layout: Layout, raw: Any) -> None:
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        add_error(
            errors, "settings", "must be a mapping, e.g. {fair_share_half_life_s: 86400, fair_reclaim: false}"
        )
        return
    for key in raw:
        if key not in SETTINGS_DEFAULTS:
            _unknown(errors, "settings", key, tuple(SETTINGS_DEFAULTS))
    if "fair_share_half_life_s" in raw:
        value, problem = _whole(0, "0 (no history) or a number of seconds")(raw["fair_share_half_life_s"])
        if problem:
            add_error(errors, "settings.fair_share_half_life_s", problem)
        else:
            layout.settings["fair_share_half_life_s"] = value
    if "fair_reclaim" in raw:
        value, problem = _boolean(raw["fair_reclaim"])
        if problem:
            add_error(errors, "settings.fair_reclaim", problem)
        else:
            layout.settings["fair_reclaim"] = value


_INDEXED = re.compile(r"(groups|shares)\[(\d+)\]")


def _parse_groups(errors: Errors, layout: Layout, raw: list[Any]) -> None:
    """The groups, and the whole tree checked by the engine's validate_tree (cycles, unknown parents,
    depth, weights, limits, name clashes, shares in unknown groups), each problem under its path."""
    specs: list[tuple[int, GroupSpec]] = []
    failed_early: set[str] = set()
    for i, item in enumerate(raw):
        path = f"groups[{i}]"
        if not isinstance(item, Mapping):
            add_error(errors, path, "must be a mapping with name, parent, weight, borrow_limit, lend_limit")
            continue
        bad = False
        for key in item:
            if key not in GROUP_KEYS:
                _unknown(errors, path, key, GROUP_KEYS)
                bad = True
        values = {key: item.get(key, default) for key, default in GROUP_DEFAULTS.items()}
        if values["parent"] is not None and not isinstance(values["parent"], str):
            add_error(
                errors, f"{path}.parent", f"must be the name of a group (got {_shown(values['parent'])})"
            )
            values["parent"] = str(values["parent"])
            bad = True
        specs.append((i, GroupSpec(name=item.get("name"), **values)))
        if bad:
            failed_early.add(f"groups[{i}]")
    shares = sorted(layout.shares.values(), key=lambda s: s.index or 0)
    views = [_TreeShare(s.name, s.values["group"], s.values["weight"]) for s in shares]
    index_of = {"groups": [i for i, _ in specs], "shares": [s.index for s in shares]}
    failed = set(failed_early)
    for path, message in validate_tree([g for _, g in specs], views):
        match = _INDEXED.match(path)
        if match:
            kind, k = match.group(1), int(match.group(2))
            path = f"{kind}[{index_of[kind][k]}]{path[match.end() :]}"
            failed.add(f"{kind}[{index_of[kind][k]}]")
        add_error(errors, path, message)
    for i, g in specs:
        if f"groups[{i}]" in failed or g.name in layout.groups or not isinstance(g.name, str):
            continue
        layout.groups[g.name] = replace(g, weight=weight_value(g.weight))
        layout.group_index[g.name] = i


@dataclass(frozen=True)
class _TreeShare:
    name: str
    group: str | None
    weight: Any


def _parse_teams(errors: Errors, layout: Layout, raw: list[Any]) -> None:
    names: dict[str, int] = {}
    for i, item in enumerate(raw):
        path = f"teams[{i}]"
        if not isinstance(item, Mapping):
            add_error(errors, path, "must be a mapping with slug, name and members")
            continue
        for key in item:
            if key not in TEAM_KEYS:
                _unknown(errors, path, key, TEAM_KEYS)
        slug = item.get("slug")
        if not isinstance(slug, str) or not SLUG_RE.fullmatch(slug):
            add_error(
                errors,
                f"{path}.slug",
                "required: 1 to 63 letters, digits, hyphens or underscores"
                + ("" if slug is None else f" (got {_shown(slug)})"),
            )
            slug = None
        elif slug in layout.teams:
            add_error(
                errors, f"{path}.slug", f'"{slug}" is listed twice (also teams[{layout.teams[slug].index}])'
            )
            slug = None
        name, problem = _text(100)(item.get("name", slug))
        if problem or not name:
            add_error(errors, f"{path}.name", problem or "must not be empty")
        elif name in names:
            add_error(errors, f"{path}.name", f'"{name}" is the name of teams[{names[name]}] too')
        else:
            names[name] = i
        members, positions = _parse_members(errors, path, item.get("members", []))
        directory = teamgroups.parse(item, path, lambda where, message: add_error(errors, where, message))
        if slug is not None:
            layout.teams[slug] = TeamSpec(
                slug=slug,
                name=name or slug,
                members=members,
                index=i,
                positions=positions,
                directory=directory,
            )


def _parse_members(errors: Errors, path: str, raw: Any) -> tuple[tuple[tuple[str, str], ...], dict[str, int]]:
    if raw is None:
        return (), {}
    if not isinstance(raw, list):
        add_error(errors, f"{path}.members", "must be a list of {user: NAME, role: member or manager}")
        return (), {}
    out: dict[str, str] = {}
    positions: dict[str, int] = {}
    for j, m in enumerate(raw[:MAX_ITEMS]):
        where = f"{path}.members[{j}]"
        if not isinstance(m, Mapping):
            add_error(errors, where, "must be a mapping {user: NAME, role: member or manager}")
            continue
        for key in m:
            if key not in MEMBER_KEYS:
                _unknown(errors, where, key, MEMBER_KEYS)
        user, role = m.get("user"), m.get("role", "member")
        if not isinstance(user, str) or not user or len(user) > 150:
            add_error(errors, f"{where}.user", f"required: a username (got {_shown(user)})")
            continue
        if role not in ROLES:
            add_error(errors, f"{where}.role", f"must be member or manager (got {_shown(role)})")
            continue
        if user in out:
            add_error(errors, f"{where}.user", f'"{user}" is listed twice in this team')
            continue
        out[user] = role
        positions[user] = j
    return tuple(sorted(out.items())), positions


def _parse_shares(errors: Errors, layout: Layout, raw: list[Any], now: datetime) -> None:
    renamed_from: dict[str, int] = {}
    for i, item in enumerate(raw):
        path = f"shares[{i}]"
        if not isinstance(item, Mapping):
            add_error(errors, path, "must be a mapping with name, team, capacity, ...")
            continue
        for key in item:
            if key not in SHARE_KEYS:
                _unknown(errors, path, key, SHARE_KEYS)
        ok = True
        name = item.get("name")
        if not isinstance(name, str) or not SHARE_NAME_RE.fullmatch(name):
            add_error(
                errors,
                f"{path}.name",
                f"required: {NAME_RULE}" + ("" if name is None else f" (got {_shown(name)})"),
            )
            ok = False
        elif name in layout.shares:
            add_error(
                errors, f"{path}.name", f'"{name}" is listed twice (also shares[{layout.shares[name].index}])'
            )
            ok = False
        team = item.get("team")
        if not isinstance(team, str) or not team:
            add_error(errors, f"{path}.team", "required: the slug of a team of this layout")
            ok = False
        elif team not in layout.teams:
            add_error(errors, f"{path}.team", f'no team "{team}" in this layout\'s teams')
            ok = False
        values: dict[str, Any] = {}
        for f in SHARE_FIELDS:
            if f.name not in item:
                values[f.name] = dict(f.default) if f.is_capacity else f.default
                continue
            value, problem = f.check(item[f.name])
            if problem:
                add_error(errors, f"{path}.{f.name}", problem)
                ok = False
            elif f.is_capacity:
                capacity = _parse_capacity(errors, f"{path}.capacity", value)
                ok = ok and capacity is not None
                values["capacity"] = capacity or {}
            else:
                values[f.name] = value
        strategy = values.get("strategy")
        limit = values.get("borrow_limit")
        if limit not in (None, policy.UNLIMITED) and strategy not in (None, policy.LEND_AND_BORROW):
            add_error(
                errors,
                f"{path}.borrow_limit",
                f"only a LEND_AND_BORROW share borrows: leave borrow_limit at -1 (or out) for a {strategy} share",
            )
            ok = False
        group = item.get("group")
        if group is not None and not isinstance(group, str):
            add_error(errors, f"{path}.group", f"must be the name of a group (got {_shown(group)})")
            ok = False
        values["group"] = group
        weight = item.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            add_error(errors, f"{path}.weight", f"must be a positive number (got {_shown(weight)})")
            ok = False
        values["weight"] = weight_value(weight)
        previous = item.get("previous_name")
        if previous is not None:
            if not isinstance(previous, str) or not SHARE_NAME_RE.fullmatch(previous):
                add_error(errors, f"{path}.previous_name", f"the share's name now: {NAME_RULE}")
                ok = False
            elif previous == name:
                previous = None  # renamed to itself: nothing to rename
            elif previous in renamed_from:
                add_error(
                    errors,
                    f"{path}.previous_name",
                    f'"{previous}" is renamed by shares[{renamed_from[previous]}] too',
                )
                ok = False
            else:
                renamed_from[previous] = i
        until = None
        if "until" in item:
            until, problem = parse_until(item["until"], now)
            if problem:
                add_error(errors, f"{path}.until", problem)
                ok = False
        if ok:
            layout.shares[name] = ShareSpec(
                name=name, team=team, values=values, previous_name=previous, until=until, index=i
            )
        else:
            layout.unread.update(n for n in (name, previous) if isinstance(n, str))
    for previous, i in renamed_from.items():
        if previous in layout.shares:
            add_error(
                errors,
                f"shares[{i}].previous_name",
                f'"{previous}" is renamed here but also listed by that name (shares[{layout.shares[previous].index}]); '
                "a share has one entry",
            )


def _parse_capacity(errors: Errors, path: str, raw: Mapping[Any, Any]) -> dict[str, int] | None:
    out: dict[str, int] = {}
    ok = True
    for gpu_type, n in raw.items():
        if not isinstance(gpu_type, str) or not GPU_TYPE_RE.fullmatch(gpu_type):
            add_error(
                errors,
                f"{path}.{gpu_type}",
                "not a GPU type: use a lower-case name such as a10g or h100 (quote a name of digits only)",
            )
            ok = False
        elif isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_INT:
            add_error(
                errors, f"{path}.{gpu_type}", f"must be a whole number of GPUs, 0 or more (got {_shown(n)})"
            )
            ok = False
        elif n:
            out[gpu_type] = n
    return dict(sorted(out.items())) if ok else None


def parse_until(value: Any, now: datetime) -> tuple[datetime | None, str | None]:
    """`until` as an aware datetime: an ISO date and time (2026-12-04T18:00, the server's time zone
    unless it names its own), or a duration from now (30d, 12h, 90m, 1d12h)."""
    from django.utils import timezone

    moment: datetime | None = None
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        return None, "give a time too, e.g. 2026-12-04T18:00 (a date alone is ambiguous)"
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        match = DURATION_RE.fullmatch(text)
        if match and any(match.groups()):
            d, h, m = (int(g or 0) for g in match.groups())
            moment = now + timedelta(days=d, hours=h, minutes=m)
        else:
            try:
                moment = datetime.fromisoformat(text)
            except ValueError:
                moment = None
            if moment is None or (len(text) <= 10 and "T" not in text and " " not in text):
                return None, (
                    f"must be a date and time (2026-12-04T18:00) or a duration from now (30d, 12h, 90m); "
                    f"got {_shown(value)}"
                )
    else:
        return None, f"must be a date and time (2026-12-04T18:00) or a duration (30d); got {_shown(value)}"
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, timezone.get_default_timezone())
    if moment <= now:
        return None, f"{moment.isoformat(timespec='minutes')} has passed: a change can only end in the future"
    if moment - now > MAX_UNTIL:
        return None, "at most a year from now: a change meant to last longer is not temporary"
    return moment.replace(microsecond=0), None


def specs_from_data(data: Mapping[str, Any]) -> Layout:
    """A layout from a document this module wrote (a stored plan or version): trusted, not checked."""
    layout = Layout()
    layout.settings.update(data.get("settings") or {})
    for i, g in enumerate(data.get("groups") or ()):
        layout.groups[g["name"]] = GroupSpec(
            name=g["name"], **{k: g.get(k, d) for k, d in GROUP_DEFAULTS.items()}
        )
        layout.group_index[g["name"]] = i
    for t in data.get("teams", ()):
        members = tuple((m["user"], m["role"]) for m in t.get("members", ()))
        layout.teams[t["slug"]] = TeamSpec(
            slug=t["slug"], name=t["name"], members=members, directory=teamgroups.from_data(t)
        )
    for i, s in enumerate(data.get("shares", ())):
        values = {
            f.name: (dict(s.get(f.name) or {}) if f.is_capacity else s.get(f.name, f.default))
            for f in SHARE_FIELDS
        }
        values.update({key: s.get(key, default) for key, default in TREE_DEFAULTS.items()})
        until = s.get("until")
        layout.shares[s["name"]] = ShareSpec(
            name=s["name"],
            team=s["team"],
            values=values,
            previous_name=s.get("previous_name"),
            until=datetime.fromisoformat(until) if until else None,
            index=i,
        )
    return layout


def plan_data(layout: Layout) -> dict[str, Any]:
    """The document with its directions (previous_name, until): what a stored plan keeps."""
    data = layout.to_data()
    data["shares"] = [
        share_data(s, directions=True) for s in sorted(layout.shares.values(), key=lambda s: s.name)
    ]
    return data


# --- the diff ----------------------------------------------------------------------------------------


def matches(current: Layout, target: Layout) -> dict[str, str | None]:
    """Each share of `target` -> the share of `current` it is (by previous_name, else by name), or
    None for a new one."""
    out: dict[str, str | None] = {}
    for name, spec in target.shares.items():
        if spec.previous_name and spec.previous_name in current.shares:
            out[name] = spec.previous_name
        elif name in current.shares:
            out[name] = name
        else:
            out[name] = None
    return out


def _field_changes(before: Mapping[str, Any], after: Mapping[str, Any], zero: Any = None) -> list[dict]:
    keys = list(dict.fromkeys([*before, *after]))
    out = []
    for key in keys:
        default = flat_default(key) if zero is None else zero
        b, a = before.get(key, default), after.get(key, default)
        if b != a:
            out.append({"field": key, "before": b, "after": a})
    # capacity per type in the order of the document, after the fields before it
    order = {f: i for i, f in enumerate(["name", "team", *FIELDS_BY_NAME, *TREE_DEFAULTS])}
    return sorted(out, key=lambda c: (order.get(c["field"].split(".")[0], 99), c["field"]))


def _team_flat(team: TeamSpec) -> dict[str, Any]:
    return {
        "name": team.name,
        **{f"members.{u}": r for u, r in team.members},
        **teamgroups.flat(team.directory),
    }


def diff(current: Layout, target: Layout) -> list[dict[str, Any]]:
    """Every change from `current` to `target`: teams, then shares, each with its fields (before ->
    after). A change: {"kind": "team"|"share", "name", "action": "added"|"changed"|"removed",
    "renamed_from", "labels" (added, renamed, disabled, enabled, changed, removed), "fields": [{"field",
    "before", "after"}], "until"}."""
    changes: list[dict[str, Any]] = []
    for slug in sorted(set(current.teams) | set(target.teams)):
        old, new = current.teams.get(slug), target.teams.get(slug)
        before = _team_flat(old) if old else {}
        after = _team_flat(new) if new else {}
        fields = _field_changes(before, after)
        if old is None or new is None or fields:
            action = "added" if old is None else "removed" if new is None else "changed"
            changes.append(
                {
                    "kind": "team",
                    "name": slug,
                    "action": action,
                    "renamed_from": None,
                    "labels": [action],
                    "fields": fields,
                    "until": None,
                }
            )
    matched = matches(current, target)
    taken = {m for m in matched.values() if m}
    share_changes = []
    for name, spec in target.shares.items():
        was = matched[name]
        old = current.shares.get(was) if was else None
        before = old.flat() if old else {}
        fields = _field_changes(before, spec.flat())
        labels = []
        if old is None:
            labels.append("added")
        else:
            if was != name:
                labels.append("renamed")
                fields.insert(0, {"field": "name", "before": was, "after": name})
            state = next((f for f in fields if f["field"] == "state"), None)
            if state:
                labels.append("disabled" if state["after"] == DISABLED else "enabled")
            if any(f["field"] not in ("name", "state") for f in fields):
                labels.append("changed")
        if labels:
            share_changes.append(
                {
                    "kind": "share",
                    "name": name,
                    "action": "added" if old is None else "changed",
                    "renamed_from": was if old is not None and was != name else None,
                    "labels": labels,
                    "fields": fields,
                    "until": spec.until.isoformat() if spec.until else None,
                }
            )
    for name, old in current.shares.items():
        if name not in taken:
            share_changes.append(
                {
                    "kind": "share",
                    "name": name,
                    "action": "removed",
                    "renamed_from": None,
                    "labels": ["removed"],
                    "fields": _field_changes(old.flat(), {}),
                    "until": None,
                }
            )
    changes.extend(sorted(share_changes, key=lambda c: c["name"]))
    changes.extend(_tree_changes(current, target))
    return changes


def _tree_changes(current: Layout, target: Layout) -> list[dict[str, Any]]:
    """The groups added, changed or removed, and the fair-sharing settings changed (the tree's diff)."""
    out: list[dict[str, Any]] = []
    for name in sorted(set(current.groups) | set(target.groups)):
        old, new = current.groups.get(name), target.groups.get(name)
        before = group_flat(old) if old else {}
        after = group_flat(new) if new else {}
        if old is None:  # every field, as for a share added: the plan's table shows a row per field
            fields = [{"field": k, "before": None, "after": v} for k, v in after.items()]
        elif new is None:
            fields = [{"field": k, "before": v, "after": None} for k, v in before.items()]
        else:
            fields = [
                {"field": k, "before": before[k], "after": after[k]}
                for k in GROUP_DEFAULTS
                if before[k] != after[k]
            ]
        if old is None or new is None or fields:
            action = "added" if old is None else "removed" if new is None else "changed"
            out.append(
                {
                    "kind": "group",
                    "name": name,
                    "action": action,
                    "renamed_from": None,
                    "labels": [action],
                    "fields": fields,
                    "until": None,
                }
            )
    fields = [
        {"field": k, "before": current.settings.get(k, d), "after": target.settings.get(k, d)}
        for k, d in SETTINGS_DEFAULTS.items()
        if current.settings.get(k, d) != target.settings.get(k, d)
    ]
    if fields:
        out.append(
            {
                "kind": "settings",
                "name": SETTINGS_NAME,
                "action": "changed",
                "renamed_from": None,
                "labels": ["changed"],
                "fields": fields,
                "until": None,
            }
        )
    return out


def value_words(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False) if value == "" or " " in value else value
    return str(value)


def describe(change: Mapping[str, Any]) -> str:
    """One change in a line: "share vision-main changed: capacity.a10g 4 → 8, strategy ..."."""
    head = f"{change['kind']} {change['name']} {', '.join(change['labels'])}"
    if change["action"] == "removed":
        return head
    parts = [f"{f['field']} {value_words(f['before'])} → {value_words(f['after'])}" for f in change["fields"]]
    if change["action"] == "added":
        parts = [f"{f['field']} {value_words(f['after'])}" for f in change["fields"]]
    text = head + (": " + ", ".join(parts) if parts else "")
    if change.get("until"):
        text += f" (until {change['until']})"
    return text


def summary(changes: Sequence[Mapping[str, Any]]) -> str:
    """The changes counted: "2 shares: 1 added (audio), 1 changed (vision-main); 1 team: 1 added
    (audio)", or "no change" (names when there are three or fewer of a kind)."""
    parts = []
    for kind in ("share", "team", "group", "settings"):
        by_action: dict[str, list[str]] = {}
        for c in changes:
            if c["kind"] == kind:
                by_action.setdefault(c["action"], []).append(c["name"])
        if by_action and kind == "settings":
            parts.append("the fair-sharing settings changed")
        elif by_action:
            total = sum(len(v) for v in by_action.values())
            words = ", ".join(
                f"{len(by_action[action])} {action}"
                + (f" ({', '.join(by_action[action])})" if len(by_action[action]) <= 3 else "")
                for action in ("added", "changed", "removed")
                if action in by_action
            )
            parts.append(f"{total} {kind}{'s' if total != 1 else ''}: {words}")
    return "; ".join(parts) or "no change"


# --- writing -----------------------------------------------------------------------------------------

HEADER = (
    "The gpuquota quota layout: every team with its members, every share with its settings.",
    "Edit it, then plan: `gpuquota shares plan -f FILE` shows the change and its effect; nothing changes",
    "before `gpuquota shares apply PLAN`. A share left out is removed; a field left out has its default.",
    "A share may carry `previous_name: OLD` (a rename) and `until: 2026-12-04T18:00` or `until: 30d`",
    "(what the plan changes of it goes back by itself then). Lines from # on are comments.",
)


def _plain_ok(text: str) -> bool:
    import yaml

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", text):
        return False
    return yaml.resolver.Resolver().resolve(yaml.ScalarNode, text, (True, False)) == "tag:yaml.org,2002:str"


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # a weight: YAML reads 1.5 back as a number
        return repr(value)
    text = str(value)
    return text if _plain_ok(text) else json.dumps(text, ensure_ascii=False)


def _flow_mapping(mapping: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{_scalar(k)}: {_scalar(v)}" for k, v in mapping.items()) + "}"


def render_yaml(
    data: Mapping[str, Any],
    *,
    notes: Mapping[str, Sequence[str]] | None = None,
    header: Sequence[str] = HEADER,
) -> str:
    """The document as YAML, in its stable order, with a header and, under a share, `notes[name]` as
    comments (e.g. its temporary changes). yaml.safe_load of the text gives `data` back."""
    notes = notes or {}
    lines = [f"# {h}" if h else "#" for h in header]
    lines.append(f"format: {_scalar(data.get('format', FORMAT))}")
    if TEAM_PART_KEY in data:
        lines.append(f"{TEAM_PART_KEY}: [{', '.join(_scalar(t) for t in data[TEAM_PART_KEY])}]")
    if data.get("settings"):
        lines.append("settings:")
        lines.extend(f"  {k}: {_scalar(v)}" for k, v in data["settings"].items())
    lines.append("teams:" + (" []" if not data["teams"] else ""))
    for t in data["teams"]:
        lines.append(f"  - slug: {_scalar(t['slug'])}")
        lines.append(f"    name: {_scalar(t['name'])}")
        lines.append("    members:" + (" []" if not t["members"] else ""))
        lines.extend(f"      - {_flow_mapping(m)}" for m in t["members"])
        lines.extend(
            f"    {key}: [{', '.join(_scalar(g) for g in t[key])}]" for key in teamgroups.KEYS if t.get(key)
        )
    if data.get("groups"):
        lines.append("groups:")
        lines.extend(f"  - {_flow_mapping(g)}" for g in data["groups"])
    lines.append("shares:" + (" []" if not data["shares"] else ""))
    for s in data["shares"]:
        first = True
        for key, value in s.items():
            text = _flow_mapping(value) if isinstance(value, Mapping) else _scalar(value)
            lines.append(f"  {'- ' if first else '  '}{key}: {text}")
            first = False
        lines.extend(f"    # {n}" for n in notes.get(s["name"], ()))
    return "\n".join(lines) + "\n"
