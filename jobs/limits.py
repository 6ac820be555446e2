"""The one set of limits on what a job may ask for, and the one message for each: the dashboard's form
(jobs.forms), the API's serializers (jobs.api.serializers), the services (jobs.services, which every
interface goes through) and, told by the server at login, the CLI (client/.../limits.py holds the same
words, kept equal by tests/security/test_grace_cap_and_cancel.py) all read them from here. A value one
interface refuses, every other refuses too, in the same words.

Some bounds are operator settings (MAX_PREEMPTION_GRACE_S, MAX_ARRAY_SIZE): read when a value is
checked, never frozen at import."""

from __future__ import annotations

from dataclasses import dataclass

# The largest integer every supported database stores in an integer column (PostgreSQL `integer`); a
# larger one overflowed SQLite's INTEGER and answered a 500.
MAX_INT = 2**31 - 1
MAX_PRIORITY = 9999
# No cluster this product runs has a single job of more GPUs; the nodes' shapes refuse most requests
# long before (jobs.services.check_fits).
MAX_GPUS = 4096
MAX_NAME = 200


@dataclass(frozen=True)
class IntLimit:
    """An integer a job field may hold: from `low` to `high` (or to the setting `setting`), and the one
    sentence that says so (`{low}` and `{high}` filled in)."""

    field: str
    low: int
    high: int = MAX_INT
    message: str = ""
    setting: str = ""
    # The refusal also says the value given ("; this one has 11.").
    value_words: str = ""

    @property
    def top(self) -> int:
        if self.setting:
            from django.conf import settings

            return int(getattr(settings, self.setting))
        return self.high

    def text(self) -> str:
        return self.message.format(low=self.low, high=self.top)

    def problem(self, value) -> str | None:
        """None if `value` is an integer within the limit, else the message."""
        if type(value) is not int or not self.low <= value <= self.top:
            if self.value_words and type(value) is int:
                return f"{self.text()[:-1]}; {self.value_words.format(value=value)}."
            return self.text()
        return None

    def as_dict(self) -> dict:
        out = {"min": self.low, "max": self.top, "message": self.text()}
        if self.value_words:
            out["value_words"] = self.value_words
        return out


GPUS = IntLimit("gpus", 1, MAX_GPUS, "Ask for {low} to {high:,} GPUs.")
PRIORITY = IntLimit("priority", 0, MAX_PRIORITY, "Priority is an integer from {low} to {high}.")
PREEMPTION_GRACE = IntLimit(
    "preemption_grace_s",
    0,
    message="The grace period is {low} to {high:,} seconds (MAX_PREEMPTION_GRACE_S): the time a pre-empted "
    "or cancelled job has between SIGTERM and SIGKILL.",
    setting="MAX_PREEMPTION_GRACE_S",
)
MAX_RUNTIME = IntLimit("max_runtime_s", 1, MAX_INT, "max_runtime_s is {low} to {high:,} seconds.")
MAX_PREEMPTIONS = IntLimit(
    "max_preemptions", -1, MAX_INT, "max_preemptions is -1 (unlimited) or 0 to {high:,}."
)
ARRAY_SIZE = IntLimit(
    "array",
    1,
    message="An array has {low} to {high:,} tasks (MAX_ARRAY_SIZE).",
    setting="MAX_ARRAY_SIZE",
    value_words="this one has {value:,}",
)

# A share's protection window (Share.min_runtime_s, SEMANTICS rule 10): a promise to its jobs, held to
# the same one-sentence rule in the shares form, the API and `gpuquota min-runtime`.
MIN_RUNTIME = IntLimit(
    "min_runtime_s",
    0,
    message="min_runtime_s is {low} to {high:,} seconds (MAX_MIN_RUNTIME_S): how long a share's jobs run "
    "before a pre-emption may take them.",
    setting="MAX_MIN_RUNTIME_S",
)

# What a job's submit may ask for, by field: the form, the API and the CLI (at login) all get these.
JOB_LIMITS = {
    limit.field: limit for limit in (GPUS, PRIORITY, PREEMPTION_GRACE, MAX_RUNTIME, MAX_PREEMPTIONS)
}


def job_limits() -> dict[str, dict]:
    """Every limit as {field: {"min", "max", "message"}}, the settings' values filled in (the token
    answer gives it to the CLI, which checks before it sends anything)."""
    limits = {**JOB_LIMITS, "array": ARRAY_SIZE, "min_runtime_s": MIN_RUNTIME}
    return {name: limit.as_dict() for name, limit in limits.items()}


def effective_grace(grace_s: int) -> int:
    """The grace a stop is sent with: the job's, never more than MAX_PREEMPTION_GRACE_S (a job stored
    before the cap, or before an operator lowered it, is held to today's cap too)."""
    return min(grace_s, PREEMPTION_GRACE.top)
