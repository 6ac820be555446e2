"""The stored forecast learns from the runtimes the system has seen and gives a likely range (SEMANTICS
"Forecast": Runtime estimates, Ranges), end to end from the database the control worker reads."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import AttemptState, JobState, Outcome
from jobs.models import Attempt, Job
from quotas import services
from quotas.engine import runtimes as rt
from quotas.models import QueueForecast
from tests.api.conftest import run
from tests.web.conftest import submit

pytestmark = pytest.mark.django_db


def seen(bob, share, seconds, *, n=1, name="sweep", ended_ago=timedelta(hours=1)):
    """n successful jobs of each of `seconds` (a number or a list) that ended `ended_ago` (an hour ago)."""
    end = timezone.now() - ended_ago
    for each in [seconds] * n if isinstance(seconds, int) else seconds:
        job = submit(bob, share, gpus=1, name=name)
        Job.objects.filter(pk=job.pk).update(state=JobState.SUCCEEDED, attempt_count=1)
        Attempt.objects.create(
            job=job,
            number=1,
            state=AttemptState.ENDED,
            outcome=Outcome.SUCCEEDED,
            admitted_at=end - timedelta(seconds=each),
            started_at=end - timedelta(seconds=each),
            ended_at=end,
        )


def fill(bob, share, nodes, *, started_ago, name="sweep"):
    """Every GPU of both 4-GPU nodes busy with a 4-GPU job that started `started_ago` seconds ago."""
    at = timezone.now() - timedelta(seconds=started_ago)
    for node in nodes[:2]:
        run(submit(bob, share, gpus=4, name=name), node, [0, 1, 2, 3], started_at=at)


def test_a_waiting_jobs_eta_follows_how_long_the_running_work_has_left(bob, vision_share, nodes):
    # Half the jobs seen ran 10 min, the rest 3 to 7 h (5 h the median). The running ones have run 20 min:
    # they are of the long kind, so the waiting job's ETA is about 4 h 40 min away, not "now" and not the
    # 10-min median.
    seen(bob, vision_share, 600, n=10, name="")
    seen(bob, vision_share, [10800 + 1600 * i for i in range(10)], name="")
    fill(bob, vision_share, nodes, started_ago=1200, name="")
    waiting = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    wait = (f.eta - timezone.now()).total_seconds()
    assert 16500 < wait < 17500, wait
    assert f.kind == "estimate" and f.basis.endswith("(runtimes seen in vision-main)")
    # The range: the fastest tenth of the long kind at one end, the slowest at the other, holding the ETA.
    low, high = ((t - timezone.now()).total_seconds() for t in (f.eta_low, f.eta_high))
    assert 10500 < low < 11500 < wait < 22000 < high < 23000, (low, wait, high)


def test_estimates_learn_from_the_most_recent_runtimes_so_they_follow_a_workload_that_changes(
    bob, vision_share, nodes, monkeypatch
):
    # The share's jobs ran 10 h until two days ago; its most recent ones run 10 min. The guess is theirs
    # (the whole month's would be a mix, its median 10 h), for the share and for bob's job name alike.
    monkeypatch.setattr(rt, "RECENT_SAMPLE", 12)
    seen(bob, vision_share, 36000, n=20, ended_ago=timedelta(days=2))
    seen(bob, vision_share, 600, n=12, ended_ago=timedelta(hours=1))
    model = services.runtime_history(timezone.now())
    assert model.guess("vision-main").seconds == 600
    sweep = model.guess("vision-main", "bob", "sweep")
    assert sweep.source == "bob's 'sweep' jobs" and sweep.seconds == sweep.high == 600


def test_the_users_own_job_name_is_learnt_once_there_are_enough(bob, vision_share, nodes):
    seen(bob, vision_share, 600, n=20, name="other")
    seen(bob, vision_share, 7200, n=10, name="sweep")
    fill(bob, vision_share, nodes, started_ago=60, name="sweep")
    waiting = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    assert 7000 < (f.eta - timezone.now()).total_seconds() < 7200
    assert "bob's 'sweep' jobs" in f.basis


def test_a_long_queue_gets_its_etas_first_and_its_ranges_right_after(bob, vision_share, nodes, settings):
    # Runtimes that vary: runtimes all of one length would give an estimate no range (none of no width).
    seen(bob, vision_share, [500, 550, 600, 650, 700] * 2)
    fill(bob, vision_share, nodes, started_ago=60)
    waiting = submit(bob, vision_share, gpus=4)
    settings.FORECAST_RANGES_INLINE_S = 0  # as if the replay were slow: ranges in a second write
    settings.FORECAST_RANGES_INTERVAL_S = 3600
    result = services.forecast_refresh(ranges=True)
    assert result["ranges"] == 1
    f = QueueForecast.objects.get(job=waiting)
    assert f.eta_low is not None and f.eta_high is not None
    # A refresh without the range replays keeps the ranges last found.
    result = services.forecast_refresh()
    assert result["ranges"] == 0
    f2 = QueueForecast.objects.get(job=waiting)
    assert (f2.eta_low, f2.eta_high) == (f.eta_low, f.eta_high)
