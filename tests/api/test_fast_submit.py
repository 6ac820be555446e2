"""The quick submit path (jobs.api.fast_submit): it answers a plain token submit exactly as the DRF view
would, leaves every other request (and every error) to the view with the same answer, counts the
throttle once, and its token cache stops a revoked token within API_TOKEN_CACHE_S."""

import pytest
from knox.models import AuthToken

from config import auth
from jobs.models import Job, JobEvent
from quotas.choices import ShareState
from quotas.models import Share
from tests.api.conftest import client_for

URL = "/api/v1/jobs/"


def body(**overrides):
    data = {"share": "vision-main", "gpus": 2, "gpu_type": "a10g", "command": ["python", "train.py"]}
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not ...}


def both_ways(client, settings, payload, **extra):
    """The answer with the quick way on, then off (DRF's view alone)."""
    settings.FAST_SUBMIT = True
    quick = client.post(URL, payload, format="json", **extra)
    settings.FAST_SUBMIT = False
    full = client.post(URL, payload, format="json", **extra)
    settings.FAST_SUBMIT = True
    return quick, full


VOLATILE = {"id", "submitted_at", "updated_at", "events"}


def test_a_plain_submit_is_answered_the_quick_way_as_drf_would(as_bob, vision_share, nodes, settings, taken):
    payload = body(name="resnet", priority=5, env={"SEED": "1"}, max_runtime_s=7200, use_shell=False)
    quick, full = both_ways(as_bob, settings, payload)
    assert len(taken) == 1 and quick.status_code == full.status_code == 201
    q, f = quick.json(), full.json()
    assert {k: v for k, v in q.items() if k not in VOLATILE} == {
        k: v for k, v in f.items() if k not in VOLATILE
    }
    assert [(e["kind"], e["reason"], e["detail"]) for e in q["events"]] == [
        (e["kind"], e["reason"], e["detail"]) for e in f["events"]
    ]
    assert set(quick.headers) == set(full.headers)
    for header in ("Content-Type", "Allow", "Vary", "X-Frame-Options", "Content-Security-Policy"):
        assert quick[header] == full[header], header
    assert Job.objects.count() == 2 and JobEvent.objects.count() == 2
    assert "sessionid" not in quick.cookies and "csrftoken" not in quick.cookies


BAD = [
    body(gpus=0),
    body(gpus=True),
    body(gpus="2"),  # DRF coerces it: the view answers (201), the same way
    body(gpus=2.0),
    body(gpus=2**31),
    body(gpus=None),
    body(gpus=...),
    body(priority=-1),
    body(priority=10**6),
    body(name="evil\x1b[2J"),
    body(name=" padded "),
    body(name="x" * 201),
    body(name=None),
    body(gpu_type="A10G"),
    body(gpu_type=""),
    body(gpu_type=" a10g"),
    body(gpu_type="h100"),
    body(gpus=64),
    body(command="python train.py"),
    body(command=[]),
    body(command=["python", 3]),
    body(command=["a\x00b"]),
    body(env={"GPUQUOTA_X": "1"}),
    body(env={"A": 1}),
    body(env={"A": None}),
    body(env={"bad name": "1"}),
    body(env=None),
    body(use_shell="yes"),
    body(use_shell=True),
    body(max_runtime_s=0),
    body(max_runtime_s="60"),
    body(preemption_grace_s=-1),
    body(max_preemptions=-2),
    body(colour="red"),
    body(share="nope"),
    body(share=""),
    body(share="language-main"),  # bob is no member: 403
    body(share=["vision-main"]),
    body(array={"size": 0}),
    body(array={"size": 2}),
    [body()],
    "just a string",
]


@pytest.mark.parametrize("payload", BAD, ids=[repr(p)[:60] for p in BAD])
def test_every_other_submit_gets_the_drf_answer(
    as_bob, vision_share, language_share, nodes, settings, payload
):
    before = Job.objects.count()
    quick, full = both_ways(as_bob, settings, payload)
    assert quick.status_code == full.status_code
    assert quick.status_code != 500
    q, f = quick.json(), full.json()
    if quick.status_code == 201:
        q, f = ({k: v for k, v in d.items() if k not in VOLATILE | {"tasks", "counts"}} for d in (q, f))
    else:
        assert Job.objects.count() == before  # nothing half-written
    assert q == f


