from __future__ import annotations

from django.apps import AppConfig


class CogworkerConfig(AppConfig):
    name = "django_cogworker"
    verbose_name = "Cogworker jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.backends.signals import connection_created

        from django_cogworker import (
            logs,
            registry,
            runs,
            system_checks,  # noqa: F401  (registers the checks)
        )

        connection_created.connect(runs.opened_connection, dispatch_uid="django_cogworker.opened")
        logs.install_filter()
        registry.autodiscover()
