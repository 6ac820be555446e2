"""Proof, not hope: each attempt of a test job writes its own start, ticks and end, with timestamps taken
inside the job process, to a file outside the agents; the audit checks that no two attempts of one job
ran at the same time.

An attempt killed with SIGKILL writes no end: its last tick bounds it (it ticks every TICK_S while it
runs), so the interval taken for it is [start, last tick + TICK_S]. Every attempt writes to a file of
its own (`job-<id>.<attempt>`, in a 1777 directory), because a root agent runs each attempt as another
uid and the files are private to their writer.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

TICK_S = 0.5


@dataclass(frozen=True)
class Span:
    job: int
    attempt: int
    start: float
    end: float
    ended: bool  # wrote its end (not killed with SIGKILL)


class Ledger:
    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o1777)
        self.release_file = folder / "release"

    def command(self, *, run_s: float | None = None) -> str:
        """A shell job that records itself and runs until the ledger is released (or for `run_s`)."""
        f = shlex.quote(str(self.folder))
        until = f"[ ! -e {shlex.quote(str(self.release_file))} ]"
        if run_s is not None:
            until += f' && [ "$(date +%s)" -lt "$((S + {int(run_s)}))" ]'
        return (
            f'L={f}/job-"$GPUQUOTA_JOB_ID"."$GPUQUOTA_ATTEMPT"; S=$(date +%s); '
            'echo "start $(date +%s.%N)" >> "$L"; '
            'trap \'echo "end $(date +%s.%N)" >> "$L"; exit 143\' TERM; '
            f'while {until}; do echo "tick $(date +%s.%N)" >> "$L"; sleep {TICK_S}; done; '
            'echo "end $(date +%s.%N)" >> "$L"'
        )

    def release(self) -> None:
        self.release_file.touch()

    def spans(self) -> list[Span]:
        out = []
        for path in sorted(self.folder.glob("job-*.*")):
            job, attempt = (int(x) for x in path.name[len("job-") :].split("."))
            start = last = None
            ended = False
            for line in path.read_text().splitlines():
                kind, _, value = line.partition(" ")
                try:
                    t = float(value)
                except ValueError:
                    continue  # a line cut short by a kill
                if kind == "start":
                    start = t
                last = t if last is None else max(last, t)
                ended = ended or kind == "end"
            if start is None:
                continue
            out.append(Span(job, attempt, start, last if ended else last + TICK_S, ended))
        return out

    def attempts(self, job: int) -> list[Span]:
        return sorted((s for s in self.spans() if s.job == job), key=lambda s: s.attempt)

    def last_tick(self) -> float:
        """The latest timestamp any attempt wrote (to see that jobs kept running)."""
        return max((s.end for s in self.spans()), default=0.0)

    def assert_no_overlap(self) -> int:
        """No two attempts of one job overlapped in time; returns how many attempts were checked."""
        by_job: dict[int, list[Span]] = {}
        for s in self.spans():
            by_job.setdefault(s.job, []).append(s)
        problems = []
        for job, spans in by_job.items():
            spans.sort(key=lambda s: s.start)
            for a, b in zip(spans, spans[1:], strict=False):
                if b.start < a.end:
                    problems.append(
                        f"job {job}: attempt {b.attempt} started at {b.start:.2f}, "
                        f"{a.end - b.start:.2f} s before attempt {a.attempt} ended"
                    )
        assert not problems, "attempts overlapped:\n  " + "\n  ".join(problems)
        return sum(len(s) for s in by_job.values())