def test_a_disabled_share_and_odd_bodies_get_the_drf_answer(as_bob, vision_share, nodes, settings):
    plain = '{"share": "vision-main", "gpus": 2, "gpu_type": "a10g", "command": [%s]}'
    odd = ['{"gpus": NaN}', "{", '{"share": "vision-main"', plain % '"\\ud800"', plain % '"a\\u0000"']
    for raw in odd:
        settings.FAST_SUBMIT = True
        quick = as_bob.post(URL, raw, content_type="application/json")
        settings.FAST_SUBMIT = False
        full = as_bob.post(URL, raw, content_type="application/json")
        assert quick.status_code == full.status_code == 400 and quick.json() == full.json()
    Share.objects.filter(pk=vision_share.pk).update(state=ShareState.DISABLED)
    quick, full = both_ways(as_bob, settings, body())
    assert quick.status_code == full.status_code == 400 and quick.json() == full.json()


def test_only_plain_json_token_requests_go_the_quick_way(as_bob, bob, vision_share, nodes, taken, client):
    as_bob.post(URL, body(), format="json", HTTP_ACCEPT="text/html")
    as_bob.post(URL, body(), format="json", HTTP_ACCEPT="application/json; indent=4")
    as_bob.post("/api/v1/jobs", body(), format="json")
    client.force_login(bob)  # a session (browser) request: CSRF and sessions apply, DRF's view answers
    client.post(URL, body(), content_type="application/json")
    assert taken == []
    assert as_bob.post(URL, body(), format="json", HTTP_ACCEPT="*/*").status_code == 201
    assert len(taken) == 1


def test_a_submit_counts_once_against_the_throttle(as_bob, vision_share, nodes, monkeypatch, taken):
    monkeypatch.setattr("jobs.api.views.SubmitThrottle.rate", "3/min", raising=False)
    # Counted by the quick way, then refused by the service and answered by DRF's view: one count.
    assert as_bob.post(URL, body(gpus=0), format="json").status_code == 400
    assert as_bob.post(URL, body(), format="json").status_code == 201
    assert as_bob.post(URL, body(), format="json").status_code == 201
    r = as_bob.post(URL, body(), format="json")
    assert r.status_code == 429 and int(r["Retry-After"]) > 0
    assert len(taken) == 2 and Job.objects.count() == 2


# --- the token cache ---------------------------------------------------------------------------------


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(auth, "_now", lambda: now[0])
    return now


def test_a_logged_out_token_stops_at_once(as_bob, vision_share, nodes, clock):
    assert as_bob.post(URL, body(), format="json").status_code == 201
    assert as_bob.delete("/api/v1/auth/token/current/").status_code == 204
    assert as_bob.post(URL, body(), format="json").status_code == 401


def test_a_token_revoked_elsewhere_stops_within_the_ttl(as_bob, bob, vision_share, nodes, settings, clock):
    settings.API_TOKEN_CACHE_S = 5
    assert as_bob.post(URL, body(), format="json").status_code == 201
    # Deleted without this process hearing of it (as by another web worker).
    tokens = AuthToken.objects.filter(user=bob)
    tokens._raw_delete(tokens.db)
    clock[0] += 4
    assert as_bob.post(URL, body(), format="json").status_code == 201  # within the TTL: still cached
    clock[0] += 1.5
    assert as_bob.post(URL, body(), format="json").status_code == 401
    assert Job.objects.count() == 2


def test_without_a_ttl_nothing_is_cached(as_bob, bob, vision_share, nodes, settings, clock):
    settings.API_TOKEN_CACHE_S = 0
    assert as_bob.post(URL, body(), format="json").status_code == 201
    tokens = AuthToken.objects.filter(user=bob)
    tokens._raw_delete(tokens.db)
    assert as_bob.post(URL, body(), format="json").status_code == 401


def test_a_deactivated_user_or_an_expired_token_stops_at_once(bob, vision_share, nodes, clock):
    import time
    from datetime import timedelta

    from rest_framework.test import APIClient

    as_bob = client_for(bob)
    assert as_bob.post(URL, body(), format="json").status_code == 201
    bob.is_active = False
    bob.save()
    assert as_bob.post(URL, body(), format="json").status_code == 401
    bob.is_active = True
    bob.save()
    # A cached token's own expiry is checked on every use.
    _, key = AuthToken.objects.create(user=bob, expiry=timedelta(seconds=1))
    short = APIClient()
    short.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert short.post(URL, body(), format="json").status_code == 201
    time.sleep(1.05)
    assert short.post(URL, body(), format="json").status_code == 401


def test_each_request_gets_its_own_user(bob):
    _, key = AuthToken.objects.create(user=bob)
    first, _, _ = auth.cached_token(f"Token {key}")
    second, _, _ = auth.cached_token(f"Token {key}")
    assert first == second == bob and first is not second
    assert auth.cached_token("Token") is None and auth.cached_token(f"Token {key} x") is None
    assert auth.cached_token("Token " + "0" * 40) is None
