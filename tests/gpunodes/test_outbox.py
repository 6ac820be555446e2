"""The agent's durable outbox (gpunodes/agent/outbox.py): a report stays on disk, across restarts, until
the control side acknowledges it; the heartbeat carries the unacknowledged ones, the control worker
applies them idempotently and acknowledges what it recorded; a duplicate never turns a success into a
re-run."""

from __future__ import annotations

import sqlite3
import sys

import pytest

from gpunodes.agent import tasks as agent_tasks
from gpunodes.agent.outbox import Outbox
from gpunodes.agent.runner import FINISHED, LOG, REPORT_FIELDS, STARTED
from gpunodes.services import fake_inventory
from gpunodes.tasks import OUTBOX_ACK, node_heartbeat, uncovered
from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job, LogChunk
from jobs.services import job_submit
from tests.gpunodes.test_runner import Reports, make_runner, wait_finished

# --- the outbox itself -------------------------------------------------------------------------------


def test_it_keeps_its_entries_across_a_restart(tmp_path):
    box = Outbox(tmp_path / "outbox.sqlite3")
    first = box.add(STARTED, {"attempt_id": 1, "number": 1})
    epoch = box.epoch
    box.close()  # the agent goes away (a kill -9 loses nothing either: each add is committed)
    again = Outbox(tmp_path / "outbox.sqlite3")
    assert [e.id for e in again.pending()] == [first] and again.epoch == epoch
    assert again.add(FINISHED, {"attempt_id": 1, "number": 1}) > first  # ids only grow


def test_it_is_written_ahead_and_synced(tmp_path):
    box = Outbox(tmp_path / "outbox.sqlite3")
    assert box._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert box._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert (tmp_path / "outbox.sqlite3").stat().st_mode & 0o777 == 0o600


