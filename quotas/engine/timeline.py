"""What the simulator records over virtual time and the report draws: plain data, and the percentile
both use. Its own module so that the report reads the simulator's record without importing the
simulator (which calls the report from its command line)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class Timeline:
    """Step functions over virtual time, recorded only where a value changes.

    Keys are ``(share, gpu_type, metric)`` with metric ``own``, ``borrowed``, ``lent`` or ``capacity``;
    the unassigned pool shows as share ``policy.UNASSIGNED`` (metric ``lent``) and the READY cluster as
    share ``"(cluster)"`` (metric ``capacity``). A value holds from its time until the next change.
    """

    CLUSTER: ClassVar[str] = "(cluster)"

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], tuple[list[int], list[float]]] = {}
        self.end = 0

    def record(self, t: int, values: Mapping[tuple[str, str, str], float]) -> None:
        series = self.series
        for key, (_, now) in series.items():
            if now[-1] and key not in values:
                self.set_value(key, t, 0)
        for key, value in values.items():
            held = series.get(key)
            if held is None or held[1][-1] != value:  # else _set would keep the series as it is
                self.set_value(key, t, value)
        self.end = max(self.end, t)

    def set_value(self, key: tuple[str, str, str], t: int, value: float) -> None:
        """The series `key` holds `value` from `t` on (t at or after its last change)."""
        held = self.series.get(key)
        if held is None:  # (not setdefault: it would make two lists and a tuple at every call)
            held = self.series[key] = ([], [])
        times, values = held
        if values and values[-1] == value:
            return
        if times and times[-1] == t:
            values[-1] = value
            if len(values) > 1 and values[-2] == value:
                times.pop()
                values.pop()
        else:
            times.append(t)
            values.append(value)

    def keys(self, *, share: str | None = None, metric: str | None = None) -> list[tuple[str, str, str]]:
        return sorted(
            k for k in self.series if (share is None or k[0] == share) and (metric is None or k[2] == metric)
        )

    def integral(self, key: tuple[str, str, str], until: int | None = None) -> float:
        """The area under one series over [0, until] (default: the end of the run)."""
        until = self.end if until is None else until
        times, values = self.series.get(key, ((), ()))
        total = 0.0
        if not times:
            return total
        # Each value times how long it held, summed in time order (the same sums, in the same order, as
        # an indexed walk; a replay's result reads thousands of series of up to 100k steps).
        ends = [*times[1:], until]
        for t, v, nxt in zip(times, values, ends, strict=True):
            if t >= until:
                break
            total += v * ((nxt if nxt < until else until) - t)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "end": self.end,
            "series": [
                {"share": s, "gpu_type": g, "metric": m, "t": list(ts), "v": list(vs)}
                for (s, g, m), (ts, vs) in sorted(self.series.items())
            ],
        }


def percentile(sorted_values: Sequence[int], pct: int) -> int | None:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100 * len(sorted_values)))
    return sorted_values[rank - 1]
