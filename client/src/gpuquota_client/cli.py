"""The `gpuquota` command: log in, look at shares and the queue, submit, watch and cancel jobs.

Human tables by default, `--json` for scripts. Exit codes: 0 done; 2 the server refused the request
(its message is printed) or the command line is wrong; 1 the server could not be reached or failed;
`wait` exits 1 when the job did not succeed.
"""

from __future__ import annotations

import os
import sys

from gpuquota_client import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

# Nothing but os and sys at start-up (`gpuquota --version` imports nothing else; a fresh `gpuquota
# submit` is a Python start plus one request, `make bench` times it): argparse, re, json, datetime,
# getpass, the config file and the HTTP client are imported where they are used, and the parser is
# built for the one command given (build_parser).
OPEN_STATES = ("QUEUED", "HELD", "ADMITTED", "RUNNING", "PREEMPTING", "CANCELLING")

DURATION_RE = r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$"
# What the agent watches for in a job's checkpoint directory (gpunodes/agent/checkpoints.py MARKER).
CHECKPOINT_MARKER = ".gpuquota-checkpoint"


def _usage_error(message: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(message)


def parse_duration(text: str) -> int:
    """'90', '90s', '30m', '2h', '1d', '1h30m' -> seconds."""
    import re

    match = re.match(DURATION_RE, text.strip().lower())
    if not text.strip() or not match or not any(match.groups()):
        raise _usage_error(f"{text!r} is not a duration (e.g. 90s, 30m, 2h, 1h30m)")
    d, h, m, s = (int(g or 0) for g in match.groups())
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds <= 0:
        raise _usage_error("a duration must be more than 0 seconds")
    return seconds


def parse_grace(text: str) -> int:
    """Like a duration, but 0 is allowed (stop at once)."""
    if text.strip() in ("0", "0s"):
        return 0
    return parse_duration(text)


ARRAY_RE = r"^(\d+)(?:-(\d+))?$"


def parse_count(text: str) -> int:
    """A whole number of at least 1."""
    if not text.strip().isdigit() or int(text) < 1:
        raise _usage_error(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def parse_version(text: str) -> int:
    """A layout version: a whole number, 0 (the layout before version 1) or more."""
    if not text.strip().isdigit():
        raise _usage_error(f"{text!r} is not a version number (0 or more)")
    return int(text)


def parse_since(text: str):
    """'2h' (back from now), '2026-12-01' or '2026-12-01T09:30' (local time unless zoned) -> an aware
    datetime."""
    import re
    from datetime import datetime, timedelta

    text = text.strip()
    if text and re.match(DURATION_RE, text.lower()):
        return datetime.now().astimezone() - timedelta(seconds=parse_duration(text))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise _usage_error(
            f"{text!r} is neither a duration (2h, 1d) nor a date/time (2026-12-01T09:30)"
        ) from None
    return moment if moment.tzinfo else moment.astimezone()


def parse_array(text: str) -> dict[str, int]:
    """'0-999' -> {"start": 0, "size": 1000}; '100' -> 100 tasks from index 0."""
    import re

    match = re.match(ARRAY_RE, text.strip())
    if not match:
        raise _usage_error(f"{text!r} is not an array range (e.g. 0-999, or a number of tasks)")
    first, last = match.groups()
    if last is None:
        if int(first) < 1:
            raise _usage_error("an array has at least 1 task")
        return {"start": 0, "size": int(first)}
    if int(last) < int(first):
        raise _usage_error(f"{text!r}: the last index is before the first")
    return {"start": int(first), "size": int(last) - int(first) + 1}


def parse_target(text: str) -> tuple[str, int]:
    """A job id ('12') or an array id ('A12', 'array:12')."""
    t = text.strip().lower()
    for prefix in ("array:", "a"):
        if t.startswith(prefix) and t[len(prefix) :].isdigit():
            return "array", int(t[len(prefix) :])
    if t.isdigit():
        return "job", int(t)
    raise _usage_error(f"{text!r} is not a job id (12) or an array id (A12)")


def parse_mount(text: str) -> str:
    """HOST[:CONTAINER], both absolute paths (the server checks what the cluster or the share allows)."""
    host, sep, container = text.partition(":")
    for path in (host, container) if sep else (host,):
        if not path.startswith("/") or ".." in path.split("/"):
            raise _usage_error(
                f"{text!r} is not HOST[:CONTAINER] with absolute paths, e.g. /datasets/imagenet:/data"
            )
    return text


def parse_env(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise _usage_error(f"{text!r} is not NAME=VALUE")
    return name, value


# --- output ---------------------------------------------------------------------------------------


def clean(value: Any) -> str:
    """Text from the server as one printable line: control and other non-printable characters (an
    escape sequence in a job name, a newline in a reason) are shown escaped, never sent to the terminal."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    return "\n".join(Table(headers).lines(rows))


class Table:
    """A table printed a page at a time: the columns as wide as the first page needs, widened where a
    later page needs more (a long listing starts printing before its last page is read)."""

    def __init__(self, headers: Sequence[str]) -> None:
        self.headers = [str(h) for h in headers]
        self.widths = [0] * len(self.headers)
        self.started = False

    def lines(self, rows: Sequence[Sequence[Any]]) -> list[str]:
        cells = [["-" if c is None else clean(c) for c in row] for row in rows]
        if not self.started:
            cells.insert(0, self.headers)
            self.started = True
        self.widths = [max([w] + [len(r[i]) for r in cells]) for i, w in enumerate(self.widths)]
        return [
            "  ".join(c.ljust(w) for c, w in zip(row, self.widths, strict=True)).rstrip() for row in cells
        ]


def when(value: str | None) -> str | None:
    """An ISO time as local 'YYYY-MM-DD HH:MM', with 'in 5m' / '3m ago' for near times."""
    from datetime import UTC, datetime

    if not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    delta = (t - datetime.now(UTC)).total_seconds()
    stamp = t.astimezone().strftime("%Y-%m-%d %H:%M")
    if abs(delta) < 48 * 3600:
        return f"{stamp} ({'in ' if delta >= 0 else ''}{human_seconds(abs(delta))}{'' if delta >= 0 else ' ago'})"
    return stamp


def human_seconds(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def capacity_text(capacity: dict) -> str:
    return ", ".join(f"{n} {t}" for t, n in sorted(capacity.items())) or "-"


def usage_text(share: dict) -> str:
    parts = []
    for gpu_type, u in sorted(share.get("usage", {}).items()):
        cap = share["capacity"].get(gpu_type, 0)
        text = f"{u['own']}/{cap} {gpu_type}"
        if u["borrowed"]:
            text += f" +{u['borrowed']} borrowed"
        if u["lent"]:
            text += f" ({u['lent']:g} lent)"
        parts.append(text)
    return ", ".join(parts) or "-"


def queued_text(share: dict) -> str:
    jobs = sum(u["queued_jobs"] for u in share.get("usage", {}).values())
    gpus = sum(u["queued_gpus"] for u in share.get("usage", {}).values())
    return f"{jobs} ({gpus} GPUs)" if jobs else "0"


def job_line(job: dict) -> str:
    text = clean(f"job {job['id']} {job['name'] or ''}".rstrip()) + f": {job['state']}"
    if job["state"] in ("CANCELLING", "HELD") and job.get("state_reason"):
        # Stopping (its GPUs still held) or held: the reason says what happens next.
        return f"{text} ({clean(job['state_reason'])})"
    if job["state"] == "FAILED" and job.get("exit_code") is not None:
        text += f", exit code {job['exit_code']}"
    position = job.get("queue_position")
    if position:
        text += f", #{position['in_share']} in {job['share']}, #{position['overall']} overall"
    text += eta_text(job)
    if job.get("waiting_reason"):
        text += f" ({clean(job['waiting_reason'])})"
    reason = job.get("state_reason")
    if job["state"] == "FAILED" and reason and reason != f"exit code {job.get('exit_code')}":
        text += f" ({clean(reason)})"  # only what the exit code above does not say already
    return text


def lost_text(attempt: dict) -> str | None:
    """The work an ended attempt threw away: '2 GPUs x 45s (reclaim)'; 'none' for one that lost nothing."""
    if attempt.get("gpu_seconds_run") is None:
        return None  # still running (or a server before lost work was counted)
    cause = attempt.get("lost_cause")
    if not cause:
        return "none"
    gpus = sum(len(p["gpus"]) for p in attempt["placement"]) or 1
    return f"{gpus} GPU{'s' if gpus != 1 else ''} x {human_seconds(attempt['gpu_seconds_lost'] / gpus)} ({cause})"


def eta_text(job: dict) -> str:
    """The stored forecast in words: when (never a time in the past), what it rests on, its age."""
    kind = job.get("eta_kind")
    age = job.get("forecast_age_s")
    aged = f"; forecast {human_seconds(age)} ago" if age is not None else ""
    if kind == "none":
        return f", no ETA ({clean(job.get('eta_basis') or '')}{aged})"
    if not job.get("eta"):
        return ", not forecast yet (after the next pass)" if job.get("state") == "QUEUED" else ""
    from datetime import UTC, datetime

    t = datetime.fromisoformat(job["eta"].replace("Z", "+00:00"))
    now = datetime.now(UTC)
    basis = f"[{clean(job.get('eta_basis') or kind or '')}{aged}]"
    if t <= now:
        return f", expected to start due now, forecast again after the next pass {basis}"
    if kind == "estimate" and job.get("eta_low") and job.get("eta_high"):
        # An estimate with its likely range (10th-90th percentile); a bound's range ends at the bound,
        # which the ETA says already.
        low = datetime.fromisoformat(job["eta_low"].replace("Z", "+00:00"))
        high = datetime.fromisoformat(job["eta_high"].replace("Z", "+00:00"))
        likely = f"{clock(t, now)} (in {human_seconds((t - now).total_seconds())})"
        return f", starts {clock(low, now)}–{clock(high, max(low, now))}, likely {likely} {basis}"
    return f", expected to start {when(job['eta'])} {basis}"


def clock(t, ref) -> str:
    """A time of the likely range, local: '14:10' on the day of `ref`, 'Tue 09:30' within the week,
    else the date too; 'now' once passed."""
    from datetime import UTC, datetime

    if t <= datetime.now(UTC):
        return "now"
    local, day = t.astimezone(), ref.astimezone().date()
    if local.date() == day:
        return local.strftime("%H:%M")
    return local.strftime("%a %H:%M" if (local.date() - day).days < 7 else "%Y-%m-%d %H:%M")


def array_line(array: dict) -> str:
    counts = array.get("counts") or {}
    order = [
        "QUEUED",
        "HELD",
        "ADMITTED",
        "RUNNING",
        "PREEMPTING",
        "CANCELLING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ]
    parts = [f"{counts[s]} {s.lower()}" for s in order if counts.get(s)]
    name = clean(f"array A{array['id']} {array['name'] or ''}".rstrip())
    return (
        f"{name} ({array['size']} tasks, index {array['first_index']}-{array['last_index']}, "
        f"share {array['share']}): {', '.join(parts) or 'no tasks'}"
        + (" — done" if array.get("done") else "")
    )


# --- commands -------------------------------------------------------------------------------------


def cmd_login(args, out) -> int:
    import getpass

    from gpuquota_client.client import Client

    if args.token_stdin:
        # A token made on the server's Tokens page (/account/tokens/): how those who sign in with the
        # organisation's directory, who have no password, log the CLI in. Checked before it is saved.
        client = Client(args.server_url, sys.stdin.readline().strip())
        mine = client.request("GET", "auth/tokens/")
        username = mine["results"][0]["user"] if mine.get("results") else "?"
        token = client.token
    else:
        username = args.username or input("Username: ")
        password = sys.stdin.readline().rstrip("\n") if args.password_stdin else getpass.getpass("Password: ")
        client = Client(args.server_url)
        token = client.login(username, password)
    from gpuquota_client import config

    saved = {"url": client.url, "token": token}
    if client.limits:
        saved["limits"] = client.limits  # what a job may ask for: `submit` checks before sending
    path = config.save(saved, args.config_path)
    if args.json:
        out({"url": client.url, "config": str(path)})
    else:
        out(f"Logged in to {client.url} as {username}; token saved in {path}")
    return 0


def cmd_logout(args, out) -> int:
    client = args.client()
    client.logout()
    from gpuquota_client import config

    config.remove(args.config_path)
    out({"logged_out": True} if args.json else "Logged out; the token is revoked.")
    return 0


def protection_text(share: dict) -> str:
    """A share's protection window (min_runtime_s) in words; '-' for none (or a server without it)."""
    seconds = share.get("min_runtime_s") or 0
    return human_seconds(seconds) if seconds else "-"


def cmd_shares(args, out) -> int:
    action = getattr(args, "shares_command", None)
    if action is not None:
        return SHARES_COMMANDS[action](args, out)
    shares = args.client().shares()
    if args.json:
        out(shares)
        return 0
    rows = [
        (
            s["name"],
            s["team"],
            s["strategy"],
            s["state"],
            capacity_text(s["capacity"]),
            protection_text(s),
            usage_text(s),
            queued_text(s),
        )
        for s in shares
    ]
    headers = ["SHARE", "TEAM", "STRATEGY", "STATE", "CAPACITY", "PROTECTED", "IN USE (OWN/CAP)", "QUEUED"]
    out(table(rows, headers))
    return 0


SHARE_NAME_RE = r"^[a-z0-9-]{1,63}$"


def cmd_min_runtime(args, out) -> int:
    """Set a share's protection window (admins): its jobs run at least this long after each start
    before a reclaim or an in-share pre-emption may take them. Checked before anything is sent."""
    import re

    from gpuquota_client import limits

    if not re.match(SHARE_NAME_RE, args.share):
        raise UsageError(f"{args.share!r} is not a share name (`gpuquota shares` lists them)")
    problem = limits.problem(args.settings().get("limits"), "min_runtime_s", args.duration)
    if problem:
        raise UsageError(f"DURATION: {problem}")
    share = args.client().set_share(args.share, min_runtime_s=args.duration)
    if args.json:
        out(share)
    elif share["min_runtime_s"]:
        out(
            f"Share {share['name']}: each job runs at least {human_seconds(share['min_runtime_s'])} after a "
            "start before a pre-emption may take it (owners may wait that long for its GPUs)."
        )
    else:
        out(f"Share {share['name']}: its jobs are not protected (any pre-emption may take them).")
    return 0


def cmd_checkpoint(args, out) -> int:
    """Inside a job: say that its checkpoint is whole now. Writes the marker the agent watches for in
    $GPUQUOTA_CHECKPOINT_DIR (under another name, then renamed into place, so it is never seen half
    written); once the marker is there, only the marker counts for the job. No server, no token."""
    import time

    directory = args.dir or os.environ.get("GPUQUOTA_CHECKPOINT_DIR")
    if not directory:
        raise UsageError("not inside a gpuquota job: $GPUQUOTA_CHECKPOINT_DIR is not set (or give --dir)")
    if not os.path.isdir(directory):
        raise UsageError(f"{directory}: no such directory")
    now = time.time()
    tmp = os.path.join(directory, f"{CHECKPOINT_MARKER}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{now:.3f}\n")
        os.utime(tmp, (now, now))
        os.replace(tmp, os.path.join(directory, CHECKPOINT_MARKER))
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"cannot write the checkpoint marker in {directory}: {e.strerror}") from None
    out({"checkpoint_at": now, "dir": directory} if args.json else f"Checkpoint noted in {directory}")
    return 0


# --- the layout: export, plan, apply, history ----------------------------------------------------


def cmd_shares_export(args, out) -> int:
    """The layout as YAML with comments (the server writes it: the client needs no YAML library), or
    JSON with --json; to a file with -o."""
    client = args.client()
    if args.json:
        import json

        text = json.dumps(client.layout(), indent=2) + "\n"
    else:
        text = client.layout_text()
    if args.output and args.output != "-":
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"cannot write {args.output}: {e.strerror}") from None
        print(f"Wrote the layout to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _read_layout_file(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UsageError(
            f"-f {path}: no such file (`gpuquota shares export -o {path}` writes the layout)"
        ) from None
    except UnicodeDecodeError:
        raise UsageError(f"-f {path}: not UTF-8 text") from None
    except OSError as e:
        raise UsageError(f"-f {path}: cannot read it ({e.strerror})") from None


def _plan_problems(error) -> str | None:
    """A refused plan's problems, one a line under its path; None if the answer is not that shape."""
    data = error.data
    if error.status != 400 or not isinstance(data, dict):
        return None
    lines = [
        f"  {clean(path)}: {clean(m)}"
        for path, messages in data.items()
        for m in (messages if isinstance(messages, list) else [messages])
    ]
    n = len(lines)
    return f"the layout was not planned: {n} problem{'s' if n != 1 else ''}\n" + "\n".join(lines)


def _arrow(pair) -> str:
    before, after = pair[0], pair[1]
    shown = ["-" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in (before, after)]
    return shown[0] if shown[0] == shown[1] else f"{shown[0]} -> {shown[1]}"


def plan_lines(plan: dict) -> list[str]:
    """A plan in words: the diff, what it does now, warnings, temporary changes."""
    head = f"Plan {plan['id']}"
    head += (
        f" (from version {plan['base_version']})"
        if plan.get("base_version")
        else " (from the layout before any version)"
    )
    if plan.get("rollback_to") == 0:
        head += ", a rollback to the layout before version 1"
    elif plan.get("rollback_to"):
        head += f", a rollback to version {plan['rollback_to']}"
    lines = [f"{head}: {plan['summary']}"]
    lines += [f"  {clean(c['words'])}" for c in plan["changes"]]
    now = plan.get("now") or {}
    effects = [f"  over-committed: {clean(o['words'])}" for o in now.get("overcommit", [])]
    effects += [f"  could never run any more: {clean(g['words'])}" for g in now.get("never_runnable", [])]
    effects += [f"  uncovered: {clean(u['words'])}" for u in now.get("uncovered", [])]  # a lower group limit
    if now.get("borrowed_total"):
        effects.append(f"  {now['borrowed_total']} running job(s) become borrowed (reclaimable):")
        effects += [f"    {clean(b['words'])}" for b in now.get("borrowed", [])]
    if now.get("no_longer_borrowed"):
        effects.append(f"  {now['no_longer_borrowed']} running job(s) are no longer borrowed")
    if plan["changed"]:
        lines += ["Now:", *(effects or ["  nothing running or queued is affected"])]
    lines += [f"Warning: {clean(w)}" for w in plan.get("warnings", [])]
    for t in plan.get("temporary", []):
        backs = ", ".join(f"{path} back to {pair[0]}" for path, pair in t["fields"].items())
        lines.append(f"Temporary: {t['share']} until {when(t['until'])}: {backs}")
    return lines


def whatif_lines(replay: dict | None) -> list[str]:
    """The what-if's comparison: per share, the cluster, the jobs that never started."""
    if not replay:
        return []
    if replay["state"] != "done":
        why = "; ".join(replay.get("errors") or []) or replay["state"]
        return [f"What if (last week replayed): no result ({clean(why)})"]
    result, window = replay["result"], replay["window"] or {}
    lines = [
        f"What if: last week replayed as is and with the plan ({window.get('jobs', '?')} submissions from "
        f"{when(window.get('start'))} to {when(window.get('end'))}, in {replay.get('seconds')} s; a job "
        "that never started counts as waiting until the cut):"
    ]
    rows = [
        (
            r["share"] + (" *" if r["changed"] else ""),
            _arrow(r["gpu_hours_run"]),
            _arrow(r["wait_p50_s"]),
            _arrow(r["wait_p95_s"]),
            _arrow(r["preemptions"]),
            _arrow(r["borrowed_gpu_hours"]),
            _arrow(r["lent_gpu_hours"]),
            _arrow(r["never_started"]),
        )
        for r in result["rows"]
    ]
    headers = [
        "SHARE",
        "GPU-H RUN",
        "WAIT P50 S",
        "WAIT P95 S",
        "PRE-EMPTIONS",
        "BORROWED GPU-H",
        "LENT GPU-H",
        "NEVER STARTED",
    ]
    lines += ["  " + line for line in Table(headers).lines(rows)]
    lines += [f"  {c['metric']}: {_arrow((c['before'], c['after']))}" for c in result["cluster"]]
    lines += [f"  never started with the plan: {clean(w)}" for w in result["never_started"]["after"]]
    return lines


def _wait_for_whatif(client, plan: dict, timeout_s: float) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    shown = False
    while plan.get("whatif") and plan["whatif"]["state"] == "running" and time.monotonic() < deadline:
        if sys.stderr.isatty():
            sys.stderr.write(f"\rreplaying last week: {plan['whatif']['percent']} %  ")
            sys.stderr.flush()
            shown = True
        time.sleep(1.0)
        plan = client.layout_plan_get(plan["id"])
    if shown:
        sys.stderr.write("\r" + " " * 40 + "\r")
    return plan


def cmd_shares_plan(args, out) -> int:
    from gpuquota_client.client import ApiError

    if (args.file is None) == (args.rollback is None):
        raise UsageError("plan: give the layout with -f FILE (- for stdin), or --rollback N")
    client = args.client()
    document = _read_layout_file(args.file) if args.file is not None else None
    try:
        plan = client.layout_plan(document=document, rollback=args.rollback, whatif=not args.no_whatif)
    except ApiError as e:
        problems = _plan_problems(e)
        if problems is None:
            raise
        print(f"gpuquota: {problems}", file=sys.stderr)
        return 2
    if not args.no_whatif and not args.no_wait:
        plan = _wait_for_whatif(client, plan, args.wait)
    if args.json:
        out(plan)
        return 0
    lines = plan_lines(plan) + whatif_lines(plan.get("whatif"))
    if plan["changed"]:
        lines.append(f"Apply it: gpuquota shares apply {plan['id']}")
    else:
        lines.append("Nothing to apply: this is the layout as it is.")
    out("\n".join(lines))
    return 0


PLAN_ID_RE = r"^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$"


def cmd_shares_apply(args, out) -> int:
    import re

    if not re.match(PLAN_ID_RE, args.plan.strip()):
        raise UsageError(f"{args.plan!r} is not a plan id (`gpuquota shares plan` prints it: Apply it: ...)")
    from gpuquota_client.client import ApiError

    try:
        applied = args.client().layout_apply(args.plan.strip(), confirm=args.overcommit)
    except ApiError as e:
        confirm = (e.data or {}).get("confirm") if isinstance(e.data, dict) else None
        if e.status != 400 or not confirm:
            raise
        raise UsageError(
            " ".join(confirm) + f" (gpuquota shares apply {args.plan.strip()} --overcommit)"
        ) from None
    out(
        applied
        if args.json
        else clean(applied["detail"])
        + (
            f" {applied['told']} queued job(s) that can never run now were told so."
            if applied.get("told")
            else ""
        )
    )
    return 0


def cmd_shares_history(args, out) -> int:
    client = args.client()
    versions = client.layout_versions(limit=args.limit)
    temporary = [t for t in client.layout_temporary() if t["state"] == "PENDING"]
    if args.json:
        out({"versions": versions, "temporary": temporary})
        return 0
    rows = [
        (
            v["number"],
            when(v["applied_at"]),
            v["actor"] or "(system)",
            v["kind"],
            v["summary"] + (f" ({v['note']})" if v["note"] else ""),
        )
        for v in versions
    ]
    lines = [table(rows, ["VERSION", "APPLIED", "BY", "KIND", "CHANGES"])]
    if temporary:
        lines.append("")
        lines.append(
            table(
                [
                    (
                        t["share_now"] or t["share"],
                        when(t["until"]),
                        t["version"],
                        ", ".join(f"{p} back to {pair[0]}" for p, pair in t["fields"].items()),
                    )
                    for t in temporary
                ],
                ["TEMPORARY", "ENDS", "VERSION", "GOES BACK"],
            )
        )
    lines.append("")
    lines.append("Plan a rollback: gpuquota shares plan --rollback N")
    out("\n".join(lines))
    return 0


SHARES_COMMANDS = {
    "export": cmd_shares_export,
    "plan": cmd_shares_plan,
    "apply": cmd_shares_apply,
    "history": cmd_shares_history,
}


def tree_rows(groups: list[dict], shares: list[dict], gpu_type: str | None = None) -> list[tuple]:
    """The organisation tree depth first (children by name, groups and shares together), one row per
    node and GPU type: name indented by depth, type, capacity, in use, taken from and lent outside,
    weight, history, fair-share value, state."""
    children: dict[str | None, list[tuple[str, dict]]] = {}
    for g in groups:
        children.setdefault(g["parent"], []).append((g["name"], {**g, "kind": "group"}))
    for s in shares:
        types = [{"gpu_type": t, **v} for t, v in sorted((s.get("fair_share") or {}).items())]
        children.setdefault(s.get("group"), []).append((s["name"], {**s, "kind": "share", "types": types}))
    rows: list[tuple] = []

    def walk(parent: str | None, depth: int) -> None:
        for name, node in sorted(children.get(parent, ()), key=lambda c: c[0]):
            label = "  " * depth + (f"{name}/" if node["kind"] == "group" else name)
            for v in node["types"]:
                if gpu_type and v["gpu_type"] != gpu_type:
                    continue
                rows.append(
                    (
                        label,
                        v["gpu_type"],
                        v["capacity"],
                        v["in_use"],
                        v["taken_from_outside"],
                        f"{v['lent_outside']:g}",
                        f"{v['weight']:g}",
                        f"{v['history']:.1f}",
                        f"{v['fair_share_value']:.2f}",
                        v["state"],
                    )
                )
            if node["kind"] == "group":
                walk(name, depth + 1)

    walk(None, 0)
    return rows


def cmd_groups(args, out) -> int:
    client = args.client()
    groups, shares = client.groups(), client.shares()
    if args.json:
        out({"groups": groups, "shares": shares})
        return 0
    rows = tree_rows(groups, shares, args.gpu_type)
    if not rows:
        out(
            "No group or share has capacity, use or a waiting job"
            + (f" of {args.gpu_type}." if args.gpu_type else ".")
        )
        return 0
    headers = [
        "GROUP/SHARE",
        "TYPE",
        "CAPACITY",
        "IN USE",
        "TAKEN",
        "LENT",
        "WEIGHT",
        "HISTORY",
        "VALUE",
        "STATE",
    ]
    out(table(rows, headers))
    out(
        "TAKEN: GPUs taken from outside the group or share; LENT: of its GPUs, those used outside it; "
        "VALUE: (taken + history) / (weight x capacity): the lowest borrows first."
    )
    waits = why_it_waits_lines(shares, args.gpu_type)
    if waits:
        out("")
        out("\n".join(waits))
    return 0


def why_it_waits_lines(shares: list[dict], gpu_type: str | None = None) -> list[str]:
    """Each share that waits to borrow and is held back, with why, in the server's words (the
    organisation page's): "vision-main waits to borrow a10g: group research may take 2 a10g from
    outside: 2 taken"."""
    lines = []
    for s in sorted(shares, key=lambda s: s["name"]):
        for t, v in sorted((s.get("fair_share") or {}).items()):
            if (gpu_type and t != gpu_type) or not v.get("why_it_waits"):
                continue
            lines.append(clean(f"{s['name']} waits to borrow {t}: " + "; ".join(v["why_it_waits"])))
    return lines


def _wait_for_advice(client, run: dict, timeout_s: float) -> dict:
    import time

    deadline = time.monotonic() + timeout_s
    shown = False
    while not run["finished"] and time.monotonic() < deadline:
        if sys.stderr.isatty():
            total = run["replays_total"] if run["replays_final"] else f"at least {run['replays_total']}"
            sys.stderr.write(f"\rreplays: {run['replays_done']} of {total}  ")
            sys.stderr.flush()
            shown = True
        time.sleep(1.0)
        run = client.advice_get(run["id"])
    if shown:
        sys.stderr.write("\r" + " " * 40 + "\r")
    return run


def _wait_words(seconds) -> str:
    return "-" if seconds is None else human_seconds(seconds)


def cmd_advise(args, out) -> int:
    """Start an advice run (or read --run ID), wait for it, print the frontier; --plan N makes a layout
    plan of point N (then `gpuquota shares apply PLAN`)."""
    client = args.client()
    if args.plan is not None:
        if not args.run:
            raise UsageError("advise: --plan N needs --run ID (the run whose frontier has point N)")
        plan = client.advice_plan(args.run, args.plan)
        if args.json:
            out(plan)
            return 0
        out(f"Layout plan {plan['plan']} made of point {args.plan}; its what-if runs.")
        out(f"See it: {plan['page']}\nApply it: gpuquota shares apply {plan['plan']}")
        return 0
    run = client.advice_get(args.run) if args.run else client.advice_start(weeks=args.weeks)
    if not args.no_wait:
        run = _wait_for_advice(client, run, args.wait)
    if args.json:
        out(run)
        return 0
    if not run["finished"]:
        out(
            f"Advice run {run['id']}: {run['replays_done']} replays done; see it with gpuquota advise --run {run['id']}"
        )
        return 0
    if run["state"] != "done":
        out(f"Advice run {run['id']} {run['state']}: " + "; ".join(run["errors"] or ["no answer"]))
        return 1
    advice = run["advice"]
    window = run["window"]
    out(
        f"{advice['replays']} replays of {window['jobs']} jobs ({run['weeks']} week(s) of history) in "
        f"{run['seconds']} s. Today: utilisation {advice['today']['utilisation']} %, owners' p95 wait "
        f"{_wait_words(advice['today']['owners_p95_wait_s'])}."
    )
    rows = []
    for i, point in enumerate(advice["frontier"]):
        mark = "today" if point["today"] else ("recommended" if i == advice["recommended"] else "")
        if point["today"] and i == advice["recommended"]:
            mark = "today, recommended"
        rows.append(
            (
                i,
                point["utilisation"],
                _wait_words(point["owners_p95_wait_s"]),
                round(point["lost_gpu_seconds"] / 3600, 1),
                point["never_started"],
                "; ".join(c["words"] for c in point["changes"]) or "today's layout",
                mark,
            )
        )
    out(table(rows, ["POINT", "UTIL%", "OWNERS P95", "LOST GPU-H", "NEVER STARTED", "CHANGES", ""]))
    out(
        f"Recommended: {advice['rule']}"
        + (" (here: keep today's layout)." if advice["recommended"] is None else ".")
    )
    out(f"Plan a point: gpuquota advise --run {run['id']} --plan N")
    return 0


def cmd_nodes(args, out) -> int:
    nodes = args.client().nodes()
    if args.json:
        out(nodes)
        return 0
    rows = [
        (
            n["name"],
            n["gpu_type"],
            f"{n['gpus_in_use']}/{n['gpus']}",
            n.get("gpus_unhealthy", 0) or "",  # a server before issue 29 does not say
            n["state"],
            when(n["last_heartbeat"]),
        )
        for n in nodes
    ]
    out(table(rows, ["NODE", "TYPE", "GPUS IN USE", "UNHEALTHY", "STATE", "LAST HEARTBEAT"]))
    return 0


def check_submit(args) -> None:
    """Refuse, before any request, what the server would refuse for its limits (the ones it told at
    login: gpuquota_client.limits), in its own words: a UsageError, exit code 2."""
    from gpuquota_client import limits

    if not args.share.strip():
        raise UsageError("--share: give the name of a share (`gpuquota shares` lists them)")
    known = args.settings().get("limits")
    for flag, field, value in (
        ("--gpus", "gpus", args.gpus),
        ("--priority", "priority", args.priority),
        ("--max-runtime", "max_runtime_s", args.max_runtime),
        ("--grace", "preemption_grace_s", args.grace),
        ("--array", "array", args.array["size"] if args.array else None),
    ):
        problem = limits.problem(known, field, value)
        if problem:
            raise UsageError(f"{flag}: {problem}")


# After a submit or a priority change, how long the CLI waits for a stored forecast that has seen the
# change (the pass the change asks for forecasts the queue again, within seconds), reading the job
# every FORECAST_POLL_S.
FORECAST_WAIT_S = 10.0
FORECAST_POLL_S = 0.5


def changed_job_line(client, job: dict) -> str:
    """A job just changed (submitted, its priority set) in words, with its position and ETA from a
    stored forecast computed after the change (`forecast_at` at or after the job's `updated_at`, both
    server times): read again until there is one, for at most FORECAST_WAIT_S, or until the job has
    left the queue (started meanwhile). If none comes in time, it says so; the change stands either way."""
    import time
    from datetime import datetime

    from gpuquota_client.client import ClientError

    def moment(value: str | None) -> datetime | None:
        return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None

    since = moment(job.get("updated_at") or job.get("submitted_at"))

    def seen(job: dict) -> bool:
        at = moment(job.get("forecast_at"))
        return job.get("state") != "QUEUED" or (at is not None and (since is None or at >= since))

    deadline = time.monotonic() + FORECAST_WAIT_S
    reads = 0
    while not seen(job) and time.monotonic() < deadline:
        if reads:
            time.sleep(FORECAST_POLL_S)
        try:
            job = client.job(job["id"])
        except ClientError:  # the change is made; only its forecast could not be read
            break
        reads += 1
    if not seen(job):
        name = clean(f"job {job['id']} {job['name'] or ''}".rstrip())
        return (
            f"{name}: QUEUED; no forecast yet: the scheduler has not forecast the queue since the change "
            f"(`gpuquota status {job['id']}` shows its position and ETA once it has)"
        )
    if job["state"] == "ADMITTED":
        return f"{job_line(job)} (started: its GPUs are assigned and it is starting)"
    return job_line(job)


def cmd_submit(args, out) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("give the command after --, e.g. gpuquota submit ... -- python train.py")
    check_submit(args)
    extra: dict[str, Any] = {}
    if args.grace is not None:
        extra["preemption_grace_s"] = args.grace
    if args.array is not None:
        extra["array"] = args.array
    if getattr(args, "image", None):
        extra["image"] = args.image
    if getattr(args, "mount", None):
        if not extra.get("image"):
            raise UsageError("--mount: only a container job mounts datasets: give --image too")
        extra["mounts"] = list(args.mount)
    job = args.client().submit(
        share=args.share,
        gpus=args.gpus,
        gpu_type=args.gpu_type,
        command=command,
        name=args.name or "",
        priority=args.priority,
        env=dict(args.env or []),
        max_runtime_s=args.max_runtime,
        **extra,
    )
    if args.array is not None:
        out(job if args.json else f"Submitted {array_line(job)}")
        return 0
    if not args.json and job.get("state") == "QUEUED" and (args.forecast or sys.stdout.isatty()):
        # With its queue position and ETA, from the forecast the pass the submit asked for makes (the
        # submit's answer has none). For a person at a terminal; a script's loop of submits does not
        # wait for it unless it asks (--forecast).
        out(f"Submitted {changed_job_line(args.client(), job)}")
        return 0
    out(job if args.json else f"Submitted {job_line(job)}")
    return 0


def cmd_jobs(args, out) -> int:
    pages = args.client().job_pages(
        states=None if args.all_states else OPEN_STATES,
        share=args.share,
        mine=True if args.mine else None,
        array=args.array[1] if args.array else None,
        limit=args.limit,
        since=args.since,
    )
    if args.json:
        out([j for page in pages for j in page])
        return 0
    printed = Table(["ID", "NAME", "SHARE", "USER", "GPUS", "PRIO", "STATE", "SUBMITTED"])
    for page in pages:
        rows = [
            (
                j["id"],
                f"{j['name']}[A{j['array']}:{j['array_index']}]" if j.get("array") else j["name"],
                j["share"],
                j["submitted_by"],
                f"{j['gpus']} {j['gpu_type']}",
                j["priority"],
                j["state"],
                when(j["submitted_at"]),
            )
            for j in page
        ]
        out("\n".join(printed.lines(rows)))
        # Each page reaches the reader before the next is asked for: `| head` ends it after one page.
        sys.stdout.flush()
    if not printed.started:
        out("\n".join(printed.lines([])))
    return 0


def cmd_status(args, out) -> int:
    kind, ident = args.job
    if kind == "array":
        array = args.client().array(ident)
        out(array if args.json else array_line(array))
        return 0
    job = args.client().job(ident)
    if args.json:
        out(job)
        return 0
    lines = [job_line(job), ""]
    fields = [
        ("share", f"{job['share']} (team {job['team']})"),
        ("submitted", f"{when(job['submitted_at'])} by {job['submitted_by']}"),
        ("gpus", f"{job['gpus']} × {job['gpu_type']}"),
        ("priority", job["priority"]),
        ("array", f"A{job['array']} index {job['array_index']}" if job.get("array") else None),
        ("command", " ".join(job["command"])),
        ("image", job.get("image") or None),
        ("datasets", ", ".join(job.get("mounts") or ()) or None),
        ("max runtime", human_seconds(job["max_runtime_s"]) if job["max_runtime_s"] else None),
        ("attempts", job["attempt_count"]),
        ("pre-emptions", job["preemption_count"]),
        ("last checkpoint", when(job.get("last_checkpoint_at")) or "none reported"),
        ("exit code", job["exit_code"]),
        ("reason", job["state_reason"] or None),
        # What holds its share's borrowing back, in the organisation page's words (the server's).
        ("why it waits", "; ".join(job.get("why_it_waits") or ()) or None),
    ]
    lines += [f"{k:>13}: {clean(v)}" for k, v in fields if v not in (None, "")]
    if job["attempts"]:
        lines += [
            "",
            table(
                [
                    (
                        a["number"],
                        a["state"],
                        a["outcome"] or None,
                        ", ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in a["placement"]),
                        "borrowed" if a["borrowed"] else "own",
                        when(a["started_at"]),
                        when(a["ended_at"]),
                        lost_text(a),
                    )
                    for a in job["attempts"]
                ],
                ["ATTEMPT", "STATE", "OUTCOME", "GPUS", "CAPACITY", "STARTED", "ENDED", "WORK LOST"],
            ),
        ]
    if job["events"]:
        lines += [
            "",
            table(
                [(when(e["at"]), e["kind"], e["reason"]) for e in job["events"][-10:]],
                ["AT", "EVENT", "REASON"],
            ),
        ]
    out("\n".join(lines))
    return 0


def cmd_queue(args, out) -> int:
    data = args.client().queue(args.share)
    if args.json:
        out(data)
        return 0
    if not data["jobs"]:
        out(f"Nothing is queued{' in ' + args.share if args.share else ''}.")
        return 0
    rows = [
        (
            (j["position"] or {}).get("in_share"),
            (j["position"] or {}).get("overall"),
            j["id"],
            j["name"],
            j["share"],
            f"{j['gpus']} {j['gpu_type']}",
            j["priority"],
            (when(j["eta"]) or "-") if j.get("eta_kind") != "none" else "none",
            j.get("eta_kind") or "-",
            j["waiting_reason"],
        )
        for j in data["jobs"]
    ]
    out(
        table(
            rows,
            ["#", "OVERALL", "ID", "NAME", "SHARE", "GPUS", "PRIO", "EXPECTED START", "KIND", "WAITING FOR"],
        )
    )
    if data.get("count", 0) > len(data["jobs"]):
        out(f"(the first {len(data['jobs'])} of {data['count']} queued jobs)")
    if data.get("forecast_at"):
        out(
            f"(forecast at {when(data['forecast_at'])}; bound = only enforced max runtimes, estimate = a guess)"
        )
    elif not data["planned"]:
        out("(no forecast yet: it is computed after the next pass)")
    return 0


def cmd_cancel(args, out) -> int:
    kind, ident = args.job
    if kind == "array":
        array = args.client().cancel_array(ident)
        stopping = (array.get("counts") or {}).get("CANCELLING")
        note = f" ({stopping} still stopping; `gpuquota wait A{ident}` waits for them)" if stopping else ""
        out(array if args.json else f"Cancelled {array_line(array)}{note}")
        return 0
    job = args.client().cancel(ident)
    if args.json:
        out(job)
    elif job["state"] == "CANCELLING":
        # Not CANCELLED yet: its processes are being stopped, its GPUs held until its host confirms.
        out(f"Cancelling {job_line(job)}. `gpuquota wait {ident}` waits until it is CANCELLED.")
    else:
        out(f"Cancelled {job_line(job)}")
    return 0


def cmd_release(args, out) -> int:
    job = args.client().release(args.job)
    out(job if args.json else f"Released {job_line(job)}")
    return 0


def cmd_priority(args, out) -> int:
    kind, ident = args.job
    if kind == "array":
        array = args.client().set_array_priority(ident, args.priority)
        out(
            array if args.json else f"Priority of every open task is now {args.priority}: {array_line(array)}"
        )
        return 0
    client = args.client()
    job = client.set_priority(ident, args.priority)
    if args.json:
        out(job)
        return 0
    # Not the forecast of before the change: its new position and ETA, once the pass it asked for has
    # forecast the queue again (or "no forecast yet").
    out(f"Priority of job {job['id']} is now {job['priority']}: {changed_job_line(client, job)}")
    return 0


def cmd_logs(args, out) -> int:
    """One rank's log (`--node`, `--rank`; a one-node job's only one), or every rank's of a multi-node
    attempt, each line prefixed with its rank and node: a gang's traceback is often not in rank 0's."""
    client = args.client()
    one = {"node": args.node, "rank": args.rank}
    if args.follow:
        if args.node is not None or args.rank is not None:
            for text in client.follow_logs(args.job, tail=args.tail, poll_s=args.poll, **one):
                sys.stdout.write(text)
                sys.stdout.flush()
            return 0
        prefixed = RankPrefixes()
        for rank, node, text, ranks in client.follow_every_rank(args.job, tail=args.tail, poll_s=args.poll):
            sys.stdout.write(prefixed(rank, node, text) if ranks > 1 else prefixed.rest() + text)
            sys.stdout.flush()
        sys.stdout.write(prefixed.rest())
        return 0
    data = client.logs(args.job, attempt=args.attempt, tail=args.tail, **one)
    ranks = [data]
    if args.node is None and args.rank is None and len(data["nodes"]) > 1:
        ranks += [
            client.logs(args.job, attempt=data["attempt"], tail=args.tail, rank=rank)
            for rank in range(1, len(data["nodes"]))
        ]
    if args.json:
        out(data if len(ranks) == 1 else ranks)
    elif len(ranks) == 1:
        sys.stdout.write(data["text"])
    else:
        prefixed = RankPrefixes()
        for rank, each in enumerate(ranks):
            sys.stdout.write(prefixed(rank, each["node"], each["text"]) + prefixed.rest())
    return 0


class RankPrefixes:
    """Each line of a multi-node log with its rank and node in front (`[rank 1 gpu-b] ...`); a line
    that comes in pieces is written once whole."""

    def __init__(self) -> None:
        self._partial: dict[int, tuple[str, str]] = {}

    def __call__(self, rank: int, node: str, text: str) -> str:
        if rank < 0:  # the client's own line (a new attempt)
            return self.rest() + text
        before = self._partial.pop(rank, ("", node))[0]
        lines = (before + text).split("\n")
        if lines[-1]:
            self._partial[rank] = (lines[-1], node)
        return "".join(f"[rank {rank} {node}] {line}\n" for line in lines[:-1])

    def rest(self) -> str:
        """The pieces of lines still waiting for their end (at the end of a log)."""
        rest = "".join(f"[rank {r} {node}] {line}\n" for r, (line, node) in sorted(self._partial.items()))
        self._partial.clear()
        return rest


def cmd_wait(args, out) -> int:
    kind, ident = args.job
    try:
        if kind == "array":
            array = args.client().wait_array(ident, poll_s=args.poll, timeout_s=args.timeout)
            out(array if args.json else array_line(array))
            return 0 if set(array["counts"]) <= {"SUCCEEDED"} else 1
        job = args.client().wait(ident, poll_s=args.poll, timeout_s=args.timeout)
    except TimeoutError as e:
        print(f"gpuquota: {e}", file=sys.stderr)
        return 1
    out(job if args.json else job_line(job))
    return 0 if job["state"] == "SUCCEEDED" else 1


# --- parser ---------------------------------------------------------------------------------------


class UsageError(Exception):
    pass


def _login(p) -> None:
    p.add_argument("server_url", metavar="URL")
    p.add_argument("--username", "-u")
    p.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    p.add_argument(
        "--token-stdin",
        action="store_true",
        help="read an API token made on the server's Tokens page from stdin (directory sign-in: no password)",
    )


def _submit(p) -> None:
    import argparse

    p.add_argument("--share", required=True)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--gpu-type", required=True)
    p.add_argument("--priority", type=int, default=0, help="0..9999, higher first")
    p.add_argument("--name")
    p.add_argument("--max-runtime", type=parse_duration, help="e.g. 90m, 2h, 1h30m")
    p.add_argument(
        "--grace", type=parse_grace, help="time between SIGTERM and SIGKILL when pre-empted (e.g. 30s, 5m, 0)"
    )
    p.add_argument(
        "--forecast",
        action="store_true",
        help="print the queue position and expected start (the default at a terminal)",
    )
    p.add_argument(
        "--array",
        type=parse_array,
        metavar="FIRST-LAST",
        help="submit an array: one task per index (e.g. 0-999), each with GPUQUOTA_ARRAY_INDEX set",
    )
    p.add_argument("--env", "-e", type=parse_env, action="append", metavar="NAME=VALUE")
    p.add_argument(
        "--image",
        metavar="REGISTRY/PATH:TAG",
        help="run the command in this container image (one the cluster or the share allows)",
    )
    p.add_argument(
        "--mount",
        type=parse_mount,
        action="append",
        metavar="HOST[:CONTAINER]",
        help="mount this host directory read-only in the container (a dataset the cluster or the share "
        "allows); repeat for more",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD...")


def _jobs(p) -> None:
    p.add_argument(
        "--all-states",
        action="store_true",
        help="also jobs that have ended (SUCCEEDED, FAILED, CANCELLED); without it only open ones",
    )
    p.add_argument("--share", metavar="SHARE", help="only jobs of this share")
    p.add_argument("--mine", action="store_true", help="only jobs you submitted")
    p.add_argument("--array", type=parse_target, metavar="A12", help="only the tasks of this array")
    p.add_argument("--limit", type=parse_count, metavar="N", help="at most N jobs, the newest")
    p.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only jobs submitted since then: a duration back from now (30m, 2h, 1d) or a date/time "
        "(2026-12-01, 2026-12-01T09:30, local time unless it names its zone)",
    )


def _one_target(p) -> None:
    p.add_argument("job", type=parse_target, metavar="JOB|ARRAY")


def _one_job(p) -> None:
    p.add_argument("job", type=int)


def _queue(p) -> None:
    p.add_argument("share", nargs="?")


def _priority(p) -> None:
    p.add_argument("job", type=parse_target, metavar="JOB|ARRAY")
    p.add_argument("priority", type=int)


def _logs(p) -> None:
    import argparse

    p.add_argument("job", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--attempt", type=int)
    p.add_argument("--tail", type=int, help="only the last N lines")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--node", help="the log of the rank on this node (default: every rank's, prefixed)")
    which.add_argument("--rank", type=int, help="the log of this rank of a multi-node job (0 is the first)")
    p.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)


def _wait(p) -> None:
    import argparse

    p.add_argument("job", type=parse_target, metavar="JOB|ARRAY")
    p.add_argument("--timeout", type=parse_duration)
    p.add_argument("--poll", type=float, default=2.0, help=argparse.SUPPRESS)


def _groups(p) -> None:
    p.add_argument("--gpu-type", help="only this GPU type")


def _advise(p) -> None:
    p.add_argument(
        "--weeks", type=int, default=2, choices=range(1, 5), metavar="1-4", help="weeks of history (2)"
    )
    p.add_argument("--run", help="read this run instead of starting one")
    p.add_argument(
        "--plan", type=int, metavar="N", help="make a layout plan of frontier point N (with --run)"
    )
    p.add_argument("--no-wait", action="store_true", help="do not wait for the replays")
    p.add_argument("--wait", type=float, default=600, metavar="SECONDS", help="wait at most this long (600)")


def _nothing(p) -> None:
    pass


def _shares(p) -> None:
    import argparse

    sub = p.add_subparsers(dest="shares_command", metavar="ACTION")
    export = sub.add_parser("export", help="the layout (every team, member and share) as YAML")
    export.add_argument("-o", "--output", metavar="FILE", help="write it here (default: standard output)")
    plan = sub.add_parser(
        "plan",
        help="plan a layout: the change, what it does now, last week replayed with it (nothing changes yet)",
    )
    plan.add_argument("-f", "--file", metavar="FILE", help="the layout (YAML or JSON; - for stdin)")
    plan.add_argument(
        "--rollback",
        type=parse_version,
        metavar="N",
        help="plan back to the layout of version N (0: the layout before version 1)",
    )
    plan.add_argument("--no-whatif", action="store_true", help="leave out the replay of last week")
    plan.add_argument("--no-wait", action="store_true", help="do not wait for the replay (read it later)")
    plan.add_argument("--wait", type=parse_duration, default=900, help=argparse.SUPPRESS)
    apply = sub.add_parser(
        "apply", help="apply a plan exactly as planned (refused if the layout changed since)"
    )
    apply.add_argument("plan", metavar="PLAN", help="the plan's id, as `gpuquota shares plan` printed it")
    apply.add_argument(
        "--overcommit",
        action="store_true",
        help="apply it although it over-commits a GPU type (the plan says so; refused without this)",
    )
    history = sub.add_parser("history", help="the layout's versions and the temporary changes still to end")
    history.add_argument("--limit", type=parse_count, default=20, metavar="N", help="the last N versions")


def _min_runtime(p) -> None:
    p.add_argument("share")
    p.add_argument(
        "duration", type=parse_grace, metavar="DURATION", help="e.g. 10m, 1h, 600; 0 for no protection"
    )


def _checkpoint(p) -> None:
    p.add_argument("--dir", help="the checkpoint directory (default: $GPUQUOTA_CHECKPOINT_DIR)")


# Each command: its help line, what adds its arguments, what runs it (in the order --help lists them).
COMMANDS = {
    "login": ("log in and store the token", _login, "cmd_login"),
    "logout": ("revoke the token and forget it", _nothing, "cmd_logout"),
    "shares": (
        "shares with capacity and usage; `shares export|plan|apply|history`: the layout as one file",
        _shares,
        "cmd_shares",
    ),
    "min-runtime": (
        "set a share's protection window: its jobs run this long after a start before a pre-emption may "
        "take them (admins)",
        _min_runtime,
        "cmd_min_runtime",
    ),
    "groups": (
        "the organisation tree: each group and share with what it takes and lends, its fair-share value "
        "and state",
        _groups,
        "cmd_groups",
    ),
    "advise": (
        "utilisation or reservation? replay the last weeks with variants of the layout and show the "
        "trade-off; --plan N makes a layout plan of a point (admins)",
        _advise,
        "cmd_advise",
    ),
    "nodes": ("GPU hosts", _nothing, "cmd_nodes"),
    "submit": (
        "submit a job: gpuquota submit --share S --gpus N --gpu-type T -- CMD...",
        _submit,
        "cmd_submit",
    ),
    "jobs": ("your teams' jobs (not finished, unless --all-states)", _jobs, "cmd_jobs"),
    "status": (
        "a job with its position, ETA, attempts and events; an array (A12) with its counts",
        _one_target,
        "cmd_status",
    ),
    "queue": ("the queue as the scheduler would admit it", _queue, "cmd_queue"),
    "cancel": (
        "cancel a job (a running one is CANCELLING until its processes are gone), or every open task of an "
        "array (A12)",
        _one_target,
        "cmd_cancel",
    ),
    "release": ("release a HELD job: queue it again (admins)", _one_job, "cmd_release"),
    "priority": (
        "change the priority of a job, or of every open task of an array",
        _priority,
        "cmd_priority",
    ),
    "logs": ("a job's output", _logs, "cmd_logs"),
    "wait": ("wait for a job or an array to finish (exit 0 if all succeeded)", _wait, "cmd_wait"),
    "checkpoint": (
        "inside a job: say that its checkpoint is saved now (no login needed)",
        _checkpoint,
        "cmd_checkpoint",
    ),
}


def command_in(argv: Sequence[str]) -> str | None:
    """The command an argument list names after the global options, when that is certain (the options
    spelled out in full); None otherwise."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--json" or arg.startswith(("--url=", "--config=")):
            i += 1
        elif arg in ("--url", "--config"):
            i += 2
        else:
            return arg if arg in COMMANDS else None
    return None


class Args:
    """The parsed command line (what argparse's Namespace holds)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)


SUBMIT_VALUES = {
    "--share": ("share", str),
    "--gpus": ("gpus", int),
    "--gpu-type": ("gpu_type", str),
    "--priority": ("priority", int),
    "--name": ("name", str),
    "--max-runtime": ("max_runtime", parse_duration),
    "--grace": ("grace", parse_grace),
    "--array": ("array", parse_array),
    "--env": ("env", parse_env),
    "-e": ("env", parse_env),
    "--image": ("image", str),
    "--mount": ("mount", parse_mount),
}


def quick_submit_args(argv: Sequence[str]) -> Args | None:
    """`[--json] [--url URL] [--config FILE] submit --share S --gpus N --gpu-type T [options] -- CMD...`
    parsed as argparse parses it, without argparse (whose import, with re and gettext, is a third of a
    fresh `gpuquota submit`'s own time). Only the plain spelling: every option in full, each value its
    own word or after `=`, no value that starts with "-", the command after `--` or at the first word
    that is not an option. Anything else, or any value argparse would refuse, returns None: argparse
    parses it then, and answers as it always did (errors, help, abbreviations)."""
    values: dict[str, Any] = {"json": False, "url": None, "config_file": None}
    i, n = 0, len(argv)
    while i < n and argv[i] != "submit":
        arg = argv[i]
        if arg == "--json":
            values["json"] = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in ("--url", "--config"):
            return None
        if not eq:
            if i + 1 >= n or argv[i + 1].startswith("-"):
                return None
            value, i = argv[i + 1], i + 1
        values["url" if name == "--url" else "config_file"] = value
        i += 1
    if i >= n:
        return None
    values.update(
        command_name="submit",
        func=cmd_submit,
        priority=0,
        name=None,
        max_runtime=None,
        grace=None,
        forecast=False,
        array=None,
        env=None,
        image=None,
        mount=None,
    )
    i += 1
    while i < n:
        arg = argv[i]
        if arg == "--" or not arg.startswith("-"):
            values["command"] = list(argv[i:])  # argparse's REMAINDER keeps the "--"
            break
        if arg == "--forecast":
            values["forecast"] = True
            i += 1
            continue
        name, eq, value = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name not in SUBMIT_VALUES:
            return None
        if not eq:
            if i + 1 >= n or argv[i + 1].startswith("-"):
                return None
            value, i = argv[i + 1], i + 1
        dest, convert = SUBMIT_VALUES[name]
        try:
            value = convert(value)
        except Exception:  # noqa: BLE001 - argparse says what is wrong with it
            return None
        if dest in ("env", "mount"):
            values[dest] = [*(values[dest] or []), value]
        else:
            values[dest] = value
        i += 1
    if not values.get("command") or any(values.get(k) is None for k in ("share", "gpus", "gpu_type")):
        return None
    return Args(**values)


def terminal_columns() -> int:
    """shutil.get_terminal_size().columns, without importing shutil (and the compression modules it
    imports)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or 80


def _formatter_class():
    import argparse

    class Formatter(argparse.HelpFormatter):
        """argparse's own, sized as it sizes itself, but without shutil: argparse makes one per
        argument added."""

        def __init__(self, prog, indent_increment=2, max_help_position=24, width=None):
            if width is None:
                width = terminal_columns() - 2
            super().__init__(prog, indent_increment, max_help_position, width)

    return Formatter


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser. Given the arguments, only the command they name gets its sub-parser
    filled in (the others are left out: building them all took longer than the rest of a `gpuquota
    submit`); every command is there for --help, a mistyped command or an uncertain case."""
    import argparse

    formatter = _formatter_class()
    parser = argparse.ArgumentParser(
        prog="gpuquota", description="Submit and watch jobs on gpuquota shares.", formatter_class=formatter
    )
    parser.add_argument("--version", action="version", version=f"gpuquota {__version__}")
    parser.add_argument("--json", action="store_true", help="print the server's JSON (for scripts)")
    parser.add_argument("--url", help="server URL (default: the one you logged in to, or $GPUQUOTA_URL)")
    parser.add_argument("--config", dest="config_file", help="config file (default: the user config dir)")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)
    only = None if argv is None else command_in(argv)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        if only is None or name == only:
            p = sub.add_parser(name, help=help_text, formatter_class=formatter)
            add_arguments(p)
            p.set_defaults(func=globals()[run])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--version"]:
        print(f"gpuquota {__version__}")  # what argparse's version action prints, without argparse
        return 0
    args = quick_submit_args(argv)
    if args is None:
        args = build_parser(argv).parse_args(argv)
    from gpuquota_client import config

    args.config_path = config.config_path(args.config_file)

    from gpuquota_client.client import ApiError, Client, ClientError

    loaded: list[dict] = []

    def settings() -> dict:
        """The config file's contents, read once."""
        if not loaded:
            loaded.append(config.load(args.config_path))
        return loaded[0]

    def client() -> Client:
        url = args.url or settings().get("url")
        if not url:
            raise UsageError("not logged in: run `gpuquota login URL` first (or set GPUQUOTA_URL)")
        return Client(url, settings().get("token"))

    def out(value: Any) -> None:
        if isinstance(value, str):
            print(value)
        else:
            import json

            print(json.dumps(value, indent=2))

    args.client = client
    args.settings = settings
    try:
        try:
            return args.func(args, out)
        finally:
            sys.stdout.flush()  # a closed pipe shows here, inside the handler below
    except BrokenPipeError:
        # Piped into `head` (or anything that stops reading): stop quietly, as `cat` would. Point stdout
        # at /dev/null so that the interpreter's own flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a pipeline stopped by its reader
    except UsageError as e:
        print(f"gpuquota: {e}", file=sys.stderr)
        return 2
    except ApiError as e:
        message = e.message
        if e.status == 401:
            message += " Run `gpuquota login URL` to log in again."
        print(f"gpuquota: {message}", file=sys.stderr)
        return 2 if 400 <= e.status < 500 else 1
    except ClientError as e:
        print(f"gpuquota: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
