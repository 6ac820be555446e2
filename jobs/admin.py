from django.contrib import admin

from jobs.models import Attempt, GpuClaim, Job, JobEvent


class AttemptInline(admin.TabularInline):
    model = Attempt
    fk_name = "job"
    extra = 0
    fields = [
        "number",
        "state",
        "placement",
        "borrowed",
        "reason",
        "started_at",
        "ended_at",
        "outcome",
        "preempted_by",
        "preemption_reason",
        "exit_code",
    ]
    readonly_fields = fields
    can_delete = False
    show_change_link = True


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    fields = ["at", "attempt_number", "kind", "reason", "detail"]
    readonly_fields = fields
    can_delete = False
    ordering = ["-at", "-id"]


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "name",
        "share",
        "submitted_by",
        "gpus",
        "gpu_type",
        "priority",
        "state",
        "submitted_at",
        "attempt_count",
    ]
    list_filter = ["state", "gpu_type", "share__team", "share"]
    search_fields = ["=id", "name", "share__name", "submitted_by__username"]
    list_select_related = ["share", "submitted_by"]
    raw_id_fields = ["submitted_by"]
    readonly_fields = ["attempt_count", "preemption_count", "beneficiary", "finished_at", "updated_at"]
    date_hierarchy = "submitted_at"
    inlines = [AttemptInline, JobEventInline]


class GpuClaimInline(admin.TabularInline):
    model = GpuClaim
    extra = 0
    readonly_fields = ["gpu", "claimed_at"]
    can_delete = False


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    list_display = [
        "job",
        "number",
        "state",
        "borrowed",
        "reason",
        "started_at",
        "ended_at",
        "outcome",
        "preemption_reason",
    ]
    list_filter = ["state", "outcome", "borrowed", "preemption_reason"]
    search_fields = ["=job__id", "job__name"]
    list_select_related = ["job"]
    raw_id_fields = ["job", "preempted_by"]
    inlines = [GpuClaimInline]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["at", "job", "attempt_number", "kind", "reason"]
    list_filter = ["kind"]
    search_fields = ["=job__id", "reason"]
    list_select_related = ["job"]
    raw_id_fields = ["job"]
    date_hierarchy = "at"
