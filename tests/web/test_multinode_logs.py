"""Multi-node logs (issue 42, item 5). Before: the job page and the API's default showed rank 0's log only
(the traceback was in rank 1's), and a gang's STARTED event named one node, whichever reported first.
Now the page shows every rank's last lines under its rank and node, the API reads any rank's log by
`?rank=` or `?node=`, and the STARTED event names every node in rank order."""

import pytest
from django.utils import timezone

from jobs import lifecycle
from jobs.choices import AttemptState, EventKind, JobState
from jobs.models import Attempt, Job, JobEvent, LogChunk
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def gang(job, nodes, *, state=AttemptState.RUNNING) -> Attempt:
    """An attempt of `job` over these nodes, rank 0 first, 4 GPUs each, as the pass admits a gang."""
    now = timezone.now()
    attempt = Attempt.objects.create(
        job=job,
        number=1,
        state=state,
        placement=[{"node": n.name, "gpus": [0, 1, 2, 3]} for n in nodes],
        admitted_at=now,
        started_at=now if state == AttemptState.RUNNING else None,
    )
    attempt.nodes.add(*nodes)
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, attempt_count=1)
    return attempt


@pytest.fixture
def logs(bob, vision_share, nodes):
    job = submit(bob, vision_share, gpus=8)
    attempt = gang(job, nodes)
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="rank 0: step 7\n")
    LogChunk.objects.create(attempt=attempt, node="node-2", offset=0, text="Traceback: rank 1 failed\n")
    return job


def test_the_page_shows_every_ranks_log_under_its_rank_and_node(as_bob, logs):
    for body in (
        as_bob.get(f"/jobs/{logs.pk}/").content.decode(),
        hx(as_bob, f"/jobs/{logs.pk}/?part=log").content.decode(),
    ):
        assert "rank 0: step 7" in body and "Traceback: rank 1 failed" in body
        assert "rank 0 on node-1" in body and "rank 1 on node-2" in body
        assert f"gpuquota logs {logs.pk} --rank 1" in body


def test_the_api_reads_any_ranks_log(as_bob, logs):
    first = as_bob.get(f"/api/v1/jobs/{logs.pk}/logs/").json()
    assert (first["rank"], first["node"], first["nodes"]) == (0, "node-1", ["node-1", "node-2"])
    by_rank = as_bob.get(f"/api/v1/jobs/{logs.pk}/logs/", {"rank": 1}).json()
    assert (by_rank["rank"], by_rank["node"], by_rank["text"]) == (1, "node-2", "Traceback: rank 1 failed\n")
    assert as_bob.get(f"/api/v1/jobs/{logs.pk}/logs/", {"node": "node-2"}).json()["rank"] == 1


@pytest.mark.parametrize(
    "query, field",
    [
        ({"rank": 2}, "rank"),
        ({"rank": -1}, "rank"),
        ({"rank": "x"}, "rank"),
        ({"rank": 1, "node": "node-2"}, "rank"),
    ],
)
def test_a_rank_it_did_not_have_is_a_400_that_says_which_it_had(as_bob, logs, query, field):
    response = as_bob.get(f"/api/v1/jobs/{logs.pk}/logs/", query)
    assert response.status_code == 400 and field in response.json(), response.content


def test_the_started_event_names_every_node(bob, vision_share, nodes):
    job = submit(bob, vision_share, gpus=8)
    Job.objects.filter(pk=job.pk).update(state=JobState.ADMITTED)
    attempt = gang(job, nodes, state=AttemptState.ADMITTED)
    Job.objects.filter(pk=job.pk).update(state=JobState.ADMITTED)
    assert lifecycle.mark_started(attempt.pk, 1, "node-2")  # rank 1's report came first
    started = JobEvent.objects.get(job=job, kind=EventKind.STARTED)
    assert started.reason == "running on 2 nodes: node-1 (rank 0), node-2 (rank 1)"


def test_a_one_node_attempt_says_its_node_as_before():
    assert lifecycle.running_on([{"node": "gpu-7", "gpus": [0]}], "gpu-7") == "running on gpu-7"
    many = [{"node": f"gpu-node-{i:03d}", "gpus": [0]} for i in range(64)]
    assert len(lifecycle.running_on(many, "gpu-node-000")) <= 300
