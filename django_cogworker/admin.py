"""The jobs pages of the Django admin.

Duties: register the placeholder ``Job`` model, so that the app has an entry
in the admin index and Django's own permissions; route its URLs to the
pages (``admin_views``: dashboard, queues, busy and a job running now,
periodic; ``admin_sets``: scheduled, retries, dead, unsettled), each through
``admin_site.admin_view()``, which asks for an active staff login, protects
every POST with CSRF and keeps pages out of caches. Seeing a page takes the
view (or change) permission; every change takes the change permission and a
POST. The pages call only ``django_cogworker.api``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, re_path, reverse

from django_cogworker import admin_sets, admin_views
from django_cogworker.models import Job

#: The set pages, as they appear in URLs.
SET_NAMES = "|".join(admin_sets.SET_PAGES)


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
        def page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
            def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                return view(request, self, *args, **kwargs)

            return self.admin_site.admin_view(update_wrapper(wrapper, view))

        # No change/delete/history URLs: there is no table behind the model.
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="django_cogworker_job_changelist",
            ),
            path("dashboard/", page(admin_views.dashboard), name="django_cogworker_dashboard"),
            path("queues/", page(admin_views.queues), name="django_cogworker_queues"),
            # Queue names and job ids come from Redis and may hold any
            # character: they travel percent-encoded in one path segment.
            re_path(r"^queues/(?P<name>[^/]+)/$", page(admin_views.queue), name="django_cogworker_queue"),
            re_path(
                r"^queues/(?P<name>[^/]+)/action/$",
                page(admin_views.queue_action),
                name="django_cogworker_queue_action",
            ),
            re_path(
                r"^queues/(?P<name>[^/]+)/clear/$",
                page(admin_views.queue_clear),
                name="django_cogworker_queue_clear",
            ),
            path("busy/", page(admin_views.busy), name="django_cogworker_busy"),
            path("busy/signal/", page(admin_views.busy_signal), name="django_cogworker_busy_signal"),
            re_path(
                r"^busy/(?P<identity>[^/]+)/job/(?P<jid>[^/]+)/$",
                page(admin_views.running_job),
                name="django_cogworker_running_job",
            ),
            path("periodic/", page(admin_views.periodic), name="django_cogworker_periodic"),
            re_path(rf"^(?P<set_name>{SET_NAMES})/$", page(admin_sets.set_list), name="django_cogworker_set"),
            re_path(
                rf"^(?P<set_name>{SET_NAMES})/action/$",
                page(admin_sets.set_action),
                name="django_cogworker_set_action",
            ),
            re_path(
                rf"^(?P<set_name>{SET_NAMES})/job/(?P<record_id>[^/]+)/$",
                page(admin_sets.job_detail),
                name="django_cogworker_job",
            ),
            re_path(
                rf"^(?P<set_name>{SET_NAMES})/job/(?P<record_id>[^/]+)/action/$",
                page(admin_sets.job_action),
                name="django_cogworker_job_action",
            ),
        ]
