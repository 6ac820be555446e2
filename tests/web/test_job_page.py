"""The job page: state, attempts timeline, events with reasons, live log tail; visible only to the job's
team and admins (other teams' commands, env and logs stay hidden)."""

import pytest

from jobs.models import Attempt, LogChunk
from quotas import services as quota_services
from tests.api.conftest import run
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


def test_it_shows_state_attempts_events_and_log(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share, name="train-resnet", command=["python", "train.py", "--secret-flag"])
    attempt = run(job, nodes[0], [0])
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="epoch 1 loss 0.5\n")
    body = as_bob.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="job-state">RUNNING' in body
    assert 'data-plot="timeline"' in body and "attempt 1" in body
    assert "SUBMITTED" in body and "by bob to share vision-main" in body
    assert "epoch 1 loss 0.5" in body and "--secret-flag" in body


def test_a_queued_job_shows_its_position(as_bob, bob, vision_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    job = submit(bob, vision_share, gpus=4)
    quota_services.forecast_refresh()  # what the control worker stores after a pass
    assert "Position <b>1</b> overall" in as_bob.get(f"/jobs/{job.pk}/").content.decode()


def test_other_teams_jobs_do_not_exist(as_charlie, bob, vision_share, nodes):
    job = submit(bob, vision_share, command=["python", "--secret-flag"])
    for url in (f"/jobs/{job.pk}/", f"/jobs/{job.pk}/?part=log", f"/jobs/{job.pk}/?part=state"):
        response = as_charlie.get(url)
        assert response.status_code == 404 and b"--secret-flag" not in response.content


def test_admins_see_any_job(as_alice, bob, vision_share, nodes):
    assert as_alice.get(f"/jobs/{submit(bob, vision_share).pk}/").status_code == 200


def test_live_parts_poll_until_the_job_is_over(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    running = hx(as_bob, f"/jobs/{job.pk}/?part=log")
    assert running.status_code == 200 and 'hx-trigger="every 3s"' in running.content.decode()
    as_bob.post(f"/jobs/{job.pk}/cancel/")
    assert hx(as_bob, f"/jobs/{job.pk}/?part=state").status_code == 286  # htmx: stop polling
    assert hx(as_bob, f"/jobs/{job.pk}/?part=log").status_code == 286


def test_cancel_button_only_for_who_may(as_bob, as_alice, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    assert f'action="/jobs/{job.pk}/cancel/"' in as_bob.get(f"/jobs/{job.pk}/").content.decode()


def test_cancel_from_the_job_page_redirects_back(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    response = as_bob.post(f"/jobs/{job.pk}/cancel/", HTTP_HX_REQUEST="true")
    assert response.status_code == 204 and response["HX-Redirect"] == f"/jobs/{job.pk}/"


def test_job_page_runs_constant_queries(as_bob, bob, vision_share, nodes, constant_queries):
    job = submit(bob, vision_share)
    attempt = run(job, nodes[0], [0])
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="a\n")

    def grow():
        for i in range(1, 30):
            LogChunk.objects.create(attempt=attempt, node="node-1", offset=i, text=f"line {i}\n")
        for _ in range(30):
            submit(bob, vision_share)
        Attempt.objects.filter(pk=attempt.pk).update(reason="ADMITTED_OWN")

    constant_queries(as_bob, f"/jobs/{job.pk}/", grow)
