"""A job's likely range (SEMANTICS "Ranges") beside its ETA in the API: eta_low and eta_high on the job
and in the queue, widened to hold the ETA; null where the stored forecast has none."""

from datetime import timedelta

from django.utils import timezone
from rest_framework.fields import DateTimeField

from quotas.models import QueueForecast
from tests.api.conftest import submit


def stored(job, *, eta, low=None, high=None, kind="estimate"):
    return QueueForecast.objects.create(
        job=job,
        position_in_share=1,
        position_overall=1,
        eta=eta,
        eta_low=low,
        eta_high=high,
        kind=kind,
        computed_at=timezone.now(),
    )


def iso(t):
    return DateTimeField().to_representation(t)


def test_a_job_and_the_queue_give_its_range_beside_its_eta(as_bob, bob, vision_share, nodes):
    now = timezone.now()
    job = submit(bob, vision_share)
    eta, low, high = now + timedelta(minutes=50), now + timedelta(minutes=20), now + timedelta(minutes=90)
    stored(job, eta=eta, low=low, high=high)

    data = as_bob.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (data["eta"], data["eta_low"], data["eta_high"]) == (iso(eta), iso(low), iso(high))
    listed = as_bob.get("/api/v1/jobs/", {"state": "QUEUED"}).json()["results"][0]
    assert (listed["eta_low"], listed["eta_high"]) == (iso(low), iso(high))
    queued = as_bob.get("/api/v1/queue/").json()["jobs"][0]
    assert (queued["eta"], queued["eta_low"], queued["eta_high"]) == (iso(eta), iso(low), iso(high))


def test_a_range_that_misses_the_eta_is_widened_to_hold_it(as_bob, bob, vision_share, nodes):
    now = timezone.now()
    job = submit(bob, vision_share)
    eta, low, high = now + timedelta(minutes=50), now + timedelta(minutes=20), now + timedelta(minutes=40)
    stored(job, eta=eta, low=low, high=high)
    data = as_bob.get(f"/api/v1/jobs/{job.pk}/").json()
    assert (data["eta_low"], data["eta_high"]) == (iso(low), iso(eta))
    queued = as_bob.get("/api/v1/queue/").json()["jobs"][0]
    assert (queued["eta_low"], queued["eta_high"]) == (iso(low), iso(eta))


def test_no_range_reads_null(as_bob, bob, vision_share, nodes):
    with_eta, without = submit(bob, vision_share), submit(bob, vision_share)
    stored(with_eta, eta=timezone.now() + timedelta(minutes=5), kind="bound")  # before the range replays
    data = as_bob.get(f"/api/v1/jobs/{with_eta.pk}/").json()
    assert data["eta"] is not None and (data["eta_low"], data["eta_high"]) == (None, None)
    data = as_bob.get(f"/api/v1/jobs/{without.pk}/").json()  # not forecast yet
    assert (data["eta"], data["eta_low"], data["eta_high"]) == (None, None, None)
    for entry in as_bob.get("/api/v1/queue/").json()["jobs"]:
        assert (entry["eta_low"], entry["eta_high"]) == (None, None)
