"""The warning that jobs are enqueued by a project whose INSTALLED_APPS
lacks ``django_cogworker``: ``.delay()`` still enqueues there, but
``manage.py cogworker`` does not exist, and nothing would run the jobs."""

from __future__ import annotations

import warnings


class NotInstalledWarning(RuntimeWarning):
    """Jobs are enqueued by a project whose INSTALLED_APPS lacks the app."""


_installed_checked = False


def warn_if_not_installed() -> None:
    """Warns once per process when ``django_cogworker`` is not in
    INSTALLED_APPS: ``.delay()`` still enqueues, but ``manage.py cogworker``
    does not exist there, and nothing would ever run the jobs."""
    global _installed_checked
    if _installed_checked:
        return
    _installed_checked = True
    from django.apps import apps

    if apps.ready and not apps.is_installed("django_cogworker"):
        warnings.warn(
            "jobs are being enqueued, but 'django_cogworker' is not in INSTALLED_APPS: add it there, or "
            "'manage.py cogworker' does not exist and the checks and the admin pages are missing",
            NotInstalledWarning,
            stacklevel=4,
        )
