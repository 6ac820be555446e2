"""The CLI shows the stored forecast: what an ETA rests on and how old it is, never a time in the past."""

from datetime import timedelta

from django.utils import timezone

from quotas import services
from quotas.choices import Strategy
from quotas.models import QueueForecast
from tests.api.conftest import run, submit
from tests.conftest import make_share


def test_status_says_what_the_eta_rests_on_and_its_age(logged_in, bob, vision, nodes):
    # Waits for the one 4-GPU job with a max runtime that holds its RESERVE share's capacity: a bound.
    share = make_share(vision, "vision-prod", capacity={"a10g": 4}, strategy=Strategy.RESERVE)
    run(submit(bob, share, gpus=4, max_runtime_s=3600), nodes[0], [0, 1, 2, 3])
    job = submit(bob, share, gpus=4)
    services.forecast_refresh()
    code, out, _ = logged_in("status", job.pk)
    assert code == 0
    assert "expected to start" in out and "[bound: every job before it has a max runtime; forecast" in out


def test_a_passed_eta_reads_due_now_not_a_time_ago(logged_in, bob, vision_share, nodes):
    for node in nodes:
        run(submit(bob, vision_share, gpus=4), node, [0, 1, 2, 3])
    job = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    QueueForecast.objects.filter(job=job).update(eta=timezone.now() - timedelta(seconds=30))
    code, out, _ = logged_in("status", job.pk)
    assert "due now, forecast again after the next pass" in out and " ago)" not in out.split("[")[0]
