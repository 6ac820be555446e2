"""Issue 41, item 8: stored output is bounded per team (TEAM_OUTPUT_MAX_BYTES). Past the budget an
attempt's new output is not stored and a note says where it was cut; a cut log is whole for the end
report's gap check (its host is not asked for the rest, for ever); old output pruned frees the budget."""

from datetime import timedelta

import pytest
from django.utils import timezone

from gpunodes.services import fake_inventory
from gpunodes.tasks import FINISHED, OUTBOX_ACK, node_heartbeat
from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job, LogChunk, TeamOutput
from jobs.services import job_logs, job_submit, recount_team_output
from jobs.tasks import attempt_log, prune_job_output

CHUNK = "x" * 1000 + "\n"  # 1,001 bytes


@pytest.fixture
def sent(monkeypatch, settings):
    settings.NODE_AUTO_ACCEPT = True
    sent = []
    monkeypatch.setattr("gpunodes.dispatch.app.send_task", lambda name, **kw: sent.append((name, kw)))
    monkeypatch.setattr("quotas.triggers.request_pass", lambda why="": sent.append(("pass", why)))
    return sent


def running(user, share, node):
    job = job_submit(user=user, share=share, gpus=1, gpu_type="a10g", command=["true"])
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=1)
    attempt = Attempt.objects.create(
        job=job, number=1, state=AttemptState.RUNNING, placement=[{"node": node.name, "gpus": [0]}]
    )
    attempt.nodes.add(node)
    return attempt


def used(team) -> int:
    return TeamOutput.objects.filter(team=team).values_list("bytes", flat=True).first() or 0


def test_output_past_the_teams_budget_is_cut_with_a_note(
    bob, charlie, vision, vision_share, language_share, nodes, sent, settings
):
    settings.TEAM_OUTPUT_MAX_BYTES = 5_000
    first, second = running(bob, vision_share, nodes[0]), running(bob, vision_share, nodes[0])
    other = running(charlie, language_share, nodes[0])
    assert [attempt_log(first.pk, 1, "node-1", i * 1001, CHUNK) for i in range(4)] == [True] * 4
    assert attempt_log(first.pk, 1, "node-1", 0, CHUNK) is False  # a repeat: counted once
    assert used(vision) == 4004
    assert attempt_log(second.pk, 1, "node-1", 0, CHUNK) is False  # 5,005 > 5,000: cut
    assert attempt_log(second.pk, 1, "node-1", 1001, CHUNK) is False
    assert attempt_log(first.pk, 1, "node-1", 4004, CHUNK) is False
    assert used(vision) == 4004
    # One note per attempt, where it was cut; the chunks stored before it stay.
    notes = LogChunk.objects.filter(cut=True).order_by("attempt_id")
    assert [(n.attempt_id, n.offset) for n in notes] == [(first.pk, 4004), (second.pk, 0)]
    text = job_logs(job=second.job)["text"]
    assert "output cut here" in text and "5000 (TEAM_OUTPUT_MAX_BYTES)" in text
    assert (
        job_logs(job=first.job)["text"].startswith(CHUNK * 4)
        and "output cut here" in job_logs(job=first.job)["text"]
    )
    # Another team's output is its own budget.
    assert all(attempt_log(other.pk, 1, "node-1", i * 1001, CHUNK) for i in range(4))


def test_its_host_is_told_to_stop_shipping_a_cut_attempts_output(bob, vision_share, nodes, sent, settings):
    settings.TEAM_OUTPUT_MAX_BYTES = 1_500
    attempt = running(bob, vision_share, nodes[0])
    assert attempt_log(attempt.pk, 1, "node-1", 0, CHUNK) is True
    assert [name for name, _ in sent] == []
    attempt_log(attempt.pk, 1, "node-1", 1001, CHUNK)
    [(name, message)] = sent
    assert name == "gpunodes.agent.tasks.log_cut" and message["queue"] == "node.node-1"
    assert message["kwargs"] == {"node": "node-1", "attempt_id": attempt.pk, "number": 1}


