"""Issue 30, finding 7: with AXES_RESET_ON_SUCCESS, one address alternating 4 wrong passwords for bob with
1 successful login of its own account guessed bob's password for ever; and anyone could lock `admin`
out from anywhere (the lockout was per username alone). Now a lockout is per username and address, a
success resets only its own username's failures from its own address, a username guessed at from many
addresses is slowed (never locked), and every login endpoint is rate-limited per address. Issue 31:
django-axes logs nothing at INFO."""

import logging
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

TOKEN_URL = "/api/v1/auth/token/"
URLS = ["/login/", "/admin/login/", TOKEN_URL]
LIMIT = 5


@pytest.fixture(autouse=True)
def _limits(settings):
    settings.AXES_FAILURE_LIMIT = LIMIT


@pytest.fixture
def eve(django_user_model):
    """The attacker's own account (a staff user: the admin login accepts her too)."""
    return django_user_model.objects.create_user("eve", "eve@example.com", "eve-pw-123", is_staff=True)


@pytest.fixture
def staff_bob(bob):
    bob.is_staff = True  # so that the admin login's success is a success for him too
    bob.save()
    return bob


def post_login(url: str, username: str, password: str, *, addr="10.0.0.1"):
    if url == TOKEN_URL:
        return APIClient().post(
            url, {"username": username, "password": password}, format="json", REMOTE_ADDR=addr
        )
    return Client().post(url, {"username": username, "password": password}, REMOTE_ADDR=addr)


def logged_in(url: str, response) -> bool:
    if url == TOKEN_URL:
        return response.status_code == 200 and "token" in response.json()
    return response.status_code == 302 and "/login/" not in response["Location"]


@pytest.mark.parametrize("url", URLS)
def test_a_login_of_ones_own_account_does_not_reset_the_count_of_anothers(url, staff_bob, eve):
    """The attack as found: 4 guesses at bob, 1 login as eve, again and again, from one address."""
    guesses = 0
    for _ in range(4):
        for _ in range(4):
            guesses += 1
            if post_login(url, "bob", f"guess-{guesses}").status_code == 429:
                break
        else:
            assert logged_in(url, post_login(url, "eve", "eve-pw-123"))
            continue
        break
    assert guesses == LIMIT  # locked out at the limit, whatever eve's logins in between
    r = post_login(url, "bob", "bob-pw-123")
    assert not logged_in(url, r) and r.status_code == 429
    assert "Too many failed logins for bob from your address" in r.content.decode()
    assert int(r["Retry-After"]) > 60  # the cool-off: LOGIN_COOLOFF_MINUTES


@pytest.mark.parametrize("url", URLS)
def test_nobody_can_lock_the_admin_out_from_elsewhere(url, alice):
    assert logged_in(url, post_login(url, "alice", "alice-pw-123", addr="10.9.9.9"))  # her usual address
    for i in range(40):  # a botnet: many addresses, a few guesses each
        post_login(url, "alice", f"guess-{i}", addr=f"198.51.100.{i // 3}")
    assert logged_in(url, post_login(url, "alice", "alice-pw-123", addr="10.9.9.9"))


@pytest.mark.parametrize("url", URLS)
def test_a_lockout_holds_one_username_at_one_address(url, staff_bob, settings):
    settings.LOGIN_DELAY_MAX_S = 0  # the per-username delay apart: tested below
    for i in range(LIMIT):
        post_login(url, "bob", f"guess-{i}", addr="10.0.1.1")
    assert not logged_in(url, post_login(url, "bob", "bob-pw-123", addr="10.0.1.1"))
    assert logged_in(url, post_login(url, "bob", "bob-pw-123", addr="10.0.1.2"))


def test_a_success_resets_only_its_own_username_at_its_own_address(bob, eve, settings):
    from axes.models import AccessAttempt

    settings.LOGIN_DELAY_MAX_S = 0
    for who, addr in (("bob", "10.0.2.1"), ("eve", "10.0.2.1"), ("bob", "10.0.2.2")):
        post_login("/login/", who, "wrong", addr=addr)
    assert logged_in("/login/", post_login("/login/", "bob", "bob-pw-123", addr="10.0.2.1"))
    left = set(AccessAttempt.objects.values_list("username", "ip_address"))
    assert left == {("eve", "10.0.2.1"), ("bob", "10.0.2.2")}


