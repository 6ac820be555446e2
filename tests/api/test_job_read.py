"""Listing and reading jobs: members see their teams' jobs; other teams' jobs are not found."""

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.choices import JobState
from jobs.models import Job
from quotas import services as quota_services
from quotas.choices import Strategy
from quotas.models import Team
from tests.api.conftest import run, submit
from tests.conftest import make_share

URL = "/api/v1/jobs/"


@pytest.fixture
def jobs(bob, charlie, vision_share, language_share, nodes):
    a = submit(bob, vision_share, name="a", env={"TOKEN": "secret"})
    b = submit(bob, vision_share, name="b")
    run(b, nodes[0], [0])
    c = submit(charlie, language_share, name="c", command=["secret-tool", "--key", "k"])
    return a, b, c


def ids(response):
    return [j["id"] for j in response.json()["results"]]


def test_a_member_lists_their_teams_jobs_only(as_bob, jobs):
    a, b, c = jobs
    r = as_bob.get(URL)
    assert r.status_code == 200
    assert ids(r) == [b.pk, a.pk]  # newest first
    assert "secret-tool" not in r.content.decode()


def test_an_admin_lists_every_job(as_alice, jobs):
    assert sorted(ids(as_alice.get(URL))) == sorted(j.pk for j in jobs)


def test_anonymous_gets_401(anon, jobs):
    assert anon.get(URL).status_code == 401
    assert anon.get(f"{URL}{jobs[0].pk}/").status_code == 401


def test_another_teams_job_is_not_found_with_its_command_env_and_logs(as_bob, as_charlie, jobs):
    a, _, c = jobs
    for path in (f"{URL}{a.pk}/", f"{URL}{a.pk}/logs/"):
        r = as_charlie.get(path)
        assert r.status_code == 404
        assert "secret" not in r.content.decode()
    assert as_bob.get(f"{URL}{c.pk}/").status_code == 404


def test_jobs_filter_by_state(as_bob, jobs):
    a, b, _ = jobs
    assert ids(as_bob.get(URL, {"state": "QUEUED"})) == [a.pk]
    assert ids(as_bob.get(f"{URL}?state=QUEUED&state=RUNNING")) == [b.pk, a.pk]


def test_an_unknown_state_filter_is_a_400(as_bob, jobs):
    r = as_bob.get(URL, {"state": "SLEEPING"})
    assert r.status_code == 400
    assert "SLEEPING is not one of the available choices" in r.json()["state"][0]


def test_jobs_filter_by_share_team_and_mine(as_alice, alice, bob, jobs, vision_share):
    a, b, c = jobs
    mine = submit(alice, vision_share, name="alice's")
    assert ids(as_alice.get(URL, {"share": "language-main"})) == [c.pk]
    assert ids(as_alice.get(URL, {"team": "vision"})) == [mine.pk, b.pk, a.pk]
    assert ids(as_alice.get(URL, {"mine": "true"})) == [mine.pk]
    assert ids(as_alice.get(URL, {"mine": "false", "team": "vision"})) == [b.pk, a.pk]


def test_the_detail_has_attempts_events_and_no_position_when_running(as_bob, jobs):
    _, b, _ = jobs
    r = as_bob.get(f"{URL}{b.pk}/")
    assert r.status_code == 200
    job = r.json()
    assert job["state"] == JobState.RUNNING
    assert job["queue_position"] is None and job["eta"] is None
    assert [(a["number"], a["state"], a["placement"]) for a in job["attempts"]] == [
        (1, "RUNNING", [{"node": "node-1", "gpus": [0]}])
    ]
    assert [e["kind"] for e in job["events"]] == ["SUBMITTED", "STARTED"]


def test_a_queued_job_shows_its_position_in_share_and_overall(
    as_bob, bob, charlie, vision_share, language_share, nodes
):
    # Fill the cluster so nothing new can start, then queue: the positions follow the queue order.
    t0 = timezone.now() - timedelta(minutes=10)
    language_big = make_share(
        language_share.team, "language-big", capacity={"a10g": 4}, strategy=Strategy.LEND
    )
    for i, node in enumerate(nodes):
        run(
            submit(
                bob if i == 0 else charlie,
                vision_share if i == 0 else language_big,
                gpus=4,
                max_runtime_s=3600,
            ),
            node,
            [0, 1, 2, 3],
            started_at=t0,
        )
    first = submit(bob, vision_share, gpus=4, priority=1)
    low = submit(bob, vision_share, gpus=4)
    urgent = submit(bob, vision_share, gpus=4, priority=9)
    quota_services.forecast_refresh()
    positions = {j.pk: as_bob.get(f"{URL}{j.pk}/").json()["queue_position"] for j in (first, low, urgent)}
    assert [positions[j.pk]["in_share"] for j in (urgent, first, low)] == [1, 2, 3]
    assert [positions[j.pk]["overall"] for j in (urgent, first, low)] == [1, 2, 3]


def test_the_job_list_runs_a_constant_number_of_queries(as_bob, bob, nodes, django_assert_max_num_queries):
    team = Team.objects.get(slug="vision")
    for i in range(4):
        share = make_share(team, f"s-{i}", capacity={"a10g": 2})
        for _ in range(3):
            submit(bob, share)
    as_bob.get(URL)
    with django_assert_max_num_queries(4):
        r = as_bob.get(URL)
    assert r.json()["count"] == 12


def test_the_job_detail_runs_a_constant_number_of_queries(
    as_bob, bob, vision_share, nodes, django_assert_max_num_queries
):
    jobs = [submit(bob, vision_share) for _ in range(3)]
    as_bob.get(f"{URL}{jobs[0].pk}/")
    with django_assert_max_num_queries(16) as few:
        as_bob.get(f"{URL}{jobs[0].pk}/")
    for _ in range(20):
        submit(bob, vision_share)
    with django_assert_max_num_queries(len(few.captured_queries)):
        as_bob.get(f"{URL}{jobs[0].pk}/")
    assert Job.objects.count() == 23


@pytest.mark.parametrize("value", ["-1.7976931348623157e+308", "99999999999999999999999999", "1.5", "0"])
def test_an_array_filter_that_is_no_array_id_is_a_400_not_a_500(as_bob, jobs, value):
    """The schema fuzz test sent array=-1.7976931348623157e+308: the database refused the number (500)."""
    r = as_bob.get("/api/v1/jobs/", {"array": value})
    assert r.status_code == 400 and "array" in r.json()
