"""Logins hold against guessing (issue 18, issue 30): the dashboard, admin and API token logins lock out
after LOGIN_FAILURE_LIMIT wrong passwords for one username from one client address, slow a username
guessed at from many, and take LOGIN_RATE tries per address, whatever X-Forwarded-For says; API tokens
are stored as digests, expire, and die with a password change."""

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from config.auth import client_ip

TOKEN_URL = "/api/v1/auth/token/"
LIMIT = 5


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT


def post_login(url: str, username: str, password: str, *, addr="10.0.0.1", xff=None):
    extra = {"REMOTE_ADDR": addr, **({"HTTP_X_FORWARDED_FOR": xff} if xff else {})}
    if url == TOKEN_URL:
        return APIClient().post(url, {"username": username, "password": password}, format="json", **extra)
    return Client().post(url, {"username": username, "password": password}, **extra)


def logged_in(url: str, response) -> bool:
    if url == TOKEN_URL:
        return response.status_code == 200 and "token" in response.json()
    return response.status_code == 302 and "/login/" not in response["Location"]


URLS = ["/login/", "/admin/login/", TOKEN_URL]


@pytest.mark.parametrize("url", URLS)
def test_the_right_password_works_before_any_lockout(url, alice):
    assert logged_in(url, post_login(url, "alice", "alice-pw-123"))


@pytest.mark.parametrize("url", URLS)
def test_wrong_passwords_lock_the_login_out_whatever_x_forwarded_for_says(url, alice):
    for i in range(LIMIT):
        post_login(url, "alice", f"guess-{i}", xff=f"198.51.100.{i}")
    r = post_login(url, "alice", "alice-pw-123", xff="203.0.113.99")
    assert not logged_in(url, r) and r.status_code in (403, 429)


@pytest.mark.parametrize("url", URLS)
def test_a_username_guessed_at_from_every_address_is_slowed(url, alice):
    """Not locked out (tests/security/test_login_lockout.py: its owner still gets in), but a new
    address's try right after the guesses waits."""
    for i in range(LIMIT):
        post_login(url, "alice", f"guess-{i}", addr=f"10.0.1.{i}")
    r = post_login(url, "alice", "alice-pw-123", addr="10.0.2.1")
    assert not logged_in(url, r) and r.status_code == 429 and int(r["Retry-After"]) >= 1


@pytest.mark.parametrize("url", URLS)
def test_an_address_is_rate_limited_for_every_username(url, alice, monkeypatch):
    from config.logins import LoginThrottle

    monkeypatch.setattr(LoginThrottle, "rate", f"{LIMIT}/min", raising=False)
    for i in range(LIMIT):
        post_login(url, f"user{i}", "guess", addr="10.0.3.1")
    r = post_login(url, "alice", "alice-pw-123", addr="10.0.3.1")
    assert not logged_in(url, r) and r.status_code == 429
    assert logged_in(url, post_login(url, "alice", "alice-pw-123", addr="10.0.3.2"))  # not alice herself


def test_behind_a_proxy_the_client_is_the_address_the_proxy_saw(settings):
    class Req:
        META = {"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 192.0.2.7"}

    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 0}
    assert client_ip(Req) == "10.0.0.1"  # no proxy: the header is the client's own invention
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    assert client_ip(Req) == "192.0.2.7"  # one proxy: what it appended, not what the client sent


def test_the_login_throttle_is_keyed_on_the_real_address(settings):
    from rest_framework.test import APIRequestFactory

    from config.api_auth import ObtainTokenView
    from config.logins import LoginThrottle

    assert settings.REST_FRAMEWORK["NUM_PROXIES"] == 0
    assert ObtainTokenView.throttle_classes == [LoginThrottle]
    request = APIRequestFactory().post(TOKEN_URL, REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="1.2.3.4")
    assert LoginThrottle().get_cache_key(request, None) == "throttle_login_10.0.0.1"


# --- API tokens ------------------------------------------------------------------------------------


def login_token(username="bob", password="bob-pw-123") -> str:
    r = APIClient().post(TOKEN_URL, {"username": username, "password": password}, format="json")
    assert r.status_code == 200, r.content
    return r.json()["token"]


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_tokens_are_stored_as_digests_only(bob):
    from django.db import connection

    token = login_token()
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM knox_authtoken")
        rows = cursor.fetchall()
    assert rows and not [row for row in rows if any(token in str(v) for v in row)]


def test_a_token_expires(bob):
    token = login_token()
    assert api(token).get("/api/v1/shares/").status_code == 200
    AuthToken.objects.filter(user=bob).update(expiry=timezone.now() - timedelta(seconds=1))
    assert api(token).get("/api/v1/shares/").status_code == 401


def test_a_password_change_revokes_every_token(bob):
    token = login_token()
    bob.set_password("a-new-pw-456")
    bob.save()
    assert api(token).get("/api/v1/shares/").status_code == 401
    assert api(login_token(password="a-new-pw-456")).get("/api/v1/shares/").status_code == 200


def test_a_password_change_in_the_admin_revokes_every_token(alice, bob):
    token = login_token()
    admin = Client()
    admin.force_login(alice)
    r = admin.post(
        f"/admin/auth/user/{bob.pk}/password/",
        {"password1": "a-new-pw-456", "password2": "a-new-pw-456", "usable_password": "true"},
    )
    assert r.status_code == 302, r.content[:500]
    assert api(token).get("/api/v1/shares/").status_code == 401
