"""LOCAL_LOGIN=0: no password sign-in (page, admin, API) but for LOCAL_LOGIN_USERS; tokens made before
keep working (robots)."""

import pytest
from knox.models import AuthToken


@pytest.fixture
def no_local(settings):
    settings.LOCAL_LOGIN = False
    settings.LOCAL_LOGIN_USERS = ["alice"]
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def test_the_password_form_is_gone(no_local, client, db):
    assert b'name="password"' not in client.get("/login/").content
    assert b'name="password"' in client.get("/login/?local").content  # break-glass


def test_passwords_are_refused_but_for_the_listed_accounts(no_local, client, alice, bob):
    client.post("/login/", {"username": "bob", "password": "bob-pw-123"})
    assert "_auth_user_id" not in client.session
    client.post("/login/", {"username": "alice", "password": "alice-pw-123"})
    assert client.session["_auth_user_id"] == str(alice.pk)


def test_the_api_refuses_a_password_but_takes_a_token(no_local, client, bob):
    refused = client.post(
        "/api/v1/auth/token/", {"username": "bob", "password": "bob-pw-123"}, content_type="application/json"
    )
    assert refused.status_code == 400
    _, key = AuthToken.objects.create(user=bob)
    assert client.get("/api/v1/teams/", headers={"Authorization": f"Token {key}"}).status_code == 200


def test_local_login_stays_by_default(client, bob):
    client.post("/login/", {"username": "bob", "password": "bob-pw-123"})
    assert client.session["_auth_user_id"] == str(bob.pk)
