"""The quick submit path's one round trip (jobs.api.fast_submit): on Redis + PostgreSQL a warm submit
costs one Redis script (throttle, node shapes, teams, the share) and one statement, and a cached share
that changed behind the cache (even by a queryset update(), which fires no signal) is never acted on:
the checked insert writes nothing and the full stack answers from the database."""

import os
import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs import submit_cache
from jobs.models import Job, JobEvent
from quotas.choices import ShareState, Strategy
from quotas.models import Share, ShareCapacity, Team

URL = "/api/v1/jobs/"
REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = pytest.mark.skipif(
    not REDIS_URL or not os.environ.get("DATABASE_URL", "").startswith("postgres"),
    reason="needs REDIS_URL and PostgreSQL",
)


@pytest.fixture(autouse=True)
def on_redis(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "config.cache.ReusingRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"test-{uuid.uuid4().hex}",
        }
    }


def body(**overrides):
    return {"share": "vision-main", "gpus": 2, "gpu_type": "a10g", "command": ["true"], **overrides}


def test_a_warm_submit_costs_one_statement(as_bob, vision_share, nodes, taken):
    assert as_bob.post(URL, body(), format="json").status_code == 201  # fills the cache
    with CaptureQueriesContext(connection) as queries:
        r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 201 and len(taken) == 2
    assert len(queries) == 1, [q["sql"][:80] for q in queries]
    assert Job.objects.count() == JobEvent.objects.count() == 2


def reserve_of_one(share):
    ShareCapacity.objects.filter(share=share).update(max_gpus=1)
    Share.objects.filter(pk=share.pk).update(strategy=Strategy.RESERVE)


@pytest.mark.parametrize(
    "change, status",
    [
        (lambda s: Share.objects.filter(pk=s.pk).update(state=ShareState.DISABLED), 400),
        (lambda s: Share.objects.filter(pk=s.pk).update(name="vision-renamed"), 400),
        (lambda s: reserve_of_one(s), 400),
        (lambda s: ShareCapacity.objects.filter(share=s).update(max_gpus=1), 201),
        (
            lambda s: Share.objects.filter(pk=s.pk).update(
                team=Team.objects.create(name="Other", slug="other")
            ),
            403,
        ),
        (lambda s: Team.objects.filter(pk=s.team_id).update(slug="vision-2"), 201),
    ],
    ids=["disabled", "renamed", "reserve-of-1", "capacity-lowered", "other-team", "team-renamed"],
)
def test_a_share_changed_behind_the_cache_is_decided_from_the_database(
    as_bob, vision_share, nodes, taken, change, status
):
    assert as_bob.post(URL, body(), format="json").status_code == 201
    change(vision_share)  # no signal: the cached share is now stale
    r = as_bob.post(URL, body(gpus=4 if status == 201 else 2), format="json")
    assert len(taken) == 1, "the quick way acted on a stale share"
    assert r.status_code == status, r.content
    stored = Job.objects.order_by("pk").last()
    if status == 201:  # decided by the full stack on the share as it is now
        assert stored.pk == r.json()["id"] and r.json()["team"] == stored.share.team.slug
    else:
        assert Job.objects.count() == JobEvent.objects.count() == 1
    # The stale key is gone: the next submit caches the share afresh and goes the quick way again.
    if status == 201:
        assert as_bob.post(URL, body(gpus=4), format="json").status_code == 201
        assert len(taken) == 2


def test_share_changes_through_the_orm_forget_the_cached_share(as_bob, vision_share, nodes, taken):
    key = submit_cache.share_key("vision-main")
    assert as_bob.post(URL, body(), format="json").status_code == 201
    assert submit_cache._get_many([key])
    vision_share.description = "changed"
    vision_share.save()
    assert not submit_cache._get_many([key])
    assert as_bob.post(URL, body(), format="json").status_code == 201
    ShareCapacity.objects.get(share=vision_share).save()
    assert not submit_cache._get_many([key])


def test_without_a_throttle_the_quick_way_still_reads_the_cache_in_one_round_trip(
    as_bob, vision_share, nodes, taken, monkeypatch
):
    from jobs.api.views import SubmitThrottle

    monkeypatch.setattr(SubmitThrottle, "rate", None, raising=False)
    monkeypatch.setattr(SubmitThrottle, "get_rate", lambda self: None)
    for _ in range(3):
        assert as_bob.post(URL, body(), format="json").status_code == 201
    assert len(taken) == 3 and Job.objects.count() == 3


def test_with_redis_down_the_quick_way_asks_the_database(as_bob, vision_share, nodes, taken, monkeypatch):
    from jobs.api.views import SubmitThrottle

    def down(self, request, keys):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(SubmitThrottle, "count_and_read", down)
    monkeypatch.setattr(SubmitThrottle, "allow_request", lambda self, request, view: True)
    with CaptureQueriesContext(connection) as queries:
        assert as_bob.post(URL, body(), format="json").status_code == 201
    assert len(taken) == 1 and Job.objects.count() == 1
    assert any("quotas_share" in q["sql"] for q in queries)  # the share read from the database
