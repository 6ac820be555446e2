"""Logins: the client address throttles and lockouts key on, and revoking API tokens when a password
changes. Lockouts are django-axes' (dashboard, admin and API token logins alike: all go through
django.contrib.auth's authenticate()); API tokens are django-rest-knox's (stored as SHA-512 digests,
expiring after API_TOKEN_TTL_HOURS, sent as `Authorization: Token <key>`)."""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.auth import TokenAuthentication as KnoxTokenAuthentication


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
