"""The what-if as Celery tasks: a preview is two replays (as is, with the change), a sweep one replay per
value, each its own task on the `whatif` queue; progress and results live in the cache under the run's
id; the same request while its run is going shows that run; a replay past its budget or failing says so."""

import io

import pytest
from django.core.cache.backends.locmem import LocMemCache
from django.core.management import call_command

from config.celery import WHATIF_QUEUE, route_task
from quotas import whatif
from quotas.choices import Strategy
from tests.web.conftest import submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(no_messages, db):
    """A small seeded week: 120 finished jobs on their own cluster (seed_history)."""
    call_command("seed_history", jobs=120, stdout=io.StringIO())
    return "hist-team-1"


def test_whatif_replays_go_to_the_whatif_queue_which_a_worker_of_its_own_consumes():
    """Never the control worker: a replay of a week holds a thread for minutes, and a sweep would hold
    every thread the heartbeats and passes need."""
    assert route_task("quotas.tasks.whatif_replay", (), {}, {}) == {"queue": WHATIF_QUEUE}
    assert route_task("quotas.tasks.scheduling_pass", (), {}, {}) == {"queue": "control"}
    from pathlib import Path

    lines = Path("Procfile.dev").read_text().splitlines()
    control = next(line for line in lines if line.startswith("worker:"))
    whatif_worker = next(line for line in lines if line.startswith("whatif:"))
    assert "-Q control " in control and WHATIF_QUEUE not in control
    assert f"-Q {WHATIF_QUEUE} " in whatif_worker


def test_a_preview_is_two_tasks_one_per_replay(no_messages, history, monkeypatch):
    sent = []
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: sent.append((run_id, index)))
    run_id = whatif.start_preview(share=history, changes={"strategy": Strategy.RESERVE, "borrow_limit": -1})
    assert sent == [(run_id, 0), (run_id, 1)]
    run = whatif.status(run_id)
    assert run.kind == "preview" and not run.finished and run.labels == ["as is", "with the change"]
    assert [p["state"] for p in run.parts] == [whatif.QUEUED, whatif.QUEUED]


def test_the_same_request_while_its_run_is_going_shows_that_run(no_messages, history, monkeypatch):
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    changes = {"borrow_limit": 50}
    first = whatif.start_preview(share=history, changes=changes)
    assert whatif.start_preview(share=history, changes=changes) == first
    assert whatif.start_preview(share=history, changes={"borrow_limit": 100}) != first  # another request
    for index in (0, 1):
        whatif.run_part(first, index, isolated=False)
    assert whatif.status(first).finished
    assert whatif.start_preview(share=history, changes=changes) != first  # done: asking again replays again


def test_a_part_is_replayed_once_even_if_its_task_is_delivered_twice(no_messages, history, monkeypatch):
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    run_id = whatif.start_preview(share=history, changes={})
    assert whatif.run_part(run_id, 0, isolated=False) == whatif.DONE
    monkeypatch.setattr(whatif, "replay", lambda *a, **k: pytest.fail("replayed twice"))
    assert whatif.run_part(run_id, 0, isolated=False) == whatif.DONE
    assert whatif.run_part("no-such-run", 0, isolated=False) == "unknown run"


def test_progress_is_stored_while_the_replay_runs(no_messages, history, monkeypatch):
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    monkeypatch.setattr(whatif, "PROGRESS_EVERY_S", 0.0)
    run_id = whatif.start_preview(share=history, changes={})
    key = whatif._part_key(run_id, 0)
    seen = []
    real_set = LocMemCache.set

    def spy(self, k, value, *args, **kwargs):
        if k.endswith(key):
            seen.append((value["state"], value.get("done"), value.get("total")))
        return real_set(self, k, value, *args, **kwargs)

    monkeypatch.setattr(LocMemCache, "set", spy)
    whatif.run_part(run_id, 0, isolated=False)
    total = seen[-1][2]
    assert total and seen[0] == (whatif.READING, 0, None) and seen[-1] == (whatif.DONE, total, total)
    middle = [done for state, done, _ in seen if state == whatif.REPLAYING]
    assert middle == sorted(middle) and any(0 < d < total for d in middle), seen
    run = whatif.status(run_id)
    assert not run.finished and run.parts[0]["done"] == total and 0 < run.percent <= 50


def test_a_preview_answers_the_comparison_when_both_replays_are_done(celery_eager, no_messages, history):
    run = whatif.status(
        whatif.start_preview(share=history, changes={"strategy": Strategy.RESERVE, "borrow_limit": -1})
    )
    assert run.finished and not run.failed and run.percent == 100
    result = run.result
    assert {r["share"] for r in result["rows"]} >= {history}
    assert next(r for r in result["rows"] if r["share"] == history)["changed"]
    assert [c["metric"] for c in result["cluster"]][0] == "utilisation over the replayed window (%)"
    assert run.window["jobs"] == 120 and run.window["left_out"] == 0
    # the same engine as the in-process preview (no second copy of the comparison)
    same = whatif.preview(share=history, changes={"strategy": Strategy.RESERVE, "borrow_limit": -1})
    assert same.rows == result["rows"] and same.cluster == result["cluster"]


