"""Template filters of the dashboard: wording that reads right for small numbers."""

from datetime import datetime

from django import template
from django.urls import reverse
from django.utils import timezone
from django.utils.timesince import timesince

register = template.Library()


@register.filter
def ago(value: datetime | None) -> str:
    """'just now' under a minute ('0 minutes ago' says nothing), else '3 minutes ago'."""
    if not value:
        return ""
    if (timezone.now() - value).total_seconds() < 60:
        return "just now"
    return f"{timesince(value)} ago"


_PATHS: dict[str, str] = {}
_MARK = "987654321"


@register.simple_tag
def job_path(name: str, pk) -> str:
    """`{% url name pk %}` for the per-job URLs of long tables (a queue of 50 rows reversed 500 URLs
    per render, a quarter of the team page's time): reversed once, then formatted."""
    pattern = _PATHS.get(name)
    if pattern is None:
        pattern = _PATHS[name] = reverse(name, args=[int(_MARK)]).replace(_MARK, "{}")
    return pattern.format(int(pk))
