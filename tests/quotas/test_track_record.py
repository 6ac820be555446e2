"""The forecast's track record (quotas.track_record): each job's first forecast is kept once, beside its
first attempt's start; a share's summary counts the starts within their range and the median error."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Attempt, Job
from quotas import services, track_record
from quotas.models import ForecastRecord, QueueForecast
from tests.api.conftest import run, submit
from tests.track_history import record_start

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quiet(no_messages, nodes):
    return no_messages


def stored(job, at, *, eta=None, low=None, high=None, kind="estimate", position=1):
    return QueueForecast.objects.create(
        job=job,
        position_in_share=position,
        position_overall=position,
        eta=eta,
        eta_low=low,
        eta_high=high,
        kind=kind,
        computed_at=at,
    )


def test_a_jobs_first_forecast_is_recorded_once_not_twice(bob, vision_share):
    job = submit(bob, vision_share)
    first = timezone.now()
    stored(
        job,
        first,
        eta=first + timedelta(minutes=30),
        low=first + timedelta(minutes=10),
        high=first + timedelta(minutes=50),
    )
    assert track_record.record_first_forecasts(first) == 1

    # The next forecast says something else: the record keeps what the job was told first.
    later = first + timedelta(seconds=5)
    QueueForecast.objects.all().delete()
    stored(job, later, eta=later + timedelta(hours=3), kind="bound")
    assert track_record.record_first_forecasts(later) == 0

    record = ForecastRecord.objects.get()
    assert record.job_id == job.pk and record.share_id == vision_share.pk
    assert record.forecast_at == first and record.submitted_at == job.submitted_at
    assert record.eta == first + timedelta(minutes=30)
    assert (record.eta_low, record.eta_high) == (first + timedelta(minutes=10), first + timedelta(minutes=50))
    assert record.kind == "estimate" and record.started_at is None


def test_only_the_forecast_written_at_that_time_and_jobs_still_at_their_first_wait_are_recorded(
    bob, vision_share, nodes
):
    now = timezone.now()
    waiting, admitted, requeued, older = (submit(bob, vision_share) for _ in range(4))
    stored(waiting, now, eta=now + timedelta(minutes=5), position=1)
    run(admitted, nodes[0], [0])  # admitted while the forecast was written: never shown it
    stored(admitted, now, eta=now + timedelta(minutes=5), position=2)
    Job.objects.filter(pk=requeued.pk).update(attempt_count=1)  # back in the queue after an attempt
    stored(requeued, now, eta=now + timedelta(minutes=5), position=3)
    stored(older, now - timedelta(seconds=3), eta=now + timedelta(minutes=5), position=4)

    assert track_record.record_first_forecasts(now) == 1
    assert list(ForecastRecord.objects.values_list("job_id", flat=True)) == [waiting.pk]


def test_a_forecast_from_too_little_history_is_kept_out_of_the_track_record(bob, vision_share, nodes):
    """A young cluster's first forecasts rest on the default runtime (issue 42: "median error 59 min"):
    they say so, and the record waits for a forecast that rests on what the system has seen."""
    for node in nodes:
        run(submit(bob, vision_share, gpus=4), node, [0, 1, 2, 3])  # no max runtime, nothing seen yet
    job = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=job)
    assert f.kind == "estimate" and "too little history yet: a default 60 min assumed" in f.basis
    assert not ForecastRecord.objects.exists()

    later = timezone.now() + timedelta(seconds=5)
    QueueForecast.objects.all().delete()
    stored(job, later, eta=later + timedelta(minutes=20), kind="estimate")
    assert track_record.record_first_forecasts(later) == 1


def test_recording_takes_one_statement_whatever_the_queue(bob, vision_share):
    now = timezone.now()
    for i, job in enumerate(submit(bob, vision_share) for _ in range(30)):
        stored(job, now, eta=now + timedelta(minutes=i), position=i + 1)
    with CaptureQueriesContext(connection) as queries:
        assert track_record.record_first_forecasts(now) == 30
        assert track_record.record_first_forecasts(now) == 0
        track_record.mark_started()
    assert len(queries) == 3


def test_the_start_is_filled_in_from_the_first_attempt_that_started(bob, vision_share, nodes):
    now = timezone.now()
    started, waiting = submit(bob, vision_share), submit(bob, vision_share)
    for job in (started, waiting):
        stored(job, now, eta=now + timedelta(minutes=1))
    track_record.record_first_forecasts(now)

    first_start = now + timedelta(minutes=2)
    run(started, nodes[0], [0], started_at=first_start)
    Attempt.objects.filter(job=started).update(state="ENDED", outcome="PREEMPTED")
    Job.objects.filter(pk=started.pk).update(state=JobState.QUEUED)
    run(Job.objects.get(pk=started.pk), nodes[0], [1], started_at=now + timedelta(minutes=9))

    assert track_record.mark_started() == 1
    assert ForecastRecord.objects.get(job=started).started_at == first_start
    assert ForecastRecord.objects.get(job=waiting).started_at is None
    assert track_record.mark_started() == 0  # a filled-in start is not looked at again


def test_a_stored_forecast_records_first_forecasts_and_starts(bob, vision_share, nodes):
    for node in nodes:
        run(submit(bob, vision_share, gpus=4, max_runtime_s=600), node, [0, 1, 2, 3])
    job = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    record = ForecastRecord.objects.get()
    assert record.job_id == job.pk and record.eta == QueueForecast.objects.get(job=job).eta


def test_a_failing_track_record_never_fails_the_forecast(bob, vision_share, monkeypatch, caplog):
    def broken(computed_at):
        raise RuntimeError("bug")

    monkeypatch.setattr(track_record, "record_first_forecasts", broken)
    job = submit(bob, vision_share, gpus=4)
    assert services.forecast_refresh()["jobs"] == 1
    assert QueueForecast.objects.filter(job=job).exists()
    assert "track record was not updated" in caplog.text


# --- the summary, on a hand-made table -----------------------------------------------------------------


def record(job, share, *, submitted, eta, started, low=None, high=None, kind="estimate"):
    return ForecastRecord.objects.create(
        job=job,
        share=share,
        submitted_at=submitted,
        forecast_at=submitted + timedelta(seconds=5),
        eta=eta,
        eta_low=low,
        eta_high=high,
        kind=kind,
        started_at=started,
    )


@pytest.fixture
def history(bob, charlie, vision_share, language_share):
    """Six jobs of vision-main that started in the last week, one that started 10 days ago, one still
    waiting long past its range, and one of another share. Times in minutes from `now - 1 day`."""
    now = timezone.now()
    t0 = now - timedelta(days=1)

    def m(minutes):
        return t0 + timedelta(minutes=minutes)

    def job():
        return submit(bob, vision_share)

    # within its range (10..50, ETA 30), started at 40: error 10 min
    record(job(), vision_share, submitted=m(0), eta=m(30), low=m(10), high=m(50), started=m(40))
    # within: a minute past its range's end counts (TOLERANCE_S); error 21 min
    record(job(), vision_share, submitted=m(0), eta=m(30), low=m(20), high=m(50), started=m(51))
    # late: after its range; error 60 min
    record(job(), vision_share, submitted=m(0), eta=m(30), low=m(20), high=m(40), started=m(90))
    # early: before its range; error 25 min
    record(job(), vision_share, submitted=m(0), eta=m(30), low=m(20), high=m(40), started=m(5))
    # a bound without a range: in the error (5 min), not in the range counts
    record(job(), vision_share, submitted=m(0), eta=m(30), started=m(25), kind="bound")
    # no ETA: counted as started, in no error
    record(job(), vision_share, submitted=m(0), eta=None, started=m(70), kind="none")
    # started 10 days ago: outside the week
    old = now - timedelta(days=10)
    record(job(), vision_share, submitted=old, eta=old, low=old, high=old, started=old)
    # still queued, its range long over
    record(job(), vision_share, submitted=m(0), eta=m(30), low=m(20), high=m(40), started=None)
    # another share's job
    other = submit(charlie, language_share)
    record(other, language_share, submitted=m(0), eta=m(30), low=m(20), high=m(40), started=m(35))
    return now


def test_the_summary_counts_starts_within_their_range_and_the_median_error(vision_share, history):
    s = track_record.summary(vision_share, now=history)
    assert s["started"] == 6
    assert s["by_kind"] == {
        "bound": {"started": 1, "with_range": 0, "within_range": 0},
        "estimate": {"started": 4, "with_range": 4, "within_range": 2},
        "none": {"started": 1, "with_range": 0, "within_range": 0},
    }
    assert (s["n"], s["with_range"], s["within_range"], s["early"], s["late"]) == (5, 4, 2, 1, 1)
    assert s["within_fraction"] == 0.5
    assert s["median_error_s"] == 21 * 60  # of 10, 21, 60, 25, 5 minutes
    assert s["waiting_past_range"] == 1
    assert len(s["points"]) == 5
    first = s["points"][0]  # the earliest start: the early one
    assert (first["forecast_s"], first["low_s"], first["high_s"], first["actual_s"]) == (
        1800,
        1200,
        2400,
        300,
    )
    assert first["within"] is False
    bound = next(p for p in s["points"] if p["kind"] == "bound")
    assert bound["low_s"] is None and bound["within"] is None


def test_the_summary_reads_a_range_widened_to_hold_the_eta(bob, vision_share):
    now = timezone.now()
    t0 = now - timedelta(hours=2)
    # The range replays ran on an older state: 10..20 beside an ETA of 30. Read as 10..30.
    record(
        submit(bob, vision_share),
        vision_share,
        submitted=t0,
        eta=t0 + timedelta(minutes=30),
        low=t0 + timedelta(minutes=10),
        high=t0 + timedelta(minutes=20),
        started=t0 + timedelta(minutes=29),
    )
    s = track_record.summary(vision_share, now=now)
    assert s["within_range"] == 1 and s["points"][0]["high_s"] == 1800


def test_an_estimates_range_of_no_width_counts_as_no_range(bob, vision_share):
    """8 of 17 points were "likely between 02:02 and 02:02", within range only through the tolerance."""
    submitted = timezone.now() - timedelta(hours=1)
    record = record_start(submit(bob, vision_share), vision_share, submitted, 30.5)
    ForecastRecord.objects.filter(pk=record.pk).update(eta_low=record.eta, eta_high=record.eta)
    summary = track_record.summary(vision_share)
    assert (summary["n"], summary["with_range"], summary["within_range"]) == (1, 0, 0)
    assert summary["points"][0]["low_s"] is None and summary["points"][0]["within"] is None
    ForecastRecord.objects.filter(pk=record.pk).update(kind="bound")  # a bound's may: it ends at the bound
    assert track_record.summary(vision_share)["with_range"] == 1


def test_a_longer_window_takes_in_older_starts(vision_share, history):
    assert track_record.summary(vision_share, now=history, days=30)["started"] == 7
    assert track_record.summary(vision_share, now=history, days=1)["started"] == 6


def test_a_share_without_history_has_empty_numbers(language_share):
    s = track_record.summary(language_share)
    assert (s["started"], s["n"], s["with_range"], s["points"]) == (0, 0, 0, [])
    assert s["median_error_s"] is None and s["within_fraction"] is None
