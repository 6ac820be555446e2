"""Text that reaches other people's screens (job, array and team names, descriptions) holds printable
characters only: no control characters (a name with ESC sequences rewrites a terminal that lists it),
no bidirectional overrides or isolates (they make a name read differently from what it is), no other
invisible format characters, line or paragraph separators."""

import unicodedata

from django.core.exceptions import ValidationError

REFUSED_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
MESSAGE = "Use printable characters only: no control characters, bidirectional overrides or invisible ones."


def printable(value: str) -> None:
    if any(unicodedata.category(c) in REFUSED_CATEGORIES for c in value or ""):
        raise ValidationError(MESSAGE, code="unprintable")
