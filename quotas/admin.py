from django.contrib import admin

from quotas.models import Membership, Share, ShareCapacity, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


class ShareCapacityInline(admin.TabularInline):
    model = ShareCapacity
    extra = 1


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__name"]
    autocomplete_fields = ["user", "team"]


@admin.register(Share)
class ShareAdmin(admin.ModelAdmin):
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
class ShareCapacityAdmin(admin.ModelAdmin):
    list_display = ["share", "gpu_type", "max_gpus"]
    list_filter = ["gpu_type"]
    search_fields = ["share__name", "gpu_type"]
    list_select_related = ["share"]
