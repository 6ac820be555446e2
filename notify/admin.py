from django.contrib import admin

from notify.models import Channel, Delivery


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    """Failing and switched-off channels at a glance. Neither the secret nor a chat URL's path (its
    token) is shown; switching a channel back on is clearing its `disabled at`."""

    list_display = ["__str__", "kind", "shown_url", "events", "failing_since", "last_error", "disabled_at"]
    list_filter = ["kind"]
    fields = ["user", "team", "kind", "shown_url", "events", "failing_since", "last_error", "disabled_at"]
    readonly_fields = ["user", "team", "kind", "shown_url", "events", "failing_since", "last_error"]

    def has_add_permission(self, request):
        return False  # made on the notifications page, where the URL is checked

    def save_model(self, request, obj, form, change):
        if obj.disabled_at is None:  # switched back on: its failures start afresh
            obj.failing_since, obj.last_error = None, ""
        super().save_model(request, obj, form, change)


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["subject", "channel", "created_at", "tries", "sent_at", "gave_up_at", "last_error"]
    fields = list_display

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
