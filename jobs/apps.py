from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self) -> None:
        from jobs import submit_cache

        submit_cache.connect()
        # The token revocation signals (a token deleted, a user changed: every process's cached tokens go
        # stale at once) must be connected in every process that can delete a token, not only in those
        # that happened to import the token cache.
        import config.auth  # noqa: F401
