"""Teams cannot see each other's work: another team's commands, env and logs never show, whichever
endpoint is asked (the queue shows other teams' jobs only as anonymous entries)."""

import json

import pytest

from jobs.models import Attempt, LogChunk
from tests.security.conftest import client_as

READS = ["/api/v1/jobs/", "/api/v1/queue/", "/api/v1/shares/", "/api/v1/teams/", "/api/v1/nodes/"]


@pytest.fixture
def logged(world):
    """The other team's job has run and written a secret to its log."""
    attempt = Attempt.objects.create(
        job_id=world["other_job"],
        number=1,
        state="ENDED",
        outcome="SUCCEEDED",
        placement=[{"node": "node-1", "gpus": [0]}],
    )
    LogChunk.objects.create(attempt=attempt, node="node-1", offset=0, text="language-log-secret\n")
    return world


@pytest.mark.parametrize("path", READS)
def test_no_read_shows_another_teams_command_env_or_name(logged, path):
    text = client_as(logged, "member").get(path).content.decode()
    assert "language-secret" not in text and "LANG_SECRET" not in text and "language-log-secret" not in text


def test_the_jobs_list_holds_only_the_members_teams_jobs(logged):
    from jobs.models import Job

    ids = {j["id"] for j in client_as(logged, "member").get("/api/v1/jobs/").json()["results"]}
    array_tasks = set(Job.objects.filter(array_id=logged["array"]).values_list("pk", flat=True))
    assert ids == {logged["job"], logged["peer_job"]} | array_tasks and len(array_tasks) == 2


@pytest.mark.parametrize("query", ["team=language", "share=language-main", "mine=false"])
def test_filters_do_not_widen_what_is_visible(logged, query):
    r = client_as(logged, "member").get(f"/api/v1/jobs/?{query}")
    assert logged["other_job"] not in {j["id"] for j in r.json()["results"]}


def test_another_teams_logs_and_detail_are_404(logged):
    client = client_as(logged, "member")
    assert client.get(f"/api/v1/jobs/{logged['other_job']}/").status_code == 404
    assert client.get(f"/api/v1/jobs/{logged['other_job']}/logs/").status_code == 404
    assert client.get(f"/api/v1/jobs/{logged['other_job']}/logs/?attempt=1").status_code == 404


def test_the_queue_shows_other_teams_jobs_anonymously(logged):
    entries = client_as(logged, "member").get("/api/v1/queue/").json()["jobs"]
    other = [e for e in entries if e["id"] == logged["other_job"]]
    assert other and other[0]["name"] is None and other[0]["submitted_by"] is None
    assert all("command" not in e and "env" not in e for e in entries)


def test_an_admin_sees_everything(logged):
    client = client_as(logged, "admin")
    detail = client.get(f"/api/v1/jobs/{logged['other_job']}/").json()
    assert detail["env"] == {"LANG_SECRET": "language-secret"}
    assert "language-log-secret" in client.get(f"/api/v1/jobs/{logged['other_job']}/logs/").json()["text"]


def test_an_unknown_share_lists_only_the_users_own_shares(world):
    r = client_as(world, "other").post(
        "/api/v1/jobs/",
        {"share": "nope", "gpu_type": "a10g", "gpus": 1, "command": ["true"]},
        format="json",
    )
    message = json.dumps(r.json())
    assert r.status_code == 400 and "language-main" in message and "vision-main" not in message


def test_another_team_cannot_submit_to_a_share(world):
    r = client_as(world, "other").post(
        "/api/v1/jobs/",
        {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "command": ["true"]},
        format="json",
    )
    assert r.status_code == 403


VISION_SECRETS = ("vision-secret", "SECRET_TOKEN", "vision-cmd-secret", "vision-job-name")


@pytest.mark.parametrize("path", READS)
def test_the_other_team_sees_none_of_visions_command_env_or_name_in_the_api(world, path):
    text = client_as(world, "other").get(path).content.decode()
    assert not [s for s in VISION_SECRETS if s in text]


@pytest.mark.parametrize("path", ["/", "/teams/", "/nodes/", "/teams/language/"])
def test_the_other_team_sees_none_of_visions_command_env_or_name_on_the_dashboard(world, client, path):
    client.force_login(world["users"]["other"])
    response = client.get(path, follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert not [s for s in VISION_SECRETS if s in text]


def test_the_team_sees_its_own_job_on_the_dashboard(world, client):
    client.force_login(world["users"]["member"])
    assert "vision-job-name" in client.get(f"/jobs/{world['job']}/").content.decode()
