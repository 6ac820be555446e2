"""Tokens: log in for one, use it, list and revoke it (owner and admins); session auth beside it."""

import pytest
from knox.models import AuthToken
from rest_framework.test import APIClient

from tests.api.conftest import client_for

TOKEN_URL = "/api/v1/auth/token/"
TOKENS_URL = "/api/v1/auth/tokens/"


def test_it_gives_a_token_for_a_username_and_password(anon, bob):
    r = anon.post(TOKEN_URL, {"username": "bob", "password": "bob-pw-123"}, format="json")
    assert r.status_code == 200
    [stored] = AuthToken.objects.filter(user=bob)
    assert r.json()["token"].startswith(stored.token_key)  # stored: only a prefix and a digest


def test_the_token_authenticates_later_calls(anon, bob):
    key = anon.post(TOKEN_URL, {"username": "bob", "password": "bob-pw-123"}, format="json").json()["token"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/v1/shares/").status_code == 200


def test_it_rejects_a_wrong_password(anon, bob):
    r = anon.post(TOKEN_URL, {"username": "bob", "password": "nope"}, format="json")
    assert r.status_code == 400
    assert "Unable to log in" in r.json()["non_field_errors"][0]


def test_it_rejects_a_login_without_password(anon, bob):
    r = anon.post(TOKEN_URL, {"username": "bob"}, format="json")
    assert r.status_code == 400
    assert r.json()["password"] == ["This field is required."]


def test_it_rejects_unknown_login_fields(anon, bob):
    r = anon.post(TOKEN_URL, {"username": "bob", "password": "bob-pw-123", "otp": "1"}, format="json")
    assert r.status_code == 400
    assert "Unknown field" in r.json()["otp"][0]


def test_anonymous_calls_get_401_with_the_scheme(anon, db):
    r = anon.get("/api/v1/shares/")
    assert r.status_code == 401
    assert r["WWW-Authenticate"] == "Token"


def test_a_bad_token_gets_401(db):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    assert client.get("/api/v1/shares/").status_code == 401


def test_session_auth_works_for_reads(bob):
    client = APIClient()
    client.force_login(bob)
    assert client.get("/api/v1/jobs/").status_code == 200


def test_session_auth_writes_need_the_csrf_token(bob, vision_share, nodes):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(bob)
    r = client.post(
        "/api/v1/jobs/",
        {"share": "vision-main", "gpus": 1, "gpu_type": "a10g", "command": ["true"]},
        format="json",
    )
    assert r.status_code == 403
    assert "CSRF" in r.json()["detail"]


def test_a_user_lists_only_their_own_token(bob, charlie):
    client_for(charlie)
    r = client_for(bob).get(TOKENS_URL)
    assert r.status_code == 200
    assert [t["user"] for t in r.json()["results"]] == ["bob"]
    assert "key" not in r.json()["results"][0]


def test_an_admin_lists_every_token(alice, bob, charlie):
    client_for(bob), client_for(charlie)
    r = client_for(alice).get(TOKENS_URL)
    assert sorted(t["user"] for t in r.json()["results"]) == ["alice", "bob", "charlie"]


def test_a_user_revokes_their_token(bob):
    client = client_for(bob)
    assert client.delete(f"{TOKENS_URL}bob/").status_code == 204
    assert not AuthToken.objects.filter(user=bob).exists()
    assert client.get("/api/v1/shares/").status_code == 401


def test_a_user_cannot_revoke_another_users_token(bob, charlie):
    client_for(charlie)
    assert client_for(bob).delete(f"{TOKENS_URL}charlie/").status_code == 404
    assert AuthToken.objects.filter(user=charlie).exists()


def test_an_admin_revokes_any_token(alice, bob):
    client_for(bob)
    assert client_for(alice).delete(f"{TOKENS_URL}bob/").status_code == 204
    assert not AuthToken.objects.filter(user=bob).exists()


def test_logging_out_revokes_the_current_token(bob):
    client = client_for(bob)
    assert client.delete(f"{TOKEN_URL}current/").status_code == 204
    assert not AuthToken.objects.filter(user=bob).exists()


def test_login_attempts_are_throttled(anon, bob, monkeypatch):
    monkeypatch.setattr("config.api_auth.LoginThrottle.rate", "2/min", raising=False)
    for _ in range(2):
        anon.post(TOKEN_URL, {"username": "bob", "password": "x"}, format="json")
    r = anon.post(TOKEN_URL, {"username": "bob", "password": "bob-pw-123"}, format="json")
    assert r.status_code == 429
    assert int(r["Retry-After"]) > 0


@pytest.mark.parametrize("body", ["{nope", "[1, 2]"])
def test_a_login_body_that_is_no_json_object_is_a_400(anon, db, body):
    r = anon.post(TOKEN_URL, body, content_type="application/json")
    assert r.status_code == 400