def test_it_hands_out_the_oldest_first_in_bounded_batches(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    ids = [box.add(FINISHED, {"attempt_id": i, "number": 1}) for i in range(1, 8)]
    assert [e.id for e in box.pending(limit=3)] == ids[:3]
    assert [e.kwargs["attempt_id"] for e in box.pending()] == list(range(1, 8))


def test_an_ack_removes_exactly_what_it_names(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    a, b, c = (box.add(FINISHED, {"attempt_id": i, "number": 1}) for i in (1, 2, 3))
    assert box.ack([a, c], box.epoch) == 2
    assert [e.id for e in box.pending()] == [b]
    assert box.ack([a, c], box.epoch) == 0  # a repeated ack changes nothing


def test_an_ack_for_an_earlier_outbox_removes_nothing(tmp_path):
    box = Outbox(tmp_path / "o.sqlite3")
    a = box.add(FINISHED, {"attempt_id": 1, "number": 1})
    assert box.ack([a], "another-epoch") == 0
    assert len(box) == 1


def test_a_crash_between_writing_and_acknowledging_keeps_the_entry(tmp_path):
    """What another process sees on disk (the WAL is read too): the entry is there once add returned."""
    box = Outbox(tmp_path / "o.sqlite3")
    box.add(FINISHED, {"attempt_id": 1, "number": 1, "exit_code": 0})
    seen = sqlite3.connect(tmp_path / "o.sqlite3").execute("SELECT count(*) FROM outbox").fetchone()[0]
    assert seen == 1


# --- the runner writes its reports there ---------------------------------------------------------------


def test_the_runner_keeps_started_and_finished_reports_until_acknowledged(tmp_path, monkeypatch):
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None)
    try:
        runner.start(
            attempt_id=5, number=2, job_id=9, command=[sys.executable, "-c", "print('hi')"], grace_s=1
        )
        wait_finished(runner, reports)
        pending = runner.outbox.pending()
        assert [e.name for e in pending] == [STARTED, FINISHED]
        end = pending[1].kwargs
        assert (end["attempt_id"], end["number"], end["how"], end["exit_code"]) == (5, 2, "exited", 0)
        assert (end["job_id"], end["log_ranges"]) == (9, [[0, 3]])  # the log shipped: "hi\n"
        # The quick path sent the same report, without the outbox's own fields.
        assert reports.of(FINISHED)[-1] == {k: v for k, v in end.items() if k in REPORT_FIELDS}

        monkeypatch.setattr(agent_tasks, "RUNNER", runner)
        assert agent_tasks.outbox_ack(node="n2", epoch=runner.outbox.epoch, ids=[pending[0].id]) == 0
        assert agent_tasks.outbox_ack(node="n1", epoch=runner.outbox.epoch, ids=["1; drop"]) == 0
        assert agent_tasks.outbox_ack(node="n1", epoch=runner.outbox.epoch, ids=[pending[0].id]) == 1
    finally:
        runner.shutdown(grace_s=0)
    restarted = make_runner(tmp_path, Reports(), cgroups=None)  # a new agent on the same state directory
    assert [e.id for e in restarted.outbox.pending()] == [pending[1].id]


# --- the control side applies them and acknowledges ----------------------------------------------------


@pytest.fixture(autouse=True)
def auto_accept(settings):
    settings.NODE_AUTO_ACCEPT = True


@pytest.fixture
def sent(monkeypatch):
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    return sent


@pytest.fixture
def running(bob, vision_share, nodes, sent, django_capture_on_commit_callbacks):
    beat([], boot="boot-1", running=[])
    job = job_submit(user=bob, share=vision_share, gpus=1, gpu_type="a10g", command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=1)
    a = Attempt.objects.create(
        job=job, number=1, state=AttemptState.RUNNING, placement=[{"node": "node-1", "gpus": [0]}]
    )
    a.nodes.add(nodes[0])
    sent.clear()
    return a


def beat(outbox, *, node="node-1", boot="boot-1", running=(), epoch="e1"):
    inv = [g.__dict__ for g in fake_inventory(node, 4)]
    return node_heartbeat(
        node, "a10g", inv, [list(r) for r in running], boot, outbox=outbox, outbox_epoch=epoch
    )


def finished(entry_id, attempt, how="exited", exit_code=0, log_ranges=(), age_s=1.0):
    kwargs = {"attempt_id": attempt.pk, "number": attempt.number, "node": "node-1", "how": how}
    kwargs.update(exit_code=exit_code, job_id=attempt.job_id, log_ranges=[list(r) for r in log_ranges])
    return {"id": entry_id, "name": FINISHED, "kwargs": kwargs, "age_s": age_s}


def acks(sent) -> list[dict]:
    return [kw["kwargs"] for name, kw in sent if name == OUTBOX_ACK]


def test_a_heartbeat_applies_the_outbox_and_acknowledges_it(
    running, sent, django_capture_on_commit_callbacks
):
    started = {"id": 3, "name": STARTED, "kwargs": {"attempt_id": running.pk, "number": 1, "node": "node-1"}}
    with django_capture_on_commit_callbacks(execute=True):
        beat([started, finished(4, running)])
    assert Job.objects.get(pk=running.job_id).state == JobState.SUCCEEDED
    assert acks(sent) == [{"node": "node-1", "epoch": "e1", "ids": [3, 4], "relog": []}]
    # The ack was lost: the same entries come again, change nothing, and are acknowledged again.
    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        beat([started, finished(4, running)])
    assert Attempt.objects.filter(job_id=running.job_id).count() == 1
    assert acks(sent) == [{"node": "node-1", "epoch": "e1", "ids": [3, 4], "relog": []}]


def test_a_success_carried_by_a_restarted_agent_is_not_lost_nor_run_again(
    running, sent, django_capture_on_commit_callbacks
):
    """The job ended while the broker was away and the agent restarted since: its first heartbeat no
    longer runs the attempt; the outbox's exit 0 is applied before the reconciliation would call it
    lost (and re-queue it)."""
    with django_capture_on_commit_callbacks(execute=True):
        result = beat([finished(1, running)], boot="boot-2", running=[])
    running.refresh_from_db()
    assert result["lost"] == [] and running.outcome == Outcome.SUCCEEDED
    assert Job.objects.get(pk=running.job_id).state == JobState.SUCCEEDED


def test_a_late_copy_never_turns_a_success_into_a_failure_or_a_rerun(
    running, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        beat([finished(1, running)])
        beat([finished(2, running, how="stopped", exit_code=None), finished(3, running, exit_code=1)])
    assert Job.objects.get(pk=running.job_id).state == JobState.SUCCEEDED
    assert Attempt.objects.filter(job_id=running.job_id).count() == 1


def test_a_fenced_attempt_reported_stopped_is_requeued(running, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        beat([finished(1, running, how="stopped", exit_code=-15)])
    running.refresh_from_db()
    assert running.outcome == Outcome.NODE_LOST
    assert Job.objects.get(pk=running.job_id).state == JobState.QUEUED


def test_a_report_about_another_nodes_attempt_is_refused_but_acknowledged(
    running, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        beat([finished(7, running)], node="node-2")  # node-2 speaks of node-1's attempt
    running.refresh_from_db()
    assert running.state == AttemptState.RUNNING
    assert acks(sent) == [{"node": "node-2", "epoch": "e1", "ids": [7], "relog": []}]  # moot: not sent again


def test_malformed_entries_are_skipped_and_acknowledged(running, sent, django_capture_on_commit_callbacks):
    bad = [
        {"id": 1, "name": "jobs.tasks.cancel", "kwargs": {"attempt_id": running.pk, "number": 1}},
        {"id": 2, "name": FINISHED, "kwargs": {"attempt_id": str(running.pk), "number": 1}},
        "nonsense",
    ]
    with django_capture_on_commit_callbacks(execute=True):
        beat(bad)
    running.refresh_from_db()
    assert running.state == AttemptState.RUNNING
    assert acks(sent) == [{"node": "node-1", "epoch": "e1", "ids": [1, 2], "relog": []}]


# --- the log: what was shipped is asked for again until it is all held ----------------------------------


@pytest.mark.parametrize(
    ("ranges", "chunks", "gaps"),
    [
        ([(0, 10)], [(0, 4), (4, 6)], []),
        ([(0, 10)], [(0, 4)], [(4, 10)]),
        ([(0, 10)], [(0, 2), (6, 4)], [(2, 6)]),  # a gap ends where the next chunk begins
        ([(0, 10)], [], [(0, 10)]),
        ([(0, 4), (8, 12)], [(0, 4), (4, 50), (8, 4)], []),  # the cap's note between is not asked for
        ([(0, 4), (8, 12)], [(0, 4), (4, 50)], [(8, 12)]),
    ],
)
def test_uncovered_names_the_gaps(ranges, chunks, gaps):
    assert uncovered(ranges, chunks) == gaps


def test_the_shipped_ranges_follow_the_log_cap(tmp_path):
    runner = make_runner(tmp_path, Reports(), cgroups=None)
    runner.log_cap_bytes = 100
    assert runner._shipped_ranges(0) == []
    assert runner._shipped_ranges(50) == [[0, 50]]
    assert runner._shipped_ranges(90) == [[0, 90]]  # the tail begins where the head ends: nothing dropped
    assert runner._shipped_ranges(500) == [[0, 50], [450, 500]]


def test_an_end_whose_log_lacks_bytes_is_held_back_and_the_gap_asked_for(
    running, sent, django_capture_on_commit_callbacks
):
    LogChunk.objects.create(attempt=running, node="node-1", offset=0, text="héllo ")  # 7 bytes
    report = finished(5, running, log_ranges=[(0, 12)], age_s=60)
    beat([report])
    assert Job.objects.get(pk=running.job_id).state == JobState.SUCCEEDED  # the end counts at once
    assert acks(sent) == [{"node": "node-1", "epoch": "e1", "ids": [], "relog": [[5, 7, 12]]}]
    sent.clear()
    LogChunk.objects.create(attempt=running, node="node-1", offset=7, text="world")  # sent again
    beat([report])
    assert acks(sent) == [{"node": "node-1", "epoch": "e1", "ids": [5], "relog": []}]


def test_a_fresh_end_waits_for_its_last_chunks_before_its_log_is_checked(running, sent):
    beat([finished(5, running, log_ranges=[(0, 12)], age_s=0.5)])
    assert acks(sent) == []  # neither acknowledged nor asked for: the next heartbeat looks again


def test_the_agent_sends_the_gaps_again_from_its_log_file(tmp_path, monkeypatch):
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None)
    try:
        runner.start(
            attempt_id=5, number=1, job_id=9, command=[sys.executable, "-c", "print('0123456789')"], grace_s=1
        )
        wait_finished(runner, reports)
        [end] = [e for e in runner.outbox.pending() if e.name == FINISHED]
        monkeypatch.setattr(agent_tasks, "RUNNER", runner)
        reports.clear()
        epoch = runner.outbox.epoch
        assert agent_tasks.outbox_ack(node="n1", epoch=epoch, ids=[], relog=[[end.id, 3, 7]]) == 0
        assert [(k["offset"], k["text"]) for k in reports.of(LOG)] == [(3, "3456")]
        assert runner.outbox.get(end.id) is not None  # still there: the control side will say
        for path in (tmp_path / "logs").rglob("*.log"):
            path.unlink()  # rotated away: nothing more can be sent, the end is dropped
        agent_tasks.outbox_ack(node="n1", epoch=epoch, ids=[], relog=[[end.id, 3, 7]])
        assert runner.outbox.get(end.id) is None
    finally:
        runner.shutdown(grace_s=0)
