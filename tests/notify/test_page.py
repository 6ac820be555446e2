"""The notifications page: a user's e-mail choices per event, saved and read back; removing a channel
is its owner's (or its team manager's) only."""

import pytest

from notify.models import Channel, Event, Kind
from quotas.choices import Role
from quotas.models import Membership

pytestmark = pytest.mark.django_db


def test_email_choices_are_saved_and_cleared(client, bob):
    client.force_login(bob)
    client.post("/account/notifications/", {"form": "email", "events": [Event.PREEMPTED, Event.ENDED]})
    assert Channel.objects.get(user=bob, kind=Kind.EMAIL).events == [Event.PREEMPTED, Event.ENDED]
    page = client.get("/account/notifications/")
    assert page.context["email_form"].initial["events"] == [Event.PREEMPTED, Event.ENDED]
    client.post("/account/notifications/", {"form": "email"})
    assert not Channel.objects.exists()


def test_a_bad_event_is_a_form_error(client, bob):
    client.force_login(bob)
    page = client.post("/account/notifications/", {"form": "email", "events": ["exploded"]})
    assert page.status_code == 400 and page.context["email_form"].errors["events"]


def test_only_its_owner_or_team_manager_removes_a_channel(client, bob, charlie, vision):
    channel = Channel.objects.create(
        team=vision, kind=Kind.CHAT, url="https://hooks.example.org/x", events=[]
    )
    client.force_login(charlie)
    assert client.post(f"/account/notifications/{channel.pk}/delete/").status_code == 404
    client.force_login(bob)  # a member, not a manager
    assert client.post(f"/account/notifications/{channel.pk}/delete/").status_code == 404
    Membership.objects.filter(user=bob).update(role=Role.MANAGER)
    assert client.post(f"/account/notifications/{channel.pk}/delete/").status_code == 302
    assert not Channel.objects.exists()
