"""The jobs pages of the Django admin (SPEC section 7).

Duties: register the placeholder ``Job`` model, so that the app has an entry
in the admin index and Django's own permissions, and route its URLs to the
pages (``urls``), each through ``admin_site.admin_view()``, which asks for
an active staff login, protects every POST with CSRF and keeps pages out of
caches. Seeing a page takes the view (or change) permission; every change
takes the change permission and a POST. The pages call only
``django_cogworker.api``; values from Redis reach the templates as data and
are escaped there.

One module per tab: ``dashboard``, ``queues``, ``busy``, ``sets`` (the
scheduled, retries, dead and unsettled lists, one job's page, and their
actions), ``periodic``, ``metrics`` (per-job figures and one job's page), ``limits``
(the limiters, and setting a limit), ``batches`` (the batches, one
batch's page, and its actions).
Shared by them: ``helpers`` (context, permissions, URLs, pagination,
rendering, the rows several tabs list), ``filters`` (a set page's
filters), ``display`` (how values read),
``chart`` (the dashboard's charts) and ``metrics_chart`` (the metrics
pages' charts), pure functions. ``urls`` routes them.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import URLPattern, reverse

from django_cogworker.models import Job


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        # The admin index links here; the jobs start at the dashboard.
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_cogworker_dashboard"))

    def get_urls(self) -> list[URLPattern]:
        from django_cogworker.admin import urls

        return urls.patterns(self)
