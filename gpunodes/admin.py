from django.contrib import admin, messages

from gpunodes import services
from gpunodes.choices import GpuHealth
from gpunodes.models import Gpu, GpuFailure, Node
from quotas.admin import AuditedAdmin


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "model", "memory_mb", "health", "health_detail"]
    readonly_fields = ["health", "health_detail"]


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "gpu_type", "state", "gpu_count", "last_heartbeat", "agent_version"]
    list_filter = ["state", "gpu_type"]
    search_fields = ["name", "hostname"]
    readonly_fields = ["registered_at", "state_changed_at"]
    inlines = [GpuInline]
    actions = ["accept", "cordon", "uncordon", "drain"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpus")

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Node) -> int:
        return len(obj.gpus.all())

    def _apply(self, request, queryset, service, verb: str) -> None:
        # Through the same service as the dashboard and the API: audited, and the pass is told.
        from jobs.services import Conflict

        done = 0
        for node in queryset:
            try:
                service(node=node, actor=request.user)
                done += 1
            except Conflict as e:
                self.message_user(request, f"{node.name}: {e}", messages.WARNING)
        if done:
            self.message_user(request, f"{verb} {done} node(s).", messages.SUCCESS)

    @admin.action(description="Accept: a node that asked to join (PENDING) takes work")
    def accept(self, request, queryset):
        self._apply(request, queryset, services.node_accept, "Accepted")

    @admin.action(description="Cordon: take no new work")
    def cordon(self, request, queryset):
        self._apply(request, queryset, services.node_cordon, "Cordoned")

    @admin.action(description="Uncordon: take work again")
    def uncordon(self, request, queryset):
        self._apply(request, queryset, services.node_uncordon, "Uncordoned")

    @admin.action(description="Drain: no new work, mark cordoned once empty")
    def drain(self, request, queryset):
        self._apply(request, queryset, services.node_drain, "Draining")


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = [
        "node",
        "index",
        "model",
        "memory_mb",
        "uuid",
        "health",
        "health_reason",
        "health_changed_at",
    ]
    list_filter = ["health", "node__gpu_type", "model"]
    search_fields = ["node__name", "uuid", "model"]
    list_select_related = ["node"]
    # Health changes only through the agent's reports and the mark-healthy service (audited, re-checked).
    readonly_fields = ["health", "health_reason", "health_detail", "health_changed_at", "recheck"]
    actions = ["mark_healthy"]

    @admin.action(description="Mark healthy (after a reset): its agent re-checks it before it takes work")
    def mark_healthy(self, request, queryset):
        done = 0
        for gpu in queryset.select_related("node").exclude(health=GpuHealth.HEALTHY):
            services.gpu_mark_healthy(node=gpu.node, index=gpu.index, actor=request.user)
            done += 1
        self.message_user(request, f"Marked {done} GPU(s) healthy: re-checking.", messages.SUCCESS)


@admin.register(GpuFailure)
class GpuFailureAdmin(admin.ModelAdmin):
    """The record of GPU failures: read-only (written by the heartbeats and the mark-healthy service)."""

    list_display = ["node", "index", "reason", "detail", "found_at", "cleared_at", "cleared_by"]
    list_filter = ["reason"]
    search_fields = ["node__name", "uuid", "detail"]
    list_select_related = ["node", "cleared_by"]

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