def request_for(username: str, addr: str = "10.0.3.1"):
    from axes.handlers.proxy import AxesProxyHandler
    from django.test import RequestFactory

    request = RequestFactory().post("/login/", {"username": username}, REMOTE_ADDR=addr)
    AxesProxyHandler.update_request(request)
    return request


def failures(username: str, n: int, last_s_ago: float) -> None:
    from axes.models import AccessAttempt

    attempt = AccessAttempt.objects.create(
        username=username,
        ip_address="203.0.113.1",
        user_agent="",
        get_data="",
        post_data="",
        http_accept="",
        path_info="/login/",
        failures_since_start=n,
    )
    # attempt_time is set on create (auto_now_add): moved back after.
    AccessAttempt.objects.filter(pk=attempt.pk).update(
        attempt_time=timezone.now() - timedelta(seconds=last_s_ago)
    )


@pytest.mark.parametrize(
    ("failed", "wait"),
    [
        (LIMIT - 1, 0),
        (LIMIT, 1),
        (LIMIT + 1, 2),
        (LIMIT + 3, 8),
        (LIMIT + 5, 32),
        (LIMIT + 6, 60),
        (LIMIT + 40, 60),
    ],
)
def test_the_delay_per_username_doubles_up_to_its_cap(bob, settings, failed, wait):
    from config.logins import username_delay_s

    settings.LOGIN_DELAY_MAX_S = 60
    failures("bob", failed, last_s_ago=0)
    assert username_delay_s(request_for("bob"), {"username": "bob"}) == pytest.approx(wait, abs=0.5)


def test_the_delay_counts_from_the_last_failure(bob):
    from config.logins import username_delay_s

    failures("bob", LIMIT + 3, last_s_ago=5)  # waits 8 s after it: 3 s left
    assert username_delay_s(request_for("bob"), {"username": "bob"}) == pytest.approx(3, abs=0.5)
    assert username_delay_s(request_for("bob"), {"username": "bob"}) > 0
    failures("carol", LIMIT + 3, last_s_ago=9)
    assert username_delay_s(request_for("carol"), {"username": "carol"}) == 0


def test_a_delayed_try_is_refused_with_its_wait_and_not_counted(bob):
    from axes.models import AccessAttempt

    failures("bob", LIMIT + 4, last_s_ago=0)
    r = post_login(TOKEN_URL, "bob", "bob-pw-123", addr="10.0.4.1")
    assert r.status_code == 429 and 15 <= int(r["Retry-After"]) <= 16
    assert r.json()["detail"].startswith("Too many failed logins for bob lately (from anywhere)")
    assert AccessAttempt.objects.filter(username="bob").count() == 1  # the refused try added nothing


@pytest.mark.parametrize("url", ["/login/", "/admin/login/"])
def test_the_login_forms_are_rate_limited_per_address(url, staff_bob, monkeypatch):
    from config.logins import LoginThrottle

    monkeypatch.setattr(LoginThrottle, "rate", "3/min", raising=False)
    assert [post_login(url, "nobody", "x", addr="10.0.5.1").status_code for _ in range(3)] == [200] * 3
    r = post_login(url, "bob", "bob-pw-123", addr="10.0.5.1")
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60
    assert "Too many login attempts from your address" in r.content.decode()
    assert logged_in(url, post_login(url, "bob", "bob-pw-123", addr="10.0.5.2"))


def test_a_login_logs_nothing_at_info(bob, caplog):
    with caplog.at_level(logging.INFO):
        assert logged_in("/login/", post_login("/login/", "bob", "bob-pw-123"))
        assert logged_in(TOKEN_URL, post_login(TOKEN_URL, "bob", "bob-pw-123"))
    assert not [r for r in caplog.records if r.name.startswith("axes") and r.levelno < logging.WARNING]


def test_axes_says_no_begin_line(settings):
    assert settings.AXES_VERBOSE is False
