from django.contrib import admin

from quotas import audit
from quotas.models import AuditEntry, Group, Membership, Share, ShareCapacity, Team


class AuditedAdmin(admin.ModelAdmin):
    """Writes every save and delete made in the Django admin to the audit log, with the admin as actor.
    The entry is taken after the inlines are saved (save_related), so it shows the whole change. A row
    that belongs to a share or team (capacity, membership) is recorded as a change of its owner."""

    def audited(self, obj):
        return obj

    def save_model(self, request, obj, form, change):
        target = self.audited(obj)
        obj._audit_before = audit.snapshot(target) if (change or target is not obj) else {}
        super().save_model(request, obj, form, change)

    def save_related(self, request, form, formsets, change):
        super().save_related(request, form, formsets, change)
        obj = form.instance
        target = self.audited(obj)
        action = "update" if (change or target is not obj) else "create"
        audit.record_audit(
            request.user, action, target, getattr(obj, "_audit_before", {}), audit.snapshot(target)
        )

    def delete_model(self, request, obj):
        target = self.audited(obj)
        if target is obj:
            audit.record_audit(request.user, "delete", obj, audit.snapshot(obj), {})
            super().delete_model(request, obj)
            return
        before = audit.snapshot(target)
        super().delete_model(request, obj)
        audit.record_audit(request.user, "update", target, before, audit.snapshot(target))

    def delete_queryset(self, request, queryset):
        # One by one, so each deleted row has its own entry (the bulk delete action).
        for obj in queryset:
            self.delete_model(request, obj)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ShareCapacityInline(admin.TabularInline):
    model = ShareCapacity
    extra = 1


@admin.register(Team)
class TeamAdmin(AuditedAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(AuditedAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__name"]
    autocomplete_fields = ["user", "team"]

    def audited(self, obj):
        return obj.team


@admin.register(Share)
class ShareAdmin(AuditedAdmin):
    list_display = ["name", "team", "strategy", "borrow_limit", "in_share_preemption", "state", "capacity"]
    list_filter = ["strategy", "state", "in_share_preemption", "team"]
    search_fields = ["name", "team__name", "description"]
    list_select_related = ["team"]
    inlines = [ShareCapacityInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("capacities")

    @admin.display(description="capacity")
    def capacity(self, obj: Share) -> str:
        return ", ".join(f"{n} × {t}" for t, n in sorted(obj.capacity_map().items())) or "none"


@admin.register(ShareCapacity)
class ShareCapacityAdmin(AuditedAdmin):
    list_display = ["share", "gpu_type", "max_gpus"]
    list_filter = ["gpu_type"]
    search_fields = ["share__name", "gpu_type"]
    list_select_related = ["share"]

    def audited(self, obj):
        return obj.share


@admin.register(AuditEntry)
class AuditEntryAdmin(admin.ModelAdmin):
    """Read-only: the log is written by the services and the admin hooks, never edited."""

    list_display = ["at", "actor_name", "action", "object_type", "object_repr"]
    list_filter = ["action", "object_type"]
    search_fields = ["actor_name", "object_repr", "object_id"]
    readonly_fields = [f.name for f in AuditEntry._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Group)
class GroupAdmin(admin.ModelAdmin):
    """Read-only: the tree changes only through the layout (/layout/), which checks it whole (no cycle,
    at most 4 levels, limits in range) and keeps every version; /organisation/ shows it live."""

    list_display = ["name", "parent", "weight", "borrow_limit", "lend_limit"]
    search_fields = ["name"]
    list_select_related = ["parent"]
    readonly_fields = [f.name for f in Group._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
