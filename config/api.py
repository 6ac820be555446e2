"""What every gpuquota API view shares: how service errors become HTTP answers, the body-size limit,
strict serializers that refuse unknown fields, and the error responses the schema documents.

Services raise Django's ValidationError / PermissionDenied and jobs.services.Conflict; the API turns
them into DRF's `{"field": ["message"]}` 400, a 403 with the service's own sentence, and a 409.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, RequestDataTooBig
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions, permissions, serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.settings import api_settings

from jobs.services import Conflict


class RequestTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"

    def __init__(self):
        super().__init__(f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes.")


class ConflictError(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_code = "conflict"


def _validation_detail(exc: DjangoValidationError):
    if hasattr(exc, "error_dict"):
        # Django's key for errors of no one field ("__all__") is DRF's "non_field_errors" in an answer.
        return {
            ("non_field_errors" if field == NON_FIELD_ERRORS else field): messages
            for field, messages in exc.message_dict.items()
        }
    return {"non_field_errors": exc.messages}


DJANGO_NOT_FOUND = re.compile(r"No (\w+) matches the given query\.")


def translate(exc: Exception) -> Exception:
    """A service's exception as the API exception that answers it (others unchanged)."""
    if isinstance(exc, DjangoValidationError):
        return serializers.ValidationError(_validation_detail(exc))
    if isinstance(exc, DjangoPermissionDenied):
        # DRF would answer with its generic sentence; the service's says what is wrong.
        return exceptions.PermissionDenied(str(exc) or None)
    if isinstance(exc, Conflict):
        return ConflictError(str(exc))
    if isinstance(exc, RequestDataTooBig):
        return RequestTooLarge()
    if isinstance(exc, Http404) and (found := DJANGO_NOT_FOUND.fullmatch(str(exc))):
        # Django's "No Job matches the given query." reads like a database error; its class name in
        # words ("JobArray" was "No such jobarray.").
        words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", found.group(1)).lower()
        return exceptions.NotFound(f"No such {words}.")
    return exc


class StrictJSONParser(JSONParser):
    """DRF's JSON parser, plus: a body nested too deep for Python's decoder is a 400, not a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError as e:
            raise exceptions.ParseError("JSON parse error - the document is nested too deeply.") from e


class ApiViewMixin:
    """Mixed into every API view (viewsets and plain APIViews)."""

    parser_classes = [StrictJSONParser]  # no multipart/form parsing: JSON bodies only

    def initial(self, request, *args, **kwargs):
        # Refuse an oversized body from its Content-Length before anything reads it (DRF's own
        # parsers would otherwise turn Django's RequestDataTooBig into a 400 or a 500).
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if limit is not None and length > limit:
            raise RequestTooLarge()
        super().initial(request, *args, **kwargs)

    def handle_exception(self, exc):
        return super().handle_exception(translate(exc))

    def perform_content_negotiation(self, request, force=False):
        # DRF answers an unknown ?format= with a 404, as if the resource did not exist: say what it takes.
        # (A format suffix in the path, `/jobs/0.5/`, names no resource: that stays a 404.)
        try:
            return super().perform_content_negotiation(request, force)
        except Http404:
            if force or self.kwargs.get(api_settings.FORMAT_SUFFIX_KWARG):
                raise
            formats = list(dict.fromkeys(r.format for r in self.get_renderers() if r.format != "api"))
            raise exceptions.NotAcceptable(f"format must be {' or '.join(formats)}.") from None


class StrictSerializer(serializers.Serializer):
    """Refuses fields it does not know (a typo must not be silently ignored)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            writable = {name for name, f in self.fields.items() if not f.read_only}
            unknown = sorted(str(k) for k in data if k not in writable)
            if unknown:
                raise serializers.ValidationError(
                    {
                        name: [f"Unknown field. Known fields: {', '.join(sorted(writable))}."]
                        for name in unknown
                    }
                )
        return super().to_internal_value(data)


class StrictModelSerializer(StrictSerializer, serializers.ModelSerializer):
    pass


# --- schema --------------------------------------------------------------------------------------

_DETAIL = {
    "type": "object",
    "properties": {"detail": {"type": "string"}},
    "additionalProperties": True,
}
# {"field": ["message", ...], ...}; {"detail": "..."} for a body that is not JSON at all.
_FIELD_ERRORS = {"type": "object", "additionalProperties": True}


class ApiSchema(AutoSchema):
    """Documents the errors an endpoint can answer with, next to its success responses."""

    def _error_responses(self) -> dict[str, tuple[dict, str]]:
        method = self.method.upper()
        errors = {
            "401": (_DETAIL, "Not logged in (send `Authorization: Token ...`)."),
            "403": (_DETAIL, "Not allowed."),
            "429": (_DETAIL, "Throttled: retry after the number of seconds in the Retry-After header."),
            "400": (_FIELD_ERRORS, 'Bad input: {"field": ["message"]}.'),
        }
        if "{" in self.path:
            errors["404"] = (_DETAIL, "No such object, or not one you may see.")
        if method in ("POST", "PUT", "PATCH"):
            errors["409"] = (_DETAIL, "The object's state does not allow this.")
            errors["413"] = (_DETAIL, "The request body is too large.")
            errors["415"] = (_DETAIL, "Send JSON.")
        if method == "GET":
            errors["406"] = (_DETAIL, "Not acceptable.")
        return errors

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction == "response":
            for code, (schema, description) in self._error_responses().items():
                if code not in responses:
                    responses[code] = self._get_response_for_code(
                        OpenApiResponse(schema, description), code, direction=direction
                    )
        return responses


# --- permissions ---------------------------------------------------------------------------------


class IsAdminOrReadOnly(permissions.BasePermission):
    """Everyone logged in reads; only admins (superusers) write."""

    message = "Only an admin may change this."

    def has_permission(self, request, view):
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or request.user.is_superuser


class IsAdmin(permissions.BasePermission):
    message = "Only an admin may do this."

    def has_permission(self, request, view):
        return bool(request.user and request.user.is_authenticated and request.user.is_superuser)
