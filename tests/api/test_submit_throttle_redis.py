"""The submit throttle on Redis (one script, one round trip) decides and answers exactly as DRF's own
sliding-window log does on another cache: the same requests let through, the same Retry-After."""

import os
import uuid

import pytest

from jobs.api.views import SubmitThrottle
from jobs.models import Job

URL = "/api/v1/jobs/"
REDIS_URL = os.environ.get("REDIS_URL", "")
pytestmark = pytest.mark.skipif(not REDIS_URL, reason="needs REDIS_URL")


def body():
    return {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["true"]}


def use_redis(settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "config.cache.ReusingRedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": f"test-{uuid.uuid4().hex}",  # nothing left from an earlier run
        }
    }


def replay(as_bob, monkeypatch, times):
    """Submit at each of `times` (seconds): the status codes and the Retry-After of each 429."""
    now = [0.0]
    monkeypatch.setattr(SubmitThrottle, "timer", lambda self: now[0])
    answers = []
    for t in times:
        now[0] = 1_700_000_000.0 + t
        r = as_bob.post(URL, body(), format="json")
        answers.append((r.status_code, r.get("Retry-After")))
    return answers


TIMES = [0, 1, 2, 3, 30, 59.9, 60.0, 60.5, 61, 62.5, 120, 121, 121.5, 200]


@pytest.mark.parametrize("quick", [True, False], ids=["quick way", "DRF view"])
def test_redis_and_drf_throttle_alike(as_bob, vision_share, nodes, settings, monkeypatch, quick):
    settings.FAST_SUBMIT = quick
    monkeypatch.setattr(SubmitThrottle, "rate", "3/min", raising=False)
    drf = replay(as_bob, monkeypatch, TIMES)  # the local-memory cache of the API tests: DRF's log
    Job.objects.all().delete()
    use_redis(settings)
    called = []
    real = SubmitThrottle._allow_in_redis
    monkeypatch.setattr(SubmitThrottle, "_allow_in_redis", lambda *a: called.append(1) or real(*a))
    ours = replay(as_bob, monkeypatch, TIMES)
    assert called and ours == drf
    assert [code for code, _ in ours].count(429) >= 4
    assert Job.objects.count() == [code for code, _ in ours].count(201)


def test_a_refused_submit_says_when_to_retry(as_bob, vision_share, nodes, settings, monkeypatch):
    use_redis(settings)
    monkeypatch.setattr(SubmitThrottle, "rate", "2/min", raising=False)
    assert [as_bob.post(URL, body(), format="json").status_code for _ in range(2)] == [201, 201]
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 429 and 0 < int(r["Retry-After"]) <= 60
    assert "Expected available in" in r.json()["detail"]
