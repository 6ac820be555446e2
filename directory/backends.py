"""Authentication backends: the directory's (mozilla-django-oidc's code flow, with the checks it leaves
out) and the local passwords' (which LOCAL_LOGIN=0 turns off for all but LOCAL_LOGIN_USERS).

mozilla-django-oidc verifies the ID token's signature and nonce, but not its issuer or audience, and
matches users by e-mail address. Here the token must be for this client (aud, azp), from OIDC_ISSUER
(iss), unexpired (exp, with OIDC_LEEWAY_S), and a user is found by (issuer, subject) only: a directory
account named like a local one (or with its e-mail) never becomes it."""

from __future__ import annotations

import logging

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.utils import timezone
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from directory import provider
from directory.models import Identity
from directory.sync import group_names, sync_memberships

log = logging.getLogger(__name__)
USERNAME_CLAIMS = ("preferred_username", "email", "sub")


class LocalBackend(ModelBackend):
    """Passwords (the login page, the admin's login, the API's token endpoint): off with LOCAL_LOGIN=0
    except for the accounts LOCAL_LOGIN_USERS names (the first admin, break-glass). Tokens already
    made (robots) keep working: they are not a password login."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.LOCAL_LOGIN and username not in settings.LOCAL_LOGIN_USERS:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


class DirectoryBackend(OIDCAuthenticationBackend):
    def __init__(self, *args, **kwargs):
        # The endpoints come from the discovery document, read when a sign-in needs them (not at start).
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_RP_CLIENT_SECRET = settings.OIDC_RP_CLIENT_SECRET
        self.OIDC_RP_SIGN_ALGO = settings.OIDC_RP_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.UserModel = get_user_model()

    def authenticate(self, request, **kwargs):
        if not provider.enabled() or request is None or "code" not in request.GET:
            return None  # not a directory sign-in (a password login asks every backend)
        meta = provider.discovery()
        self.OIDC_OP_TOKEN_ENDPOINT = meta["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = meta.get("userinfo_endpoint", "")
        self.OIDC_OP_JWKS_ENDPOINT = meta["jwks_uri"]
        return super().authenticate(request, **kwargs)

    def _verify_jws(self, payload, key):
        header = jwt.get_unverified_header(payload)
        if header.get("alg") != self.OIDC_RP_SIGN_ALGO:
            raise SuspiciousOperation(
                f"ID token signed with {header.get('alg')!r}, not {self.OIDC_RP_SIGN_ALGO}"
            )
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[self.OIDC_RP_SIGN_ALGO],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=provider.issuer(),
                leeway=settings.OIDC_LEEWAY_S,
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.InvalidTokenError as exc:
            raise SuspiciousOperation(f"ID token refused: {exc}") from exc
        # Several audiences: the token must have been issued to us (OpenID Connect Core 3.1.3.7).
        several = isinstance(claims.get("aud"), list) and len(claims["aud"]) > 1
        if several and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SuspiciousOperation("ID token refused: issued to another client (azp)")
        return claims

    def get_or_create_user(self, access_token, id_token, payload):
        # The session's check with the provider is due no later than the ID token's own end.
        self.request.oidc_id_token_exp = payload["exp"]
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT and access_token:
            userinfo = self.get_userinfo(access_token, id_token, payload)
            if userinfo.get("sub") != payload["sub"]:  # Core 5.3.2: else it is someone else's answer
                raise SuspiciousOperation("userinfo is about another subject")
            claims = {**userinfo, **payload}
        groups_claim = settings.OIDC_GROUPS_CLAIM
        groups = group_names(payload.get(groups_claim, claims.get(groups_claim)))
        with transaction.atomic():
            identity = (
                Identity.objects.select_related("user")
                .select_for_update()
                .filter(issuer=provider.issuer(), subject=payload["sub"])
                .first()
            )
            if identity is None:
                if not settings.OIDC_CREATE_USER:
                    log.info("directory sign-in of an unknown subject refused (OIDC_CREATE_USER=0)")
                    return None
                user = self._create(claims)
                identity = Identity.objects.create(
                    user=user, issuer=provider.issuer(), subject=payload["sub"]
                )
            user = identity.user
            self._update(user, claims)
            identity.groups = groups
            identity.signed_in_at = timezone.now()
            identity.save(update_fields=["groups", "signed_in_at"])
            changes = sync_memberships(user=user, groups=groups)
        if changes:
            log.info("directory sign-in of %s: %s", user.get_username(), "; ".join(changes))
        return user

    def _create(self, claims):
        base = next((str(claims[c]) for c in USERNAME_CLAIMS if claims.get(c)), "user")
        base = "".join(ch for ch in base if ch.isalnum() or ch in "@.+-_")[:140] or "user"
        name, n = base, 1
        while self.UserModel.objects.filter(username=name).exists():
            n += 1
            name = f"{base}-{n}"
        user = self.UserModel.objects.create_user(name, email=claims.get("email") or "")
        user.set_unusable_password()  # signs in through the directory only
        user.save(update_fields=["password"])
        return user

    def _update(self, user, claims):
        fields = {
            "email": (claims.get("email") or "")[:254],
            "first_name": (claims.get("given_name") or "")[:150],
            "last_name": (claims.get("family_name") or "")[:150],
        }
        changed = [f for f, v in fields.items() if getattr(user, f) != v]
        for f in changed:
            setattr(user, f, fields[f])
        if changed:
            user.save(update_fields=changed)
