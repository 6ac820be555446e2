"""Where people are told what happened to their jobs: channels (a user's e-mail or webhook, a team's
Slack/Mattermost/Teams or signed JSON webhook), each with the events it wants; what waits to be sent
(grouped per channel, so a burst is one message); and each delivery with its tries."""

from django.conf import settings
from django.db import models
from django.db.models import Q


class Event(models.TextChoices):
    STARTED = "started", "Started"
    PREEMPTED = "preempted", "Pre-empted (with the work lost and the checkpoint's age)"
    ENDED = "ended", "Ended or failed"
    WAITING = "waiting", "Still waiting past the end of its likely range"


class Kind(models.TextChoices):
    EMAIL = "email", "E-mail"
    WEBHOOK = "webhook", "JSON webhook, signed (X-Gpuquota-Signature: sha256=HMAC)"
    CHAT = "chat", "Slack, Mattermost or Teams incoming webhook"


class Channel(models.Model):
    """A user's (their own jobs) or a team's (the jobs of its shares). `secret` is write-only: never shown
    back after it is saved."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    team = models.ForeignKey("quotas.Team", null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    url = models.URLField(max_length=500, blank=True)
    secret = models.CharField(max_length=200, blank=True)
    events = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    # A failing endpoint: since when, what it last said; past NOTIFY_GIVE_UP_AFTER_H it is switched off
    # (disabled_at) and its owner sees why on the notifications page.
    failing_since = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    flush_due = models.BooleanField(default=False)  # a flush is queued: later events join it

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False, team__isnull=True) | Q(user__isnull=True, team__isnull=False),
                name="notify_channel_one_owner",
            ),
            models.CheckConstraint(
                condition=Q(team__isnull=True) | ~Q(kind="email"), name="notify_team_channel_not_email"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} of {self.user or self.team}"

    @property
    def shown_url(self) -> str:
        """The URL without its path: a chat webhook's path is its secret (Slack's, Teams')."""
        from urllib.parse import urlsplit

        parts = urlsplit(self.url)
        return f"{parts.scheme}://{parts.netloc}/…" if parts.path.strip("/") else self.url


class Pending(models.Model):
    """One thing to tell a channel, waiting for its grouped message."""

    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="pending")
    event = models.CharField(max_length=16, choices=Event.choices)
    job_id = models.BigIntegerField()
    line = models.CharField(max_length=500)  # what the message says of it (only what the reader may see)
    data = models.JSONField(default=dict)
    at = models.DateTimeField()

    class Meta:
        ordering = ["at", "id"]

    def __str__(self) -> str:
        return self.line


class Delivery(models.Model):
    channel = models.ForeignKey(Channel, on_delete=models.CASCADE, related_name="deliveries")
    created_at = models.DateTimeField(auto_now_add=True)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    payload = models.JSONField(default=dict)
    tries = models.PositiveIntegerField(default=0)
    sent_at = models.DateTimeField(null=True, blank=True)
    gave_up_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.subject} to {self.channel}"


class Promise(models.Model):
    """The end of the likely range a queued job was first given (what its owner was told to expect): a
    job still queued past it is told of once (Event.WAITING), whatever later forecasts say."""

    job_id = models.BigIntegerField(primary_key=True)
    until = models.DateTimeField()
    told_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"job {self.job_id} likely started by {self.until:%Y-%m-%d %H:%M}"
