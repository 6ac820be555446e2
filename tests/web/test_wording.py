"""Wording a person reads: "just now", not "0 minutes"."""

import pytest

from tests.api.conftest import run
from tests.web.conftest import hx, submit


@pytest.mark.django_db
def test_a_job_that_just_started_says_just_now_not_0_minutes(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "0 minutes" not in body and "just now" in body
    run(job, nodes[0], [0])
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "0 minutes" not in body and "just now" in body
    assert "0 minutes" not in as_bob.get(f"/jobs/{job.pk}/").content.decode()


def test_job_path_gives_the_url_that_reverse_gives(settings):
    """The team queue formats per-job URLs from one reversed pattern (job_path): they must be the
    URLs Django would reverse, for every per-job route the queue links to."""
    from django.urls import reverse

    from quotas.templatetags.gpuquota import job_path

    for name in ("job", "job_priority", "job_cancel"):
        for pk in (1, 42, 987654321, 10**12):
            assert job_path(name, pk) == reverse(name, args=[pk])


def _forecast(job, eta_in_s: float) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from quotas.models import QueueForecast

    now = timezone.now()
    QueueForecast.objects.update_or_create(
        job=job,
        defaults={
            "position_in_share": 1,
            "position_overall": 1,
            "eta": now + timedelta(seconds=eta_in_s),
            "kind": "bound",
            "basis": "test",
            "computed_at": now,
        },
    )


@pytest.mark.django_db
def test_an_eta_within_the_minute_is_due_now_not_in_0_minutes(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    _forecast(job, 30)
    for body in (
        hx(as_bob, "/teams/vision/?part=queue").content.decode(),
        as_bob.get(f"/jobs/{job.pk}/").content.decode(),
    ):
        assert "0 minutes" not in body and "due now" in body
    _forecast(job, 630)
    assert "in 10\xa0minutes" in hx(as_bob, "/teams/vision/?part=queue").content.decode()


@pytest.mark.django_db
def test_an_array_row_says_just_now_and_due_now(as_bob, bob, vision_share, nodes):
    from jobs.models import Job
    from jobs.services import job_array_submit

    array = job_array_submit(user=bob, share=vision_share, size=3, gpus=1, gpu_type="a10g", command=["x"])
    _forecast(Job.objects.filter(array=array).order_by("array_index").first(), 30)
    row = hx(as_bob, "/teams/vision/?part=queue").content.decode().split(f'data-array="{array.pk}"', 1)[1]
    row = row.split("</tr>", 1)[0]
    assert "0 minutes" not in row
    assert "just now" in row and "due now" in row


def test_until_under_a_minute_is_less_than_a_minute():
    from datetime import timedelta

    from django.utils import timezone

    from quotas.templatetags.gpuquota import starts_in, until

    now = timezone.now()
    assert until(now + timedelta(seconds=59), now) == "< 1 min"
    assert starts_in(now + timedelta(seconds=59), now) == "due now"
    assert starts_in(now + timedelta(seconds=90), now) == "in 1\xa0minute"
