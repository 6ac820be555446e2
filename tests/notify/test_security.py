"""Webhooks cannot be turned on the control plane (no SSRF): private, loopback and link-local addresses
and the database's and Redis' hosts are refused when saved and again at delivery (a name that resolves
elsewhere by then, DNS rebinding), unless an admin allows them; a secret is never shown back."""

import socket

import pytest

from notify import tasks, urlcheck
from notify.models import Channel, Delivery, Event, Kind

pytestmark = pytest.mark.django_db

PUBLIC = "93.184.215.14"


def resolving_to(monkeypatch, address: str) -> None:
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda host, port, **kw: [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))],
    )


def add_channel(client, url, **extra):
    data = {"form": "channel", "owner": "me", "kind": Kind.CHAT, "url": url, "events": [Event.ENDED], **extra}
    return client.post("/account/notifications/", data)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:6379/",
        "http://localhost:5432/",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/hook",
        "http://0.0.0.0/hook",
        "ftp://example.org/hook",
    ],
)
def test_a_webhook_on_a_private_address_is_refused(client, bob, url):
    client.force_login(bob)
    page = add_channel(client, url)
    assert page.status_code == 400
    assert page.context["channel_form"].errors["url"]
    assert not Channel.objects.exists()


def test_the_database_and_redis_hosts_are_refused_even_when_public(client, bob, settings, monkeypatch):
    settings.REDIS_URL = "redis://redis.example.org:6379/0"
    resolving_to(monkeypatch, PUBLIC)
    with pytest.raises(urlcheck.Refused, match="database or broker"):
        urlcheck.check("http://redis.example.org:6379/")
    urlcheck.check("https://hooks.example.org/x")  # another public host is fine


def test_an_admin_may_allow_a_network(client, bob, settings):
    settings.NOTIFY_ALLOWED_HOSTS = ["10.20.0.0/16"]
    client.force_login(bob)
    assert add_channel(client, "http://10.20.3.4/hook").status_code == 302
    assert add_channel(client, "http://10.21.3.4/hook").status_code == 400


def test_a_name_that_resolves_to_loopback_at_delivery_is_refused(client, bob, vision_share, monkeypatch):
    resolving_to(monkeypatch, PUBLIC)
    client.force_login(bob)
    assert add_channel(client, "https://hooks.example.org/T000/B000/XXXX").status_code == 302
    channel = Channel.objects.get()
    delivery = Delivery.objects.create(channel=channel, subject="s", body="b", payload={"text": "b"})
    resolving_to(monkeypatch, "127.0.0.1")  # DNS rebinding
    with pytest.raises(tasks.DeliveryFailed):
        tasks.deliver(delivery.pk)
    channel.refresh_from_db()
    assert "loopback" in channel.last_error


def test_a_secret_is_never_shown_back(client, bob, monkeypatch):
    resolving_to(monkeypatch, PUBLIC)
    client.force_login(bob)
    made = add_channel(
        client, "https://hooks.example.org/T000/B000/token123", kind=Kind.WEBHOOK, secret="hmac-secret-1"
    )
    assert made.status_code == 302
    page = client.get("/account/notifications/").content.decode()
    assert "hmac-secret-1" not in page and "token123" not in page
    assert "https://hooks.example.org/…" in page and "(signed)" in page


def test_a_json_webhook_needs_a_secret(client, bob, monkeypatch):
    resolving_to(monkeypatch, PUBLIC)
    client.force_login(bob)
    page = add_channel(client, "https://hooks.example.org/x", kind=Kind.WEBHOOK)
    assert page.status_code == 400 and page.context["channel_form"].errors["secret"]


def test_only_a_teams_manager_adds_its_channel(client, bob, vision, monkeypatch):
    resolving_to(monkeypatch, PUBLIC)
    client.force_login(bob)  # a member of vision, not its manager
    page = add_channel(client, "https://hooks.example.org/x", owner="team:vision")
    assert page.status_code == 400 and page.context["channel_form"].errors["owner"]
