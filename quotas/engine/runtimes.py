"""Runtime estimates that learn (SEMANTICS.md "Forecast": runtime estimates, ranges). Pure: no Django, no I/O.

The control side (and the simulator) hand over the runtimes they have seen, per share and per (user, job
name); `Runtimes.guess` turns them into a job's guessed runtime for the forecast's replays:
- the distribution comes from the job's own kind (the same user's jobs of the same name) where there are
  GROUP_MIN_SAMPLES of them, else from its share where there are SHARE_MIN_SAMPLES, else a default;
- for a running attempt it is the remaining time *given how long it has run*: among the seen runtimes
  longer than its elapsed time, their quantile minus that time (a job that has run 20 h of a heavy-tailed
  workload is not "due in 2 h" because the median job runs 3 h). Where fewer than TAIL_MIN_SAMPLES seen
  runtimes are that long, it runs past what the system knows; the remaining time then follows the
  heavy tail's rule of thumb (Lindy: as long again as it has run, for the median);
- never beyond a declared max_runtime_s.
Each guess carries three points of the distribution: LOW_Q, the median and HIGH_Q. The forecast replays
the queue with each (quantile replays), and a job's likely range of start is between the starts of the
LOW_Q and HIGH_Q replays.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

LOW_Q = 0.1
HIGH_Q = 0.9
GROUP_MIN_SAMPLES = 10  # a user's job name needs this many seen runtimes to be its own estimate
SHARE_MIN_SAMPLES = 5
# The estimates learn from the RECENT_SAMPLE most recent successful runtimes of each share and of each kind
# of job (production and the simulator alike): recent enough to follow a workload as it changes, enough
# for a tail. Measured (bench/RESULTS.md, issue 27): 100 guessed better than 200 and 1,000 on ITP week 1
# and tracegen (week 2 mixed), 50 worse (too few for the tail of a running attempt's remaining life).
RECENT_SAMPLE = 100
TAIL_MIN_SAMPLES = 5  # seen runtimes longer than a running attempt's elapsed time, to condition on them
MIN_REMAINING_S = 60.0  # a running attempt with a guessed runtime is never "due this instant"
# Without history: a median of DEFAULT_RUNTIME_S and a spread of a factor DEFAULT_SPREAD either way at the
# 10th/90th percentile (a log-normal's with sigma 1.1: runtimes of unknown work span orders of magnitude).
DEFAULT_SPREAD = 4.0
# How a guess from too little history is named in an ETA's basis: such an ETA says so, and is kept out of
# the track record (quotas.track_record), whose figures would measure the default, not the forecast.
TOO_LITTLE_HISTORY = "too little history yet"


def default_words(seconds: float) -> str:
    return f"{TOO_LITTLE_HISTORY}: a default {duration(seconds)} assumed"


_Z = statistics.NormalDist()


@dataclass(frozen=True, slots=True)
class Observed:
    """Runtimes seen (seconds, sorted ascending) and whose they are ("vision-main", "bob's train-bert")."""

    label: str
    samples: tuple[float, ...]

    @classmethod
    def of(cls, label: str, samples: Iterable[float]) -> Observed:
        return cls(label, tuple(sorted(max(1.0, float(s)) for s in samples)))

    def quantile(self, q: float) -> float:
        return _quantile(self.samples, q)

    def remaining(self, elapsed: float, q: float) -> float:
        """The q-quantile of the remaining time of an attempt that has run `elapsed` seconds."""
        tail = self.samples[bisect.bisect_right(self.samples, elapsed) :]
        if len(tail) >= TAIL_MIN_SAMPLES:
            return max(MIN_REMAINING_S, _quantile(tail, q) - elapsed)
        return max(MIN_REMAINING_S, lindy_remaining(elapsed, q))


def _quantile(values: tuple[float, ...], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if len(values) == 1:
        return values[0]
    pos = q * (len(values) - 1)
    i = int(pos)
    if i >= len(values) - 1:
        return values[-1]
    return values[i] + (values[i + 1] - values[i]) * (pos - i)


def lindy_remaining(elapsed: float, q: float) -> float:
    """Remaining time at quantile q of work whose runtime tail is Pareto with index 1: P(T > a + r | T > a)
    = a / (a + r), so r_q = a q / (1 - q): the median is as long again as it has run."""
    q = min(q, 0.99)
    return max(elapsed, 1.0) * q / (1.0 - q)


@dataclass(frozen=True, slots=True)
class Guess:
    """A job's guessed runtime (from its attempt's start): the point the forecast replays with, and the
    LOW_Q / HIGH_Q points the range replays use. `source` names where it comes from, for the ETA's basis."""

    seconds: float
    low: float
    high: float
    source: str | None  # an Observed's label; None: the default
    conditional: bool = False  # a running attempt's: given how long it has run

    def words(self) -> str:
        if self.source is None:
            return default_words(self.seconds)
        return f"runtimes seen in {self.source}"


def duration(seconds_f: float) -> str:
    seconds = int(round(seconds_f))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h".replace(".0 h", " h")
    return f"{seconds / 86400:.1f} days".replace(".0 days", " days")


