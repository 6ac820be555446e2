"""The forecast counts a container job's pull (issue 39.4): each attempt's pull time is recorded from its
host's start report (the longest of a gang's ranks), and a queued job whose image is not known cached on
every host that could run it has its image's typical pull (the median of its recent pulls) added to its
ETA and range, which its basis says; a job whose image every such host ran lately, or whose image was
never seen pulled, is forecast as before."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, Job
from jobs.tasks import attempt_started
from quotas import services
from quotas.choices import Strategy
from quotas.models import QueueForecast
from tests.api.conftest import run
from tests.conftest import make_share
from tests.web.conftest import submit

pytestmark = pytest.mark.django_db
IMAGE = "registry.example.com/ml/train:1"


@pytest.fixture
def busy(bob, vision, nodes, settings):
    """Both hosts full until 600 s after a start 100 s ago: a 4-GPU job's ETA is that bound."""
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    share = make_share(vision, "vision-prod", capacity={"a10g": 8}, strategy=Strategy.RESERVE)
    started = timezone.now() - timedelta(seconds=100)
    for node in nodes:
        run(submit(bob, share, gpus=4, max_runtime_s=600), node, [0, 1, 2, 3], started_at=started)
    return share, started + timedelta(seconds=600)


def pulled(bob, share, node, pull_s, *, ago=timedelta(days=3), image=IMAGE):
    """An ended attempt of a job of `image` that started on `node` after a pull of `pull_s` seconds."""
    job = submit(bob, share, gpus=1, image=image)
    at = timezone.now() - ago
    attempt = Attempt.objects.create(
        job=job,
        number=1,
        state=AttemptState.ENDED,
        placement=[{"node": node.name, "gpus": [0]}],
        admitted_at=at,
        started_at=at,
        ended_at=at + timedelta(minutes=5),
        outcome="SUCCEEDED",
        exit_code=0,
        pull_s=pull_s,
    )
    attempt.nodes.add(node)
    Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, attempt_count=1)


def test_a_job_whose_image_may_need_a_pull_has_the_typical_pull_in_its_eta_and_words(bob, nodes, busy):
    share, bound = busy
    for seconds in (30, 50, 170):
        pulled(bob, share, nodes[0], seconds)
    waiting = submit(bob, share, gpus=4, max_runtime_s=60, image=IMAGE)
    plain = submit(bob, share, gpus=4, max_runtime_s=60)
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    assert abs((f.eta - (bound + timedelta(seconds=50))).total_seconds()) < 2, (f.eta, bound)
    assert f.basis.endswith(f"includes pulling image {IMAGE}: 50 s (median of 3 pulls)"), f.basis
    fields = services.forecast_fields(Job.objects.select_related("forecast").get(pk=waiting.pk))
    assert fields["eta_low"] <= fields["eta"] <= fields["eta_high"]
    # The same job without an image waits for the same hosts, with no pull.
    g = QueueForecast.objects.get(job=plain)
    assert "pulling" not in g.basis
    assert abs((g.eta - bound).total_seconds()) < 2, (g.eta, bound)


def test_an_image_every_host_ran_lately_adds_no_pull(bob, nodes, busy):
    share, bound = busy
    pulled(bob, share, nodes[0], 120)
    waiting = submit(bob, share, gpus=4, max_runtime_s=60, image=IMAGE)
    pulled(bob, share, nodes[0], 0, ago=timedelta(hours=2))  # node-1 had it two hours ago
    services.forecast_refresh()
    assert "includes pulling" in QueueForecast.objects.get(job=waiting).basis  # node-2 may lack it
    pulled(bob, share, nodes[1], 80, ago=timedelta(hours=1))  # now both have it
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    assert "pulling" not in f.basis, f.basis
    assert abs((f.eta - bound).total_seconds()) < 2


def test_an_image_never_seen_pulled_adds_nothing(bob, nodes, busy):
    share, bound = busy
    waiting = submit(bob, share, gpus=4, max_runtime_s=60, image="registry.example.com/ml/new:1")
    pulled(bob, share, nodes[0], 300)  # another image's pull
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    assert "pulling" not in f.basis and abs((f.eta - bound).total_seconds()) < 2


def test_a_start_report_records_the_longest_pull_of_the_attempts_hosts(bob, vision_share, nodes, settings):
    settings.ALLOWED_IMAGES = ["registry.example.com/ml/"]
    job = submit(bob, vision_share, gpus=8, image=IMAGE)
    attempt = Attempt.objects.create(
        job=job,
        number=1,
        placement=[
            {"node": nodes[0].name, "gpus": [0, 1, 2, 3]},
            {"node": nodes[1].name, "gpus": [0, 1, 2, 3]},
        ],
    )
    Job.objects.filter(pk=job.pk).update(state=JobState.ADMITTED, attempt_count=1)
    assert attempt_started(attempt.pk, 1, nodes[0].name, pull_s=12.5)
    attempt_started(attempt.pk, 1, nodes[1].name, pull_s=3.0)  # a faster rank does not lower it
    attempt.refresh_from_db()
    assert attempt.pull_s == 12.5 and attempt.state == AttemptState.RUNNING
    attempt_started(attempt.pk, 1, nodes[1].name, pull_s="a lot")  # not a number: ignored
    attempt_started(attempt.pk, 1, nodes[1].name, pull_s=-1)
    attempt.refresh_from_db()
    assert attempt.pull_s == 12.5
    # An older agent says nothing: nothing recorded.
    other = submit(bob, vision_share, gpus=1)
    a2 = Attempt.objects.create(job=other, number=1, placement=[{"node": nodes[0].name, "gpus": [4]}])
    Job.objects.filter(pk=other.pk).update(state=JobState.ADMITTED, attempt_count=1)
    attempt_started(a2.pk, 1, nodes[0].name)
    a2.refresh_from_db()
    assert a2.pull_s is None and a2.state == AttemptState.RUNNING
