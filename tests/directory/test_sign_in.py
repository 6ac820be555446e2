"""Sign-in through a real OpenID Connect provider (tests/oidc_provider/, its own process): an account
made at the first sign-in and found again by issuer and subject, never by name."""

import pytest
from django.contrib.auth import get_user_model

from directory.models import Identity
from tests.directory.provider import SignIn

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_login_page_offers_the_directory(directory, client):
    page = client.get("/login/")
    assert b'data-testid="directory-login"' in page.content
    assert b'name="password"' in page.content  # local accounts stay


def test_it_signs_in_and_makes_the_account(directory, client):
    page = SignIn(client, directory, "dana").sign_in()
    assert page.status_code == 200
    user = get_user_model().objects.get(username="dana")
    assert page.wsgi_request.user == user
    assert user.email == "dana@example.org"
    assert not user.has_usable_password()
    identity = Identity.objects.get(user=user)
    assert identity.issuer == directory.issuer


def test_it_finds_the_account_again_by_subject(directory, client):
    SignIn(client, directory, "dana").sign_in()
    client.logout()
    SignIn(client, directory, "dana").sign_in()
    assert get_user_model().objects.filter(username__startswith="dana").count() == 1


def test_a_local_account_of_the_same_name_is_not_taken_over(directory, client, django_user_model):
    local = django_user_model.objects.create_user("alice", email="alice@example.org", password="x-local-pw-1")
    page = SignIn(client, directory, "alice").sign_in()
    signed_in = page.wsgi_request.user
    assert signed_in.is_authenticated and signed_in.pk != local.pk
    assert signed_in.username == "alice-2"
