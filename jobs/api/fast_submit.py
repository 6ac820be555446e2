"""The quick way in for `POST /api/v1/jobs/` with `Authorization: Token ...`: the common, well-formed
single-job submit, answered without DRF's request machinery and without the middleware a token request
does not need (sessions, CSRF, messages, auth, htmx, axes). About a third of the web server's CPU per
submit (bench 3, bench/RESULTS.md "Intake").

It takes a request only when the answer is certain to be the one the DRF view (JobViewSet.create) would
give: a JSON object whose fields have exactly the types, ranges and characters the submit serializer
accepts unchanged, an existing share, a throttle that lets it through, and a service that accepts the job.
Everything else (a bad or unknown token, another content type or Accept, a value DRF would coerce or
refuse, an array, a 400/403/429 of any kind) goes on to the full stack, which answers it from scratch,
so errors stay exactly DRF's and the service's. Nothing is written before the service has validated the
job (one statement inserts job and event). The throttle is counted once: a request the quick way counted
is not counted again by the DRF view it falls back to.

Tokens are looked up through config.auth.cached_token (an in-process cache of API_TOKEN_CACHE_S seconds,
trusted only while the shared cache's token revocation generation is the one it was filled under: a
revoked token stops at once in every process). On Redis and PostgreSQL a warm submit is one Redis round
trip (the throttle's count with the revocation generation, the submit cache's node shapes, the user's
teams and the share: _count_and_read) and one statement, which inserts only if the cached share still has
the facts the job was decided on and the user has fewer than MAX_QUEUED_PER_USER jobs queued
(jobs.services.insert_job_with_event); when not, nothing is written and the full stack decides from the
database (and answers a 400 with both numbers for a full queue).
FAST_SUBMIT=0 turns the quick way off."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpResponse

from jobs.api.throttles import COUNTED

# DRF's JobViewSet answers a list route with these (its finalize_response sets them on every answer).
ALLOW = "GET, POST, HEAD, OPTIONS"
ACCEPTS = frozenset({None, "", "*/*", "application/json"})

_STR_FIELDS = {"share", "name", "gpu_type"}
_INT_FIELDS = {"gpus", "priority", "max_preemptions"}
_NULLABLE_INT_FIELDS = {"max_runtime_s", "preemption_grace_s"}
KNOWN = frozenset({*_STR_FIELDS, *_INT_FIELDS, *_NULLABLE_INT_FIELDS, "command", "env", "use_shell", "array"})
REQUIRED = ("share", "gpu_type", "gpus", "command")
DEFAULTS = {
    "name": "",
    "priority": 0,
    "env": {},
    "max_runtime_s": None,
    "preemption_grace_s": None,
    "max_preemptions": -1,
    "use_shell": False,
}


def _refuse_constant(name):
    raise ValueError(name)  # NaN, Infinity: DRF's strict JSON parser refuses them


def _plain_int(value) -> bool:
    from jobs.limits import MAX_INT

    return type(value) is int and -MAX_INT <= value <= MAX_INT


def _plain_text(value) -> bool:
    """A string DRF's CharField(trim_whitespace=False) keeps as it is: no NUL, no lone surrogate."""
    if type(value) is not str or "\x00" in value:
        return False
    if value.isascii():
        return True
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def _trimmed_text(value, max_length: int, *, allow_blank: bool) -> bool:
    """A string a trimming CharField keeps as it is (and printable: no validator can refuse it)."""
    return (
        type(value) is str
        and len(value) <= max_length
        and (allow_blank or value != "")
        and value == value.strip()
        and value.isprintable()
    )


def plain_fields(data) -> dict | None:
    """The submit's fields as JobSubmitSerializer would validate them, if it would accept them without
    changing a value; None when in any doubt (the DRF view decides then)."""
    if type(data) is not dict or not data.keys() <= KNOWN or "array" in data:
        return None
    if any(name not in data for name in REQUIRED):
        return None
    share = data["share"]
    if type(share) is not str or not 0 < len(share) <= 63:
        return None
    if "name" in data and not _trimmed_text(data["name"], 200, allow_blank=True):
        return None
    if not _trimmed_text(data["gpu_type"], 32, allow_blank=False):
        return None
    for name in _INT_FIELDS:
        if name in data and not _plain_int(data[name]):
            return None
    for name in _NULLABLE_INT_FIELDS:
        if data.get(name) is not None and not _plain_int(data[name]):
            return None
    command = data["command"]
    if type(command) is not list or not all(_plain_text(a) for a in command):
        return None
    if "env" in data:
        env = data["env"]
        if type(env) is not dict or not all(_plain_text(v) for v in env.values()):
            return None
    if "use_shell" in data and type(data["use_shell"]) is not bool:
        return None
    fields = {**DEFAULTS, **data}
    if "env" in data:
        fields["env"] = dict(data["env"])
    fields["command"] = list(command)
    return fields


class _ThrottleRequest:
    """What SubmitThrottle reads of a request: the user and the address headers."""

    def __init__(self, request, user):
        self._request, self.user, self.META = request, user, request.META


REVOKED = "revoked"  # _count_and_read's answer when the token cache may be stale


