"""What sharing gained and what it cost (quotas/sharing.py), and where admins read it: the usage page,
GET /api/v1/usage/ and its CSV, the Prometheus counter gpuquota_lost_gpu_seconds_total{share,cause}."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from jobs.choices import AttemptState, LostCause, Outcome
from jobs.models import Attempt, Job
from jobs.services import job_submit
from quotas import sharing
from quotas.metrics import render
from quotas.models import UsageSample
from tests.api.conftest import client_for

# Whole hours, a little after one: the window of the last day then has 25 hourly buckets, the data
# below in known ones.
NOW = datetime(2026, 12, 5, 12, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def quiet(no_messages):
    return no_messages


def hours_ago(h: float) -> datetime:
    return NOW - timedelta(hours=h)


def ended(job, *, number, cause, lost_s, run_s, at, outcome=Outcome.PREEMPTED, borrowed=True):
    return Attempt.objects.create(
        job=job,
        number=number,
        state=AttemptState.ENDED,
        outcome=outcome,
        borrowed=borrowed,
        placement=[{"node": "node-1", "gpus": [0, 1]}],
        admitted_at=at - timedelta(seconds=run_s / 2),
        started_at=at - timedelta(seconds=run_s / 2),
        ended_at=at,
        lost_cause=cause,
        gpu_seconds_lost=lost_s,
        gpu_seconds_run=run_s,
    )


def owner_start(job, *, number, needed, started, priority):
    Job.objects.filter(pk=job.pk).update(priority=priority)
    return Attempt.objects.create(
        job=job,
        number=number,
        state=AttemptState.RUNNING,
        borrowed=False,
        placement=[{"node": "node-2", "gpus": [0]}],
        admitted_at=started,
        started_at=started,
        reclaim_needed_at=needed,
    )


@pytest.fixture
def history(bob, charlie, vision_share, language_share, nodes):
    """vision-main borrowed 2 GPUs for the hour 3 h ago (4 own); language-main lent them. vision lost
    1 GPU-hour to reclaims and 0.5 to a lost node; language's owners waited 30 s and 90 s (priority 5)
    and 600 s (priority 0) for GPUs reclaimed from vision."""
    for minute in range(60):
        at = hours_ago(3) + timedelta(minutes=minute)
        UsageSample.objects.create(at=at, share=vision_share, gpu_type="a10g", own=4, borrowed=2, capacity=4)
        UsageSample.objects.create(at=at, share=language_share, gpu_type="a10g", lent=2, capacity=2)
    v = job_submit(user=bob, share=vision_share, gpus=2, gpu_type="a10g", command=["true"])
    ended(v, number=1, cause=LostCause.RECLAIM, lost_s=2400, run_s=7200, at=hours_ago(2.5))
    ended(v, number=2, cause=LostCause.RECLAIM, lost_s=1200, run_s=3000, at=hours_ago(2.4))
    ended(v, number=3, cause=LostCause.NODE_LOST, lost_s=1800, run_s=3600, at=hours_ago(1.5))
    ended(v, number=4, cause="", lost_s=0, run_s=600, at=hours_ago(1.2), outcome=Outcome.SUCCEEDED)
    ended(v, number=5, cause=LostCause.PRIORITY, lost_s=999, run_s=999, at=hours_ago(30))  # before the window
    for i, (wait_s, prio) in enumerate([(30, 5), (90, 5), (600, 0)], start=1):
        job = job_submit(user=charlie, share=language_share, gpus=1, gpu_type="a10g", command=["true"])
        started = hours_ago(2.5) + timedelta(minutes=i)
        owner_start(job, number=1, needed=started - timedelta(seconds=wait_s), started=started, priority=prio)
    # A borrowed start that needed a reclaim is no owner's wait.
    job = job_submit(user=charlie, share=language_share, gpus=1, gpu_type="a10g", command=["true"])
    a = owner_start(job, number=1, needed=hours_ago(2.2), started=hours_ago(2.1), priority=5)
    Attempt.objects.filter(pk=a.pk).update(borrowed=True)


def test_the_report_has_a_column_for_every_cause_an_attempt_can_lose_work_to():
    from jobs.choices import LostCause

    assert sorted(sharing.CAUSES) == sorted(LostCause.values) and set(sharing.CAUSE_LABELS) == set(
        sharing.CAUSES
    )


def test_the_report_integrates_the_samples_and_counts_lost_work_and_owner_waits(history):
    r = sharing.report(days=1, now=NOW)
    assert (
        r.bucket_s == 3600 and len(r.buckets) == 25 and r.buckets[0] == datetime(2026, 12, 4, 12, tzinfo=UTC)
    )
    vision, language = r.shares["vision-main"], r.shares["language-main"]
    assert (vision.own, vision.borrowed, vision.lent) == pytest.approx((4.0, 2.0, 0.0))
    assert (language.own, language.borrowed, language.lent) == pytest.approx((0.0, 0.0, 2.0))
    assert vision.lost == pytest.approx(
        {
            "reclaim": 1.0,
            "priority": 0,
            "fair_share": 0,
            "node_lost": 0.5,
            "fenced": 0,
            "gpu_failed": 0,
            "agent_stopped": 0,
            "host_fault": 0,
        }
    )
    assert language.waits.summary() == {"n": 3, "p50_s": 90.0, "p95_s": 600.0}
    assert {p: w.summary()["n"] for p, w in language.waits_by_priority.items()} == {5: 2, 0: 1}
    assert language.waits_by_priority[5].summary() == {"n": 2, "p50_s": 30.0, "p95_s": 90.0}
    hour = datetime(2026, 12, 5, 9, tzinfo=UTC)  # 3 h before 12:30, truncated
    assert r.by_bucket[("vision-main", hour)].borrowed == pytest.approx(1.0)  # 2 GPUs, 09:30-10:00
    assert r.by_bucket[("vision-main", datetime(2026, 12, 5, 10, tzinfo=UTC))].lost[
        "reclaim"
    ] == pytest.approx(1.0)
    assert r.team_totals["vision"].lost_total == pytest.approx(1.5)
    assert r.cluster.borrowed == pytest.approx(2.0) and r.cluster.lost_total == pytest.approx(1.5)


def test_a_longer_window_is_in_days_and_can_be_one_share(history):
    r = sharing.report(days=7, shares=["vision-main"], now=NOW)
    assert r.bucket_s == 86400 and list(r.shares) == ["vision-main"]
    assert r.shares["vision-main"].lost["priority"] == pytest.approx(999 / 3600)  # 30 h ago: in
    assert r.chart("vision-main")["series"]["reclaim"][-1] == pytest.approx(1.0)


# --- the API and its CSV ------------------------------------------------------------------------------


@pytest.fixture
def at_now(monkeypatch):
    monkeypatch.setattr("quotas.sharing.timezone.now", lambda: NOW)


def test_the_api_gives_the_figures_to_admins(alice, history, at_now):
    data = client_for(alice).get("/api/v1/usage/", {"days": 1}).json()
    assert data["bucket_s"] == 3600 and data["causes"] == list(sharing.CAUSES)
    vision = next(s for s in data["shares"] if s["share"] == "vision-main")
    assert vision["team"] == "vision" and vision["gpu_hours_borrowed"] == pytest.approx(2.0)
    assert vision["lost_gpu_hours"]["reclaim"] == pytest.approx(1.0)
    language = next(s for s in data["shares"] if s["share"] == "language-main")
    assert language["owner_wait"]["p95_s"] == 600.0
    assert language["owner_wait"]["by_priority"]["5"] == {"n": 2, "p50_s": 30.0, "p95_s": 90.0}
    assert data["cluster"]["lost_gpu_hours_total"] == pytest.approx(1.5)
    assert {t["team"] for t in data["teams"]} == {"vision", "language"}


def test_the_csv_has_the_same_numbers(alice, history, at_now):
    api = client_for(alice)
    r = api.get("/api/v1/usage/", {"days": 1, "format": "csv"})
    assert r.status_code == 200 and r["Content-Type"].startswith("text/csv")
    assert r["Content-Disposition"] == 'attachment; filename="gpuquota-usage-1d.csv"'
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    assert list(rows[0]) == list(sharing.CSV_COLUMNS)
    series = api.get("/api/v1/usage/", {"days": 1}).json()["series"]
    assert len(rows) == len(series)
    for row, point in zip(rows, series, strict=True):
        assert (row["bucket_start"], row["share"]) == (point["bucket_start"], point["share"])
        assert float(row["gpu_hours_borrowed"]) == pytest.approx(point["gpu_hours_borrowed"], abs=1e-3)
        assert float(row["lost_gpu_hours_reclaim"]) == pytest.approx(
            point["lost_gpu_hours"]["reclaim"], abs=1e-3
        )
    assert sum(float(r["lost_gpu_hours"]) for r in rows) == pytest.approx(1.5, abs=1e-2)


@pytest.mark.parametrize(
    "params, field, words",
    [
        ({"days": 0}, "days", "Give 1 to 90 days"),
        ({"days": 91}, "days", "Give 1 to 90 days"),
        ({"days": "week"}, "days", "Give 1 to 90 days"),
        ({"share": "nope"}, "share", 'No share named "nope".'),
    ],
)
def test_a_bad_question_is_a_400_naming_the_field(alice, vision_share, params, field, words):
    r = client_for(alice).get("/api/v1/usage/", params)
    assert r.status_code == 400 and list(r.json()) == [field] and words in r.json()[field][0]
    r = client_for(alice).get("/api/v1/usage/", {**params, "format": "csv"})
    assert r.status_code == 400 and words in r.content.decode()


def test_members_may_not_read_it(bob, vision_share):
    assert client_for(bob).get("/api/v1/usage/").status_code == 403
    client = Client()
    client.force_login(bob)
    assert client.get("/usage/").status_code == 403


# --- the page ---------------------------------------------------------------------------------------


def test_the_usage_page_draws_and_tabulates_it(alice, history, at_now):
    client = Client()
    client.force_login(alice)
    page = client.get("/usage/", {"days": 1}).content.decode()
    assert 'data-plot="usage"' in page and 'id="usage-data"' in page
    assert "2.0</b> GPU-hours run on borrowed GPUs" in page
    assert (
        "1.5</b> GPU-hours of work thrown away" in page and "1.0 reclaim" in page and "0.5 node lost" in page
    )
    row = page.split('data-share="language-main">', 1)[1].split("</tr>", 1)[0]
    assert "90 s / 10 min (3)" in row and "priority 5: 30 s / 90 s (2)" in row
    assert 'href="/api/v1/usage/?format=csv&amp;days=1"' in page


def test_the_usage_page_never_rounds_work_that_was_there_to_nothing(alice, vision_share, bob, at_now):
    """A young cluster's 50 GPU-seconds of borrowing read "0.0" GPU-hours (issue 42.6)."""
    from quotas.templatetags.gpuquota import gpu_hours

    assert [gpu_hours(h) for h in (0, 0.0139, 0.0004, 0.1, 2.04, 1234.5)] == [
        "0",
        "0.014",
        "0.00040",
        "0.1",
        "2.0",
        "1,234.5",
    ]
    UsageSample.objects.create(
        at=hours_ago(0.5), share=vision_share, gpu_type="a10g", own=1, borrowed=1, capacity=1
    )
    client = Client()
    client.force_login(alice)
    page = client.get("/usage/", {"days": 1}).content.decode()
    borrowed = sharing.report(days=1, now=NOW).cluster.borrowed
    assert 0 < borrowed < 0.05
    assert f"{gpu_hours(borrowed)}</b> GPU-hours run on borrowed GPUs" in page
    assert "<b>0.0</b>" not in page


def test_the_usage_page_says_what_is_wrong_with_its_question(alice, vision_share):
    client = Client()
    client.force_login(alice)
    r = client.get("/usage/", {"days": "0"})
    assert r.status_code == 400 and "Give 1 to 90 days" in r.content.decode()


# --- Prometheus -------------------------------------------------------------------------------------


def test_the_counter_of_lost_gpu_seconds_by_share_and_cause(history):
    values = {
        (s.labels["share"], s.labels["cause"]): s.value
        for family in text_string_to_metric_families(render().decode())
        if family.name == "gpuquota_lost_gpu_seconds"
        for s in family.samples
        if s.name == "gpuquota_lost_gpu_seconds_total"
    }
    assert values[("vision-main", "reclaim")] == 3600
    assert values[("vision-main", "node_lost")] == 1800
    assert values[("vision-main", "priority")] == 999
    assert values[("language-main", "fenced")] == 0  # every share and cause, from zero
    assert set(c for _, c in values) == set(LostCause.values)
