"""An advice run's worker lost at each step of a replay's task (issue 38, item 3; the real processes:
tests/live/test_advice_worker_lost.py): its task is delivered again (acknowledged late) and the run ends
as if nothing was lost, every replay counted once, the retry said; a what-if worker's broker options."""

import pytest

from config.celery import whatif_worker_options
from quotas import advice
from tests.quotas.test_advice_runs import history, sent  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db


class Lost(BaseException):
    """The worker went away here (kill -9): nothing after it ran, nothing caught it."""


def lose_once(monkeypatch, target, name):
    real = getattr(target, name)
    calls = []

    def once(*args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise Lost
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, once)
    return calls


@pytest.fixture
def stage2(monkeypatch):
    """Stage 2 of two combined replays whatever stage 1 found (the small seeded history's has none)."""
    monkeypatch.setattr(
        advice.advise,
        "combined",
        lambda today, singles: [[singles[0][0], singles[-1][0]], [singles[1][0], singles[-1][0]]],
    )


def stage1(run_id) -> int:
    return advice.cache.get(advice._run_key(run_id))["stage1"]


def test_a_redelivered_replay_is_made_again_counted_once_and_said(history, sent):  # noqa: F811
    run_id = advice.start(weeks=1)
    # Its first try was lost mid-replay (the part says where it ran).
    advice.cache.set(advice._part_key(run_id, 1), {"state": advice.REPLAYING, "tries": 1, "on": "h:1"}, 60)
    assert advice.run_part(run_id, 1) == advice.DONE
    st = advice.status(run_id)
    assert st["replays_done"] == 1 and st["replays_retried"] == 1
    assert st["retries"] == ["replay 2 was made 2 times: a worker was lost mid-replay"]
    # Delivered once more (a visibility timeout shorter than the replay): nothing replayed, nothing added.
    assert advice.run_part(run_id, 1) == advice.DONE
    assert advice.status(run_id)["replays_done"] == 1


def test_a_worker_lost_between_its_replay_and_the_next_stage_ends_the_run_when_redelivered(
    history,  # noqa: F811
    sent,  # noqa: F811
    monkeypatch,
):
    run_id = advice.start(weeks=1)
    last = stage1(run_id) - 1
    for index in range(last):
        advice.run_part(run_id, index)
    # The last of stage 1 wrote its figures and was lost before it sent stage 2: before, its task, again,
    # found the part done and returned: stage 2 was never sent and the run hung.
    lose_once(monkeypatch, advice, "advance")
    with pytest.raises(Lost):
        advice.run_part(run_id, last)
    assert advice.status(run_id)["replays_done"] == last + 1
    sent_before = len(sent)
    assert advice.run_part(run_id, last) == advice.DONE
    spec = advice.cache.get(advice._run_key(run_id))
    assert spec["stage2_sent"] and sent[sent_before:] == list(range(spec["stage1"], len(spec["variants"])))


def test_a_sender_lost_mid_stage2_sends_it_when_redelivered_and_only_it(history, sent, stage2, monkeypatch):  # noqa: F811
    run_id = advice.start(weeks=1)
    last = stage1(run_id) - 1
    for index in range(last):
        advice.run_part(run_id, index)
    lose_once(monkeypatch, advice, "_send_stage2")  # stage 2 written, not sent
    with pytest.raises(Lost):
        advice.run_part(run_id, last)
    spec = advice.cache.get(advice._run_key(run_id))
    assert spec["stage2"] == 2 and not spec.get("stage2_sent")
    sent_before = len(sent)
    advice.run_part(run_id, 0)  # another part's task, delivered again: not its stage to send
    assert len(sent) == sent_before
    advice.run_part(run_id, last)  # the sender's, again: sends it
    spec = advice.cache.get(advice._run_key(run_id))
    assert spec["stage2_sent"] and sent[sent_before:] == list(range(spec["stage1"], len(spec["variants"])))
    for index in range(spec["stage1"], len(spec["variants"])):
        advice.run_part(run_id, index)
    st = advice.status(run_id)
    assert st["state"] == advice.DONE and st["replays_done"] == st["replays_total"] == st["advice"]["replays"]


def test_a_writer_of_the_answer_lost_writes_it_when_redelivered(history, sent, stage2, monkeypatch):  # noqa: F811
    run_id = advice.start(weeks=1)
    for index in range(stage1(run_id)):
        advice.run_part(run_id, index)
    spec = advice.cache.get(advice._run_key(run_id))
    *first, last = range(spec["stage1"], len(spec["variants"]))
    for index in first:
        advice.run_part(run_id, index)
    calls = lose_once(monkeypatch, advice.advise, "answer")
    with pytest.raises(Lost):
        advice.run_part(run_id, last)
    advice.run_part(run_id, 0)  # not the part that holds the answer's lock
    assert advice.status(run_id)["advice"] is None and len(calls) == 1
    advice.run_part(run_id, last)
    st = advice.status(run_id)
    assert st["state"] == advice.DONE and st["advice"]["replays"] == st["replays_done"] == st["replays_total"]


def test_a_lost_replay_process_is_replaced_and_the_retry_said(history, sent, monkeypatch):  # noqa: F811
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    run_id = advice.start(weeks=1)
    submitted = []

    class Pool:
        def submit(self, fn, *args):
            submitted.append(args)
            future = Future()
            if len(submitted) == 1:
                future.set_exception(BrokenProcessPool("a process of the pool was killed"))
            else:
                future.set_result(fn(*args))
            return future

    monkeypatch.setattr(advice, "_process_pool", Pool)
    monkeypatch.setattr(advice, "_reset_pool", lambda: None)
    assert advice.run_part(run_id, 0) == advice.DONE
    assert len(submitted) == 2
    st = advice.status(run_id)
    assert st["replays_done"] == 1 and st["replays_retried"] == 1


def test_a_prefork_pool_process_replays_in_itself(history, sent, monkeypatch):  # noqa: F811
    """A prefork pool's process is daemonic: a process pool there failed every replay ('daemonic
    processes are not allowed to have children')."""
    import multiprocessing

    run_id = advice.start(weeks=1)
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True)
    monkeypatch.setattr(advice, "_process_pool", lambda: pytest.fail("a pool started in a daemonic process"))
    assert advice.run_part(run_id, 0) == advice.DONE


def test_a_whatif_worker_keeps_its_own_unacknowledged_messages_on_its_own_clock(settings):
    settings.REDIS_URL = "redis://127.0.0.1:6379/0"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600, "unacked_key": "control:unacked"}
    settings.WHATIF_VISIBILITY_TIMEOUT_S = 900
    settings.WHATIF_RESTORE_INTERVAL_S = 30
    options = whatif_worker_options(["whatif"])
    assert options["visibility_timeout"] == 900 and options["unacked_restore_interval"] == 30
    assert (
        options["unacked_key"] == "whatif:unacked" and options["unacked_index_key"] == "whatif:unacked_index"
    )
    assert options["unacked_restore_throttle"] == 1
    assert whatif_worker_options("whatif") == options
    # The control worker, or one that consumes both: the control side's keys and hour stay.
    assert whatif_worker_options(["control"]) is None
    assert whatif_worker_options(["control", "whatif"]) is None
    settings.REDIS_URL = ""
    assert whatif_worker_options(["whatif"]) is None
