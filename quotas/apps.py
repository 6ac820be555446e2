from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    verbose_name = "Teams and quota shares"

    def ready(self) -> None:
        from config import numbers
        from jobs.signals import queue_changed
        from quotas import tasks, triggers  # noqa: F401 (tasks: registered, so sent by name from below)

        # Jobs say that the queue changed (jobs.signals); the scheduling side asks for a pass.
        queue_changed.connect(triggers.on_queue_changed, dispatch_uid="quotas.triggers.on_queue_changed")
        numbers.install()  # a number too large says the largest allowed
