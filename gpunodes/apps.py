from django.apps import AppConfig


class GpunodesConfig(AppConfig):
    name = "gpunodes"
    verbose_name = "GPU nodes"

    def ready(self) -> None:
        from django.conf import settings

        from gpunodes import checks  # noqa: F401 - registers the fencing margin check

        if settings.MESSAGE_SIGNING_KEY:
            # Signed control messages (gpunodes/signing.py), in every process that sends or consumes them.
            from celery.signals import before_task_publish

            from gpunodes.signing import add_envelope, register

            register(
                settings.MESSAGE_SIGNING_KEY,
                settings.MESSAGE_SIGNING_CERT,
                settings.MESSAGE_TRUSTED_CERTS,
                nodes=not settings.AGENT_PROCESS,  # an agent hears the control side only
            )
            before_task_publish.connect(add_envelope, dispatch_uid="gpuquota-envelope")
