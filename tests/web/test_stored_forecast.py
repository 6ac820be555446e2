"""The stored forecast (SEMANTICS "Forecast"): computed once after a pass, read by the team page, the job
page and the API with its age; ETAs say what they rest on and are never in the past."""

from datetime import timedelta

import pytest
from django.utils import timezone

from quotas import services
from quotas.choices import Strategy
from quotas.models import QueueForecast
from tests.api.conftest import run
from tests.conftest import make_share
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def test_a_job_at_its_borrow_limit_has_an_honest_reason_and_no_eta_in_the_past(as_bob, bob, vision, nodes):
    share = make_share(vision, "vision-lab", capacity={"a10g": 1}, borrow_limit=100)
    long_ago = timezone.now() - timedelta(hours=5)  # far past the default runtime guess
    run(submit(bob, share, gpus=1), nodes[0], [0], started_at=long_ago)
    run(submit(bob, share, gpus=1), nodes[0], [1], borrowed=True, started_at=long_ago)
    blocked = submit(bob, share, gpus=1, name="blocked")
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=blocked)
    assert f.reason == "needs 1 a10g: share at its own capacity (1 of 1), borrow limit reached (1 of 1)"
    assert f.kind == "estimate" and f.eta > timezone.now() + timedelta(minutes=1)
    assert f.basis.startswith("estimate: 2 jobs without a max runtime end before it (too little history yet")
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "borrow limit reached (1 of 1)" in body and "estimate" in body
    assert "due now" not in body


def test_an_eta_resting_only_on_max_runtimes_is_a_bound(as_bob, bob, vision, nodes):
    share = make_share(vision, "vision-prod", capacity={"a10g": 4}, strategy=Strategy.RESERVE)
    started = timezone.now() - timedelta(seconds=100)
    run(submit(bob, share, gpus=4, max_runtime_s=600), nodes[0], [0, 1, 2, 3], started_at=started)
    waiting = submit(bob, share, gpus=4, max_runtime_s=60)
    services.forecast_refresh()
    f = QueueForecast.objects.get(job=waiting)
    assert f.kind == "bound"
    assert abs((f.eta - (started + timedelta(seconds=600))).total_seconds()) < 2
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert 'class="badge eta-bound"' in body


def test_the_job_page_and_the_api_read_the_stored_forecast_with_its_age(as_bob, bob, vision_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=4), nodes[1], [0, 1, 2, 3])
    waiting = submit(bob, vision_share, gpus=4)
    services.forecast_refresh()
    QueueForecast.objects.filter(job=waiting).update(computed_at=timezone.now() - timedelta(seconds=42))
    page = as_bob.get(f"/jobs/{waiting.pk}/").content.decode()
    assert "(forecast 42 s ago)" in page or "(forecast 43 s ago)" in page
    data = as_bob.get(f"/api/v1/jobs/{waiting.pk}/").json()
    assert data["queue_position"] == {"in_share": 1, "overall": 1}
    assert data["eta_kind"] == "estimate" and data["eta_basis"].startswith("estimate:")
    assert 40 <= data["forecast_age_s"] <= 50
    listed = as_bob.get("/api/v1/jobs/?state=QUEUED").json()
    row = next(j for j in listed["results"] if j["id"] == waiting.pk)
    assert row["eta_kind"] == "estimate" and row["queue_position"]["overall"] == 1


def test_no_web_request_replays_the_queue(as_bob, bob, vision_share, nodes, monkeypatch):
    submit(bob, vision_share, gpus=1)
    services.forecast_refresh()

    def no_replay(*a, **k):
        raise AssertionError("a web request replayed the queue")

    monkeypatch.setattr("quotas.engine.forecast.forecast", no_replay)
    job_id = QueueForecast.objects.get().job_id
    assert as_bob.get("/teams/vision/").status_code == 200
    assert as_bob.get(f"/jobs/{job_id}/").status_code == 200
    assert as_bob.get(f"/api/v1/jobs/{job_id}/").status_code == 200
    assert as_bob.get("/api/v1/jobs/").status_code == 200
    assert as_bob.get("/api/v1/queue/", {"share": "vision-main"}).status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_job_deleted_while_the_forecast_runs_does_not_fail_the_write(bob, vision_share, nodes, monkeypatch):
    from jobs.models import Job

    kept, gone = submit(bob, vision_share, gpus=1), submit(bob, vision_share, gpus=1)
    real = services.queue_view

    def then_delete(**kwargs):
        view = real(**kwargs)
        Job.objects.filter(pk=gone.pk).delete()  # after the snapshot was read, before the write
        return view

    monkeypatch.setattr(services, "queue_view", then_delete)
    services.forecast_refresh()  # was an IntegrityError at commit (the row's job no longer exists)
    assert QueueForecast.objects.filter(job=kept).exists()
    # The next forecast drops the left-over row; deleting a job through the ORM drops its row at once.
    monkeypatch.setattr(services, "queue_view", real)
    services.forecast_refresh()
    assert set(QueueForecast.objects.values_list("job_id", flat=True)) == {kept.pk}
    Job.objects.filter(pk=kept.pk).delete()
    assert not QueueForecast.objects.exists()
