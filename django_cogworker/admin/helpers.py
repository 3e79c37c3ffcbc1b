"""What every jobs page shares: the admin context, permissions, URLs,
pagination and rendering, and the rows that more than one tab lists
(queues: dashboard and queues; processes: dashboard and busy).

Seeing a page takes the view permission (``require_view``); every change
takes the change permission (``require_change``) and a POST, which
``admin_site.admin_view()`` protects with CSRF. Every page reads Redis
through ``django_cogworker.api`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import django
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse

from django_cogworker import api, connection
from django_cogworker.admin.display import When, duration_text
from django_cogworker.conf import get_config
from django_cogworker.errors import (
    PAGE_CATCHES,
    CogworkerError,
    RedisAccessRefused,
    RedisRefused,
    RedisUnavailable,
    redis_failure,
)

#: Jobs per page of a list.
PER_PAGE = 25

#: Past the end of any list Redis holds; a larger ``?p=`` (30 digits) is
#: read as this, so that no offset overflows Redis's 64-bit integers.
MAX_PAGE_NUMBER = 10**15

#: Refresh periods offered by the dashboard and busy pages (s).
REFRESH_CHOICES_S = (2, 5, 10, 30, 60)

TEMPLATES = "django_cogworker/admin/"


def segment(value: str) -> str:
    """``value`` as one URL path segment, for the patterns of ``admin/urls.py``.

    Encoded here and once more by ``reverse()``, so that after the server
    decodes the path once, a ``/`` (or a dot segment such as ``..``, which a
    browser would resolve away) is still encoded, and ``unsegment`` restores
    the original text."""
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) <= {"."} else encoded


def unsegment(value: str) -> str:
    return unquote(value)


def admin_url(model_admin: ModelAdmin, name: str, *args: str) -> str:
    return reverse(f"{model_admin.admin_site.name}:django_cogworker_{name}", args=args)


def require_view(request: HttpRequest, model_admin: ModelAdmin) -> None:
    if not model_admin.has_view_permission(request):
        raise PermissionDenied


def require_change(request: HttpRequest, model_admin: ModelAdmin) -> None:
    if not model_admin.has_change_permission(request):
        raise PermissionDenied


class _OnePage(Sequence[Any]):
    """What ``Paginator`` needs from a list of which only one page was read."""

    def __init__(self, count: int, items: list[Any]) -> None:
        self._count = count
        self._items = items

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        return self._items


def paginate(request: HttpRequest, fetch: Callable[[int, int], tuple[int, list[Any]]]) -> Page:
    """Page ``?p=`` of a list that ``fetch(offset, limit) -> (count, items)``
    reads one page at a time; past the end (however many digits), the last page."""
    try:
        number = min(max(1, int(request.GET.get("p", "1"))), MAX_PAGE_NUMBER)
    except ValueError:  # not a number, or more digits than Python converts
        number = 1
    count, items = fetch((number - 1) * PER_PAGE, PER_PAGE)
    last = max(1, -(-count // PER_PAGE))
    if number > last:
        number = last
        count, items = fetch((number - 1) * PER_PAGE, PER_PAGE)
    return Paginator(_OnePage(count, items), PER_PAGE).page(number)


def page_by_name(request: HttpRequest, items: Sequence[Any]) -> tuple[str, Page]:
    """The text of ``?q=``, and page ``?p=`` of those of ``items`` (a list
    read whole, in its order) whose ``name`` holds it, ignoring case."""
    search = request.GET.get("q", "").strip()
    needle = search.casefold()
    shown = [item for item in items if needle in item.name.casefold()]
    return search, paginate(request, lambda offset, limit: (len(shown), shown[offset : offset + limit]))


def page_links(page: Page) -> list[int | str]:
    return list(page.paginator.get_elided_page_range(page.number, on_each_side=2, on_ends=1))


def context(
    request: HttpRequest,
    model_admin: ModelAdmin,
    *,
    title: str,
    tab: str,
    crumbs: list[tuple[str, str | None]] | None = None,
    **extra: Any,
) -> dict:
    """The admin's own context (header, sidebar, permissions), the jobs tabs,
    and the breadcrumbs after the app's (``crumbs``: label, link or None;
    by default the dashboard and the tab)."""
    stats = api.Stats()
    processes = api.ProcessSet().all()
    tabs = [
        ("dashboard", "Dashboard", admin_url(model_admin, "dashboard"), None),
        ("queues", "Queues", admin_url(model_admin, "queues"), stats.enqueued),
        ("busy", "Busy", admin_url(model_admin, "busy"), sum(p.busy for p in processes)),
        ("scheduled", "Scheduled", admin_url(model_admin, "set", "scheduled"), stats.scheduled_size),
        ("retries", "Retries", admin_url(model_admin, "set", "retries"), stats.retry_size),
        ("dead", "Dead", admin_url(model_admin, "set", "dead"), stats.dead_size),
        ("unsettled", "Unsettled", admin_url(model_admin, "set", "unsettled"), stats.unsettled_size),
        ("batches", "Batches", admin_url(model_admin, "batches"), stats.batches_size),
        ("periodic", "Periodic", admin_url(model_admin, "periodic"), None),
        ("metrics", "Metrics", admin_url(model_admin, "metrics"), None),
        ("limits", "Limits", admin_url(model_admin, "limits"), None),
    ]
    tab_url, tab_label = next((url, label) for key, label, url, _ in tabs if key == tab)
    dashboard_url = admin_url(model_admin, "dashboard")
    if tab == "dashboard":
        trail: list[tuple[str, str | None]] = [("Dashboard", None)]
    else:
        tail = crumbs if crumbs is not None else []
        trail = [("Dashboard", dashboard_url), (tab_label, tab_url if tail else None), *tail]
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": title,
        "tab": tab,
        "tabs": tabs,
        "crumbs": trail,
        "breadcrumbs_as_list": django.VERSION >= (6, 0),
        "can_change": model_admin.has_change_permission(request),
        "stats": stats,
        "processes": processes,
        **extra,
    }


def when_redis_answers(
    request: HttpRequest, model_admin: ModelAdmin, view: Callable[[], HttpResponse]
) -> HttpResponse:
    """``view()``'s response, rendered here (a lazy template would meet
    Redis after this frame); or, when Redis cannot be reached or refuses,
    a page that says so (HTTP 503) in the admin's frame, with the address
    and without the password (SPEC section 8)."""
    try:
        response = view()
        if isinstance(response, TemplateResponse):
            response.render()
        return response
    except PAGE_CATCHES as exc:
        error = redis_failure(exc, "load this page")
        if error is None:
            raise
    request.current_app = model_admin.admin_site.name
    ctx = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": _title(error),
        "unreachable": isinstance(error, RedisUnavailable),
        "address": connection.describe(get_config()),
        "reason": str(error),
        "breadcrumbs_as_list": django.VERSION >= (6, 0),
    }
    response = TemplateResponse(request, TEMPLATES + "unavailable.html", ctx, status=503)
    response.render()
    return response


class _Page(TemplateResponse):
    """A jobs page, which any str a payload holds can be written on: a lone
    surrogate (JSON's ``"\\udcff"`` reads as one), which no UTF-8 can
    carry, is written as ``\\udcff``, the text ``escaping.storable`` keeps
    in Redis for it. Django's own response would answer 500 instead."""

    def make_bytes(self, value: Any) -> bytes:
        if isinstance(value, str):
            return value.encode(self.charset or "utf-8", "backslashreplace")
        return super().make_bytes(value)


def _title(error: CogworkerError) -> str:
    if isinstance(error, RedisUnavailable):
        return "Redis is unreachable"
    if isinstance(error, RedisAccessRefused):
        return "Redis refused the credentials or the database"
    if isinstance(error, RedisRefused) and error.full:
        return "Redis is full"
    return "Redis refused"


def render(
    request: HttpRequest, model_admin: ModelAdmin, template: str, ctx: dict[str, Any]
) -> TemplateResponse:
    # {% url "admin:..." %} resolves in this admin site, whatever its name.
    request.current_app = model_admin.admin_site.name
    return _Page(request, TEMPLATES + template, ctx)


# -- rows more than one tab lists ----------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    name: str
    size: int
    latency: str
    paused: bool
    url: str
    action_url: str
    clear_url: str


def queue_rows(model_admin: ModelAdmin, queues: Iterable[api.Queue]) -> list[QueueRow]:
    """The rows of ``queues`` (the page's one ``Queue.all()``, whose notes it
    also shows), read in one round trip for them all."""
    rows = []
    for queue in api.queue_figures(queues):
        seg = segment(queue.name)
        rows.append(
            QueueRow(
                name=queue.name,
                size=queue.size,
                latency=duration_text(queue.latency_s),
                paused=queue.paused,
                url=admin_url(model_admin, "queue", seg),
                action_url=admin_url(model_admin, "queue_action", seg),
                clear_url=admin_url(model_admin, "queue_clear", seg),
            )
        )
    return rows


@dataclass(frozen=True)
class ProcessRow:
    process: api.ProcessRecord
    started: When | None
    last_beat: When | None
    rss: str


def process_rows(processes: list[api.ProcessRecord]) -> list[ProcessRow]:
    return [
        ProcessRow(p, When.of(p.started_at), When.of(p.last_beat), f"{p.rss_kb / 1024:.1f} MB")
        for p in processes
    ]
