"""Simulator scenarios: load and validate ../shared/spec/SCENARIO.md into frozen dataclasses.

This module owns the scenario format: which fields exist, their defaults (those of SEMANTICS.md) and
what makes a scenario invalid. It imports nothing from Django. `parse()` takes the decoded JSON,
`load()` a path; both raise `ScenarioError` naming every bad field with its job, share, node or event,
e.g. ``jobs[3] (id "a4"): share "nope" is not defined``.

Additions to SCENARIO.md, all optional: a top-level ``description`` (free text, e.g. a trace's
provenance); the job fields of SEMANTICS.md ``name``, ``command`` (both ignored by the simulator),
``preemption_grace_s`` (overrides ``settings.preemption_grace_s``) and ``max_runtime_s`` (an attempt
that runs this long without finishing ends the job FAILED).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from quotas.engine import policy
from quotas.engine.tree import MAX_LIMIT, GroupSpec, validate_tree

ENABLED = "ENABLED"
DISABLED = "DISABLED"
SHARE_STATES = (ENABLED, DISABLED)

UPDATE_SHARE = "update_share"
UPDATE_JOB = "update_job"
UPDATE_GROUP = "update_group"
CANCEL = "cancel"
EVENT_KINDS = (UPDATE_SHARE, UPDATE_JOB, CANCEL, UPDATE_GROUP)

MAX_PRIORITY = 9999
SHARE_NAME_RE = re.compile(r"[a-z0-9-]{1,63}")
GPU_TYPE_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class ScenarioError(ValueError):
    """An invalid scenario. `errors` lists every problem found, each naming its field and owner."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


@dataclass(frozen=True, slots=True)
class Settings:
    tick_s: int = 1
    preemption_grace_s: int = 30
    starvation_s: int = 3600
    until_s: int | None = None
    fair_share_half_life_s: int = 0
    fair_reclaim: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_type: str
    gpus: int
    ready_at: int = 0
    lost_at: int | None = None


@dataclass(frozen=True, slots=True)
class Share:
    name: str
    team: str
    capacity: Mapping[str, int]
    strategy: str = policy.LEND_AND_BORROW
    borrow_limit: int = policy.UNLIMITED
    in_share_preemption: bool = False
    min_runtime_s: int = 0
    state: str = ENABLED
    group: str | None = None
    weight: float = 1


@dataclass(frozen=True, slots=True)
class Group:
    """A group of the organisation tree (SEMANTICS "Groups: the organisation tree")."""

    name: str
    parent: str | None = None
    weight: float = 1
    borrow_limit: int = policy.UNLIMITED
    lend_limit: int = policy.UNLIMITED

    def spec(self) -> GroupSpec:
        return GroupSpec(self.name, self.parent, self.weight, self.borrow_limit, self.lend_limit)


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    share: str
    submit_at: int
    duration_s: int
    gpus: int
    gpu_type: str
    priority: int = 0
    max_preemptions: int = -1
    checkpoint_every_s: int | None = None
    checkpoint_on_stop: bool = False  # it saves when told to stop: a pre-emption loses nothing
    preemption_grace_s: int | None = None  # None: settings.preemption_grace_s
    max_runtime_s: int | None = None
    name: str | None = None
    command: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    at: int
    kind: str
    job: str | None = None
    share: str | None = None
    group: str | None = None
    set: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Scenario:
    settings: Settings
    nodes: tuple[Node, ...]
    shares: tuple[Share, ...]
    jobs: tuple[Job, ...]
    events: tuple[Event, ...] = ()
    description: str = ""
    groups: tuple[Group, ...] = ()

    def grace_s(self, job: Job) -> int:
        if job.preemption_grace_s is None:
            return self.settings.preemption_grace_s
        return job.preemption_grace_s

    def to_dict(self) -> dict[str, Any]:
        """The scenario as JSON-ready data with every default written out."""

        def plain(obj: Any) -> dict[str, Any]:
            out = {}
            for name in obj.__slots__:
                value = getattr(obj, name)
                out[name] = dict(value) if isinstance(value, Mapping) else value
            return out

        data: dict[str, Any] = {
            "settings": plain(self.settings),
            "nodes": [plain(n) for n in self.nodes],
            **({"groups": [plain(g) for g in self.groups]} if self.groups else {}),
            "shares": [plain(s) for s in self.shares],
            "jobs": [plain(j) for j in self.jobs],
            "events": [
                {k: v for k, v in plain(e).items() if v is not None and (k != "set" or v)}
                for e in self.events
            ],
        }
        if self.description:
            data["description"] = self.description
        return data


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError([f"cannot read {path}: {exc.strerror}"]) from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError([f"{path}: not valid JSON: {exc}"]) from exc
    return parse(data)