def _count_and_read(throttle_request, user, name: str, generation: int | None):
    """The throttle's count, the token revocation generation and the submit cache's values (node shapes,
    the user's teams, the share) in one Redis round trip: (allowed, share or None, Known), or REVOKED
    when tokens were revoked since the user's token was cached (config.auth.cached_token). None when
    that cannot be done here (the cache is not Redis, the database is not PostgreSQL, Redis failed): the
    caller asks as before."""
    import re

    from django.db import connections, router

    from config.auth import REVOCATIONS_KEY, revoked_since
    from jobs import services, submit_cache
    from jobs.api.throttles import SubmitThrottle
    from jobs.models import Job
    from quotas.models import SHARE_NAME_RE

    if connections[router.db_for_write(Job)].vendor != "postgresql" or not re.match(SHARE_NAME_RE, name):
        return None  # the checked insert is PostgreSQL's; a name no share can have is DRF's 400
    keys = [
        REVOCATIONS_KEY,
        submit_cache.shapes_key(),
        submit_cache.teams_key(user.pk),
        submit_cache.share_key(name),
    ]
    try:
        got = SubmitThrottle().count_and_read(throttle_request, keys)
    except Exception:  # noqa: BLE001 - Redis is a shortcut here; the caller goes the long way
        return None
    if got is None:
        return None
    allowed, raw = got
    if not allowed:
        return False, None, None
    revocations, raw = raw[0], raw[1:]
    if revoked_since(generation, None if revocations is None else int(revocations)):
        return REVOKED
    shapes, team_ids, share_value = (None if v is None else submit_cache.loads(v) for v in raw)
    if shapes is None or team_ids is None:
        shapes, team_ids = submit_cache.lookup(user.pk)
    found = submit_cache.load_share(name) if share_value is None else submit_cache.cached_share(share_value)
    if found is None:
        return True, None, None
    share, capacities = found
    return True, share, services.Known(shapes=shapes, team_ids=team_ids, capacities=capacities)


def fast_submit(request) -> HttpResponse | None:
    """The 201 for a plain, valid single-job submit; None to let the full stack answer."""
    from config.auth import cached_token, revocation_generation, revoked_since
    from jobs import services, submit_cache
    from jobs.api.serializers import submitted_data
    from jobs.api.throttles import SubmitThrottle
    from jobs.queries import share_by_name

    meta = request.META
    if meta.get("HTTP_ACCEPT") not in ACCEPTS:
        return None
    content_type = meta.get("CONTENT_TYPE", "")
    if content_type != "application/json" and content_type.replace(" ", "").lower() not in (
        "application/json;charset=utf-8",
    ):
        return None
    try:
        length = int(meta.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if length <= 0 or (limit is not None and length > limit):
        return None
    found = cached_token(meta.get("HTTP_AUTHORIZATION", ""))
    if found is None:
        return None
    user, auth_token, generation = found
    try:
        data = json.loads(request.body.decode("utf-8"), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None
    fields = plain_fields(data)
    if fields is None:
        return None
    name = fields.pop("share")
    throttle_request = _ThrottleRequest(request, user)
    quick = _count_and_read(throttle_request, user, name, generation)
    if quick is REVOKED:
        setattr(request, COUNTED, True)  # the script counted it: the DRF view does not again
        return None  # the full stack asks the database about the token (401 if it is gone)
    if quick is None:  # the cache is not Redis, or it failed: the same, a question at a time
        if revoked_since(generation, revocation_generation()):
            return None
        share, known = share_by_name(name), None
        if share is None or not SubmitThrottle().allow_request(throttle_request, None):
            return None
    elif not quick[0]:
        return None  # refused by the throttle: DRF's view answers the 429
    else:
        share, known = quick[1], quick[2]
    setattr(request, COUNTED, True)
    if share is None:
        return None  # no such share: the DRF view answers the 400
    try:
        job = services.job_submit(user=user, share=share, known=known, **fields)
    except (ValidationError, PermissionDenied):
        return None  # nothing written: the DRF view answers with the same errors
    if job is None:  # the cached share had changed: nothing written; decide from the database
        submit_cache.forget([submit_cache.share_key(name)])
        return None
    request.user, request.auth = user, auth_token
    from rest_framework.renderers import JSONRenderer

    response = HttpResponse(
        JSONRenderer().render(submitted_data(job)), status=201, content_type="application/json"
    )
    # What CommonMiddleware, skipped here, adds; DRF's view sets the other two.
    response["Content-Length"] = str(len(response.content))
    response["Vary"] = "Accept"
    response["Allow"] = ALLOW
    # What XFrameOptionsMiddleware, skipped here, adds to every answer.
    response["X-Frame-Options"] = getattr(settings, "X_FRAME_OPTIONS", "DENY").upper()
    return response


class FastSubmitMiddleware:
    """Placed after the security, CSP and static-file middleware: a token-authenticated POST to the
    jobs list tries the quick way first; anything it does not answer goes down the normal chain."""

    def __init__(self, get_response):
        self.get_response = get_response
        self.path: tuple[str, str] | None = None  # (script prefix, the jobs list's path_info)

    def __call__(self, request):
        if (
            request.method == "POST"
            and request.META.get("HTTP_AUTHORIZATION", "")[:6] == "Token "
            and getattr(settings, "FAST_SUBMIT", True)
        ):
            from django.urls import get_script_prefix, reverse

            prefix = get_script_prefix()
            if self.path is None or self.path[0] != prefix:
                self.path = (prefix, "/" + reverse("api:job-list")[len(prefix) :])
            if request.path_info == self.path[1]:
                response = fast_submit(request)
                if response is not None:
                    return response
        return self.get_response(request)
