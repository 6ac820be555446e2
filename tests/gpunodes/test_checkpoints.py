"""Checkpoint reports with no code change in the job (gpunodes/agent/checkpoints.py): what counts as a
checkpoint in an attempt's directory and when, the explicit marker, and the runner's reports (the
outbox keeps the latest one per attempt; the end report carries the last, one saved on SIGTERM too)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from gpunodes.agent import checkpoints
from gpunodes.agent.checkpoints import MARKER, CheckpointWatcher, Watch
from gpunodes.agent.runner import CHECKPOINT, FINISHED, STARTED
from tests.gpunodes.test_runner import TRAIN, Reports, make_runner, wait_finished

SETTLE = 2.0


def write(path: Path, text: str = "x", *, at: float) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (at, at))
    return path


def watch_of(directory: Path, started: float) -> Watch:
    return Watch(directory, started=started, known=checkpoints.scan(directory))


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "job-1"
    d.mkdir()
    return d


# --- what counts, and when -------------------------------------------------------------------------


def test_a_file_renamed_into_place_counts_at_its_mtime_once_settled(ckpt):
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    tmp = write(ckpt / "model.tmp", at=t0 + 10)
    assert w.look(now=t0 + 30, settle_s=SETTLE) is None  # only a temporary name so far
    tmp.replace(ckpt / "model.pt")
    assert w.look(now=t0 + 30, settle_s=SETTLE) == t0 + 10  # whole at once, written at t0 + 10
    assert (w.latest, w.count) == (t0 + 10, 1)
    assert w.look(now=t0 + 31, settle_s=SETTLE) is None  # nothing new


def test_a_file_still_being_written_counts_only_when_its_writer_has_stopped(ckpt):
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    f = write(ckpt / "model.pt", "a", at=t0 + 20)
    assert w.look(now=t0 + 21, settle_s=SETTLE) is None  # written 1 s ago: maybe still going
    write(f, "ab", at=t0 + 22)
    assert w.look(now=t0 + 23, settle_s=SETTLE) is None
    assert w.look(now=t0 + 24.5, settle_s=SETTLE) == t0 + 22


def test_a_checkpoint_of_several_files_counts_when_all_of_them_have_settled(ckpt):
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    write(ckpt / "step-100" / "model.pt", at=t0 + 10)
    write(ckpt / "step-100" / "optim.pt", at=t0 + 19)
    assert w.look(now=t0 + 20, settle_s=SETTLE) is None
    assert w.look(now=t0 + 21, settle_s=SETTLE) == t0 + 19


def test_what_was_there_when_the_attempt_started_is_not_its_checkpoint(ckpt):
    t0 = 1_000_000.0
    write(ckpt / "model.pt", at=t0 - 600)  # the previous attempt's
    w = watch_of(ckpt, started=t0)
    assert w.look(now=t0 + 60, settle_s=SETTLE) is None
    write(ckpt / "model.pt", "newer", at=t0 + 30)
    assert w.look(now=t0 + 60, settle_s=SETTLE) == t0 + 30


@pytest.mark.parametrize("name", ["ckpt.tmp", "ckpt.pt.part", ".hidden", "ckpt~", "x.inprogress"])
def test_temporary_and_hidden_names_are_never_a_checkpoint(ckpt, name):
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    write(ckpt / name, at=t0 + 5)
    assert w.look(now=t0 + 60, settle_s=SETTLE, final=True) is None


def test_a_checkpoint_dated_before_the_start_counts_from_the_start(ckpt):
    """A file copied in with its old mtime kept (cp -p): new to this attempt, dated when it began."""
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    write(ckpt / "restored.pt", at=t0 - 3600)
    assert w.look(now=t0 + 10, settle_s=SETTLE) == t0


def test_the_marker_counts_at_once_and_then_only_the_marker_counts(ckpt):
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    write(ckpt / "part-1.bin", at=t0 + 5)
    write(ckpt / MARKER, at=t0 + 9.5)  # written by `gpuquota checkpoint` a moment ago
    assert w.look(now=t0 + 10, settle_s=SETTLE) == t0 + 9.5
    write(ckpt / "part-2.bin", at=t0 + 20)  # the job's files say nothing any more
    assert w.look(now=t0 + 60, settle_s=SETTLE) is None
    write(ckpt / MARKER, at=t0 + 61)
    assert w.look(now=t0 + 61, settle_s=SETTLE) == t0 + 61
    assert w.count == 2


def test_the_last_look_at_the_end_does_not_wait_for_the_files_to_settle(ckpt):
    """The attempt's processes are gone: nothing is being written any more (a save on SIGTERM)."""
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    write(ckpt / "model.pt", at=t0 + 99.9)
    assert w.look(now=t0 + 100, settle_s=SETTLE) is None
    assert w.look(now=t0 + 100, settle_s=SETTLE, final=True) == t0 + 99.9


def test_a_symlinked_directory_is_not_followed(ckpt, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere / "secret.pt", at=time.time())
    (ckpt / "link").symlink_to(elsewhere)
    (ckpt / "file-link.pt").symlink_to(elsewhere / "secret.pt")
    assert checkpoints.scan(ckpt) == {}
    swapped = tmp_path / "swapped"
    swapped.symlink_to(elsewhere)  # the checkpoint directory itself replaced by a link
    assert checkpoints.scan(swapped) == {}


