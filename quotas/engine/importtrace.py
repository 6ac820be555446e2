"""Replay your own history: a job trace turned into a simulator scenario (../shared/spec/SCENARIO.md).

    python -m quotas.engine.importtrace TRACE [--format itp|sacct] [--out SCENARIO.json]
        [--nodes 168 --node-gpus 8 --gpu-type a100] [--start S --end S]
        [--top 8 | --layout LAYOUT.json] [--group account|qos]
        [--checkpoint-fraction 0.5 --checkpoint-every 1800 --seed 1 [--checkpoint-on-stop]]
        [--grace 30] [--min-runtime S] [--strategy LEND_AND_BORROW]

Two shapes of trace are read:
- **itp**: CSV with the columns of ../shared/data/msft-itp-2021.csv: `submit_s` (seconds from the first
  submission), `duration_s`, `gpus`, `group`. The group (the ITP cluster) becomes the share.
- **sacct**: Slurm's `sacct --parsable2` output (`|`-separated, with its header line), e.g.
  `sacct -a -X -P -S 2024-03-01 -E 2024-03-15 --format=JobID,Account,QOS,Submit,Start,End,AllocTRES,ReqTRES`.
  Submit time from `Submit`, run time `End - Start` (both must be known: a job that never started or
  still runs is skipped), GPUs from `AllocTRES` (`gres/gpu=N`, or the sum of `gres/gpu:TYPE=N`), else
  `ReqTRES`; the share is the `Account` (or `QOS` with `--group qos`). Job steps (`123.batch`) are
  skipped. Times without a zone are read as they are (only differences count).

The scenario: `--nodes` × `--node-gpus` GPUs of one type; jobs submitted in [start, end) of the trace
(seconds from its first submission, or ISO dates for sacct), re-based so that `start` is 0. Shares,
either one per group (`--top N`: the N groups with the most GPU-hours in the window each get a share,
the rest share one named `other`; every share's capacity is in proportion to its GPU-hours, by largest
remainder, summing to the cluster's GPUs), or from a layout file (`--layout`): a JSON list of shares in
the scenario's format, each with an optional `"groups": [...]` naming the groups it takes (default: its
own name; `"*"` takes every group no other share names). Checkpoints: a seeded draw picks
`--checkpoint-fraction` of the jobs to checkpoint every `--checkpoint-every` seconds.

A row that cannot become a job (a field missing or not a number, no GPUs, a job no node shape of the
cluster can hold, a group no share takes) is counted under its reason and reported (the first lines of
each kind), never a traceback; the exit status is 2 when no job is left or the input cannot be read.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import random
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quotas.engine import policy
from quotas.engine import scenario as sc

ITP = "itp"
SACCT = "sacct"
FORMATS = (ITP, SACCT)
OTHER = "other"
# The real trace of ../shared/data/README.md (Microsoft ITP, 2021; microsoft/elasticflow-traces, MIT).
# ../shared beside the checkout (or shared/ inside it, where a checkout has one).
_ROOT = Path(__file__).resolve().parents[2]
ITP_TRACE = (
    next(
        (p for p in (_ROOT.parent / "shared", _ROOT / "shared") if (p / "data").is_dir()),
        _ROOT.parent / "shared",
    )
    / "data"
    / "msft-itp-2021.csv"
)
EXAMPLES_PER_REASON = 5

_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=(\d+)")
_TRES_GPU_TOTAL = re.compile(r"(?:^|,)gres/gpu=(\d+)")


class TraceError(ValueError):
    """The trace cannot be imported at all (unreadable, no header, no job left)."""


@dataclass
class Options:
    format: str | None = None  # None: from the header
    nodes: int = 168
    node_gpus: int = 8
    gpu_type: str = "a100"
    start: float | str | None = None  # seconds from the first submission, or an ISO date (sacct)
    end: float | str | None = None
    top: int = 8
    layout: Sequence[Mapping[str, Any]] | None = None
    group: str = "account"  # sacct: account or qos
    strategy: str = policy.LEND_AND_BORROW
    min_runtime_s: int = 0
    grace_s: int = 30
    starvation_s: int = 3600
    checkpoint_fraction: float = 0.0
    checkpoint_every_s: int = 1800
    checkpoint_on_stop: bool = False
    seed: int = 1
    source: str = "trace"


@dataclass
class Report:
    """What the import read and what it left out, and why."""

    rows: int = 0
    jobs: int = 0
    outside_window: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[int]] = field(default_factory=dict)  # reason -> first line numbers
    gpu_hours: dict[str, float] = field(default_factory=dict)  # share -> GPU-hours of its jobs

    def skip(self, line: int, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        lines = self.examples.setdefault(reason, [])
        if len(lines) < EXAMPLES_PER_REASON:
            lines.append(line)

    def text(self) -> str:
        out = [
            f"{self.rows:,} rows read: {self.jobs:,} jobs imported, {self.outside_window:,} outside the "
            f"window, {sum(self.skipped.values()):,} skipped"
        ]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])):
            lines = ", ".join(str(x) for x in self.examples.get(reason, ()))
            out.append(f"  {n:,} {reason} (lines {lines}{', ...' if n > len(self.examples[reason]) else ''})")
        return "\n".join(out) + "\n"


@dataclass(frozen=True, slots=True)
class _Row:
    line: int
    job_id: str
    group: str
    submit: float  # seconds from the trace's first submission
    duration: int
    gpus: int


# -- reading ---------------------------------------------------------------------------------------


def _sniff(header: str) -> str:
    if "|" in header:
        return SACCT
    return ITP


def _int(text: str) -> int | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    if value != value or value in (float("inf"), float("-inf")) or value != int(value):
        return None
    return int(value)


def _read_itp(lines: Iterable[str], report: Report) -> list[_Row]:
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        raise TraceError("the trace is empty")
    names = [h.strip().lower() for h in header]
    missing = [c for c in ("submit_s", "duration_s", "gpus", "group") if c not in names]
    if missing:
        raise TraceError(f"not an ITP-shaped CSV: no column {', '.join(missing)} in the header")
    col = {c: names.index(c) for c in ("submit_s", "duration_s", "gpus", "group")}
    rows = []
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            break
        except csv.Error:  # a field over the reader's limit, an unterminated quote: that row only
            report.rows += 1
            report.skip(reader.line_num, "rows the CSV reader cannot read")
            continue
        n = reader.line_num
        if not fields or not any(f.strip() for f in fields):
            continue
        report.rows += 1
        if len(fields) < len(names):
            report.skip(n, "rows with too few fields")
            continue
        submit = _int(fields[col["submit_s"]])
        duration = _int(fields[col["duration_s"]])
        gpus = _int(fields[col["gpus"]])
        group = fields[col["group"]].strip()
        if submit is None or submit < 0:
            report.skip(n, "rows whose submit_s is not a whole number >= 0")
        elif duration is None or duration < 1:
            report.skip(n, "rows whose duration_s is not a whole number >= 1")
        elif gpus is None or gpus < 0:
            report.skip(n, "rows whose gpus is not a whole number")
        elif gpus == 0:
            report.skip(n, "jobs without GPUs")
        elif not group:
            report.skip(n, "rows without a group")
        else:
            rows.append(_Row(n, f"j{n - 1:06d}", group, float(submit), duration, gpus))
    return rows


def _when(text: str) -> datetime | None:
    text = text.strip()
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    # One with a zone is compared as UTC, one without as it is (only differences count).
    return when.astimezone(UTC).replace(tzinfo=None) if when.tzinfo is not None else when


def _tres_gpus(tres: str) -> int | None:
    """GPUs in a TRES string: the untyped total `gres/gpu=N` if given, else the sum of the typed ones;
    None when it names no GPU."""
    total = _TRES_GPU_TOTAL.search(tres)
    if total:
        return int(total.group(1))
    typed = _TRES_GPU.findall(tres)
    return sum(int(x) for x in typed) if typed else None


def _read_sacct(lines: Iterable[str], report: Report, group_by: str) -> tuple[list[_Row], datetime | None]:
    it = iter(lines)
    header = next(it, None)
    if header is None:
        raise TraceError("the trace is empty")
    names = [h.strip().lower() for h in header.rstrip("\r\n").split("|")]
    group_col = "qos" if group_by == "qos" else "account"
    missing = [c for c in ("jobid", "submit", "start", "end", group_col) if c not in names]
    if "alloctres" not in names and "reqtres" not in names:
        missing.append("AllocTRES or ReqTRES")
    if missing:
        raise TraceError(f"not sacct --parsable2 output: no column {', '.join(missing)} in the header")
    col = {c: names.index(c) for c in names}
    parsed = []
    first: datetime | None = None
    for n, line in enumerate(it, start=2):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = line.split("|")
        job_id = fields[col["jobid"]].strip() if len(fields) > col["jobid"] else ""
        if "." in job_id:
            continue  # a job step (123.batch, 123.0): the job's own line counts
        report.rows += 1
        if len(fields) < len(names):
            report.skip(n, "rows with too few fields")
            continue
        submit = _when(fields[col["submit"]])
        start = _when(fields[col["start"]])
        end = _when(fields[col["end"]])
        gpus = None
        for tres in ("alloctres", "reqtres"):
            if tres in col and gpus is None:
                gpus = _tres_gpus(fields[col[tres]])
        group = fields[col[group_col]].strip()
        if not job_id:
            report.skip(n, "rows without a JobID")
        elif submit is None:
            report.skip(n, "rows whose Submit is not a date")
        elif start is None:
            report.skip(n, "jobs that never started")
        elif end is None:
            report.skip(n, "jobs still running (no End)")
        elif (end - start).total_seconds() < 1:
            report.skip(n, "jobs that ran under a second")
        elif not gpus:
            report.skip(n, "jobs without GPUs")
        elif not group:
            report.skip(n, f"rows without {'a QOS' if group_col == 'qos' else 'an Account'}")
        else:
            if first is None or submit < first:
                first = submit
            parsed.append((n, job_id, group, submit, int((end - start).total_seconds()), gpus))
    rows = [
        _Row(n, job_id, group, (submit - first).total_seconds(), duration, gpus)
        for n, job_id, group, submit, duration, gpus in parsed
    ]
    return rows, first


def _bound(value: float | str | None, first: datetime | None, name: str) -> float | None:
    if value is None or isinstance(value, int | float):
        return value
    try:
        return float(value)
    except ValueError:
        pass
    when = _when(value)
    if when is None:
        raise TraceError(f"--{name} must be seconds from the first submission or an ISO date, got {value!r}")
    if first is None:
        raise TraceError(f"--{name} as a date needs a trace with dates (sacct)")
    return (when - first).total_seconds()


# -- shares ----------------------------------------------------------------------------------------


def share_name(group: str) -> str:
    """A group's name as a share name ([a-z0-9-]{1,63})."""
    name = re.sub(r"[^a-z0-9-]+", "-", group.lower()).strip("-")[:63]
    return name or "group"


