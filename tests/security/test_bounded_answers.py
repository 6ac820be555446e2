"""Issue 30, finding 9: bounded answers. GET /api/v1/queue/ answered every queued job at once (34 MB with
90k); `?limit=100000` was honoured (66 MB, 17 s); `?limit=10^20` was a 500 on every paginated list;
single submits did not count against any queue limit. Now every list is paged with a bound and answers a
bad parameter 400 with its field, and a user may hold MAX_QUEUED_PER_USER queued jobs, single submits
counted."""

import os
import uuid
from pathlib import Path

import pytest

from jobs.models import Job
from tests.api.conftest import client_for, submit

ROOT = Path(__file__).resolve().parents[2]
V1 = "/api/v1"
LISTS = ["/jobs/", "/arrays/", "/audit/", "/nodes/", "/shares/", "/teams/", "/auth/tokens/", "/queue/"]
BAD = [
    ("limit", "99999999999999999999"),
    ("limit", "391960203974471862714368"),
    ("limit", "-1"),
    ("limit", "0"),
    ("limit", "1001"),
    ("limit", "ten"),
    ("limit", ""),
    ("limit", "1e3"),
    ("offset", "99999999999999999999"),
    ("offset", "-5"),
    ("offset", "x"),
    ("offset", "٣"),  # a digit Python's int() would read
    ("page", "2"),
]


@pytest.mark.parametrize("path", LISTS)
@pytest.mark.parametrize(("param", "value"), BAD)
def test_a_bad_paging_parameter_is_a_400_with_its_field(as_alice, vision_share, nodes, path, param, value):
    r = as_alice.get(f"{V1}{path}", {param: value})
    assert r.status_code == 400, (r.status_code, r.content[:200])
    messages = r.json()[param]
    assert messages and all(isinstance(m, str) and len(m) > 20 for m in messages)


@pytest.mark.parametrize("path", LISTS)
def test_the_largest_page_is_api_max_page_size(as_alice, vision_share, nodes, path, settings):
    assert as_alice.get(f"{V1}{path}", {"limit": 1000, "offset": 2_147_483_647}).status_code == 200
    settings.API_MAX_PAGE_SIZE = 10
    r = as_alice.get(f"{V1}{path}", {"limit": 11})
    assert r.status_code == 400
    assert r.json()["limit"] == [
        "limit is a whole number from 1 to 10 (API_MAX_PAGE_SIZE): the most items one page holds."
    ]


def test_the_queue_is_answered_a_page_at_a_time(as_bob, bob, charlie, vision_share, language_share, nodes):
    for _ in range(5):
        submit(bob, vision_share)
    r = as_bob.get(f"{V1}/queue/", {"limit": 2})
    data = r.json()
    assert r.status_code == 200 and data["count"] == 5 and len(data["jobs"]) == 2
    assert "offset=2" in data["next"] and data["previous"] is None
    last = as_bob.get(f"{V1}/queue/", {"limit": 2, "offset": 4}).json()
    assert len(last["jobs"]) == 1 and last["next"] is None
    seen = [j["id"] for j in data["jobs"]] + [j["id"] for j in as_bob.get(data["next"]).json()["jobs"]]
    seen += [j["id"] for j in last["jobs"]]
    assert sorted(seen) == sorted(Job.objects.values_list("pk", flat=True))  # every job, once


def test_a_queue_page_is_never_longer_than_page_size(as_bob, bob, vision_share, nodes, settings):
    from jobs.services import job_array_submit

    job_array_submit(user=bob, share=vision_share, size=150, gpus=1, gpu_type="a10g", command=["true"])
    data = as_bob.get(f"{V1}/queue/").json()
    assert data["count"] == 150 and len(data["jobs"]) == settings.REST_FRAMEWORK["PAGE_SIZE"] == 100


# --- a queue limit per user ----------------------------------------------------------------------


def body(**overrides):
    return {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["true"], **overrides}


def test_single_submits_count_against_max_queued_per_user(
    as_bob, charlie, language_share, nodes, vision_share, settings, taken
):
    settings.MAX_QUEUED_PER_USER = 3
    assert [as_bob.post(f"{V1}/jobs/", body(), format="json").status_code for _ in range(3)] == [201] * 3
    r = as_bob.post(f"{V1}/jobs/", body(), format="json")
    assert r.status_code == 400
    assert r.json()["non_field_errors"] == [
        "You have 3 jobs queued; 1 more job would pass the limit of 3 queued jobs per user "
        "(MAX_QUEUED_PER_USER). Submit at most 0 now, or wait for your queue to drain."
    ]
    assert Job.objects.count() == 3
    # Another user's queue is their own; a job that leaves the queue makes room.
    assert (
        client_for(charlie).post(f"{V1}/jobs/", body(share="language-main"), format="json").status_code == 201
    )
    Job.objects.filter(pk=Job.objects.filter(submitted_by__username="bob").first().pk).update(state="RUNNING")
    assert as_bob.post(f"{V1}/jobs/", body(), format="json").status_code == 201


def test_an_array_counts_against_it_whole(as_bob, bob, vision_share, nodes, settings):
    settings.MAX_QUEUED_PER_USER = 10
    submit(bob, vision_share)
    submit(bob, vision_share)
    r = as_bob.post(f"{V1}/jobs/", body(array={"size": 9}), format="json")
    assert r.status_code == 400
    message = r.json()["array"][0]
    assert "You have 2 jobs queued; 9 more would pass the limit of 10 queued jobs per user" in message
    assert "Submit at most 8 now" in message
    assert Job.objects.count() == 2
    assert as_bob.post(f"{V1}/jobs/", body(array={"size": 8}), format="json").status_code == 201


def test_the_form_says_so_too(bob, vision_share, nodes, settings, client):
    settings.MAX_QUEUED_PER_USER = 1
    submit(bob, vision_share)
    client.force_login(bob)
    form = {"share": "vision-main", "gpu_type": "a10g", "gpus": 1, "priority": 0, "command": "true"}
    response = client.post("/teams/vision/submit/", form, HTTP_HX_REQUEST="true")
    assert response.status_code == 400
    assert "the limit of 1 queued jobs per user (MAX_QUEUED_PER_USER)" in response.content.decode()
    assert Job.objects.count() == 1


@pytest.mark.skipif(
    not os.environ.get("REDIS_URL") or not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="the one-statement submit is PostgreSQL's (with Redis)",
)
def test_the_one_statement_submit_holds_to_it(as_bob, vision_share, nodes, settings, taken):
    settings.CACHES = {
        "default": {
            "BACKEND": "config.cache.ReusingRedisCache",
            "LOCATION": os.environ["REDIS_URL"],
            "KEY_PREFIX": f"test-{uuid.uuid4().hex}",
        }
    }
    settings.MAX_QUEUED_PER_USER = 2
    codes = [as_bob.post(f"{V1}/jobs/", body(), format="json").status_code for _ in range(3)]
    assert codes == [201, 201, 400] and len(taken) == 2  # both accepted ones took the quick way
    assert Job.objects.count() == 2
