"""The queue as the policy would admit it: order, positions and ETAs, for every share; other teams'
entries without name or owner."""

from datetime import timedelta

import pytest
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from quotas import services as quota_services
from quotas.choices import Strategy
from tests.api.conftest import run, submit
from tests.conftest import make_share

URL = "/api/v1/queue/"


@pytest.fixture
def full(bob, charlie, vision_share, language, nodes):
    """node-1 runs vision's own 4-GPU job (1 h, 10 min in); node-2 a RESERVE share of team language
    (2 h). Nothing is idle, nothing can be lent."""
    t0 = timezone.now() - timedelta(minutes=10)
    reserve = make_share(language, "language-reserve", capacity={"a10g": 4}, strategy=Strategy.RESERVE)
    run(submit(bob, vision_share, gpus=4, max_runtime_s=3600), nodes[0], [0, 1, 2, 3], started_at=t0)
    run(submit(charlie, reserve, gpus=4, max_runtime_s=7200), nodes[1], [0, 1, 2, 3], started_at=t0)
    return t0, reserve


def test_the_queue_is_in_admission_order_with_etas(as_bob, bob, vision_share, full):
    t0, _ = full
    first = submit(bob, vision_share, gpus=4, max_runtime_s=1800, name="first")
    second = submit(bob, vision_share, gpus=4, name="second")
    urgent = submit(bob, vision_share, gpus=4, priority=10, max_runtime_s=600, name="urgent")
    quota_services.forecast_refresh()
    r = as_bob.get(URL, {"share": "vision-main"})
    assert r.status_code == 200
    data = r.json()
    assert data["planned"] is True
    assert [j["id"] for j in data["jobs"]] == [urgent.pk, first.pk, second.pk]
    assert [j["position"] for j in data["jobs"]] == [
        {"in_share": 1, "overall": 1},
        {"in_share": 2, "overall": 2},
        {"in_share": 3, "overall": 3},
    ]
    etas = [parse_datetime(j["eta"]) for j in data["jobs"]]
    # urgent when vision's running job ends (1 h after t0), first 10 min later, second 30 min after that.
    expected = [t0 + timedelta(seconds=s) for s in (3600, 4200, 6000)]
    assert all(abs((e - x).total_seconds()) < 2 for e, x in zip(etas, expected, strict=True)), etas
    assert data["jobs"][0]["waiting_reason"]


def test_the_job_detail_shows_the_same_eta(as_bob, bob, vision_share, full):
    t0, _ = full
    job = submit(bob, vision_share, gpus=4)
    quota_services.forecast_refresh()
    detail = as_bob.get(f"/api/v1/jobs/{job.pk}/").json()
    assert abs((parse_datetime(detail["eta"]) - (t0 + timedelta(hours=1))).total_seconds()) < 2
    assert detail["queue_position"] == {"in_share": 1, "overall": 1}
    assert detail["waiting_reason"]


def test_a_member_sees_another_teams_queue_without_names_or_owners(as_charlie, bob, vision_share, full):
    submit(bob, vision_share, gpus=4, name="secret-project", command=["./secret"])
    r = as_charlie.get(URL, {"share": "vision-main"})
    assert r.status_code == 200
    (entry,) = r.json()["jobs"]
    assert (entry["name"], entry["submitted_by"], entry["gpus"], entry["team"]) == (None, None, 4, "vision")
    assert "secret" not in r.content.decode()


def test_the_whole_queue_without_a_share(as_alice, bob, charlie, vision_share, full):
    _, reserve = full
    a = submit(bob, vision_share, gpus=4, name="a")
    b = submit(charlie, reserve, gpus=4, name="b")
    data = as_alice.get(URL).json()
    assert data["share"] is None
    assert sorted(j["id"] for j in data["jobs"]) == sorted([a.pk, b.pk])
    assert {j["name"] for j in data["jobs"]} == {"a", "b"}  # an admin sees every name


def test_an_unknown_share_is_a_400(as_bob, db):
    r = as_bob.get(URL, {"share": "nope"})
    assert r.status_code == 400
    assert r.json()["share"] == ['No share named "nope".']


def test_anonymous_gets_401(anon, db):
    assert anon.get(URL).status_code == 401


def test_when_the_planner_fails_the_queue_is_in_plain_order(as_bob, bob, vision_share, full, monkeypatch):
    def broken(snapshot):
        raise RuntimeError("a planner bug")

    monkeypatch.setattr("quotas.engine.policy.plan", broken)
    low = submit(bob, vision_share, gpus=1)
    high = submit(bob, vision_share, gpus=1, priority=5)
    data = as_bob.get(URL, {"share": "vision-main"}).json()
    assert data["planned"] is False
    assert [j["id"] for j in data["jobs"]] == [high.pk, low.pk]
    assert [j["eta"] for j in data["jobs"]] == [None, None]


def test_the_queue_runs_a_constant_number_of_queries(
    as_bob, bob, vision_share, full, django_assert_max_num_queries
):
    for _ in range(3):
        submit(bob, vision_share, gpus=4)
    as_bob.get(URL)
    with django_assert_max_num_queries(14) as few:
        as_bob.get(URL)
    for _ in range(15):
        submit(bob, vision_share, gpus=4)
    with django_assert_max_num_queries(len(few.captured_queries)):
        as_bob.get(URL)
