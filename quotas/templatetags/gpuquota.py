"""Template filters of the dashboard: wording that reads right for small numbers."""

from datetime import datetime

from django import template
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
