"""Logins: the client address throttles and lockouts key on, and revoking API tokens when a password
changes. Lockouts are django-axes' (dashboard, admin and API token logins alike: all go through
django.contrib.auth's authenticate()); API tokens are django-rest-knox's (stored as SHA-512 digests,
expiring after API_TOKEN_TTL_HOURS, sent as `Authorization: Token <key>`)."""

from __future__ import annotations

import binascii
import copy
import time

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.crypto import hash_token
from rest_framework.exceptions import AuthenticationFailed


def client_ip(request) -> str:
    """The client's address as the first of NUM_PROXIES trusted reverse proxies saw it (X-Forwarded-For
    counted from the right, as DRF's throttles do), else REMOTE_ADDR: a client cannot choose it by
    sending an X-Forwarded-For of its own. Used by django-axes (AXES_CLIENT_IP_CALLABLE)."""
    meta = getattr(request, "META", {})
    forwarded = meta.get("HTTP_X_FORWARDED_FOR", "")
    proxies = settings.REST_FRAMEWORK.get("NUM_PROXIES") or 0
    if proxies and forwarded:
        addresses = [a.strip() for a in forwarded.split(",") if a.strip()]
        if addresses:
            return addresses[-min(proxies, len(addresses))]
    return meta.get("REMOTE_ADDR", "")


class RevokeTokensOnPasswordChange:
    """Not a rule for passwords: Django calls every validator's password_changed() whenever a user's
    password is set and saved (admin, set_password, the password change views); this one revokes the
    user's API tokens then, so a leaked token dies with the password."""

    def validate(self, password, user=None) -> None:
        return None

    def password_changed(self, password, user=None) -> None:
        if user is not None and user.pk:
            from knox.models import AuthToken

            AuthToken.objects.filter(user=user).delete()

    def get_help_text(self) -> str:
        return ""


class TokenAuthentication(KnoxTokenAuthentication):
    """knox's token authentication, less its sweep of the user's other tokens on every request (a query
    per API call): an expired token is still deleted and refused when used, and a user's expired tokens
    are swept when they log in (config.api_auth.ObtainTokenView)."""

    def _cleanup_token(self, auth_token) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False


# --- the token cache of the quick submit path (jobs.api.fast_submit) ------------------------------
# SHA-512 digest of a token -> (cached until, on the monotonic clock; user; knox AuthToken). For
# API_TOKEN_CACHE_S seconds a token's user is taken from this process's memory instead of the database.
# Deleting a token (logout, revoke, password change, expiry), saving it, or saving or deleting its user
# drops the entry at once in the process that did it; in the web server's other processes the token
# works on for at most API_TOKEN_CACHE_S seconds. A token's own expiry is checked on every hit.
_TOKENS: dict[str, tuple[float, object, object]] = {}
MAX_CACHED_TOKENS = 10_000


def _now() -> float:
    return time.monotonic()


def cached_token(header: str):
    """(user, AuthToken) for an `Authorization: Token <key>` header whose token is valid, else None (the
    caller then lets knox answer, with its own 401). The user is a copy: each request its own."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "token" or not parts[1].isascii():
        return None
    key = parts[1]
    try:
        digest = hash_token(key)
    except (TypeError, ValueError, binascii.Error):
        return None
    now = _now()
    hit = _TOKENS.get(digest)
    if hit is not None:
        until, user, token = hit
        if until > now and (token.expiry is None or token.expiry > timezone.now()):
            return copy.copy(user), token
        _TOKENS.pop(digest, None)
    try:
        user, token = TokenAuthentication().authenticate_credentials(key.encode())
    except AuthenticationFailed:
        return None
    ttl = getattr(settings, "API_TOKEN_CACHE_S", 0)
    if ttl <= 0:
        return user, token
    if len(_TOKENS) >= MAX_CACHED_TOKENS:
        _TOKENS.clear()
    _TOKENS[digest] = (now + ttl, user, token)
    return copy.copy(user), token


def _forget_token(sender, instance, **kwargs) -> None:
    _TOKENS.pop(instance.digest, None)


def _forget_user(sender, instance, **kwargs) -> None:
    for digest, (_, user, _) in list(_TOKENS.items()):
        if user.pk == instance.pk:
            _TOKENS.pop(digest, None)


for _signal in (post_save, post_delete):
    _signal.connect(_forget_token, sender="knox.AuthToken", weak=False, dispatch_uid=f"gq-tok-{_signal}")
    _signal.connect(
        _forget_user, sender=settings.AUTH_USER_MODEL, weak=False, dispatch_uid=f"gq-user-{_signal}"
    )


class TokenScheme(OpenApiAuthenticationExtension):
    """The schema's description of TokenAuthentication (the same `tokenAuth` scheme as before knox)."""

    target_class = "config.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": 'Token-based authentication with required prefix "Token"',
        }
