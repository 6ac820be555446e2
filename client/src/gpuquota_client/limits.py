"""The server's limits on what a job may ask for (jobs/limits.py on the server: one set of limits, one
message each, in the form, the API and here). `gpuquota submit` checks against them before it sends
anything, and refuses with the server's own words (exit code 2). The server tells its limits at login
(`limits` in the token answer, kept in the config file); DEFAULTS are its defaults, for a login made
with an older server. Nothing imported: a submit starts fast."""

from __future__ import annotations

DEFAULTS: dict[str, dict] = {
    "gpus": {"min": 1, "max": 4096, "message": "Ask for 1 to 4,096 GPUs."},
    "priority": {"min": 0, "max": 9999, "message": "Priority is an integer from 0 to 9999."},
    "max_preemptions": {
        "min": -1,
        "max": 2147483647,
        "message": "max_preemptions is -1 (unlimited) or 0 to 2,147,483,647.",
    },
    "max_runtime_s": {"min": 1, "max": 2147483647, "message": "max_runtime_s is 1 to 2,147,483,647 seconds."},
    "preemption_grace_s": {
        "min": 0,
        "max": 3600,
        "message": "The grace period is 0 to 3,600 seconds (MAX_PREEMPTION_GRACE_S): the time a pre-empted "
        "or cancelled job has between SIGTERM and SIGKILL.",
    },
    "min_runtime_s": {
        "min": 0,
        "max": 86400,
        "message": "min_runtime_s is 0 to 86,400 seconds (MAX_MIN_RUNTIME_S): how long a share's jobs run "
        "before a pre-emption may take them.",
    },
    "array": {
        "min": 1,
        "max": 10000,
        "message": "An array has 1 to 10,000 tasks (MAX_ARRAY_SIZE).",
        "value_words": "this one has {value:,}",
    },
}


def problem(limits: dict | None, field: str, value: int) -> str | None:
    """None if `value` is within the limit of `field` (the server's, else the default), else its
    message, in the server's words."""
    limit = (limits or {}).get(field) or DEFAULTS.get(field)
    if not isinstance(limit, dict) or value is None:
        return None
    try:
        if limit["min"] <= value <= limit["max"]:
            return None
        message = str(limit["message"])
    except (KeyError, TypeError):
        return None  # not a limit this client understands: the server will say
    if limit.get("value_words"):
        return f"{message[:-1]}; {limit['value_words'].format(value=value)}."
    return message
