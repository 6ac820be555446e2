"""`gpuquota logs` of a multi-node job (issue 42, item 5): every rank's log, each line prefixed with its
rank and node (the traceback may be in rank 1's, which rank 0's alone never showed), or one rank's by
`--rank` or `--node`; with `-f`, every rank's as it comes, interleaved, until the job ends."""

import json

import pytest
from django.utils import timezone

from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job, LogChunk
from tests.api.conftest import submit
from tests.web.test_multinode_logs import gang


@pytest.fixture
def two_ranks(bob, vision_share, nodes):
    job = submit(bob, vision_share, gpus=8)
    attempt = gang(job, nodes)
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="step 1\nstep 2\n")
    LogChunk.objects.create(
        attempt=attempt, node="node-2", offset=0, text="Traceback (most recent call last):\n"
    )
    LogChunk.objects.create(attempt=attempt, node="node-2", offset=35, text="ValueError: rank 1")
    return job, attempt


def test_every_ranks_log_with_its_rank_and_node_in_front(logged_in, two_ranks):
    job, _ = two_ranks
    code, out, _ = logged_in("logs", job.pk)
    assert code == 0
    assert out == (
        "[rank 0 node-1] step 1\n"
        "[rank 0 node-1] step 2\n"
        "[rank 1 node-2] Traceback (most recent call last):\n"
        "[rank 1 node-2] ValueError: rank 1\n"
    )
    code, out, _ = logged_in("--json", "logs", job.pk)
    assert [r["node"] for r in json.loads(out)] == ["node-1", "node-2"]


def test_one_ranks_log_by_rank_or_node(logged_in, two_ranks):
    job, _ = two_ranks
    assert (
        logged_in("logs", job.pk, "--rank", 1)[1] == "Traceback (most recent call last):\nValueError: rank 1"
    )
    assert logged_in("logs", job.pk, "--node", "node-1", "--tail", 1)[1] == "step 2\n"


def test_a_rank_the_job_did_not_have_or_both_at_once_exit_2(logged_in, two_ranks):
    job, _ = two_ranks
    code, _, err = logged_in("logs", job.pk, "--rank", 5)
    assert code == 2 and "ranks 0 to 1" in err, err
    with pytest.raises(SystemExit) as exit_:
        logged_in("logs", job.pk, "--rank", 1, "--node", "node-2")
    assert exit_.value.code == 2


def test_follow_prints_every_rank_until_the_job_ends(logged_in, two_ranks):
    job, attempt = two_ranks
    Attempt.objects.filter(pk=attempt.pk).update(
        state=AttemptState.ENDED, outcome="FAILED", ended_at=timezone.now()
    )
    Job.objects.filter(pk=job.pk).update(state=JobState.FAILED)
    code, out, _ = logged_in("logs", job.pk, "-f", "--poll", 0.01)
    assert code == 0
    assert sorted(out.splitlines()) == [
        "[rank 0 node-1] step 1",
        "[rank 0 node-1] step 2",
        "[rank 1 node-2] Traceback (most recent call last):",
        "[rank 1 node-2] ValueError: rank 1",
    ]
    assert logged_in("logs", job.pk, "-f", "--rank", 1, "--poll", 0.01)[1].endswith("ValueError: rank 1")
