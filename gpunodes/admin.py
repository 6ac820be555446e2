from django.contrib import admin

from gpunodes.models import Gpu, Node
from quotas.admin import AuditedAdmin


class GpuInline(admin.TabularInline):
    model = Gpu
    extra = 0
    fields = ["index", "uuid", "model", "memory_mb"]


@admin.register(Node)
class NodeAdmin(AuditedAdmin):
    list_display = ["name", "gpu_type", "state", "gpu_count", "last_heartbeat", "agent_version"]
    list_filter = ["state", "gpu_type"]
    search_fields = ["name", "hostname"]
    readonly_fields = ["registered_at", "state_changed_at"]
    inlines = [GpuInline]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("gpus")

    @admin.display(description="GPUs")
    def gpu_count(self, obj: Node) -> int:
        return len(obj.gpus.all())


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ["node", "index", "model", "memory_mb", "uuid"]
    list_filter = ["node__gpu_type", "model"]
    search_fields = ["node__name", "uuid", "model"]
    list_select_related = ["node"]
