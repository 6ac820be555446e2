"""API tokens for people who sign in through the directory (who have no password): made on the token
page, shown once, valid for the API like a local user's, and lasting at most OIDC_API_TOKEN_TTL_HOURS,
so that someone removed from the directory loses the API at the latest then."""

from datetime import timedelta

import pytest
from django.utils import timezone
from knox.models import AuthToken

from tests.directory.provider import SignIn

pytestmark = pytest.mark.django_db(transaction=True)


def make_token(client) -> str:
    page = client.post("/account/tokens/")
    assert page.status_code == 200
    return page.context["new_key"]


def test_a_directory_user_makes_a_token_that_works(directory, client, settings):
    settings.OIDC_API_TOKEN_TTL_HOURS = 12
    user = SignIn(client, directory, "dana").sign_in().wsgi_request.user
    key = make_token(client)
    api = client.__class__()
    assert api.get("/api/v1/teams/", headers={"Authorization": f"Token {key}"}).status_code == 200
    token = AuthToken.objects.get(user=user)
    assert abs(token.expiry - (timezone.now() + timedelta(hours=12))) < timedelta(minutes=1)
    assert key.encode() not in client.get("/account/tokens/").content  # shown once


def test_it_stops_working_at_its_expiry(directory, client):
    user = SignIn(client, directory, "dana").sign_in().wsgi_request.user
    key = make_token(client)
    AuthToken.objects.filter(user=user).update(expiry=timezone.now() - timedelta(seconds=1))
    api = client.__class__()
    assert api.get("/api/v1/teams/", headers={"Authorization": f"Token {key}"}).status_code == 401


def test_a_local_users_token_lasts_as_long_as_the_api_token_ttl(client, bob, settings):
    client.force_login(bob, backend="directory.backends.LocalBackend")
    make_token(client)
    token = AuthToken.objects.get(user=bob)
    expected = timezone.now() + settings.REST_KNOX["TOKEN_TTL"]
    assert abs(token.expiry - expected) < timedelta(minutes=1)


def test_the_page_needs_a_sign_in(client, db):
    assert client.post("/account/tokens/").status_code == 302
    assert not AuthToken.objects.exists()
