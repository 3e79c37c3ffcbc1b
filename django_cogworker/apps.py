from __future__ import annotations

from django.apps import AppConfig


class CogworkerConfig(AppConfig):
    name = "django_cogworker"
    verbose_name = "Cogworker jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_cogworker import checks, logs, registry  # noqa: F401  (registers the checks)

        logs.install_filter()
        registry.autodiscover()
