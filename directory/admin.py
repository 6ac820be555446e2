from django.contrib import admin

from directory.models import DirectoryGroup, DirectoryMembership, Identity, TeamDirectory


@admin.register(Identity)
class IdentityAdmin(admin.ModelAdmin):
    list_display = ["user", "issuer", "subject", "signed_in_at"]
    search_fields = ["user__username", "subject"]
    readonly_fields = ["groups", "signed_in_at"]


@admin.register(DirectoryGroup)
class DirectoryGroupAdmin(admin.ModelAdmin):
    list_display = ["name", "first_seen", "last_seen"]
    search_fields = ["name"]


@admin.register(TeamDirectory)
class TeamDirectoryAdmin(admin.ModelAdmin):
    """Read-only: the mapping changes through the layout (planned, applied, versioned)."""

    list_display = ["team", "members_from", "managers_from"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(DirectoryMembership)
class DirectoryMembershipAdmin(admin.ModelAdmin):
    list_display = ["team", "user", "role", "created_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
