"""The URLs of the jobs pages, under the ``Job`` model's admin URL.

Duties: route every page (``dashboard``, ``queues``, ``busy``, ``periodic``,
``metrics``, ``limits``, ``batches`` and the set tabs, ``sets``) through
``admin_site.admin_view()``, which asks for an active staff login, protects
every POST with CSRF and keeps pages out of caches, and through ``when_redis_answers()``: Redis down is a 503
page in the admin's frame, never a 500. The URL names (``admin:django_cogworker_<page>``)
are what templates and views reverse. No change/delete/history URLs: there
is no table behind the model.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import update_wrapper
from typing import Any

from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, re_path

from django_cogworker.admin import batches, busy, dashboard, limits, metrics, periodic, queues, sets
from django_cogworker.admin.helpers import when_redis_answers

#: The set pages, as they appear in URLs.
SET_NAMES = "|".join(sets.SET_PAGES)


def patterns(model_admin: ModelAdmin) -> list[URLPattern]:
    """What ``JobAdmin.get_urls()`` returns."""

    def page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            def answer() -> HttpResponse:
                return view(request, model_admin, *args, **kwargs)

            return when_redis_answers(request, model_admin, answer)

        return model_admin.admin_site.admin_view(update_wrapper(wrapper, view))

    return [
        path(
            "",
            model_admin.admin_site.admin_view(model_admin.changelist_view),
            name="django_cogworker_job_changelist",
        ),
        path("dashboard/", page(dashboard.dashboard), name="django_cogworker_dashboard"),
        path("queues/", page(queues.queues), name="django_cogworker_queues"),
        # Queue names and job ids come from Redis and may hold any
        # character: they travel percent-encoded in one path segment.
        re_path(r"^queues/(?P<name>[^/]+)/$", page(queues.queue), name="django_cogworker_queue"),
        re_path(
            r"^queues/(?P<name>[^/]+)/action/$",
            page(queues.queue_action),
            name="django_cogworker_queue_action",
        ),
        re_path(
            r"^queues/(?P<name>[^/]+)/clear/$",
            page(queues.queue_clear),
            name="django_cogworker_queue_clear",
        ),
        path("busy/", page(busy.busy), name="django_cogworker_busy"),
        path("busy/signal/", page(busy.busy_signal), name="django_cogworker_busy_signal"),
        re_path(
            r"^busy/(?P<identity>[^/]+)/job/(?P<jid>[^/]+)/$",
            page(busy.running_job),
            name="django_cogworker_running_job",
        ),
        path("periodic/", page(periodic.periodic), name="django_cogworker_periodic"),
        path("metrics/", page(metrics.metrics_page), name="django_cogworker_metrics"),
        # Job names, like queue names, are any text: one encoded segment.
        re_path(r"^metrics/(?P<name>[^/]+)/$", page(metrics.job_page), name="django_cogworker_job_metrics"),
        path("limits/", page(limits.limits_page), name="django_cogworker_limits"),
        # Limiter names, like queue names, are any text: one encoded segment.
        re_path(r"^limits/(?P<name>[^/]+)/$", page(limits.limit_page), name="django_cogworker_limit"),
        re_path(r"^limits/(?P<name>[^/]+)/set/$", page(limits.limit_set), name="django_cogworker_limit_set"),
        path("batches/", page(batches.batches_page), name="django_cogworker_batches"),
        re_path(r"^batches/(?P<bid>[^/]+)/$", page(batches.batch_page), name="django_cogworker_batch"),
        re_path(
            r"^batches/(?P<bid>[^/]+)/action/$",
            page(batches.batch_action),
            name="django_cogworker_batch_action",
        ),
        re_path(rf"^(?P<set_name>{SET_NAMES})/$", page(sets.set_list), name="django_cogworker_set"),
        re_path(
            rf"^(?P<set_name>{SET_NAMES})/action/$",
            page(sets.set_action),
            name="django_cogworker_set_action",
        ),
        re_path(
            rf"^(?P<set_name>{SET_NAMES})/job/(?P<record_id>[^/]+)/$",
            page(sets.job_detail),
            name="django_cogworker_job",
        ),
        re_path(
            rf"^(?P<set_name>{SET_NAMES})/job/(?P<record_id>[^/]+)/action/$",
            page(sets.job_action),
            name="django_cogworker_job_action",
        ),
    ]
