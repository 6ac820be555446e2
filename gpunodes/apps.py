from django.apps import AppConfig


class GpunodesConfig(AppConfig):
    name = "gpunodes"
    verbose_name = "GPU nodes"
