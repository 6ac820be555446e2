"""Where a webhook may point (no SSRF into the control plane): http(s) only, and every address its host
resolves to public, unless NOTIFY_ALLOWED_HOSTS (host names, addresses or networks) lets an admin allow
one. Not loopback, private (RFC 1918, fc00::/7), link-local (169.254/16: cloud metadata), shared,
reserved, multicast or unspecified, nor the hosts of DATABASE_URL and REDIS_URL. Checked when a URL is
saved and again at each delivery, which then connects to the address it checked (a name that resolves
to a public address when saved and to 127.0.0.1 later, DNS rebinding, is refused)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings


class Refused(ValueError):
    pass


def _control_plane_hosts() -> set[str]:
    hosts = set()
    for url in (settings.DATABASES["default"].get("HOST") or "", settings.REDIS_URL):
        host = urlsplit(url).hostname if "://" in url else url
        if host:
            hosts.add(host.lower())
    return hosts


def _allowed(host: str, address: ipaddress._BaseAddress) -> bool:
    for entry in settings.NOTIFY_ALLOWED_HOSTS:
        try:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            if entry.lower() == host:
                return True
    return False


def check(url: str) -> tuple[str, int, list[str]]:
    """(host, port, the addresses to connect to) of an allowed URL; raises Refused with the reason."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("must be an http:// or https:// URL")
    if parts.username or parts.password:
        raise Refused("must not hold a user name or password (use the secret for signing)")
    host = parts.hostname.lower()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise Refused("has a bad port") from exc
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Refused(f"its host {host} does not resolve") from exc
    addresses = sorted({info[4][0] for info in infos})
    for text in addresses:
        address = ipaddress.ip_address(text.split("%")[0])
        if _allowed(host, address):
            continue
        if host in _control_plane_hosts():
            raise Refused(f"{host} is this installation's database or broker")
        if not address.is_global or address.is_multicast:
            raise Refused(
                f"{host} is a private, loopback or link-local address ({address}); an admin may allow it "
                "with NOTIFY_ALLOWED_HOSTS"
            )
    return host, port, addresses
