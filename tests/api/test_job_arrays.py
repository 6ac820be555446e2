"""Job arrays through the API: one request, N tasks in one transaction, each with its index in its env;
listed, counted, re-prioritised and cancelled as one; limits with clear errors."""

import pytest

from gpunodes.dispatch import start_messages
from jobs import lifecycle
from jobs.choices import EventKind, JobState, Outcome
from jobs.models import Job, JobArray, JobEvent
from quotas.scheduler import run_pass
from tests.api.conftest import run

URL = "/api/v1/jobs/"


def body(**overrides):
    data = {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["python", "sweep.py"]}
    data.update(overrides)
    return data


def submit_array(client, size=5, **kw):
    r = client.post(URL, body(array={"size": size, **kw}), format="json")
    assert r.status_code == 201, r.json()
    return r.json()


def test_it_submits_an_array_as_one_request(as_bob, vision_share, nodes):
    array = submit_array(as_bob, size=5, start=10)
    assert (array["size"], array["first_index"], array["last_index"]) == (5, 10, 14)
    assert array["counts"] == {"QUEUED": 5} and array["done"] is False
    tasks = list(Job.objects.filter(array_id=array["id"]).order_by("array_index"))
    assert [t.array_index for t in tasks] == [10, 11, 12, 13, 14]
    assert [t.env["GPUQUOTA_ARRAY_INDEX"] for t in tasks] == ["10", "11", "12", "13", "14"]
    assert all(t.state == JobState.QUEUED and t.submitted_by.username == "bob" for t in tasks)
    events = JobEvent.objects.filter(job__array_id=array["id"], kind=EventKind.SUBMITTED)
    assert events.count() == 5
    assert events.get(job=tasks[0]).reason.endswith(f"array {array['id']} task 10")


def test_each_task_starts_with_its_index_in_its_env(as_bob, vision_share, nodes):
    array = submit_array(as_bob, size=3)
    run_pass()
    tasks = Job.objects.filter(array_id=array["id"], state=JobState.ADMITTED)
    assert tasks.count() == 3
    ids = [a.pk for t in tasks for a in t.attempts.all()]
    envs = sorted(m["payload"]["env"]["GPUQUOTA_ARRAY_INDEX"] for m in start_messages(ids))
    assert envs == ["0", "1", "2"]


def test_the_tasks_are_listed_by_array(as_bob, vision_share, nodes):
    array = submit_array(as_bob, size=4)
    as_bob.post(URL, body(), format="json")
    listed = as_bob.get(URL, {"array": array["id"]}).json()["results"]
    assert sorted(j["array_index"] for j in listed) == [0, 1, 2, 3]
    arrays = as_bob.get("/api/v1/arrays/").json()["results"]
    assert [a["id"] for a in arrays] == [array["id"]]
    assert as_bob.get(f"/api/v1/arrays/{array['id']}/").json()["counts"] == {"QUEUED": 4}


def test_another_team_does_not_see_the_array(as_bob, as_charlie, vision_share, nodes):
    array = submit_array(as_bob, size=2)
    assert as_charlie.get(f"/api/v1/arrays/{array['id']}/").status_code == 404
    assert as_charlie.get("/api/v1/arrays/").json()["results"] == []


def test_it_reprioritises_every_open_task(as_bob, vision_share, nodes):
    array = submit_array(as_bob, size=3)
    first = Job.objects.filter(array_id=array["id"]).order_by("array_index").first()
    Job.objects.filter(pk=first.pk).update(state=JobState.SUCCEEDED)
    r = as_bob.patch(f"/api/v1/arrays/{array['id']}/", {"priority": 7}, format="json")
    assert r.status_code == 200, r.json()
    prios = dict(Job.objects.filter(array_id=array["id"]).values_list("array_index", "priority"))
    assert prios == {0: 0, 1: 7, 2: 7}
    assert JobEvent.objects.filter(job__array_id=array["id"], kind=EventKind.PRIORITY_CHANGED).count() == 2


def test_it_cancels_queued_and_running_tasks_as_one(as_bob, vision_share, nodes, no_messages):
    array = submit_array(as_bob, size=4)
    running = Job.objects.filter(array_id=array["id"]).order_by("array_index").first()
    run(running, nodes[0], [0])
    r = as_bob.post(f"/api/v1/arrays/{array['id']}/cancel/")
    assert r.status_code == 200, r.json()
    # The running task is stopping: CANCELLING, its GPUs held, until its host confirms.
    assert r.json()["counts"] == {"CANCELLED": 3, "CANCELLING": 1} and r.json()["done"] is False
    attempt = running.attempts.get()
    assert attempt.state == "STOPPING"
    assert as_bob.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 200  # still stopping
    lifecycle.end_attempt(attempt.pk, attempt.number, outcome=Outcome.PREEMPTED, exit_code=143)
    r = as_bob.get(f"/api/v1/arrays/{array['id']}/")
    assert r.json()["counts"] == {"CANCELLED": 4} and r.json()["done"] is True
    assert as_bob.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 409


def test_only_the_owner_a_manager_or_an_admin_may_cancel(as_bob, as_charlie, as_alice, vision_share, nodes):
    array = submit_array(as_bob, size=2)
    assert as_charlie.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 404
    assert as_alice.post(f"/api/v1/arrays/{array['id']}/cancel/").status_code == 200


def test_an_array_larger_than_the_limit_is_refused_whole(as_bob, vision_share, nodes, settings):
    settings.MAX_ARRAY_SIZE = 10
    r = as_bob.post(URL, body(array={"size": 11}), format="json")
    assert r.status_code == 400
    assert r.json()["array"] == ["An array has 1 to 10 tasks (MAX_ARRAY_SIZE); this one has 11."]
    assert not Job.objects.exists() and not JobArray.objects.exists()


def test_an_array_that_would_pass_the_share_queue_limit_is_refused(as_bob, vision_share, nodes, settings):
    settings.MAX_QUEUED_PER_SHARE = 8
    submit_array(as_bob, size=5)
    r = as_bob.post(URL, body(array={"size": 4}), format="json")
    assert r.status_code == 400
    message = r.json()["array"][0]
    assert "has 5 jobs queued; 4 more would pass its limit of 8 (MAX_QUEUED_PER_SHARE)" in message
    assert "Submit at most 3 now" in message
    assert Job.objects.count() == 5


def test_a_bad_task_is_refused_with_its_field_and_nothing_is_created(as_bob, vision_share, nodes):
    r = as_bob.post(URL, body(gpus=99, array={"size": 3}), format="json")
    assert r.status_code == 400 and "gpus" in r.json()
    r = as_bob.post(URL, body(array={"size": 0}), format="json")
    assert r.status_code == 400 and "array" in r.json()
    r = as_bob.post(URL, body(array={"size": 2, "step": 3}), format="json")
    assert r.status_code == 400
    assert not Job.objects.exists()


def test_a_non_member_cannot_submit_an_array(as_charlie, vision_share, nodes):
    r = as_charlie.post(URL, body(array={"size": 2}), format="json")
    assert r.status_code == 403
    assert not Job.objects.exists()


@pytest.mark.parametrize("size", [1, 1200])
def test_every_task_gets_a_submitted_event(as_bob, vision_share, nodes, size):
    array = submit_array(as_bob, size=size)
    assert JobEvent.objects.filter(job__array_id=array["id"]).count() == size
