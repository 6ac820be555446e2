"""A directory user's session is checked with the provider again every OIDC_RENEW_ID_TOKEN_EXPIRY_SECONDS
(mozilla-django-oidc's SessionRefresh: a page request goes to the provider with prompt=none and comes
back through the callback, which reads the groups claim again; a provider that no longer knows the user
answers login_required, and the session ends). Past that time a request that cannot be sent round
(an API call, a form post) is answered as a signed-out one."""

from __future__ import annotations

import logging
import time

import requests
from django.conf import settings
from django.contrib import auth
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse
from django.urls import reverse
from django.utils.functional import cached_property
from mozilla_django_oidc.middleware import SessionRefresh

from directory import provider

log = logging.getLogger(__name__)


class DirectorySessionRefresh(SessionRefresh):
    def __init__(self, get_response):
        super(SessionRefresh, self).__init__(get_response)
        self.OIDC_EXEMPT_URLS = ["login", "logout", "/healthz", "/metrics"]
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        self.OIDC_STATE_SIZE = 32
        self.OIDC_AUTHENTICATION_CALLBACK_URL = "oidc_authentication_callback"
        self.OIDC_RP_SCOPES = settings.OIDC_RP_SCOPES
        self.OIDC_USE_NONCE = True
        self.OIDC_NONCE_SIZE = 32

    @cached_property
    def exempt_urls(self):
        # mozilla-django-oidc's list names its own logout URL, which gpuquota leaves out (its /logout/).
        names = [*self.OIDC_EXEMPT_URLS, "oidc_authentication_init", "oidc_authentication_callback"]
        return {url if url.startswith("/") else reverse(url) for url in names}

    def process_request(self, request):
        if not provider.enabled() or not self._is_directory_session(request):
            return None
        if request.session.get("oidc_id_token_expiration", 0) > time.time():
            return None
        if request.path in self.exempt_urls:
            return None  # the sign-in's own pages (the callback renews the time)
        if request.method != "GET" or request.path.startswith("/api/"):
            auth.logout(request)  # no round trip possible: answered as signed out
            return None
        try:
            self.OIDC_OP_AUTHORIZATION_ENDPOINT = provider.discovery()["authorization_endpoint"]
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            # The session cannot be checked: it ends (closed, not open, while the provider is away).
            log.warning("directory session of %s ended: the provider did not answer (%s)", request.user, exc)
            auth.logout(request)
            return None
        response = super().process_request(request)
        if response is not None and getattr(request, "htmx", False):
            # A poll cannot follow a redirect to the provider: the whole page goes, and comes back.
            current = request.htmx.current_url_abs_path or "/"
            request.session["oidc_login_next"] = current
            location = response["Location"]
            response = HttpResponse(status=200)
            response["HX-Redirect"] = location
        return response

    def _is_directory_session(self, request) -> bool:
        return (
            request.user.is_authenticated
            and request.session.get(auth.BACKEND_SESSION_KEY) == "directory.backends.DirectoryBackend"
        )