class Runtimes:
    """What the system has seen, ready to guess from. `by_share`: share -> runtimes; `by_group`: (share,
    user, job name) -> runtimes (a job array's tasks share a name)."""

    def __init__(
        self,
        by_share: Mapping[str, Iterable[float]] | None = None,
        by_group: Mapping[tuple[str, Hashable, str], Iterable[float]] | None = None,
        *,
        default_s: float = 3600.0,
    ) -> None:
        self.default_s = float(default_s)
        self.shares: dict[str, Observed] = {}
        for share, values in (by_share or {}).items():
            values = list(values)
            if len(values) >= SHARE_MIN_SAMPLES:
                self.shares[share] = Observed.of(share, values)
        self.groups: dict[tuple[str, Hashable, str], Observed] = {}
        for key, values in (by_group or {}).items():
            values = list(values)
            if len(values) >= GROUP_MIN_SAMPLES and key[2]:
                share, user, name = key
                self.groups[key] = Observed.of(f"{user}'s {name!r} jobs", values)

    def observed(self, share: str, user: Hashable = None, name: str = "") -> Observed | None:
        return self.groups.get((share, user, name)) or self.shares.get(share)

    def guess(
        self,
        share: str,
        user: Hashable = None,
        name: str = "",
        *,
        elapsed: float | None = None,
        max_runtime_s: float | None = None,
    ) -> Guess:
        """The guessed runtime of a job, counted from its (current or next) attempt's start. `elapsed`:
        how long its running attempt has run (None: not running)."""
        seen = self.observed(share, user, name)
        if seen is None:
            guess = self._default(elapsed)
        elif elapsed is None or elapsed <= 0:
            guess = Guess(seen.quantile(0.5), seen.quantile(LOW_Q), seen.quantile(HIGH_Q), seen.label)
        else:
            guess = Guess(
                elapsed + seen.remaining(elapsed, 0.5),
                elapsed + seen.remaining(elapsed, LOW_Q),
                elapsed + seen.remaining(elapsed, HIGH_Q),
                seen.label,
                conditional=True,
            )
        if max_runtime_s is not None:
            cap = float(max_runtime_s)
            guess = Guess(
                min(guess.seconds, cap),
                min(guess.low, cap),
                min(guess.high, cap),
                guess.source,
                guess.conditional,
            )
        return guess

    def at(
        self,
        q: float,
        share: str,
        user: Hashable = None,
        name: str = "",
        *,
        elapsed: float | None = None,
        max_runtime_s: float | None = None,
    ) -> float:
        """The runtime (from the attempt's start) at quantile q of what `guess` draws from."""
        seen = self.observed(share, user, name)
        if seen is None:
            d = self.default_s * DEFAULT_SPREAD ** (_Z.inv_cdf(q) / _Z.inv_cdf(HIGH_Q))
            value = (
                d
                if not elapsed or d > elapsed + MIN_REMAINING_S
                else elapsed + max(MIN_REMAINING_S, lindy_remaining(elapsed, q))
            )
        elif not elapsed or elapsed <= 0:
            value = seen.quantile(q)
        else:
            value = elapsed + seen.remaining(elapsed, q)
        return value if max_runtime_s is None else min(value, float(max_runtime_s))

    def bounded(
        self,
        share: str,
        user: Hashable = None,
        name: str = "",
        *,
        max_runtime_s: float,
        elapsed: float | None = None,
    ) -> tuple[float, float]:
        """The LOW_Q and high points of a job with an enforced max runtime, for the range replays: it ends
        by its max runtime, and likely as early as the guess's low point. Where the guess's low point
        reaches the limit (a limit below anything seen, or the default's), the low point is the limit's as
        the default spreads (DEFAULT_SPREAD squared below its high point): a bound's early ends are what
        its range is made of, and without them a range would have no width."""
        cap = float(max_runtime_s)
        low = self.guess(share, user, name, elapsed=elapsed, max_runtime_s=cap).low
        if low >= cap:
            low = cap / DEFAULT_SPREAD**2
            if elapsed:
                low = max(low, min(cap, elapsed + MIN_REMAINING_S))
        return low, cap

    def _default(self, elapsed: float | None) -> Guess:
        d = self.default_s
        if elapsed is None or elapsed <= 0:
            return Guess(d, d / DEFAULT_SPREAD, d * DEFAULT_SPREAD, None)
        if elapsed < d:  # not yet past the default median: the rest of it, spread as the default's
            low = elapsed + max(MIN_REMAINING_S, (d - elapsed) / DEFAULT_SPREAD)
            # Within MIN_REMAINING_S of the default the point moves with the low end (never below it).
            return Guess(max(d, low), low, d * DEFAULT_SPREAD, None, True)
        return Guess(
            elapsed + max(MIN_REMAINING_S, lindy_remaining(elapsed, 0.5)),
            elapsed + max(MIN_REMAINING_S, lindy_remaining(elapsed, LOW_Q)),
            elapsed + max(MIN_REMAINING_S, lindy_remaining(elapsed, HIGH_Q)),
            None,
            True,
        )
