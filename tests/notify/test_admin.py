"""The admin lists the directory's and the notifications' records; a channel's secret and a chat URL's
token are not in its pages."""

import pytest
from django.urls import reverse

from notify.models import Channel, Delivery, Kind

pytestmark = pytest.mark.django_db

PAGES = [
    "directory_identity",
    "directory_directorygroup",
    "directory_teamdirectory",
    "directory_directorymembership",
    "notify_channel",
    "notify_delivery",
]


@pytest.mark.parametrize("name", PAGES)
def test_the_changelist_renders(client, alice, name):
    client.force_login(alice)
    assert client.get(reverse(f"admin:{name}_changelist")).status_code == 200


def test_a_channels_secrets_are_not_shown(client, alice, bob):
    channel = Channel.objects.create(
        user=bob,
        kind=Kind.WEBHOOK,
        url="https://hooks.example.org/T0/B0/token-xyz",
        secret="hmac-abc",
        events=[],
    )
    Delivery.objects.create(channel=channel, subject="s", body="b")
    client.force_login(alice)
    for page in (
        client.get(reverse("admin:notify_channel_changelist")),
        client.get(reverse("admin:notify_channel_change", args=[channel.pk])),
    ):
        text = page.content.decode()
        assert page.status_code == 200 and "token-xyz" not in text and "hmac-abc" not in text


def test_a_channel_switched_back_on_starts_afresh(client, alice, bob):
    from django.utils import timezone

    now = timezone.now()
    channel = Channel.objects.create(
        user=bob,
        kind=Kind.CHAT,
        url="https://hooks.example.org/x",
        events=[],
        failing_since=now,
        disabled_at=now,
    )
    client.force_login(alice)
    page = client.post(
        reverse("admin:notify_channel_change", args=[channel.pk]), {"disabled_at_0": "", "disabled_at_1": ""}
    )
    assert page.status_code == 302, page.content.decode()[:500]
    channel.refresh_from_db()
    assert channel.disabled_at is None and channel.failing_since is None
