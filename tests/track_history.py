"""Hand-made forecast track record for the tests of its API and pages: a job forecast at its submit to
start 30 min later (likely between 20 and 40 min), and when it actually started (None: not yet)."""

from datetime import timedelta

from quotas.models import ForecastRecord


def record_start(job, share, submitted, started_after_min):
    return ForecastRecord.objects.create(
        job=job,
        share=share,
        submitted_at=submitted,
        forecast_at=submitted,
        eta=submitted + timedelta(minutes=30),
        eta_low=submitted + timedelta(minutes=20),
        eta_high=submitted + timedelta(minutes=40),
        kind="estimate",
        started_at=None if started_after_min is None else submitted + timedelta(minutes=started_after_min),
    )
