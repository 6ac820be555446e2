"""How logins hold against guessing (django-axes through LoginAttemptHandler, for the dashboard's, the
admin's and the API's token logins alike: all go through django.contrib.auth's authenticate()):

- wrong passwords lock out one username from one address (LOGIN_FAILURE_LIMIT, LOGIN_COOLOFF_MINUTES;
  AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]); a successful login resets only its own
  username's failures from its own address (one address alternating guesses at bob with logins of its
  own account used to reset bob's count, AXES_RESET_ON_SUCCESS with per-address lockout);
- a username guessed at from many addresses is slowed, not locked: past LOGIN_FAILURE_LIMIT failures in
  the cool-off window each further try waits 1, 2, 4 ... up to LOGIN_DELAY_MAX_S seconds after the last
  failure, except from an address that user has logged in from before, so nobody can lock `admin` out
  from elsewhere;
- every login endpoint takes at most LOGIN_RATE tries per client address (LoginThrottle), the right
  password included.

A refusal is a 429 with Retry-After that says which rule and for how long (lockout_response)."""

from __future__ import annotations

import math

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.utils import timezone
from rest_framework.throttling import SimpleRateThrottle

from config.auth import client_ip


def _username(request, credentials) -> str | None:
    from axes.helpers import get_client_username

    return get_client_username(request, credentials)


def username_delay_s(request, credentials, now=None) -> float:
    """Seconds a login for this username must still wait: 0 until it has had LOGIN_FAILURE_LIMIT
    failures within the cool-off window (from any address), then 1, 2, 4 ... up to LOGIN_DELAY_MAX_S
    after its latest failure. 0 from an address this user has logged in from before: the owner is
    never locked out by others' guessing."""
    from axes.attempts import get_cool_off_threshold
    from axes.models import AccessAttempt, AccessLog
    from django.db.models import Max, Sum

    username = _username(request, credentials)
    cap = settings.LOGIN_DELAY_MAX_S
    if not username or cap <= 0:
        return 0.0
    got = AccessAttempt.objects.filter(
        username=username, attempt_time__gte=get_cool_off_threshold(request)
    ).aggregate(failures=Sum("failures_since_start"), last=Max("attempt_time"))
    over = (got["failures"] or 0) - settings.AXES_FAILURE_LIMIT
    if over < 0 or got["last"] is None:
        return 0.0
    wait = min(2.0**over, float(cap)) - ((now or timezone.now()) - got["last"]).total_seconds()
    if wait <= 0:
        return 0.0
    if AccessLog.objects.filter(
        username=username, ip_address=getattr(request, "axes_ip_address", None)
    ).exists():
        return 0.0
    return wait


class LoginAttemptHandler(AxesDatabaseHandler):
    """django-axes' database handler with AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]] (a
    lockout and its reset on success are per username and address), plus the per-username delay. Why
    a login was refused is left on the request for lockout_response."""

    def is_locked(self, request, credentials=None) -> bool:
        if super().is_locked(request, credentials):
            request.gpuquota_login_refused = ("lockout", _cooloff_left_s(request, credentials))
            return True
        wait = username_delay_s(request, credentials)
        if wait > 0:
            request.gpuquota_login_refused = ("delay", wait)
            return True
        return False


def _cooloff_left_s(request, credentials) -> float:
    from axes.helpers import get_cool_off
    from axes.models import AccessAttempt

    cool_off = get_cool_off(request)
    last = (
        AccessAttempt.objects.filter(
            username=_username(request, credentials), ip_address=getattr(request, "axes_ip_address", None)
        )
        .order_by("-attempt_time")
        .values_list("attempt_time", flat=True)
        .first()
    )
    if cool_off is None or last is None:
        return cool_off.total_seconds() if cool_off else 0.0
    return max(1.0, (last + cool_off - timezone.now()).total_seconds())


def _in_words(seconds: float) -> str:
    seconds = math.ceil(seconds)
    if seconds < 120:
        return f"{seconds} s"
    return f"{math.ceil(seconds / 60)} minutes"


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: a 429 with Retry-After that says why and for how long, as JSON for the API
    and as the login page (its form, the reason above it) for the dashboard and the admin."""
    from django.http import JsonResponse
    from django.shortcuts import render

    kind, wait = getattr(request, "gpuquota_login_refused", ("lockout", 0.0))
    who = _username(request, credentials) or "this username"
    if kind == "delay":
        message = (
            f"Too many failed logins for {who} lately (from anywhere): the next try is allowed in "
            f"{_in_words(wait)}."
        )
    else:
        message = (
            f"Too many failed logins for {who} from your address: try again in {_in_words(wait)} "
            f"(LOGIN_COOLOFF_MINUTES)."
        )
    if request.path.startswith("/api/"):
        response = JsonResponse({"detail": message}, status=settings.AXES_HTTP_RESPONSE_CODE)
    else:
        from django.contrib.auth.forms import AuthenticationForm

        context = {
            "form": AuthenticationForm(request),
            "lockout": message,
            "next": request.POST.get("next", ""),
        }
        response = render(
            request, "registration/login.html", context, status=settings.AXES_HTTP_RESPONSE_CODE
        )
    response["Retry-After"] = str(max(1, math.ceil(wait)))
    return response


class LoginThrottle(SimpleRateThrottle):
    """Login tries per client address (REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["login"]), whoever is
    logged in, on every login endpoint: the API's token view (as a DRF throttle) and the dashboard's and
    the admin's login forms (LoginRateMiddleware) share one count per address."""

    scope = "login"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": client_ip(request)}


class LoginRateMiddleware:
    """POSTs to /login/ and /admin/login/ past LOGIN_RATE per address: 429 with Retry-After, before any
    password is checked (the API's token view has LoginThrottle itself)."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.paths: tuple[str, ...] | None = None

    def __call__(self, request):
        if request.method == "POST":
            if self.paths is None:
                from django.urls import reverse

                self.paths = (reverse("login"), reverse("admin:login"))
            if request.path in self.paths:
                throttle = LoginThrottle()
                if not throttle.allow_request(request, None):
                    return self._refused(request, throttle.wait())
        return self.get_response(request)

    def _refused(self, request, wait):
        from django.contrib.auth.forms import AuthenticationForm
        from django.shortcuts import render

        wait = max(1, math.ceil(wait or 1))
        message = f"Too many login attempts from your address: try again in {_in_words(wait)}."
        context = {
            "form": AuthenticationForm(request),
            "lockout": message,
            "next": request.POST.get("next", ""),
        }
        response = render(request, "registration/login.html", context, status=429)
        response["Retry-After"] = str(wait)
        return response
