"""API tokens and the client address: the address throttles and lockouts key on (client_ip; how logins
are locked out and slowed is config/logins.py), and tokens. API tokens are django-rest-knox's (stored as
SHA-512 digests, expiring after API_TOKEN_TTL_HOURS, sent as `Authorization: Token <key>`), revoked with
a password change; revoking one (logout, DELETE, a password change, a user deactivated) takes effect at
once in every process: a revocation generation in the shared cache (see cached_token)."""

from __future__ import annotations

import binascii
import copy
import logging
import time

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.crypto import hash_token
from rest_framework.exceptions import AuthenticationFailed

log = logging.getLogger(__name__)


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
    are swept when they log in (config.api_auth.ObtainTokenView). A token that is not printable ASCII
    (a non-UTF-8 byte, a NUL) is refused as any wrong token is: 401, not a 500."""

    def authenticate_credentials(self, token):
        if not _plausible_key(token):
            raise AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)

    def _cleanup_token(self, auth_token) -> bool:
        if auth_token.expiry is not None and auth_token.expiry < timezone.now():
            auth_token.delete()
            return True
        return False


def _plausible_key(token) -> bool:
    """Whether a token as sent could be one (printable ASCII, no NUL): anything else is refused before it
    is decoded or reaches the database."""
    if isinstance(token, bytes):
        return token.isascii() and token.decode("ascii").isprintable()
    return isinstance(token, str) and token.isascii() and token.isprintable()


# --- the token cache of the quick submit path (jobs.api.fast_submit) ------------------------------
# SHA-512 digest of a token -> (cached until, on the monotonic clock; user; knox AuthToken; the revocation
# generation when it was cached). For API_TOKEN_CACHE_S seconds a token's user is taken from this
# process's memory instead of the database, as long as the shared cache's revocation generation has not
# moved: deleting a token (logout, revoke, password change, expiry) or saving or deleting a user (a
# deactivation) bumps it, so every process stops using its cached tokens at once (the quick submit path
# reads the generation in the round trip it makes anyway). A token's own expiry is checked on every hit.
_TOKENS: dict[str, tuple[float, object, object, int | None]] = {}
MAX_CACHED_TOKENS = 10_000
REVOCATIONS_KEY = "gpuquota:token-revocations"


def _now() -> float:
    return time.monotonic()


def revocation_generation() -> int | None:
    """The shared cache's revocation generation (None: never bumped, or the cache is unreachable)."""
    from django.core.cache import cache

    try:
        value = cache.get(REVOCATIONS_KEY)
    except Exception:  # noqa: BLE001 - an unreachable cache: the caller trusts no cached token
        return -1
    return None if value is None else int(value)


def bump_revocations() -> None:
    """A token or a user changed: every process's cached tokens are stale from now on."""
    from django.core.cache import cache

    try:
        cache.add(REVOCATIONS_KEY, 0, timeout=None)
        cache.incr(REVOCATIONS_KEY)
    except Exception:  # noqa: BLE001 - the cache is down: so is the quick path's trust in it (-1 above)
        log.warning("could not bump the token revocation generation in the cache", exc_info=True)


def cached_token(header: str):
    """(user, AuthToken, generation) for an `Authorization: Token <key>` header whose token is valid,
    else None (the caller then lets knox answer, with its own 401). The user is a copy: each request its
    own. `generation` is the revocation generation the entry was made under: the caller must see it
    unchanged in the shared cache (revoked_since) before it trusts a hit."""
    parts = header.split()
    if len(parts) != 2 or parts[0].lower() != "token" or not _plausible_key(parts[1]):
        return None
    key = parts[1]
    try:
        digest = hash_token(key)
    except (TypeError, ValueError, binascii.Error):
        return None
    now = _now()
    hit = _TOKENS.get(digest)
    if hit is not None:
        until, user, token, generation = hit
        if until > now and (token.expiry is None or token.expiry > timezone.now()):
            return copy.copy(user), token, generation
        _TOKENS.pop(digest, None)
    generation = revocation_generation()  # before the database: a revocation after it moves it on
    try:
        user, token = TokenAuthentication().authenticate_credentials(key.encode())
    except AuthenticationFailed:
        return None
    ttl = getattr(settings, "API_TOKEN_CACHE_S", 0)
    if ttl > 0 and generation != -1:
        if len(_TOKENS) >= MAX_CACHED_TOKENS:
            _TOKENS.clear()
        _TOKENS[digest] = (now + ttl, user, token, generation)
    return copy.copy(user), token, generation


def revoked_since(generation: int | None, current: int | None) -> bool:
    """Whether tokens may have been revoked since `generation` (current: the shared cache's now, -1 when
    it could not be read). When so, the caller forgets this process's cached tokens and asks the
    database."""
    if current != generation or current == -1:
        _TOKENS.clear()
        return True
    return False


def _forget_token(sender, instance, **kwargs) -> None:
    _TOKENS.pop(instance.digest, None)
    if kwargs.get("signal") is post_delete:
        bump_revocations()


def _forget_user(sender, instance, **kwargs) -> None:
    if kwargs.get("created") or set(kwargs.get("update_fields") or ()) == {"last_login"}:
        return  # a new user, or a login (update_last_login): nothing any cached token depends on
    for digest, (_, user, _, _) in list(_TOKENS.items()):
        if user.pk == instance.pk:
            _TOKENS.pop(digest, None)
    bump_revocations()


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
