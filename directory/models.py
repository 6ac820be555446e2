"""The organisation's directory as gpuquota knows it: who signed in through it (issuer + subject, never
the e-mail or username alone), the groups it has named, which teams follow which groups, and which
memberships the directory made (only those does it ever take away again)."""

from django.conf import settings
from django.db import models

from quotas.choices import Role


class Identity(models.Model):
    """A user who signs in through the directory: one (issuer, subject) pair, as the ID token says."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="identity")
    issuer = models.CharField(max_length=500)
    subject = models.CharField(max_length=255)
    groups = models.JSONField(default=list, blank=True)  # the groups claim at the last sign-in
    signed_in_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "identities"
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="identity_unique_issuer_subject")
        ]

    def __str__(self) -> str:
        return f"{self.user} ({self.subject} at {self.issuer})"


class DirectoryGroup(models.Model):
    """A group some sign-in's claim named ("oidc:" + the claim's value): what a plan checks a team's
    members_from / managers_from against (an unseen one is a warning, not an error)."""

    name = models.CharField(max_length=300, unique=True)
    first_seen = models.DateTimeField(auto_now_add=True)
    last_seen = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class TeamDirectory(models.Model):
    """The directory groups a team's members and managers come from (the layout's members_from /
    managers_from)."""

    team = models.OneToOneField("quotas.Team", on_delete=models.CASCADE, related_name="directory")
    members_from = models.JSONField(default=list, blank=True)
    managers_from = models.JSONField(default=list, blank=True)

    class Meta:
        verbose_name_plural = "team directory mappings"

    def __str__(self) -> str:
        return f"{self.team}: members {self.members_from}, managers {self.managers_from}"


class DirectoryMembership(models.Model):
    """A membership the directory made (the quotas.Membership row is the access itself). A membership
    listed in the layout by hand has none of these and is never taken away by a sign-in."""

    team = models.ForeignKey("quotas.Team", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["team", "user"], name="directory_membership_unique_team_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role}, from the directory)"