def test_a_sweep_is_one_task_per_value_and_answers_the_trade_off(
    celery_eager, no_messages, history, monkeypatch
):
    sent = []
    real = whatif._enqueue
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: (sent.append(index), real(run_id, index)))
    run_id = whatif.start_sweep(
        share=history,
        setting="strategy",
        values=["RESERVE", "LEND", "LEND_AND_BORROW"],
        labels=["R", "L", "LB"],
    )
    run = whatif.status(run_id)
    assert sent == [0, 1, 2] and run.finished and not run.failed
    assert run.spec["variants"][0]["changes"] == {"strategy": "RESERVE", "borrow_limit": -1}
    table = run.result
    assert [r["value"] for r in table["rows"]] == ["R", "L", "LB"]
    assert table["chart"]["values"] == ["R", "L", "LB"] and len(table["chart"]["utilisation"]) == 3
    assert all(0 <= u <= 100 for u in table["chart"]["utilisation"])


def test_a_capacity_sweep_changes_only_that_gpu_type(no_messages, history, monkeypatch):
    monkeypatch.setattr(whatif, "_enqueue", lambda run_id, index: None)
    run = whatif.status(
        whatif.start_sweep(share=history, setting="capacity:v100", values=[8, 0], labels=["8", "0"])
    )
    assert [v["changes"] for v in run.spec["variants"]] == [{"capacity": {"v100": 8}}, {"capacity": {}}]


def test_a_replay_past_its_budget_fails_its_part_and_the_run_says_why(
    celery_eager, no_messages, history, monkeypatch
):
    monkeypatch.setattr(whatif, "BUDGET_S", -1.0)
    run = whatif.status(whatif.start_preview(share=history, changes={}))
    assert run.finished and run.result is None
    assert run.errors == ["the replay took longer than -1 s"]


def test_a_failing_replay_fails_its_part_not_the_worker(celery_eager, no_messages, history, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("boom")

    monkeypatch.setattr(whatif, "replay", broken)
    run = whatif.status(
        whatif.start_sweep(share=history, setting="borrow_limit", values=[0, 100], labels=["0", "100"])
    )
    assert run.finished and run.failed == [("0", "the replay failed (ValueError: boom)")] * 1 + [
        ("100", "the replay failed (ValueError: boom)")
    ]


def test_on_a_worker_the_replay_runs_in_a_process_of_its_own(no_messages, bob, vision_share, nodes):
    for _ in range(6):
        submit(bob, vision_share, gpus=4, max_runtime_s=600)
    scenario, _, _ = whatif.build_scenario()
    heard = []
    summary = whatif.replay_isolated(scenario, window_s=3600, on_progress=heard.append)
    assert summary == whatif.replay(scenario, window_s=3600)
    assert summary["jobs"] == 6 and summary["shares"]["vision-main"]["preemptions"] == 0


def test_a_replay_reports_progress_and_stops_at_its_budget_mid_run(history, monkeypatch):
    """The replay runs on the engine kept between passes (no planner given) and still hears each pass:
    progress as submissions reached, and the budget checked before every pass."""
    scenario, _, _ = whatif.build_scenario()
    heard = []
    monkeypatch.setattr(whatif, "PROGRESS_EVERY_S", 0.0)
    whatif.replay(scenario, window_s=7 * 86400, on_progress=heard.append)
    assert heard and heard == sorted(heard) and heard[-1] <= len(scenario.jobs) and heard[-1] > 0
    clock = iter(range(10**6))  # each look at the clock is one second later: out of budget mid-run
    monkeypatch.setattr(whatif.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(whatif.ReplayTooLong):
        whatif.replay(scenario, window_s=7 * 86400, budget_s=5)


def test_the_same_scenario_is_replayed_once_and_read_back_after(
    celery_eager, no_messages, history, monkeypatch
):
    """The as-is replay of a second preview in the same window is read back, not replayed; a changed
    variant is replayed."""
    calls = []
    real = whatif.replay
    monkeypatch.setattr(whatif, "replay", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    first = whatif.status(whatif.start_preview(share=history, changes={"borrow_limit": 50}))
    assert len(calls) == 2 and not any(p.get("reused") for p in first.parts)
    second = whatif.status(whatif.start_preview(share=history, changes={"borrow_limit": 0}))
    assert len(calls) == 3  # only "with the change"
    assert [bool(p.get("reused")) for p in second.parts] == [True, False]
    assert second.parts[0]["summary"] == first.parts[0]["summary"]
    assert second.spec["now"] == first.spec["now"]