def parse(data: Any) -> Scenario:
    """Validate decoded scenario JSON and apply the defaults of SEMANTICS.md."""
    return _Parser().scenario(data)


# Field tables: name -> (required, checker). A checker returns (value, error or None).

_MISSING = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(lo: int | None = None, hi: int | None = None, *, nullable: bool = False):
    def check(value: Any):
        if value is None and nullable:
            return None, None
        if not _is_int(value):
            return None, "must be an integer" + (" or null" if nullable else "")
        if lo is not None and value < lo:
            return None, f"must be at least {lo}, got {value}"
        if hi is not None and value > hi:
            return None, f"must be at most {hi}, got {value}"
        return value, None

    return check


def _choice(options: tuple[str, ...]):
    def check(value: Any):
        if value not in options:
            return None, f"must be one of {', '.join(options)}"
        return value, None

    return check


def _string(pattern: re.Pattern[str] | None = None, *, nullable: bool = False):
    def check(value: Any):
        if value is None and nullable:
            return None, None
        if not isinstance(value, str) or not value:
            return None, "must be a non-empty string"
        if pattern is not None and not pattern.fullmatch(value):
            return None, f"must match {pattern.pattern}, got {value!r}"
        return value, None

    return check


def _bool(value: Any):
    if not isinstance(value, bool):
        return None, "must be true or false"
    return value, None


def _weight(value: Any):
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        return None, f"must be a positive number, got {value!r}"
    return value, None


def _capacity(value: Any):
    if not isinstance(value, Mapping):
        return None, 'must be an object {"gpu_type": gpus}'
    for gpu_type, gpus in value.items():
        if not isinstance(gpu_type, str) or not GPU_TYPE_RE.fullmatch(gpu_type):
            return None, f"GPU type {gpu_type!r} must match {GPU_TYPE_RE.pattern}"
        if not _is_int(gpus) or gpus < 0:
            return None, f"{gpu_type} must be a non-negative integer, got {gpus!r}"
    return MappingProxyType(dict(sorted(value.items()))), None


