"""Choices of the quotas app, in one place."""

from django.db import models

from quotas.engine import policy


class Strategy(models.TextChoices):
    RESERVE = policy.RESERVE, "Reserve (never lends, never borrows)"
    LEND = policy.LEND, "Lend (lends idle capacity, never borrows)"
    LEND_AND_BORROW = policy.LEND_AND_BORROW, "Lend and borrow"


LENDING_STRATEGIES = frozenset({Strategy.LEND, Strategy.LEND_AND_BORROW})
BORROWING_STRATEGIES = frozenset({Strategy.LEND_AND_BORROW})


class ShareState(models.TextChoices):
    ENABLED = "ENABLED", "Enabled"
    DISABLED = "DISABLED", "Disabled"


class Role(models.TextChoices):
    MEMBER = "member", "Member"
    MANAGER = "manager", "Manager"
