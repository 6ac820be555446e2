"""The advisor's runs (quotas.advice): the window built once, one Celery task per replay on the `whatif`
queue, stage 2 sent by the part that ends stage 1, the answer written once; results the same whatever the
order or number of workers; a cache of replays keyed by the window's digest and the variant; cancel; a
worker lost mid-replay; a point made into a layout plan, never a silent change (issue 38)."""

import io

import pytest
from django.core.management import call_command

from config.celery import WHATIF_QUEUE, route_task
from quotas import advice, advise
from quotas.models import LayoutPlan, Share

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(no_messages, db):
    call_command("seed_history", jobs=80, stdout=io.StringIO())


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr(advice, "_enqueue", lambda run_id, index: sent.append(index))
    return sent


def test_advice_replays_go_to_the_whatif_queue():
    assert route_task("quotas.tasks.advice_replay", (), {}, {}) == {"queue": WHATIF_QUEUE}
    from quotas.tasks import advice_replay

    assert advice_replay.acks_late and advice_replay.reject_on_worker_lost  # a lost worker's replay is redone


def test_a_run_is_one_task_per_replay_and_ends_as_the_pure_search_does(history, sent):
    run_id = advice.start(weeks=1)
    scenario = advice._scenario(advice.cache.get(advice._run_key(run_id))["digest"])
    stage1 = 1 + len(advise.moves(scenario))
    assert sent == list(range(stage1))
    st = advice.status(run_id)
    assert st["state"] == advice.REPLAYING and st["replays_done"] == 0 and not st["replays_final"]

    # Another order than sent (two workers race): the last of stage 1 sends stage 2, once.
    for index in reversed(range(stage1)):
        advice.run_part(run_id, index)
    st = advice.status(run_id)
    stage2 = st["replays_total"] - stage1
    assert sent[stage1:] == list(range(stage1, stage1 + stage2))
    for index in range(stage1, stage1 + stage2):
        assert advice.run_part(run_id, index) == advice.DONE
    st = advice.status(run_id)
    assert st["state"] == advice.DONE and st["replays_done"] == stage1 + stage2
    # The same answer as the pure advisor on the same window (one process, in order).
    spec = advice.cache.get(advice._run_key(run_id))
    alone = advise.search(
        scenario,
        window_s=spec["window_s"],
        replay_many=advise.local_replayer(scenario, window_s=spec["window_s"]),
    )
    assert st["advice"] == alone
    assert st["advice"]["replays"] == stage1 + stage2


def test_eager_celery_answers_within_the_request(history, celery_eager):
    """The embedded defaults (one worker, or eager tasks): the whole run, both stages, in one go."""
    st = advice.status(advice.start(weeks=1))
    assert st["state"] == advice.DONE and st["finished"]
    assert st["advice"]["replays"] == st["replays_done"] == st["replays_total"]
    assert st["window"]["jobs"] > 0 and st["weeks"] == 1


def test_the_same_window_and_variant_is_read_back_not_replayed(history, sent):
    from django.utils import timezone

    now = timezone.now()
    a = advice.start(weeks=1, now=now)
    b = advice.start(weeks=1, now=now)
    advice.run_part(a, 0)
    advice.run_part(b, 0)
    spec = advice.cache.get(advice._run_key(b))
    assert advice._parts(spec)[0]["reused"] is True


def test_cancel_stops_the_rest(history, sent):
    run_id = advice.start(weeks=1)
    advice.run_part(run_id, 0)
    assert advice.cancel(run_id)
    assert advice.run_part(run_id, 1) == advice.CANCELLED
    st = advice.status(run_id)
    assert st["state"] == advice.CANCELLED and st["finished"] and st["advice"] is None
    assert st["replays_done"] == 1


def test_a_part_whose_worker_was_lost_is_replayed_again(history, sent):
    run_id = advice.start(weeks=1)
    advice.cache.set(advice._part_key(run_id, 0), {"state": advice.REPLAYING}, 60)  # its worker died
    assert advice.run_part(run_id, 0) == advice.DONE


def test_a_failed_replay_is_said_and_the_run_gives_no_advice(history, sent, monkeypatch):
    run_id = advice.start(weeks=1)
    monkeypatch.setattr(advice, "_replay", lambda spec, variant: 1 / 0)
    assert advice.run_part(run_id, 0) == advice.FAILED
    st = advice.status(run_id)
    assert st["state"] == advice.FAILED and "ZeroDivisionError" in st["errors"][0]


def test_weeks_out_of_range_is_refused(history):
    with pytest.raises(ValueError):
        advice.start(weeks=5)


def test_a_point_becomes_a_layout_plan_with_its_whatif_never_a_change(history, sent, alice, monkeypatch):
    run_id = advice.start(weeks=1)
    share = Share.objects.filter(strategy="LEND_AND_BORROW").order_by("name").first()
    spec = advice.cache.get(advice._run_key(run_id))
    # A finished run whose frontier's second point makes that share RESERVE.
    spec["advice"] = {
        "frontier": [
            {"changes": []},
            {"changes": [advise.move(share.name, "strategy", "LEND_AND_BORROW", "RESERVE")]},
        ]
    }
    advice.cache.set(advice._run_key(run_id), spec, 60)
    started = []
    monkeypatch.setattr("quotas.whatif._enqueue", lambda run, index: started.append(run))
    before = {s.name: (s.strategy, s.borrow_limit) for s in Share.objects.all()}
    planned = advice.make_plan(run_id=run_id, index=1, actor=alice)
    assert LayoutPlan.objects.filter(pk=planned.pk).exists()
    [change] = [d for d in planned.diff if d["kind"] == "share"]
    assert change["name"] == share.name
    assert planned.whatif_run and started == [planned.whatif_run, planned.whatif_run]  # as is, with the plan
    assert {s.name: (s.strategy, s.borrow_limit) for s in Share.objects.all()} == before  # nothing applied
    with pytest.raises(IndexError):
        advice.make_plan(run_id=run_id, index=2, actor=alice)


def test_plan_document_applies_each_change():
    doc = {
        "format": 1,
        "teams": [],
        "shares": [
            {"name": "a", "team": "t", "strategy": "LEND_AND_BORROW", "borrow_limit": 4, "min_runtime_s": 0},
            {"name": "b", "team": "t", "strategy": "LEND", "borrow_limit": -1, "min_runtime_s": 0},
        ],
    }
    result = {
        "frontier": [
            {
                "changes": [
                    advise.move("a", "strategy", "LEND_AND_BORROW", "RESERVE"),
                    advise.move("b", "min_runtime_s", 0, 600),
                    advise.move("settings", "fair_reclaim", False, True),
                ]
            }
        ]
    }
    out = advice.plan_document(result, 0, doc)
    assert out["shares"][0] == {
        "name": "a",
        "team": "t",
        "strategy": "RESERVE",
        "borrow_limit": -1,
        "min_runtime_s": 0,
    }
    assert out["shares"][1]["min_runtime_s"] == 600
    assert out["settings"] == {"fair_reclaim": True}
    assert doc["shares"][0]["strategy"] == "LEND_AND_BORROW"  # today's document untouched


def test_plan_document_changes_a_groups_weight():
    doc = {"format": 1, "teams": [], "groups": [{"name": "research"}], "shares": [{"name": "a", "team": "t"}]}
    result = {"frontier": [{"changes": [advise.move("research", "weight", 1, 2)]}]}
    out = advice.plan_document(result, 0, doc)
    assert out["groups"] == [{"name": "research", "weight": 2}]
    assert doc["groups"] == [{"name": "research"}]