_SETTINGS_FIELDS = {
    "tick_s": (False, _int(1)),
    "preemption_grace_s": (False, _int(0)),
    "starvation_s": (False, _int(0)),
    "until_s": (False, _int(0, nullable=True)),
    "fair_share_half_life_s": (False, _int(0)),
    "fair_reclaim": (False, _bool),
}
_GROUP_FIELDS = {
    "name": (True, _string(SHARE_NAME_RE)),
    "parent": (False, _string(SHARE_NAME_RE, nullable=True)),
    "weight": (False, _weight),
    "borrow_limit": (False, _int(policy.UNLIMITED, MAX_LIMIT)),
    "lend_limit": (False, _int(policy.UNLIMITED, 100)),
}
_NODE_FIELDS = {
    "name": (True, _string()),
    "gpu_type": (True, _string(GPU_TYPE_RE)),
    "gpus": (True, _int(1)),
    "ready_at": (False, _int(0)),
    "lost_at": (False, _int(0, nullable=True)),
}
_SHARE_FIELDS = {
    "name": (True, _string(SHARE_NAME_RE)),
    "team": (False, _string()),
    "capacity": (True, _capacity),
    "strategy": (False, _choice(policy.STRATEGIES)),
    "borrow_limit": (False, _int(policy.UNLIMITED)),
    "in_share_preemption": (False, _bool),
    "min_runtime_s": (False, _int(0)),
    "state": (False, _choice(SHARE_STATES)),
    "group": (False, _string(SHARE_NAME_RE, nullable=True)),
    "weight": (False, _weight),
}
_JOB_FIELDS = {
    "id": (True, _string()),
    "share": (True, _string()),
    "submit_at": (True, _int(0)),
    "duration_s": (True, _int(1)),
    "gpus": (True, _int(1)),
    "gpu_type": (True, _string(GPU_TYPE_RE)),
    "priority": (False, _int(0, MAX_PRIORITY)),
    "max_preemptions": (False, _int(-1)),
    "checkpoint_every_s": (False, _int(1, nullable=True)),
    "checkpoint_on_stop": (False, _bool),
    "preemption_grace_s": (False, _int(0, nullable=True)),
    "max_runtime_s": (False, _int(1, nullable=True)),
    "name": (False, _string(nullable=True)),
    "command": (False, _string(nullable=True)),
}
# What update_share / update_job may set: the share fields a running system can change, and priority.
_SHARE_UPDATES = {
    k: _SHARE_FIELDS[k]
    for k in (
        "capacity",
        "strategy",
        "borrow_limit",
        "in_share_preemption",
        "min_runtime_s",
        "state",
        "group",
        "weight",
    )
}
_GROUP_UPDATES = {k: _GROUP_FIELDS[k] for k in ("parent", "weight", "borrow_limit", "lend_limit")}
_JOB_UPDATES = {"priority": _JOB_FIELDS["priority"]}
_EVENT_FIELDS = {
    UPDATE_SHARE: ("share", _SHARE_UPDATES),
    UPDATE_JOB: ("job", _JOB_UPDATES),
    CANCEL: ("job", None),
    UPDATE_GROUP: ("group", _GROUP_UPDATES),
}
_TOP_FIELDS = ("settings", "nodes", "groups", "shares", "jobs", "events", "description")


