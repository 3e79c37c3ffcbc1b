"""The limits tab (SPEC section 14): every limiter with its kind, the limit
in force (marked when an override set here replaces the one its code
declares), its holders and waiting jobs; one limiter's page with its
holders (jid, process) and its waiting jobs in the order they will be let
in; and the change: set a limit or reset it to the code's (a POST each,
in force at once: raising it lets waiters start)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from django_cogworker import api
from django_cogworker.admin.display import When, args_text, malformed_notes
from django_cogworker.admin.helpers import (
    admin_url,
    context,
    page_by_name,
    page_links,
    paginate,
    render,
    require_change,
    require_view,
    segment,
    unsegment,
)
from django_cogworker.admin.queues import QueuedRow
from django_cogworker.errors import RedisRefused


@dataclass(frozen=True)
class LimitRow:
    figures: api.LimitFigures
    url: str
    set_url: str


def _row(model_admin: ModelAdmin, figures: api.LimitFigures) -> LimitRow:
    seg = segment(figures.name)
    return LimitRow(figures, admin_url(model_admin, "limit", seg), admin_url(model_admin, "limit_set", seg))


def limits_page(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    listed = api.Limit.all()
    search, page = page_by_name(request, listed)
    # The figures of the page's limiters only, in one go.
    figures = api.limit_figures(page.object_list)
    ctx = context(
        request,
        model_admin,
        title="Limits",
        tab="limits",
        rows=[_row(model_admin, f) for f in figures],
        page=page,
        page_links=page_links(page),
        search=search,
        limit_count=len(listed),
        list_url=admin_url(model_admin, "limits"),
    )
    ctx["malformed_notes"] = malformed_notes(
        ctx["stats"].skipped, listed.skipped, *(f.malformed for f in figures)
    )
    return render(request, model_admin, "limits.html", ctx)


def _limit(name: str) -> api.Limit:
    try:
        return api.Limit(unsegment(name))
    except ValueError as exc:
        raise Http404(str(exc)) from None


def limit_page(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_view(request, model_admin)
    limit = _limit(name)
    figures = limit.figures()
    page = paginate(request, lambda offset, count: (figures.waiting, limit.waiting_jobs(offset, count)))
    ctx = context(
        request,
        model_admin,
        title=f"Limiter {limit.name}",
        tab="limits",
        crumbs=[(limit.name, None)],
        row=_row(model_admin, figures),
        holders=limit.holder_jobs(),
        waiting=[QueuedRow(r, args_text(r), When.of(r.enqueued_at)) for r in page.object_list],
        page=page,
        page_links=page_links(page),
        malformed_notes=figures.malformed,
    )
    return render(request, model_admin, "limit.html", ctx)


@require_POST
def limit_set(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    """Sets (``action=set``, ``n``) or resets (``action=reset``) a limit;
    back to the limiter's page or the list (``back``), never elsewhere."""
    require_change(request, model_admin)
    limit = _limit(name)
    back = (
        admin_url(model_admin, "limit", segment(limit.name))
        if request.POST.get("back") == "limit"
        else admin_url(model_admin, "limits")
    )
    action = request.POST.get("action")
    if action not in ("set", "reset"):
        messages.error(request, "Unknown limit action.")
        return HttpResponseRedirect(back)
    try:
        if action == "reset":
            started = limit.reset()
            done = "reset to the limit its code declares"
        else:
            n = _whole(request.POST.get("n", ""))
            if n is None:
                messages.error(
                    request, f"Limiter {limit.name}: a limit is a whole number >= 0; nothing changed."
                )
                return HttpResponseRedirect(back)
            started = limit.set(n)
            done = f"set to {n}" + (": no job of it starts until it is raised" if n == 0 else "")
    except RedisRefused as exc:
        if exc.full:
            raise  # the page that says Redis is full (urls.when_redis_answers)
        # A key of the wrong type: say why, on the page that notes it.
        messages.error(request, f"Limiter {limit.name}: {exc}")
        return HttpResponseRedirect(back)
    woke = f" {started} waiting job{'s' if started != 1 else ''} let in." if started else ""
    messages.success(request, f"Limiter {limit.name} {done}.{woke}")
    return HttpResponseRedirect(back)


def _whole(value: str) -> int | None:
    """A whole number >= 0 typed in a form (digits only, up to 18 of them),
    or None."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None
