"""The team page: shares with usage, the queue in admission order with position, ETA and why each job
waits, running jobs with node/GPUs and own/borrowed, the submit form, and cancel/priority buttons only
for who may use them (enforced by the services too)."""

import pytest
from django.test import Client

from jobs.choices import JobState
from jobs.models import Job
from quotas import services
from quotas.choices import Role
from quotas.models import Membership
from tests.api.conftest import run
from tests.web.conftest import hx, logged_in, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def dan(django_user_model, vision):
    """Another plain member of vision: sees bob's jobs, may not cancel them."""
    user = django_user_model.objects.create_user("dan", "dan@example.com", "dan-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MEMBER)
    return user


def test_members_see_their_team_page(as_bob, vision_share, nodes):
    response = as_bob.get("/teams/vision/")
    assert response.status_code == 200
    body = response.content.decode()
    assert 'data-share="vision-main"' in body and 'id="submit-form"' in body


def test_other_teams_pages_do_not_exist_for_a_member(as_charlie, vision_share):
    assert as_charlie.get("/teams/vision/").status_code == 404


def test_admins_see_every_team(as_alice, vision_share):
    assert as_alice.get("/teams/vision/").status_code == 200


def test_team_list_sends_a_one_team_member_to_their_team(as_bob, vision):
    response = as_bob.get("/teams/")
    assert response.status_code == 302 and response["Location"] == "/teams/vision/"


def test_queue_shows_position_eta_and_why_it_waits(as_bob, bob, vision_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    waiting = submit(bob, vision_share, gpus=4, name="waits-for-capacity")
    services.forecast_refresh()  # what the control worker stores after a pass
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert f'data-job="{waiting.pk}"' in body and "waits-for-capacity" in body
    assert '<td class="num">1<span class="muted small"> (1 in share)' in body
    assert "Positions and ETAs as forecast" in body
    assert 'data-testid="running-count">1 running' in body
    assert "node-1 [0,1,2,3]" in body and 'class="badge own">own' in body


def test_running_borrowed_jobs_are_marked(as_bob, bob, vision_share, language_share, nodes):
    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    run(submit(bob, vision_share, gpus=1), nodes[1], [0], borrowed=True)
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    rows = body.split('data-testid="borrowed-legend"', 1)[0]  # the legend shows the badge too
    assert 'class="badge borrowed">borrowed' in rows


def test_submit_from_the_form_queues_a_job(as_bob, vision_share, nodes):
    data = {
        "share": "vision-main",
        "name": "from-web",
        "gpu_type": "a10g",
        "gpus": "2",
        "priority": "3",
        "command": "python train.py --lr '0.1 0.2'",
    }
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response["HX-Trigger"] == "queue-changed"
    job = Job.objects.get(name="from-web")
    assert job.command == ["python", "train.py", "--lr", "0.1 0.2"] and job.priority == 3
    assert f'Job <a href="/jobs/{job.pk}/">{job.pk}</a> queued' in response.content.decode()


def test_submit_without_htmx_redirects_to_the_team(as_bob, vision_share, nodes):
    data = {"share": "vision-main", "gpu_type": "a10g", "gpus": "1", "priority": "0", "command": "true"}
    response = as_bob.post("/teams/vision/submit/", data)
    assert response.status_code == 302 and response["Location"] == "/teams/vision/"


def test_a_request_no_node_can_hold_is_shown_beside_the_field(as_bob, vision_share, nodes):
    data = {"share": "vision-main", "gpu_type": "a10g", "gpus": "6", "priority": "0", "command": "x"}
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_gpus-error"' in body and "whole nodes" in body
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "field, value",
    [("gpus", "zero"), ("gpus", "0"), ("priority", "10000"), ("command", "'unbalanced"), ("share", "nope")],
)
def test_bad_input_is_a_400_with_the_message_beside_the_field(as_bob, vision_share, nodes, field, value):
    data = {"share": "vision-main", "gpu_type": "a10g", "gpus": "1", "priority": "0", "command": "x"}
    data[field] = value
    response = as_bob.post("/teams/vision/submit/", data, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert f'id="id_{field}-error"' in response.content.decode()


def test_a_member_of_another_team_cannot_submit(as_charlie, vision_share, nodes):
    data = {"share": "vision-main", "gpu_type": "a10g", "gpus": "1", "priority": "0", "command": "x"}
    assert as_charlie.post("/teams/vision/submit/", data).status_code == 403
    assert not Job.objects.exists()


def test_buttons_only_for_who_may_use_them(bob, dan, vision_share, nodes):
    job = submit(bob, vision_share)
    mine = hx(logged_in(bob), "/teams/vision/?part=queue").content.decode()
    theirs = hx(logged_in(dan), "/teams/vision/?part=queue").content.decode()
    assert f'action="/jobs/{job.pk}/cancel/"' in mine
    assert f'action="/jobs/{job.pk}/cancel/"' not in theirs


def test_a_manager_may_cancel_members_jobs(bob, dan, vision_share, nodes):
    Membership.objects.filter(user=dan).update(role=Role.MANAGER)
    job = submit(bob, vision_share)
    response = logged_in(dan).post(f"/jobs/{job.pk}/cancel/", {"from": "team"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'id="team-queue"' in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_cancel_is_refused_server_side_to_a_plain_member(bob, dan, vision_share, nodes):
    job = submit(bob, vision_share)
    assert logged_in(dan).post(f"/jobs/{job.pk}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_cancel_of_another_teams_job_is_not_found(as_charlie, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    assert as_charlie.post(f"/jobs/{job.pk}/cancel/").status_code == 404


def test_cancel_of_a_finished_job_is_a_409(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    as_bob.post(f"/jobs/{job.pk}/cancel/")
    assert as_bob.post(f"/jobs/{job.pk}/cancel/").status_code == 409


def test_priority_change(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    response = as_bob.post(f"/jobs/{job.pk}/priority/", {"priority": "7", "from": "team"})
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.priority == 7
    assert as_bob.post(f"/jobs/{job.pk}/priority/", {"priority": "-1"}).status_code == 400


def test_every_post_needs_the_csrf_token(bob, vision_share, nodes):
    job = submit(bob, vision_share)
    client = Client(enforce_csrf_checks=True)
    client.force_login(bob)
    data = {"share": "vision-main", "gpu_type": "a10g", "gpus": "1", "priority": "0", "command": "x"}
    assert client.post("/teams/vision/submit/", data).status_code == 403
    assert client.post(f"/jobs/{job.pk}/cancel/").status_code == 403
    assert client.post(f"/jobs/{job.pk}/priority/", {"priority": "2"}).status_code == 403


def test_get_on_a_verb_is_refused(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    assert as_bob.get(f"/jobs/{job.pk}/cancel/").status_code == 405


def test_team_page_runs_constant_queries(as_bob, bob, vision_share, nodes, constant_queries):
    submit(bob, vision_share)
    run(submit(bob, vision_share), nodes[0], [0])

    def grow():
        for _ in range(60):
            submit(bob, vision_share, gpus=2)
        run(submit(bob, vision_share), nodes[1], [0, 1])
        run(submit(bob, vision_share), nodes[1], [2, 3])

    constant_queries(as_bob, "/teams/vision/", grow)


def test_team_queue_part_runs_constant_queries(as_bob, bob, vision_share, nodes, constant_queries):
    submit(bob, vision_share)

    def grow():
        for _ in range(60):
            submit(bob, vision_share)

    constant_queries(as_bob, "/teams/vision/?part=queue", grow, HTTP_HX_REQUEST="true")


def test_a_bad_priority_from_the_team_page_shows_in_the_queue(as_bob, bob, vision_share, nodes):
    job = submit(bob, vision_share)
    response = as_bob.post(
        f"/jobs/{job.pk}/priority/", {"priority": "99999", "from": "team"}, HTTP_HX_REQUEST="true"
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="team-queue"' in body and 'class="errors"' in body and "Priority:" in body
