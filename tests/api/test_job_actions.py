"""Changing priority, cancelling, reading logs: the owner, a team manager and an admin may act; a
teammate may read; another team's member does not find the job."""

import pytest

from jobs.choices import AttemptState, JobState
from jobs.models import Attempt, LogChunk
from quotas.choices import Role
from quotas.models import Membership
from tests.api.conftest import client_for, run, submit

URL = "/api/v1/jobs/"


@pytest.fixture
def dave(django_user_model, vision):
    """A manager of team vision."""
    user = django_user_model.objects.create_user("dave", password="dave-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MANAGER)
    return user


@pytest.fixture
def erin(django_user_model, vision):
    """Another plain member of team vision."""
    user = django_user_model.objects.create_user("erin", password="erin-pw-123")
    Membership.objects.create(team=vision, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def job(bob, vision_share, nodes):
    return submit(bob, vision_share, name="train")


# --- priority -----------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["bob", "dave", "alice"])
def test_owner_manager_and_admin_change_the_priority(request, job, dave, alice, who):
    r = client_for(request.getfixturevalue(who)).patch(f"{URL}{job.pk}/", {"priority": 42}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["priority"] == 42
    assert r.json()["events"][-1]["kind"] == "PRIORITY_CHANGED"


def test_a_teammate_cannot_change_the_priority(job, erin):
    r = client_for(erin).patch(f"{URL}{job.pk}/", {"priority": 42}, format="json")
    assert r.status_code == 403
    assert r.json()["detail"] == "Only the job's owner, a team manager or an admin may change its priority."


def test_another_teams_member_does_not_find_the_job_to_change(as_charlie, job):
    assert as_charlie.patch(f"{URL}{job.pk}/", {"priority": 42}, format="json").status_code == 404
    job.refresh_from_db()
    assert job.priority == 0


@pytest.mark.parametrize(
    ("data", "field", "message"),
    [
        ({"priority": 10000}, "priority", "Priority is an integer from 0 to 9999."),
        ({"priority": -5}, "priority", "Priority is an integer from 0 to 9999."),
        ({"priority": "high"}, "priority", "A valid integer is required."),
        ({}, "non_field_errors", "Give priority, preemption_grace_s or both."),
        ({"priority": 1, "gpus": 8}, "gpus", "Unknown field."),
    ],
)
def test_a_bad_priority_change_is_a_400(as_bob, job, data, field, message):
    r = as_bob.patch(f"{URL}{job.pk}/", data, format="json")
    assert r.status_code == 400
    assert r.json()[field][0].startswith(message)


def test_put_is_not_allowed(as_bob, job):
    assert as_bob.put(f"{URL}{job.pk}/", {"priority": 1}, format="json").status_code == 405


def test_the_priority_of_a_finished_job_is_a_409(as_bob, job):
    as_bob.post(f"{URL}{job.pk}/cancel/")
    r = as_bob.patch(f"{URL}{job.pk}/", {"priority": 3}, format="json")
    assert r.status_code == 409
    assert "has already ended" in r.json()["detail"]


# --- cancel -------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["bob", "dave", "alice"])
def test_owner_manager_and_admin_cancel_a_queued_job(request, job, dave, alice, who):
    r = client_for(request.getfixturevalue(who)).post(f"{URL}{job.pk}/cancel/")
    assert r.status_code == 200
    assert r.json()["state"] == JobState.CANCELLED


def test_cancelling_a_running_job_stops_its_attempt(as_bob, job, nodes):
    attempt = run(job, nodes[0], [0])
    r = as_bob.post(f"{URL}{job.pk}/cancel/")
    assert r.json()["state"] == JobState.CANCELLING  # CANCELLED once its host reports it stopped
    assert Attempt.objects.get(pk=attempt.pk).state == AttemptState.STOPPING


def test_cancelling_a_finished_job_is_a_409_that_says_why(as_bob, job):
    as_bob.post(f"{URL}{job.pk}/cancel/")
    r = as_bob.post(f"{URL}{job.pk}/cancel/")
    assert r.status_code == 409
    assert r.json()["detail"] == f"Job {job.pk} has already ended (CANCELLED); there is nothing to cancel."


def test_a_teammate_cannot_cancel(job, erin):
    r = client_for(erin).post(f"{URL}{job.pk}/cancel/")
    assert r.status_code == 403
    assert r.json()["detail"] == "Only the job's owner, a team manager or an admin may cancel it."


def test_another_team_and_anonymous_cannot_cancel(as_charlie, anon, job):
    assert as_charlie.post(f"{URL}{job.pk}/cancel/").status_code == 404
    assert anon.post(f"{URL}{job.pk}/cancel/").status_code == 401
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_an_unknown_job_is_a_404(as_bob, db):
    assert as_bob.post(f"{URL}999999/cancel/").status_code == 404
    assert as_bob.get(f"{URL}999999/").status_code == 404


# --- logs ---------------------------------------------------------------------------------------


def ship(attempt, lines, node="node-1", start=0):
    """Store log text as the host ships it: chunks at byte offsets."""
    offset = start
    for text in lines:
        LogChunk.objects.create(attempt=attempt, node=node, offset=offset, text=text)
        offset += len(text.encode())
    return offset


def test_logs_of_the_latest_attempt(as_bob, job, nodes):
    attempt = run(job, nodes[0], [0])
    ship(attempt, ["epoch 1\n", "epoch 2\n"])
    r = as_bob.get(f"{URL}{job.pk}/logs/")
    assert r.status_code == 200
    assert r.json()["text"] == "epoch 1\nepoch 2\n"
    assert (r.json()["attempt"], r.json()["node"], r.json()["finished"]) == (1, "node-1", False)


def test_a_teammate_reads_the_logs(job, erin, nodes):
    ship(run(job, nodes[0], [0]), ["hello\n"])
    assert client_for(erin).get(f"{URL}{job.pk}/logs/").json()["text"] == "hello\n"


def test_tail_keeps_the_last_lines(as_bob, job, nodes):
    ship(run(job, nodes[0], [0]), ["".join(f"line {i}\n" for i in range(100)), "line 100\nline 101\n"])
    r = as_bob.get(f"{URL}{job.pk}/logs/", {"tail": 3})
    assert r.json()["text"] == "line 99\nline 100\nline 101\n"


def test_after_returns_only_what_came_since(as_bob, job, nodes):
    attempt = run(job, nodes[0], [0])
    end = ship(attempt, ["one\n"])
    cursor = as_bob.get(f"{URL}{job.pk}/logs/").json()["cursor"]
    ship(attempt, ["two\n"], start=end)
    r = as_bob.get(f"{URL}{job.pk}/logs/", {"after": cursor})
    assert r.json()["text"] == "two\n"
    assert as_bob.get(f"{URL}{job.pk}/logs/", {"after": r.json()["cursor"]}).json()["text"] == ""


def test_logs_of_an_earlier_attempt(as_bob, job, nodes):
    first = run(job, nodes[0], [0])
    ship(first, ["first try\n"])
    Attempt.objects.filter(pk=first.pk).update(state=AttemptState.ENDED, outcome="PREEMPTED")
    job.state = JobState.QUEUED
    job.save()
    ship(run(job, nodes[1], [0]), ["second try\n"], node="node-2")
    assert as_bob.get(f"{URL}{job.pk}/logs/").json()["text"] == "second try\n"
    r = as_bob.get(f"{URL}{job.pk}/logs/", {"attempt": 1})
    assert (r.json()["text"], r.json()["finished"], r.json()["attempts"]) == ("first try\n", True, [1, 2])


def test_a_job_that_never_ran_has_empty_logs(as_bob, job):
    r = as_bob.get(f"{URL}{job.pk}/logs/")
    assert r.status_code == 200
    assert (r.json()["attempt"], r.json()["text"]) == (None, "")


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"attempt": 7}, "attempt", "has no attempt 7; it has attempts 1 to 1."),
        ({"attempt": 0}, "attempt", "Ensure this value is greater than or equal to 1."),
        ({"attempt": "x"}, "attempt", "A valid integer is required."),
        ({"tail": 0}, "tail", "tail is a number of lines from 1 to 10000."),
        ({"tail": 10**6}, "tail", "tail is a number of lines from 1 to 10000."),
        ({"node": "node-2"}, "node", "Attempt 1 ran on node-1, not on node-2."),
    ],
)
def test_bad_log_parameters_are_a_400(as_bob, job, nodes, params, field, message):
    run(job, nodes[0], [0])
    r = as_bob.get(f"{URL}{job.pk}/logs/", params)
    assert r.status_code == 400
    assert message in r.json()[field][0]