def largest_remainder(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """`total` split in proportion to `weights` by largest remainder (Hamilton): each gets the whole
    part of its quota, and the GPUs left go to the largest fractional parts (ties: larger weight,
    then name). Sums to `total` when any weight is positive."""
    whole = sum(weights.values())
    if whole <= 0:
        return dict.fromkeys(weights, 0)
    quota = {k: w * total / whole for k, w in weights.items()}
    out = {k: int(q) for k, q in quota.items()}
    left = total - sum(out.values())
    for k in sorted(quota, key=lambda k: (-(quota[k] - out[k]), -weights[k], k))[:left]:
        out[k] += 1
    return out


def _proportional_shares(rows: list[_Row], opts: Options) -> tuple[list[dict[str, Any]], dict[str, str]]:
    hours: dict[str, float] = {}
    for r in rows:
        hours[r.group] = hours.get(r.group, 0.0) + r.gpus * r.duration / 3600
    ranked = sorted(hours, key=lambda g: (-hours[g], g))
    kept = ranked if opts.top <= 0 or len(ranked) <= opts.top + 1 else ranked[: opts.top]
    to_share: dict[str, str] = {}
    weights: dict[str, float] = {}
    taken: set[str] = set()
    for g in kept:
        name = share_name(g)
        while name in taken or name == OTHER:
            name = f"{name[:60]}-{len(taken)}"
        taken.add(name)
        to_share[g] = name
        weights[name] = hours[g]
    for g in ranked[len(kept) :]:
        to_share[g] = OTHER
        weights[OTHER] = weights.get(OTHER, 0.0) + hours[g]
    capacity = largest_remainder(weights, opts.nodes * opts.node_gpus)
    shares = [
        {
            "name": name,
            "team": name,
            "capacity": {opts.gpu_type: capacity[name]},
            "strategy": opts.strategy,
            "borrow_limit": policy.UNLIMITED,
            "in_share_preemption": False,
            **({"min_runtime_s": opts.min_runtime_s} if opts.min_runtime_s else {}),
        }
        for name in sorted(weights, key=lambda n: (n == OTHER, -weights[n], n))
    ]
    return shares, to_share


def _layout_shares(
    layout: Sequence[Mapping[str, Any]], groups: Iterable[str]
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    if not isinstance(layout, Sequence) or isinstance(layout, str):
        raise TraceError("the layout must be a JSON list of shares")
    shares = []
    named: dict[str, str] = {}
    wildcard = None
    for i, item in enumerate(layout):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise TraceError(f"layout[{i}]: a share must be an object with a name")
        share = {k: v for k, v in item.items() if k != "groups"}
        takes = item.get("groups", [item["name"]])
        if not isinstance(takes, list) or not all(isinstance(g, str) for g in takes):
            raise TraceError(f"layout[{i}] ({item['name']}): groups must be a list of names")
        for g in takes:
            if g == "*":
                wildcard = item["name"]
            elif g in named:
                raise TraceError(f"layout[{i}] ({item['name']}): group {g!r} is taken by {named[g]} too")
            else:
                named[g] = item["name"]
        shares.append(share)
    to_share = {g: named.get(g, wildcard) for g in groups}
    return shares, {g: s for g, s in to_share.items() if s is not None}


# -- the scenario ---------------------------------------------------------------------------------


def import_trace(lines: Iterable[str], opts: Options) -> tuple[dict[str, Any], Report]:
    """The scenario (JSON-ready, valid) made from a trace's lines, and what was read and skipped.
    Raises TraceError when nothing can be made of it."""
    report = Report()
    lines = iter(lines)
    header = next(lines, None)
    if header is None:
        raise TraceError("the trace is empty")
    fmt = opts.format or _sniff(header)
    first: datetime | None = None
    if fmt == ITP:
        rows = _read_itp(_chain(header, lines), report)
    elif fmt == SACCT:
        rows, first = _read_sacct(_chain(header, lines), report, opts.group)
    else:
        raise TraceError(f"--format must be one of {', '.join(FORMATS)}")
    if opts.nodes < 1 or opts.node_gpus < 1:
        raise TraceError("--nodes and --node-gpus must be at least 1")
    if not sc.GPU_TYPE_RE.fullmatch(opts.gpu_type):
        raise TraceError(f"--gpu-type must match {sc.GPU_TYPE_RE.pattern}")

    start = _bound(opts.start, first, "start")
    end = _bound(opts.end, first, "end")
    origin = start if start is not None else 0.0
    in_window = []
    for r in rows:
        if (start is not None and r.submit < start) or (end is not None and r.submit >= end):
            report.outside_window += 1
            continue
        if r.gpus > opts.node_gpus and (r.gpus % opts.node_gpus or r.gpus // opts.node_gpus > opts.nodes):
            report.skip(r.line, f"jobs no node shape of {opts.nodes} x {opts.node_gpus} GPUs can hold")
            continue
        in_window.append(r)

    if opts.layout is not None:
        shares, to_share = _layout_shares(opts.layout, {r.group for r in in_window})
    else:
        shares, to_share = _proportional_shares(in_window, opts)
    rng = random.Random(opts.seed)
    jobs = []
    ids: set[str] = set()
    for r in sorted(in_window, key=lambda r: (r.submit, r.line)):
        share = to_share.get(r.group)
        if share is None:
            report.skip(r.line, "jobs of a group no share of the layout takes")
            continue
        job_id = r.job_id
        if job_id in ids:
            report.skip(r.line, "rows repeating a JobID")
            continue
        ids.add(job_id)
        every = opts.checkpoint_every_s if rng.random() < opts.checkpoint_fraction else None
        job: dict[str, Any] = {
            "id": job_id,
            "share": share,
            "submit_at": int(r.submit - origin),
            "duration_s": r.duration,
            "gpus": r.gpus,
            "gpu_type": opts.gpu_type,
            "checkpoint_every_s": every,
        }
        if every is not None and opts.checkpoint_on_stop:
            job["checkpoint_on_stop"] = True
        jobs.append(job)
        report.gpu_hours[share] = report.gpu_hours.get(share, 0.0) + r.gpus * r.duration / 3600
    report.jobs = len(jobs)
    if not jobs:
        raise TraceError("no job left to import:\n" + report.text())
    window = f"[{origin:,.0f} s, " + ("the end)" if end is None else f"{end:,.0f} s)")
    scenario = {
        "description": (
            f"Imported from {opts.source} ({fmt}): jobs submitted in {window} of the trace, re-based to 0; "
            f"{opts.nodes} x {opts.node_gpus} {opts.gpu_type}; "
            + (
                "shares from a layout file"
                if opts.layout is not None
                else f"one share per group ({'the ' + str(opts.top) + ' with most GPU-hours and other' if opts.top > 0 else 'all'}), "
                "capacity in proportion to GPU-hours (largest remainder)"
            )
            + (
                f"; {opts.checkpoint_fraction:g} of the jobs checkpoint every {opts.checkpoint_every_s} s "
                f"(seed {opts.seed})"
                if opts.checkpoint_fraction
                else ""
            )
            + "."
        ),
        "settings": {
            "tick_s": 1,
            "preemption_grace_s": opts.grace_s,
            "starvation_s": opts.starvation_s,
            "until_s": None,
        },
        "nodes": [
            {"name": f"node-{k + 1:04d}", "gpu_type": opts.gpu_type, "gpus": opts.node_gpus}
            for k in range(opts.nodes)
        ],
        "shares": shares,
        "jobs": jobs,
        "events": [],
    }
    try:
        sc.parse(scenario)
    except sc.ScenarioError as exc:  # a layout's share fields, checked by the scenario format
        raise TraceError("the scenario is not valid:\n  " + "\n  ".join(exc.errors)) from exc
    return scenario, report


def _chain(first: str, rest: Iterable[str]) -> Iterable[str]:
    yield first
    yield from rest


# -- CLI --------------------------------------------------------------------------------------------


def _parser(prog: str = "python -m quotas.engine.importtrace") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Turn a job trace (ITP-shaped CSV or sacct --parsable2) into a simulator scenario.",
    )
    p.add_argument("trace", help="the trace file ('-' reads standard input)")
    p.add_argument("--format", choices=FORMATS, help="default: from the header ('|' means sacct)")
    p.add_argument("--out", help="write the scenario here (default: standard output)")
    # Every option with a default says it in --help (it said none).
    p.add_argument("--nodes", type=int, default=168, help="nodes of the cluster (default: %(default)s)")
    p.add_argument("--node-gpus", type=int, default=8, help="GPUs per node (default: %(default)s)")
    p.add_argument("--gpu-type", default="a100", help="the nodes' GPU type (default: %(default)s)")
    p.add_argument("--start", help="window start: seconds from the first submission, or an ISO date")
    p.add_argument("--end", help="window end (exclusive), as --start")
    p.add_argument(
        "--top", type=int, default=8, help="groups with a share of their own, 0: all (default: %(default)s)"
    )
    p.add_argument("--layout", help="JSON list of shares (with optional 'groups') instead of --top")
    p.add_argument(
        "--group",
        choices=("account", "qos"),
        default="account",
        help="sacct: the share (default: %(default)s)",
    )
    p.add_argument(
        "--strategy",
        choices=policy.STRATEGIES,
        default=policy.LEND_AND_BORROW,
        help="every share's strategy (default: %(default)s)",
    )
    p.add_argument(
        "--min-runtime", type=int, default=0, help="every share's min_runtime_s (default: %(default)s)"
    )
    p.add_argument("--grace", type=int, default=30, help="settings.preemption_grace_s (default: %(default)s)")
    p.add_argument(
        "--starvation", type=int, default=3600, help="settings.starvation_s (default: %(default)s)"
    )
    p.add_argument(
        "--checkpoint-fraction",
        type=float,
        default=0.0,
        help="the share of jobs that checkpoint, 0 to 1 (default: %(default)s)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=1800,
        help="seconds between a checkpointing job's checkpoints (default: %(default)s)",
    )
    p.add_argument("--checkpoint-on-stop", action="store_true", help="checkpointing jobs save when stopped")
    p.add_argument("--seed", type=int, default=1, help="the checkpoint draw's seed (default: %(default)s)")
    return p


def options_from(args: argparse.Namespace, layout: Any = None) -> Options:
    return Options(
        format=args.format,
        nodes=args.nodes,
        node_gpus=args.node_gpus,
        gpu_type=args.gpu_type,
        start=args.start,
        end=args.end,
        top=args.top,
        layout=layout,
        group=args.group,
        strategy=args.strategy,
        min_runtime_s=args.min_runtime,
        grace_s=args.grace,
        starvation_s=args.starvation,
        checkpoint_fraction=args.checkpoint_fraction,
        checkpoint_every_s=args.checkpoint_every,
        checkpoint_on_stop=args.checkpoint_on_stop,
        seed=args.seed,
        source=Path(args.trace).name if args.trace != "-" else "standard input",
    )


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """The command line (also `manage.py import_trace`, which names itself `prog`). Exit code 2 with
    a message for any input it cannot use, never a traceback."""
    parser = _parser(prog) if prog else _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    problems = []
    if not 0 <= args.checkpoint_fraction <= 1:
        problems.append("--checkpoint-fraction must be between 0 and 1")
    if args.checkpoint_every < 1:
        problems.append("--checkpoint-every must be at least 1")
    if args.grace < 0 or args.min_runtime < 0 or args.starvation < 0:
        problems.append("--grace, --min-runtime and --starvation must be >= 0")
    if args.top < 0:
        problems.append("--top must be 0 (a share for every group) or more")
    layout = None
    if args.layout:
        try:
            layout = json.loads(Path(args.layout).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problems.append(f"cannot read the layout {args.layout}: {exc}")
    if problems:
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    try:
        if args.trace == "-":
            scenario, report = import_trace(sys.stdin, options_from(args, layout))
        else:
            with open(args.trace, encoding="utf-8", errors="replace", newline="") as f:
                scenario, report = import_trace(f, options_from(args, layout))
    except OSError as exc:
        print(f"error: cannot read {args.trace}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(scenario, indent=1) + "\n"
    if args.out:
        # Whole or not at all: a file that cannot be written is said, and no half of it is left.
        out = Path(args.out)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    else:
        sys.stdout.write(text)
    sys.stderr.write(report.text())
    for share in scenario["shares"]:
        cap = share["capacity"].get(args.gpu_type, 0)
        hours = report.gpu_hours.get(share["name"], 0.0)
        print(
            f"  share {share['name']}: {cap} {args.gpu_type}, {hours:,.0f} GPU-hours of jobs", file=sys.stderr
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
