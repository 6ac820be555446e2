"""Phase C where a share's smallest job left would break the cover (issue 38.4): its jobs are not tried one by
one (rules.TypePass.run); each only hears why it waits, with the numbers of that moment, when the
reasons are read. The check is _borrow's own (the cover grows with the size), so it is exact at its
edge: a job that takes exactly the idle lendable GPUs still borrows. The reasons read later are the
ones written at once (also checked on random states and whole traces in test_policy_properties and
test_engine_incremental)."""

from __future__ import annotations

import pytest

from quotas.engine import rules
from quotas.engine.policy import ShareView, plan
from quotas.engine.views import LEND, LEND_AND_BORROW

from .test_policy_properties import plan_lazy_and_eager
from .test_policy_settled import _job, _node, _run, _snap


def _cluster(gpus: int):
    """Share a (capacity 4) runs 4 own GPUs on n1 and queues one job of `gpus`; share b (capacity 8)
    runs 2 on n2 and lends the 6 it leaves idle: the cover leaves exactly 6 GPUs to borrow."""
    return _snap(
        [_node("n1", 4), _node("n2", 8)],
        [ShareView("a", {"a100": 4}, LEND_AND_BORROW), ShareView("b", {"a100": 8}, LEND)],
        running=[_run("r1", "a", "n1", (0, 1, 2, 3)), _run("r2", "b", "n2", (0, 1))],
        queued=[_job("a1", "a", gpus)],
    )


@pytest.mark.parametrize("gpus", [1, 6])
def test_a_job_that_takes_at_most_the_idle_lendable_gpus_still_borrows(gpus):
    p = plan_lazy_and_eager(_cluster(gpus))
    assert [(a.job_id, a.borrowed) for a in p.admissions] == [("a1", True)]


def test_a_job_bigger_than_the_idle_lendable_gpus_waits_and_is_told_how_many_there_are():
    p = plan_lazy_and_eager(_cluster(7))
    assert not p.admissions
    assert (
        p.waiting["a1"]
        == "needs 7 a100: share at its own capacity (4 of 4); only 6 idle lendable a100 to borrow"
    )


@pytest.mark.engine_as_python  # patches the engine (tests/conftest.py)
def test_jobs_that_cannot_keep_the_cover_are_not_tried_one_by_one(monkeypatch):
    """b uses all it could lend: a's smallest job left would break the cover, so no _borrow call is made
    for a's queue, and the reasons, read later, are the ones written at once."""
    calls = []
    borrow = rules.TypePass._borrow

    def counted(self, s, k):
        calls.append(self.q[s][k].job_id)
        return borrow(self, s, k)

    monkeypatch.setattr(rules.TypePass, "_borrow", counted)
    snapshot = _snap(
        [_node("n1", 4), _node("n2", 8)],
        [ShareView("a", {"a100": 4}, LEND_AND_BORROW), ShareView("b", {"a100": 8}, LEND)],
        running=[_run("r1", "a", "n1", (0, 1, 2, 3)), _run("r2", "b", "n2", tuple(range(8)))],
        queued=[_job("a1", "a", 2), _job("a2", "a", 1)],
    )
    p = plan(snapshot)
    assert not p.admissions
    assert dict(p.waiting) == {
        "a1": "needs 2 a100: share at its own capacity (4 of 4); nothing idle to borrow",
        "a2": "needs 1 a100: share at its own capacity (4 of 4); nothing idle to borrow",
    }
    assert not calls
    plan_lazy_and_eager(snapshot)
