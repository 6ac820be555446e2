"""Directory sign-in (mozilla-django-oidc's views, their endpoints from discovery, a failed sign-in
answered with the login page and its reason rather than a bare error) and the API token page: where a
user who signs in through the directory (who has no password) makes a token for the CLI and the API."""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_http_methods
from knox.models import AuthToken
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from directory import provider
from directory.models import Identity

log = logging.getLogger(__name__)


class SignInView(OIDCAuthenticationRequestView):
    def __init__(self, *args, **kwargs):  # the endpoint is read at the request, from discovery
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request):
        if not provider.enabled():
            raise Http404("directory sign-in is not configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider.discovery()["authorization_endpoint"]
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            log.warning("directory sign-in unavailable: %s", exc)
            messages.error(request, "Sign-in with the directory is unavailable: its provider did not answer.")
            return HttpResponseRedirect(reverse("login"))
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    @property
    def failure_url(self):
        return reverse("login")

    def get(self, request):
        if not provider.enabled():
            raise Http404("directory sign-in is not configured")
        try:
            response = super().get(request)
        except SuspiciousOperation as exc:
            # A replayed or unknown state, a token for someone else: refused, and said so.
            log.warning("directory sign-in refused: %s", exc)
            return self._refused(request, str(exc))
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            log.warning("directory sign-in failed: %s", exc)
            return self._refused(request, "the provider did not answer as expected")
        if not request.user.is_authenticated:
            if request.GET.get("error"):
                reason = request.GET.get("error_description") or request.GET["error"]
                return self._refused(request, reason[:200], status=302)
            return self._refused(request, "the provider's answer was not accepted")
        return response

    def login_success(self):
        response = super().login_success()
        # Due again after OIDC_RENEW_SECONDS, or at the ID token's expiry if that comes first (but not
        # sooner than OIDC_LEEWAY_S: a token accepted within the clock skew would send every page round).
        expiry = getattr(self.request, "oidc_id_token_exp", None)
        if expiry is not None:
            session = self.request.session
            due = min(session["oidc_id_token_expiration"], float(expiry))
            session["oidc_id_token_expiration"] = max(due, time.time() + settings.OIDC_LEEWAY_S)
        return response

    def _refused(self, request, reason: str, status: int = 400):
        if request.user.is_authenticated:
            auth.logout(request)
        messages.error(request, f"Sign-in with the directory failed: {reason}.")
        if status == 302:
            return HttpResponseRedirect(reverse("login"))
        return render(request, "registration/login.html", login_context(request), status=status)


def login_context(request) -> dict:
    return {
        "directory_login": provider.enabled(),
        "directory_name": settings.OIDC_PROVIDER_NAME,
        "hide_local_login": not settings.LOCAL_LOGIN and "local" not in request.GET,
    }


def token_ttl(user) -> timedelta:
    """How long a new API token of this user lasts: a directory user's no longer than
    OIDC_API_TOKEN_TTL_HOURS, so that one who left a group (or the directory) loses the API with it."""
    ttl = settings.REST_KNOX["TOKEN_TTL"]
    if Identity.objects.filter(user=user).exists():
        ttl = min(ttl, timedelta(hours=settings.OIDC_API_TOKEN_TTL_HOURS))
    return ttl


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request):
    """Your API tokens; POST makes a new one, shown once (only its digest is kept)."""
    new_key = None
    if request.method == "POST":
        AuthToken.objects.filter(user=request.user, expiry__lt=timezone.now()).delete()
        _, new_key = AuthToken.objects.create(user=request.user, expiry=token_ttl(request.user))
    rows = AuthToken.objects.filter(user=request.user).order_by("-created")
    return render(
        request,
        "directory/tokens.html",
        {
            "tokens": rows,
            "new_key": new_key,
            "ttl_hours": int(token_ttl(request.user).total_seconds() // 3600),
        },
    )


class LoginView(auth_views.LoginView):
    """The login page: the directory's button where OIDC_ISSUER is set, the password form unless
    LOCAL_LOGIN=0 (then at /login/?local for LOCAL_LOGIN_USERS)."""

    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **login_context(self.request)}
