"""The live picture (quotas.usage.live_picture) is shared by the pages while nothing it depends on
changed, and never served stale: a job event, a pass, a share change or a node state change gives it a
new version."""

import pytest
from django.core.cache import cache
from django.db import connection
from django.test.utils import CaptureQueriesContext

from gpunodes.choices import NodeState
from gpunodes.models import Node
from quotas import usage
from tests.api.conftest import run
from tests.web.conftest import hx, submit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def local_cache(settings):
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    cache.clear()


def test_a_second_view_with_nothing_changed_loads_no_snapshot(vision_share, bob, nodes):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    usage.live_picture()
    with CaptureQueriesContext(connection) as ctx:
        live = usage.live_picture()
    assert len(ctx) == 1  # the version only
    assert [b.own for b in next(c for c in live.picture.cards if c.name == "vision-main").bars] == [2]


def test_a_change_is_seen_at_once(vision_share, bob, nodes):
    run(submit(bob, vision_share, gpus=2), nodes[0], [0, 1])
    before = usage.live_picture()
    run(submit(bob, vision_share, gpus=1), nodes[1], [0])  # writes job events
    after = usage.live_picture()
    own = lambda live: next(c for c in live.picture.cards if c.name == "vision-main").bars[0].own  # noqa: E731
    assert (own(before), own(after)) == (2, 3)
    Node.objects.filter(name="node-2").update(state=NodeState.CORDONED, state_changed_at="2030-01-01T00:00Z")
    totals = usage.live_picture().picture.totals[0]
    assert totals["ready"] == 4


def test_the_team_page_shows_the_running_job_from_the_live_picture(as_bob, bob, vision_share, nodes):
    run(submit(bob, vision_share, gpus=4, name="trainer"), nodes[0], [0, 1, 2, 3])
    body = hx(as_bob, "/teams/vision/?part=queue").content.decode()
    assert "trainer" in body and "node-1 [0,1,2,3]" in body
    run(submit(bob, vision_share, gpus=1, name="second"), nodes[1], [0])
    assert "second" in hx(as_bob, "/teams/vision/?part=queue").content.decode()


def test_a_pass_that_decides_nothing_keeps_the_picture(vision_share, bob, nodes, no_messages):
    from quotas import scheduler

    run(submit(bob, vision_share, gpus=4), nodes[0], [0, 1, 2, 3])
    usage.live_picture()
    version = cache.get(usage.LIVE_KEY)[0]
    scheduler.run_pass("beat")  # nothing queued: it decides nothing
    usage.live_picture()
    assert cache.get(usage.LIVE_KEY)[0] == version


def test_a_share_change_is_seen_at_once(vision_share, alice, nodes):
    from quotas import services

    before = usage.live_picture()
    services.share_update(share=vision_share, actor=alice, capacity={"a10g": 6})
    after = usage.live_picture()
    cap = lambda live: next(c for c in live.picture.cards if c.name == "vision-main").bars[0].capacity  # noqa: E731
    assert (cap(before), cap(after)) == (4, 6)
