"""The OpenID Connect provider gpuquota signs in with: OIDC_ISSUER and its discovery document
(`<issuer>/.well-known/openid-configuration`), read on first use and kept for DISCOVERY_TTL_S, so that a
provider that is down at start-up delays sign-ins, not the start."""

from __future__ import annotations

import threading
import time
from typing import Any

import requests
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

DISCOVERY_TTL_S = 3600
_lock = threading.Lock()
_cached: dict[str, tuple[float, dict[str, Any]]] = {}


def enabled() -> bool:
    return bool(settings.OIDC_ISSUER and settings.OIDC_RP_CLIENT_ID)


def issuer() -> str:
    return settings.OIDC_ISSUER.rstrip("/")


def discovery() -> dict[str, Any]:
    """The provider's metadata. Its `issuer` must be OIDC_ISSUER exactly (OpenID Connect Discovery
    4.3): a document that names another issuer is refused, as are its tokens."""
    if not enabled():
        raise ImproperlyConfigured("OIDC_ISSUER and OIDC_CLIENT_ID are needed for directory sign-in")
    key = issuer()
    with _lock:
        hit = _cached.get(key)
        if hit and hit[0] > time.monotonic():
            return hit[1]
    response = requests.get(
        f"{key}/.well-known/openid-configuration",
        timeout=settings.OIDC_TIMEOUT,
        verify=settings.OIDC_VERIFY_SSL,
    )
    response.raise_for_status()
    document = response.json()
    if document.get("issuer", "").rstrip("/") != key:
        raise ImproperlyConfigured(
            f"the provider at {key} calls itself {document.get('issuer')!r}: OIDC_ISSUER must be its issuer"
        )
    for needed in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
        if not document.get(needed):
            raise ImproperlyConfigured(f"the provider's discovery document has no {needed}")
    with _lock:
        _cached[key] = (time.monotonic() + DISCOVERY_TTL_S, document)
    return document


def forget() -> None:
    """Read the discovery document again at the next use (tests, a provider that moved)."""
    with _lock:
        _cached.clear()
