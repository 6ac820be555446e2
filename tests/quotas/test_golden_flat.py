"""A layout without groups decides exactly as before (issue 37, item 2): a golden digest of every decision.

The simulator (the engine kept between passes, the same policy as production's `policy.plan`) replays
four flat workloads, and every decision it made is digested and compared with the digest stored in
tests/quotas/golden/flat_decisions.json, written before the organisation tree existed:
- tracegen 20k: `tracegen.generate(teams=6, gpus=512, jobs=20000, seed=1)` (bench 1's first size);
- the ITP fortnight of bench 10 (days 14-28 of ../shared/data/msft-itp-2021.csv, 168 x 8 a100, victims by
  safe point, half the jobs checkpointing), without and with `min_runtime_s = 600` (rule 10);
- tracegen 1,000 jobs on 64 GPUs with the forecast at each submit (the forecast replays the policy).

Per job the digest covers each attempt's (start, end, nodes, borrowed, outcome, preempted_by, reason,
preemption_reason), the forecast at submit where there is one, and why it still waits at the end;
jobs are hashed in chunks of 100 (sorted by id), so a failure names the first chunk and its job ids
that diverge. The shares' and the cluster's blocks are hashed whole.

Regenerate (only when a change of decisions is intended, and say so in the commit):
    .venv/bin/python -m tests.quotas.test_golden_flat --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from quotas.engine import scenario as sc
from quotas.engine import tracegen
from quotas.engine.importtrace import ITP_TRACE
from quotas.engine.simulate import SimResult, simulate

GOLDEN = Path(__file__).resolve().parent / "golden" / "flat_decisions.json"
CHUNK = 100


def _itp(min_runtime_s: int) -> sc.Scenario:
    from bench.bench_itp import WINDOW, itp_scenario

    return itp_scenario(WINDOW, min_runtime_s)


def _tracegen(jobs: int, gpus: int, seed: int) -> sc.Scenario:
    return sc.parse(tracegen.generate(teams=6, gpus=gpus, jobs=jobs, seed=seed))


# name -> (scenario maker, simulate keyword arguments)
RUNS = {
    "tracegen-20k": (lambda: _tracegen(20_000, 512, 1), {}),
    "itp-fortnight": (lambda: _itp(0), {}),
    "itp-fortnight-min-runtime-600": (lambda: _itp(600), {}),
    "tracegen-1k-forecast": (lambda: _tracegen(1_000, 64, 2), {"forecast": True}),
}


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def _job_row(job_id: str, result: SimResult) -> list:
    record = result.jobs[job_id]
    return [
        job_id,
        record.final,
        [
            [a.start, a.end, [n for n, _ in a.placement], a.borrowed, a.outcome, a.preempted_by, a.reason]
            + [a.preemption_reason]
            for a in record.attempts
        ],
        record.forecast_at_submit,
        result.waiting.get(job_id),
    ]


def _shares_block(result: SimResult) -> dict:
    """The shares' block as it was before the tree: the lost-work cause `fair_share` (rule 11) came with
    it and is 0 on a flat layout (asserted), so it is left out of the digest."""
    out = {}
    for name, block in result.shares.items():
        lost = dict(block["lost_gpu_seconds"])
        assert lost.pop("fair_share", 0) == 0, name
        out[name] = {**block, "lost_gpu_seconds": lost}
    return out


def digest(result: SimResult) -> dict:
    ids = sorted(result.jobs)
    chunks = []
    for i in range(0, len(ids), CHUNK):
        part = ids[i : i + CHUNK]
        chunks.append([part[0], part[-1], _hash([_job_row(j, result) for j in part])])
    return {
        "jobs": len(ids),
        "chunks": chunks,
        "shares": _hash(_shares_block(result)),
        "cluster": _hash({k: v for k, v in result.cluster.items()}),
        "rejected": _hash(result.rejected),
    }


def compute(name: str) -> dict:
    make, options = RUNS[name]
    return digest(simulate(make(), **options))


def _itp_available() -> bool:
    return Path(ITP_TRACE).exists()


@pytest.mark.parametrize("name", list(RUNS))
def test_a_flat_layout_decides_exactly_as_before(name):
    if name.startswith("itp") and not _itp_available():
        pytest.skip(f"{ITP_TRACE} is not here")
    expected = json.loads(GOLDEN.read_text())[name]
    got = compute(name)
    assert got["jobs"] == expected["jobs"]
    for mine, theirs in zip(got["chunks"], expected["chunks"], strict=True):
        assert mine == theirs, f"{name}: decisions differ first in jobs {theirs[0]}..{theirs[1]}"
    for key in ("shares", "cluster", "rejected"):
        assert got[key] == expected[key], f"{name}: the {key} block differs"


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print(__doc__)
        return 2
    GOLDEN.parent.mkdir(exist_ok=True)
    out = {name: compute(name) for name in RUNS}
    GOLDEN.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
