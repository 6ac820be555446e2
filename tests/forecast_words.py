"""How the pages put an estimate's likely range in words, for the tests of the job page and the team
queue (in a client and in a browser)."""

import re

from django.utils import timezone


def likely_between(low, high) -> re.Pattern:
    """The range in words, "likely between 14:10 and 16:40"; a clock time past midnight carries its day ("Sun 00:13")."""
    hm = [timezone.localtime(t).strftime("%H:%M") for t in (low, high)]
    return re.compile(rf"likely between (\w{{3}} )?{hm[0]} and (\w{{3}} )?{hm[1]}")
