"""Memberships that follow the directory's groups at every sign-in (and at every renewal of the session
with the provider): added, promoted, removed, each an audit entry; a membership made by hand is left
alone; someone removed from a group loses the team at the session's next check with the provider."""

import pytest
from django.test import Client

from directory.models import DirectoryGroup, TeamDirectory
from quotas.choices import Role
from quotas.models import AuditEntry, Membership
from tests.directory.provider import SignIn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def vision_from_directory(vision):
    TeamDirectory.objects.create(
        team=vision, members_from=["oidc:vision-researchers"], managers_from=["oidc:vision-leads"]
    )
    return vision


def roles(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def renew(client) -> None:
    """The session's time with the provider is up (as OIDC_RENEW_SECONDS after the sign-in)."""
    session = client.session
    session["oidc_id_token_expiration"] = 0
    session.save()


def test_the_groups_claim_decides_the_memberships_at_each_sign_in(directory, client, vision_from_directory):
    directory.set_groups("dana", ["vision-researchers", "unrelated"])
    user = SignIn(client, directory, "dana").sign_in().wsgi_request.user
    assert roles(user) == {"vision": Role.MEMBER}
    assert set(DirectoryGroup.objects.values_list("name", flat=True)) == {
        "oidc:vision-researchers",
        "oidc:unrelated",
    }

    client.logout()
    directory.set_groups("dana", ["vision-leads"])
    SignIn(client, directory, "dana").sign_in()
    assert roles(user) == {"vision": Role.MANAGER}

    client.logout()
    directory.set_groups("dana", [])
    SignIn(client, directory, "dana").sign_in()
    assert roles(user) == {}

    entries = AuditEntry.objects.filter(action="directory", object_type="team").order_by("at", "id")
    assert [(e.changes[0]["before"], e.changes[0]["after"]) for e in entries] == [
        (None, "member"),
        ("member", "manager"),
        ("manager", None),
    ]
    assert all(e.actor is None and e.changes[0]["field"] == "members.dana" for e in entries)


def test_a_membership_made_by_hand_is_left_alone(directory, client, vision_from_directory, django_user_model):
    directory.set_groups("dana", [])
    user = SignIn(client, directory, "dana").sign_in().wsgi_request.user
    Membership.objects.create(team=vision_from_directory, user=user, role=Role.MEMBER)  # the layout's
    client.logout()
    SignIn(client, directory, "dana").sign_in()
    assert roles(user) == {"vision": Role.MEMBER}


def test_someone_removed_from_the_group_loses_the_team_at_the_next_check(
    directory, client, vision_from_directory
):
    directory.set_groups("dana", ["vision-researchers"])
    browser = SignIn(client, directory, "dana")
    user = browser.sign_in().wsgi_request.user
    assert roles(user) == {"vision": Role.MEMBER}

    directory.set_groups("dana", [])
    assert client.get("/").status_code == 200  # within OIDC_RENEW_SECONDS: the session stands
    assert roles(user) == {"vision": Role.MEMBER}

    renew(client)
    first = client.get("/")
    assert first.status_code == 302 and "prompt=none" in first["Location"]
    page = browser.follow(first)  # to the provider and back, without a password
    assert page.status_code == 200 and page.wsgi_request.user == user
    assert roles(user) == {}


def test_someone_the_provider_no_longer_signs_in_is_signed_out(directory, client, vision_from_directory):
    directory.set_groups("dana", ["vision-researchers"])
    browser = SignIn(client, directory, "dana")
    browser.sign_in()
    browser.provider_session.cookies.clear()  # signed out at the directory (or removed from it)
    renew(client)
    page = browser.follow(client.get("/"))
    assert not page.wsgi_request.user.is_authenticated


def test_an_api_call_after_the_check_is_due_is_answered_as_signed_out(directory, client):
    SignIn(client, directory, "dana").sign_in()
    assert client.get("/api/v1/teams/").status_code == 200
    renew(client)
    assert client.get("/api/v1/teams/").status_code == 401
    assert client.get("/api/v1/teams/").status_code == 401  # signed out, not sent round


def test_a_poll_sends_the_whole_page_round(directory, client):
    SignIn(client, directory, "dana").sign_in()
    renew(client)
    poll = client.get("/", headers={"HX-Request": "true", "HX-Current-URL": "http://testserver/jobs/?page=2"})
    assert poll.status_code == 200 and "prompt=none" in poll["HX-Redirect"]
    assert client.session["oidc_login_next"] == "/jobs/?page=2"


def test_local_sessions_are_not_sent_to_the_provider(directory, bob):
    local = Client()
    local.force_login(bob, backend="directory.backends.LocalBackend")
    renew(local)
    assert local.get("/").status_code == 200


def test_a_session_due_for_its_check_ends_while_the_provider_is_away(directory, client, settings):
    from directory import provider

    SignIn(client, directory, "dana").sign_in()
    renew(client)
    settings.OIDC_ISSUER = "http://127.0.0.1:1/o"  # nobody answers there
    provider.forget()
    page = client.get("/")
    assert page.status_code == 302 and page["Location"].startswith("/login/")
    assert not page.wsgi_request.user.is_authenticated


def test_the_check_is_due_at_the_id_tokens_expiry_when_it_comes_first(directory, client, settings):
    import time

    settings.OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS = 900
    directory.fault(exp_in=60)  # the provider's ID token lasts one minute
    SignIn(client, directory, "dana").sign_in()
    due = client.session["oidc_id_token_expiration"]
    assert time.time() + 50 < due < time.time() + 61
    directory.fault()
    client.logout()
    SignIn(client, directory, "dana").sign_in()  # the provider's 300 s, still before 900 s
    assert client.session["oidc_id_token_expiration"] < time.time() + 301
