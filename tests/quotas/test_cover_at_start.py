"""The cover's numbers a pass starts from are kept in the GPU type's state between passes and brought up
to date for the shares whose attempts changed (cover.CoverAtStart): at every pass of a replay they equal
the numbers made from scratch from the state as it stands, with a tree (limits and weights) and flat."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.bench_tree import _tree_of_50
from quotas.engine import rules, tracegen
from quotas.engine import scenario as sc
from quotas.engine.cover import CoverAtStart
from quotas.engine.simulate import simulate

SCENARIOS = Path(__file__).resolve().parents[3] / "shared" / "scenarios"
# Every test here patches TypePass (tests/conftest.py: with the engine compiled, they run as Python).
pytestmark = pytest.mark.engine_as_python


def _with_limits(data: dict) -> dict:
    """The 50-share tree with lend and borrow limits on some groups, so that offers are capped."""
    for i, group in enumerate(data["groups"]):
        if i % 3 == 1:
            group["lend_limit"] = 30
        if i % 4 == 2:
            group["borrow_limit"] = 50
    return data


def _replay_checking(monkeypatch, scenario: sc.Scenario) -> int:
    setup = rules.TypePass._cover_setup
    checked = [0]

    def checking(self, history, fair_reclaim):
        setup(self, history, fair_reclaim)
        kept = self.base.cover_at_start
        fresh = self._cover_from_scratch()
        for field in CoverAtStart.__slots__:
            assert getattr(kept, field) == getattr(fresh, field), field
        checked[0] += 1

    monkeypatch.setattr(rules.TypePass, "_cover_setup", checking)
    simulate(scenario)
    return checked[0]


@pytest.mark.parametrize("layout", ["flat", "tree", "tree-with-limits"])
def test_the_kept_numbers_equal_those_made_from_scratch_at_every_pass(monkeypatch, layout):
    data = tracegen.generate(teams=16, gpus=128, jobs=600, seed=4)
    if layout != "flat":
        data = _tree_of_50(data)
    if layout == "tree-with-limits":
        data = _with_limits(data)
    assert _replay_checking(monkeypatch, sc.parse(data)) > 100


def test_the_kept_numbers_hold_in_the_lend_limit_scenario(monkeypatch):
    path = SCENARIOS / "two-departments-lend-limit.json"
    if not path.exists():
        pytest.skip(f"{path} is not here")
    assert _replay_checking(monkeypatch, sc.parse(json.loads(path.read_text()))) > 0