def test_no_budget_stores_everything(bob, vision, vision_share, nodes, sent, settings):
    settings.TEAM_OUTPUT_MAX_BYTES = 0
    attempt = running(bob, vision_share, nodes[0])
    assert all(attempt_log(attempt.pk, 1, "node-1", i * 1001, CHUNK) for i in range(20))
    assert used(vision) == 20 * 1001 and not LogChunk.objects.filter(cut=True).exists()


def test_a_malformed_chunk_is_refused(bob, vision_share, nodes, sent):
    attempt = running(bob, vision_share, nodes[0])
    assert attempt_log(attempt.pk, 1, "node-1", -5, CHUNK) is False
    assert attempt_log(attempt.pk, 1, "node-1", "0", CHUNK) is False
    assert attempt_log(attempt.pk, 1, "node-1", 0, ["not", "text"]) is False
    assert not LogChunk.objects.exists()


def test_the_end_of_a_cut_attempt_asks_its_host_for_nothing_more(bob, vision_share, nodes, sent, settings):
    """Without the note's mark the control side would hold the end back and ask for the bytes it did
    not store at every heartbeat, and the host would send them again for ever."""
    settings.TEAM_OUTPUT_MAX_BYTES = 2_500
    attempt = running(bob, vision_share, nodes[0])
    for i in range(5):
        attempt_log(attempt.pk, 1, "node-1", i * 1001, CHUNK)
    end = {"attempt_id": attempt.pk, "number": 1, "node": "node-1", "how": "exited", "exit_code": 0}
    end.update(job_id=attempt.job_id, log_ranges=[[0, 5005]])
    inventory = [g.__dict__ for g in fake_inventory("node-1", 4)]
    node_heartbeat(
        "node-1",
        "a10g",
        inventory,
        [],
        "boot-1",
        outbox=[{"id": 7, "name": FINISHED, "kwargs": end, "age_s": 60}],
        outbox_epoch="e1",
    )
    [ack] = [kw["kwargs"] for name, kw in sent if name == OUTBOX_ACK]
    assert (ack["ids"], ack["relog"]) == ([7], [])


def test_pruning_old_output_frees_the_budget(bob, vision, vision_share, nodes, sent, settings):
    settings.TEAM_OUTPUT_MAX_BYTES = 3_500
    settings.JOB_OUTPUT_KEEP_DAYS = 30
    old = running(bob, vision_share, nodes[0])
    assert all(attempt_log(old.pk, 1, "node-1", i * 1001, CHUNK) for i in range(2))
    Job.objects.filter(pk=old.job_id).update(
        state=JobState.SUCCEEDED, finished_at=timezone.now() - timedelta(days=31)
    )
    new = running(bob, vision_share, nodes[0])
    assert attempt_log(new.pk, 1, "node-1", 0, CHUNK) is True
    assert attempt_log(new.pk, 1, "node-1", 1001, CHUNK) is False  # 4,004 > 3,500
    assert prune_job_output() == 2
    assert used(vision) == 1001 + len(LogChunk.objects.get(cut=True).text.encode())  # the note counts now
    assert attempt_log(new.pk, 1, "node-1", 2002, CHUNK) is True


def test_the_count_is_made_good_from_the_chunks(bob, charlie, vision, language, vision_share, nodes, sent):
    attempt = running(bob, vision_share, nodes[0])
    LogChunk.objects.bulk_create(  # stored without counting (what a deleted job's chunks also leave off)
        LogChunk(attempt=attempt, node="node-1", offset=i, text="héllo\n") for i in range(3)
    )
    TeamOutput.objects.create(team=language, bytes=123)  # a team whose output is gone
    recount_team_output()
    assert (used(vision), used(language)) == (3 * 7, 0)


def test_the_team_page_shows_its_stored_output_against_the_budget(
    client, bob, vision, vision_share, nodes, sent, settings
):
    settings.TEAM_OUTPUT_MAX_BYTES = 2 * 1024**3
    attempt = running(bob, vision_share, nodes[0])
    attempt_log(attempt.pk, 1, "node-1", 0, "z" * 3 * 1024 * 1024)
    client.force_login(bob)
    page = client.get(f"/teams/{vision.slug}/").content.decode()
    assert "Stored output: 3.0\xa0MB of 2.0\xa0GB" in page
