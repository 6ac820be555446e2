from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "notify"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from jobs.signals import job_event_recorded
        from notify import hook

        job_event_recorded.connect(hook.on_job_event, dispatch_uid="notify.hook.on_job_event")
