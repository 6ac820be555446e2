"""What the relying party refuses from a real provider: an ID token for another client, from another
issuer, already expired, with a broken signature; a callback replayed (its state used once already) or
carried into another browser; a sign-in the provider refused."""

import pytest
from django.contrib.auth import get_user_model

from tests.directory.provider import SignIn

pytestmark = pytest.mark.django_db(transaction=True)


def refused(page) -> bool:
    return (
        not page.wsgi_request.user.is_authenticated and b"Sign-in with the directory failed" in page.content
    )


@pytest.mark.parametrize(
    "fault, reason",
    [
        ({"aud": "another-client"}, b"Audience doesn"),
        ({"iss": "http://127.0.0.1:1/evil"}, b"Invalid issuer"),
        ({"exp_in": -120}, b"expired"),
        ({"bad_signature": True}, b"Signature verification failed"),
    ],
)
def test_it_refuses_a_bad_id_token(directory, client, fault, reason):
    directory.fault(**fault)
    callback = SignIn(client, directory, "dana").start()
    page = client.get(callback)
    assert page.status_code == 400
    assert refused(page)
    assert reason in page.content
    assert not get_user_model().objects.filter(username="dana").exists()


def test_an_expiry_within_the_leeway_is_accepted(directory, client):
    directory.fault(exp_in=-5)  # OIDC_LEEWAY_S is 30: clocks a few seconds apart
    page = SignIn(client, directory, "dana").sign_in()
    assert page.wsgi_request.user.is_authenticated


def test_a_replayed_callback_is_refused(directory, client):
    sign_in = SignIn(client, directory, "dana")
    callback = sign_in.start()
    assert sign_in.follow(client.get(callback)).wsgi_request.user.is_authenticated
    client.logout()
    page = client.get(callback)  # the same state and code again: the state was used up
    assert page.status_code == 400 and refused(page)


def test_a_callback_carried_into_another_browser_is_refused(directory, client, django_user_model):
    from django.test import Client

    callback = SignIn(client, directory, "dana").start()
    victim = Client()
    victim.get("/login/")
    victim.get("/oidc/authenticate/")  # the victim's browser has states of its own, not this one
    page = victim.get(callback)
    assert page.status_code == 400
    assert not page.wsgi_request.user.is_authenticated


def test_a_refused_sign_in_says_why(directory, client):
    client.get("/oidc/authenticate/")
    page = client.get(
        "/oidc/callback/?error=access_denied&error_description=not+allowed&state=x", follow=True
    )
    assert not page.wsgi_request.user.is_authenticated
    assert b"not allowed" in page.content
