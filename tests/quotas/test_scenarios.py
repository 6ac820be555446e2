"""The example scenarios of shared/scenarios/ replayed with the real policy, attempt by attempt.

Copies live in tests/quotas/scenarios/ so that these tests never depend on shared/; when shared/ is
there, the copies must still equal it and are replayed from there too.
"""

import json
from pathlib import Path

import pytest

from quotas.engine import scenario as sc
from quotas.engine.simulate import main, simulate

FIXTURES = Path(__file__).resolve().parent / "scenarios"
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "scenarios"

# job -> [(start, end, outcome, borrowed, preempted_by, preemption_reason)], as the README says.
EXPECTED = {
    "three-projects-borrow-reclaim": {
        "a1": [(0, 1000, "SUCCEEDED", False, None, None)],
        "a2": [(0, 1000, "SUCCEEDED", True, None, None)],
        "a3": [(0, 100, "PREEMPTED", True, "b1", "RECLAIM"), (1000, 2000, "SUCCEEDED", False, None, None)],
        "b1": [(100, 1100, "SUCCEEDED", False, None, None)],
    },
    "reserve-and-priority": {
        "r1": [(0, 500, "SUCCEEDED", False, None, None)],
        "p-low": [
            (10, 20, "PREEMPTED", False, "p-high", "PRIORITY"),
            (120, 420, "SUCCEEDED", False, None, None),
        ],
        "p-high": [(20, 120, "SUCCEEDED", False, None, None)],
        "r2": [(500, 1000, "SUCCEEDED", False, None, None)],
    },
}


def _attempts(result: dict) -> dict:
    return {
        job_id: [
            (a["start"], a["end"], a["outcome"], a["borrowed"], a["preempted_by"], a.get("preemption_reason"))
            for a in job["attempts"]
        ]
        for job_id, job in result["jobs"].items()
    }


def _shared(name: str) -> Path:
    path = SHARED / f"{name}.json"
    if not path.exists():
        pytest.skip("shared/scenarios is not there")
    return path


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_it_replays_the_fixture_attempt_by_attempt(name):
    result = simulate(sc.load(FIXTURES / f"{name}.json")).to_dict()
    assert _attempts(result) == EXPECTED[name]
    assert all(job["final"] == "SUCCEEDED" for job in result["jobs"].values())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_it_replays_the_shared_scenario_attempt_by_attempt(name):
    result = simulate(sc.load(_shared(name))).to_dict()
    assert _attempts(result) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_fixture_copy_equals_shared(name):
    assert json.loads(_shared(name).read_text()) == json.loads((FIXTURES / f"{name}.json").read_text())


def test_admission_reasons_follow_the_readme():
    result = simulate(sc.load(FIXTURES / "three-projects-borrow-reclaim.json")).to_dict()
    reasons = {job_id: [a["reason"] for a in job["attempts"]] for job_id, job in result["jobs"].items()}
    assert reasons["a1"] == ["ADMITTED_OWN"]
    assert reasons["a2"] == ["ADMITTED_BORROWED"]
    assert reasons["a3"][0] == "ADMITTED_BORROWED"
    assert reasons["b1"] == ["ADMITTED_OWN"]


def test_three_projects_accounting():
    result = simulate(sc.load(FIXTURES / "three-projects-borrow-reclaim.json")).to_dict()
    shares = result["shares"]
    # a: a1 and a3's second run own; a2 (1000 s) and a3's first run (100 s) borrowed.
    assert shares["project-a"]["gpu_seconds_own"] == 2000
    assert shares["project-a"]["gpu_seconds_borrowed"] == 1100
    # b lent its GPU until b1 came at 100; c lent its GPU until a2 ended at 1000.
    assert shares["project-b"]["gpu_seconds_lent"] == 100
    assert shares["project-c"]["gpu_seconds_lent"] == 1000
    assert shares["project-a"]["preempted_jobs"] == 1
    assert shares["project-c"]["mean_wait_s"] is None
    assert result["cluster"]["makespan_s"] == 2000
    assert result["cluster"]["lost_gpu_seconds"] == 100  # a3 restarted from zero
    assert result["cluster"]["utilisation"] == pytest.approx(4100 / 6000, abs=1e-6)


def test_the_cli_writes_the_result(tmp_path):
    out = tmp_path / "result.json"
    assert main([str(FIXTURES / "reserve-and-priority.json"), "--out", str(out)]) == 0
    assert _attempts(json.loads(out.read_text())) == EXPECTED["reserve-and-priority"]