class _Parser:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def error(self, where: str, message: str) -> None:
        self.errors.append(f"{where}: {message}" if where else message)

    def fields(self, where: str, raw: Any, table: Mapping[str, tuple]) -> dict[str, Any] | None:
        """Check one object against a field table; returns the good fields (bad ones are left out)."""
        if not isinstance(raw, Mapping):
            self.error(where, "must be an object")
            return None
        for key in raw:
            if key not in table:
                hint = difflib.get_close_matches(str(key), list(table), n=1)
                suggestion = f' (did you mean "{hint[0]}"?)' if hint else ""
                self.error(where, f'unknown field "{key}"{suggestion}')
        out: dict[str, Any] = {}
        for key, (required, check) in table.items():
            value = raw.get(key, _MISSING)
            if value is _MISSING:
                if required:
                    self.error(where, f'field "{key}" is required')
                continue
            value, problem = check(value)
            if problem:
                self.error(where, f"{key} {problem}")
            else:
                out[key] = value
        return out

    def items(self, data: Mapping[str, Any], key: str) -> list[Any]:
        raw = data.get(key, [] if key == "events" else _MISSING)
        if raw is _MISSING:
            self.error("", f'field "{key}" is required')
            return []
        if not isinstance(raw, list):
            self.error(key, "must be a list")
            return []
        return raw

    def scenario(self, data: Any) -> Scenario:
        if not isinstance(data, Mapping):
            raise ScenarioError(["scenario must be a JSON object"])
        for key in data:
            if key not in _TOP_FIELDS:
                self.error("", f'unknown top-level field "{key}"')
        description = data.get("description", "")
        if not isinstance(description, str):
            self.error("description", "must be a string")
            description = ""
        settings = Settings(**(self.fields("settings", data.get("settings", {}), _SETTINGS_FIELDS) or {}))
        nodes = self.nodes(self.items(data, "nodes"))
        groups = self.groups(data.get("groups", []))
        shares = self.shares(self.items(data, "shares"))
        jobs = self.jobs(self.items(data, "jobs"), nodes, {s.name for s in shares})
        events = self.events(
            self.items(data, "events"), {s.name for s in shares}, jobs, {g.name for g in groups}
        )
        if not self.errors:
            self.tree(groups, shares, events)
        if self.errors:
            raise ScenarioError(self.errors)
        return Scenario(
            settings=settings,
            nodes=tuple(nodes),
            shares=tuple(shares),
            jobs=tuple(jobs),
            events=tuple(events),
            description=description,
            groups=tuple(groups),
        )

    def nodes(self, raw: list[Any]) -> list[Node]:
        nodes, seen = [], set()
        for i, item in enumerate(raw):
            where = f"nodes[{i}]" + (
                f" ({item['name']})" if isinstance(item, Mapping) and "name" in item else ""
            )
            got = self.fields(where, item, _NODE_FIELDS)
            if got is None or not all(k in got for k in ("name", "gpu_type", "gpus")):
                continue
            if got["name"] in seen:
                self.error(where, f'duplicate node name "{got["name"]}"')
                continue
            seen.add(got["name"])
            node = Node(**got)
            if node.lost_at is not None and node.lost_at <= node.ready_at:
                self.error(where, f"lost_at ({node.lost_at}) must be later than ready_at ({node.ready_at})")
            nodes.append(node)
        return nodes

    def groups(self, raw: Any) -> list[Group]:
        if not isinstance(raw, list):
            self.error("groups", "must be a list")
            return []
        groups = []
        for i, item in enumerate(raw):
            name = item.get("name") if isinstance(item, Mapping) else None
            where = f"groups[{i}]" + (f" ({name})" if isinstance(name, str) else "")
            got = self.fields(where, item, _GROUP_FIELDS)
            if got is None or "name" not in got:
                continue
            groups.append(Group(**got))
        return groups

    def tree(self, groups: list[Group], shares: list[Share], events: list[Event]) -> None:
        """The tree must be valid as given and after every event that changes it (SEMANTICS: a cycle, an
        unknown group, a fifth level are refused), each problem named with its field."""
        problems = validate_tree([g.spec() for g in groups], shares)
        for path, message in problems:
            where, field_name = _tree_where(path, groups, shares)
            self.error(where, f"{field_name}: {message}" if field_name else message)
        if problems:
            return
        by_group = {g.name: g for g in groups}
        by_share = {s.name: s for s in shares}
        for i, event in sorted(enumerate(events), key=lambda e: e[1].at):
            if event.kind == UPDATE_GROUP:
                by_group[event.group] = dataclasses.replace(by_group[event.group], **event.set)
            elif event.kind == UPDATE_SHARE and event.set.keys() & {"group", "weight"}:
                by_share[event.share] = dataclasses.replace(by_share[event.share], **event.set)
            else:
                continue
            after = validate_tree([g.spec() for g in by_group.values()], list(by_share.values()))
            for path, message in after:
                self.error(f"events[{i}] ({event.kind} at {event.at}) set", f"{path}: {message}")
            if after:
                return

    def shares(self, raw: list[Any]) -> list[Share]:
        shares, seen = [], set()
        for i, item in enumerate(raw):
            name = item.get("name") if isinstance(item, Mapping) else None
            where = f"shares[{i}]" + (f" ({name})" if isinstance(name, str) else "")
            got = self.fields(where, item, _SHARE_FIELDS)
            if got is None or "name" not in got or "capacity" not in got:
                continue
            if got["name"] in seen:
                self.error(where, f'duplicate share name "{got["name"]}"')
                continue
            seen.add(got["name"])
            got.setdefault("team", got["name"])
            shares.append(Share(**got))
        return shares

    def jobs(self, raw: list[Any], nodes: list[Node], share_names: set[str]) -> list[Job]:
        shapes: dict[str, dict[int, int]] = {}  # gpu_type -> node size -> how many such nodes
        for node in nodes:
            sizes = shapes.setdefault(node.gpu_type, {})
            sizes[node.gpus] = sizes.get(node.gpus, 0) + 1
        jobs, seen = [], set()
        for i, item in enumerate(raw):
            job_id = item.get("id") if isinstance(item, Mapping) else None
            where = f"jobs[{i}]" + (f' (id "{job_id}")' if isinstance(job_id, str) else "")
            got = self.fields(where, item, _JOB_FIELDS)
            if got is None or not all(k in got for k, (req, _) in _JOB_FIELDS.items() if req):
                continue
            if got["id"] in seen:
                self.error(where, f'duplicate job id "{got["id"]}"')
                continue
            seen.add(got["id"])
            job = Job(**got)
            if job.share not in share_names:
                self.error(where, f'share "{job.share}" is not defined')
            problem = _shape_problem(job, shapes.get(job.gpu_type))
            if problem:
                self.error(where, problem)
            jobs.append(job)
        return jobs

    def events(
        self, raw: list[Any], share_names: set[str], jobs: list[Job], group_names: set[str] = frozenset()
    ) -> list[Event]:
        submit_at = {j.id: j.submit_at for j in jobs}
        events = []
        for i, item in enumerate(raw):
            kind = item.get("kind") if isinstance(item, Mapping) else None
            where = f"events[{i}]"
            if kind not in _EVENT_FIELDS:
                self.error(where, f"kind must be one of {', '.join(EVENT_KINDS)}, got {kind!r}")
                continue
            target, updates = _EVENT_FIELDS[kind]
            table = {"at": (True, _int(0)), "kind": (True, _choice(EVENT_KINDS)), target: (True, _string())}
            if updates is not None:
                table["set"] = (True, lambda v: (v, None))
            where = (
                f"{where} ({kind}" + (f' "{item[target]}"' if isinstance(item.get(target), str) else "") + ")"
            )
            got = self.fields(where, item, table)
            if got is None or len(got) < len(table):
                continue
            if target == "share" and got["share"] not in share_names:
                self.error(where, f'share "{got["share"]}" is not defined')
                continue
            if target == "group" and got["group"] not in group_names:
                self.error(where, f'group "{got["group"]}" is not defined')
                continue
            if target == "job":
                if got["job"] not in submit_at:
                    self.error(where, f'job "{got["job"]}" is not defined')
                    continue
                if got["at"] < submit_at[got["job"]]:
                    self.error(
                        where, f"at ({got['at']}) is before the job's submit_at ({submit_at[got['job']]})"
                    )
                    continue
            if updates is not None:
                values = self.fields(
                    f"{where} set", got["set"], {k: (False, c) for k, (_, c) in updates.items()}
                )
                if values is None:
                    continue
                if not got["set"]:
                    self.error(f"{where} set", f"must set at least one of {', '.join(updates)}")
                    continue
                got["set"] = MappingProxyType(values)
            events.append(Event(**got))
        return events


def _tree_where(path: str, groups: list[Group], shares: list[Share]) -> tuple[str, str]:
    """validate_tree's path (`groups[1].parent`) as this module names fields: (`groups[1] (team)`,
    `parent`)."""
    head, _, field_name = path.partition(".")
    kind, _, rest = head.partition("[")
    items = groups if kind == "groups" else shares
    return f"{head} ({items[int(rest.rstrip(']'))].name})", field_name


def _shape_problem(job: Job, sizes: Mapping[int, int] | None) -> str | None:
    """Why no node shape of the job's type could ever run it, or None (SEMANTICS.md, Capacity)."""
    if not sizes:
        return f'no node has gpu_type "{job.gpu_type}"'
    largest = max(sizes)
    if job.gpus <= largest:
        return None
    # A gang: whole nodes of one size.
    for size, count in sizes.items():
        if job.gpus % size == 0 and job.gpus // size <= count:
            return None
    shapes = ", ".join(f"{n}×{s}" for s, n in sorted(sizes.items()))
    return (
        f"gpus {job.gpus} is larger than the largest {job.gpu_type} node ({largest}) and is not a whole "
        f"number of nodes of one size that exist (nodes: {shapes} GPUs)"
    )
