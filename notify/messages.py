"""What a notification says. Only what its reader may see: a user's channel hears of their own jobs, a
team's channel of the jobs of its shares, and neither of the job's command or environment, nor of the
other team's job that took the GPUs (README, "Security model"). A burst of one channel's news is one
message (a thousand tasks of an array started: one message, counted, the first lines shown)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from notify.models import Event, Kind

SHOWN_LINES = 20
EVENT_OF_KIND = {
    "STARTED": Event.STARTED,
    "PREEMPTED": Event.PREEMPTED,
    "SUCCEEDED": Event.ENDED,
    "FAILED": Event.ENDED,
    "CANCELLED": Event.ENDED,
}
PAST = {
    Event.STARTED: "started",
    Event.PREEMPTED: "pre-empted",
    Event.ENDED: "ended",
    Event.WAITING: "waiting",
}


def duration_words(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def line_for(job, kind: str, detail: dict[str, Any], at: datetime) -> tuple[str, dict[str, Any]]:
    """One job's news in a line, and as data for a JSON webhook."""
    name = f"job {job.pk}" + (f" {job.name!r}" if job.name else "")
    data: dict[str, Any] = {
        "job": job.pk,
        "name": job.name,
        "share": job.share.name,
        "team": job.share.team.slug,
        "owner": job.submitted_by.get_username(),
        "event": kind.lower(),
        "at": at.isoformat(),
    }
    if kind == "STARTED":
        text = f"{name} on {job.share.name} started"
    elif kind == "PREEMPTED":
        lost = float(detail.get("gpu_seconds_lost") or 0)
        data["gpu_seconds_lost"] = round(lost, 1)
        text = f"{name} on {job.share.name} was pre-empted: {duration_words(lost)} of GPU work lost"
        if detail.get("last_checkpoint_at"):
            age = (at - datetime.fromisoformat(detail["last_checkpoint_at"])).total_seconds()
            data["checkpoint_age_s"] = round(age)
            text += f", its last checkpoint {duration_words(age)} old"
        else:
            data["checkpoint_age_s"] = None
            text += ", no checkpoint"
        text += "; it is queued again"
    elif kind == "WAITING":
        until = datetime.fromisoformat(detail["until"])
        data["likely_start_by"] = until.isoformat()
        text = (
            f"{name} on {job.share.name} is still waiting: its likely start range ended "
            f"{duration_words((at - until).total_seconds())} ago"
        )
    else:
        text = f"{name} on {job.share.name} {kind.lower()}"
    return text, data


def compose(channel, items) -> tuple[str, str, dict[str, Any]]:
    """(subject, text, payload) of one message telling `items` (Pending rows, oldest first)."""
    counts = Counter(PAST[item.event] for item in items)
    subject = "gpuquota: " + ", ".join(
        f"{n} job{'s' if n != 1 else ''} {what}" for what, n in sorted(counts.items())
    )
    lines = [item.line for item in items[:SHOWN_LINES]]
    if len(items) > SHOWN_LINES:
        lines.append(f"... and {len(items) - SHOWN_LINES} more")
    text = "\n".join(lines)
    if channel.kind == Kind.CHAT:
        # Slack's and Mattermost's incoming webhooks take {"text"}; Teams' (connectors and workflows)
        # take the same "text" too.
        payload = {"text": f"*{subject}*\n{text}"}
    else:
        payload = {"subject": subject, "count": len(items), "events": [item.data for item in items]}
    return subject, text, payload
