"""How every API list is paged: `?limit=N&offset=M` (DRF's LimitOffsetPagination), with a bound on N
(API_MAX_PAGE_SIZE) and strict parameters: a limit or offset that is not a whole number in range is a 400
with the field's message, never a silent default, and never a 500 (a limit of 10^20 overflowed the
database's integer: "datatype mismatch"). `page` is refused with a sentence that names the right ones."""

from __future__ import annotations

from django.conf import settings
from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination

from jobs.limits import MAX_INT

# Longer than any number either bound can be: a longer string is refused before int() reads it.
_MAX_DIGITS = 12


def _whole(params, name: str, low: int, high: int, message: str) -> int | None:
    """The parameter as an int within [low, high]; None when absent; a ValidationError otherwise."""
    raw = params.get(name)
    if raw is None:
        return None
    text = raw.strip()
    if not text or len(text) > _MAX_DIGITS or not text.isascii() or not text.lstrip("-").isdigit():
        raise serializers.ValidationError({name: [message]})
    value = int(text)
    if not low <= value <= high:
        raise serializers.ValidationError({name: [message]})
    return value


def page_size_limit() -> int:
    return settings.API_MAX_PAGE_SIZE


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffsetPagination with max_limit = API_MAX_PAGE_SIZE and 400s for bad parameters."""

    @property
    def max_limit(self) -> int:  # read at each request: a setting, not frozen at import
        return page_size_limit()

    def get_limit(self, request):
        top = page_size_limit()
        limit = _whole(
            request.query_params,
            self.limit_query_param,
            1,
            top,
            f"limit is a whole number from 1 to {top:,} (API_MAX_PAGE_SIZE): the most items one page holds.",
        )
        return self.default_limit if limit is None else limit

    def get_offset(self, request):
        offset = _whole(
            request.query_params,
            self.offset_query_param,
            0,
            MAX_INT,
            f"offset is a whole number from 0 to {MAX_INT:,}: how many items to skip.",
        )
        return offset or 0

    def paginate_queryset(self, queryset, request, view=None):
        if "page" in request.query_params:
            raise serializers.ValidationError(
                {"page": ["This list is paged with limit and offset (?limit=100&offset=200), not page."]}
            )
        return super().paginate_queryset(queryset, request, view)