def test_a_directory_of_too_many_entries_is_watched_by_its_marker_only(ckpt, monkeypatch, caplog):
    monkeypatch.setattr(checkpoints, "MAX_ENTRIES", 5)
    t0 = 1_000_000.0
    w = watch_of(ckpt, started=t0)
    for i in range(6):
        write(ckpt / f"shard-{i}.pt", at=t0 + 5)
    assert w.look(now=t0 + 60, settle_s=SETTLE) is None
    assert "more than 5 entries" in caplog.text
    write(ckpt / MARKER, at=t0 + 70)
    assert w.look(now=t0 + 70, settle_s=SETTLE) == t0 + 70


def test_the_watcher_reports_each_new_checkpoint_of_each_attempt_once(tmp_path):
    seen = []
    clock = [1_000_000.0]
    watcher = CheckpointWatcher(
        lambda key, at, n: seen.append((key, at, n)), scan_s=0, clock=lambda: clock[0]
    )
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    watcher.begin((1, 1), a)
    watcher.begin((2, 1), b)
    write(a / "m.pt", at=clock[0] + 1)
    clock[0] += 10
    watcher.poll()
    watcher.poll()
    assert seen == [((1, 1), 1_000_001.0, 1)]
    write(b / "m.pt", at=clock[0])
    assert watcher.end((2, 1)) == (clock[0], 1)  # the end's last look
    assert watcher.end((2, 1)) == (None, 0) and watcher.watching() == [(1, 1)]


# --- the runner: reports, the outbox, the end ------------------------------------------------------


def train(steps: int, every: float) -> list[str]:
    return [
        sys.executable,
        TRAIN,
        "--steps",
        str(steps),
        "--step-seconds",
        "0.05",
        "--checkpoint-every",
        str(every),
    ]


def test_the_runner_reports_checkpoints_and_keeps_only_the_latest_in_its_outbox(tmp_path):
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None, checkpoint_scan_s=0.05, checkpoint_settle_s=0.2)
    try:
        assert runner.start(attempt_id=3, number=1, job_id=7, command=train(400, 0.3), grace_s=5) == "started"
        end = time.monotonic() + 30
        while time.monotonic() < end and len(reports.of(CHECKPOINT)) < 3:
            runner.poll()
            time.sleep(0.02)
        got = reports.of(CHECKPOINT)
        assert len(got) >= 3, f"saw {len(got)} checkpoint reports in 30 s: {got}"
        assert [r["count"] for r in got[:3]] == [1, 2, 3]
        assert all(r["attempt_id"] == 3 and r["number"] == 1 and r["node"] == "n1" for r in got)
        assert got[0]["at"] < got[1]["at"] < got[2]["at"]
        # The outbox holds the start and one checkpoint report: the latest (older ones were replaced).
        pending = [(e.name, e.kwargs.get("count")) for e in runner.outbox.pending()]
        assert pending[0] == (STARTED, None)
        assert [p for p in pending if p[0] == CHECKPOINT] == [
            (CHECKPOINT, runner.outbox.pending()[-1].kwargs["count"])
        ]
        assert len(pending) == 2
        # Told to stop, train.py saves once more: the end report carries that checkpoint.
        assert runner.stop(attempt_id=3, number=1, grace_s=5) == "stopping"
        finished = wait_finished(runner, reports)
        saved = (Path(runner.checkpoint_root) / "job-7" / "train.json").stat().st_mtime
        assert finished["how"] == "stopped" and finished["checkpoint_at"] == pytest.approx(saved, abs=0.01)
        assert finished["checkpoints"] >= 4
    finally:
        runner.shutdown(grace_s=0)


def test_a_checkpoint_is_reported_within_settle_and_one_scan_of_being_written(tmp_path):
    """Detection latency with the defaults (scan every 1 s, settled after 2 s): the report comes at
    most scan + settle after the save ended; what the control side sees then waits for the next
    heartbeat (or the quick path's message)."""
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None)
    code = (
        "import os, time, pathlib; d = pathlib.Path(os.environ['GPUQUOTA_CHECKPOINT_DIR']); "
        "time.sleep(0.3); (d / 'c.tmp').write_text('x'); (d / 'c.tmp').replace(d / 'c.pt'); time.sleep(60)"
    )
    try:
        runner.start(attempt_id=1, number=1, job_id=8, command=[sys.executable, "-c", code], grace_s=0)
        end = time.monotonic() + 20
        while time.monotonic() < end and not reports.of(CHECKPOINT):
            runner.poll()
            time.sleep(0.05)
        assert reports.of(CHECKPOINT), "no checkpoint report within 20 s"
        latency = time.time() - reports.of(CHECKPOINT)[0]["at"]
        print(f"checkpoint detection latency: {latency:.2f} s (scan 1 s, settle 2 s)")
        assert 2.0 <= latency < 3.0 + 1.0  # settle, plus at most one scan, plus a loaded machine
    finally:
        runner.shutdown(grace_s=0)


def test_an_attempt_that_saved_nothing_reports_no_checkpoint(tmp_path):
    reports = Reports()
    runner = make_runner(tmp_path, reports, cgroups=None, checkpoint_scan_s=0.05, checkpoint_settle_s=0.1)
    try:
        runner.start(attempt_id=1, number=1, job_id=9, command=[sys.executable, "-c", "pass"], grace_s=0)
        finished = wait_finished(runner, reports)
        assert "checkpoint_at" not in finished and not reports.of(CHECKPOINT)
        assert [e.name for e in runner.outbox.pending()] == [STARTED, FINISHED]
    finally:
        runner.shutdown(grace_s=0)
