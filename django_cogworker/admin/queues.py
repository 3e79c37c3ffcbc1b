"""The queues tab: every queue with its size and latency (a page of them at
a time, filtered by name), one queue's jobs in the order they will run, and
the changes: pause, unpause (a POST each) and clear (confirmed on a page of
its own, then a POST)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from django_cogworker import api
from django_cogworker.admin.display import When, args_text, duration_text, malformed_notes
from django_cogworker.admin.helpers import (
    admin_url,
    context,
    page_by_name,
    page_links,
    paginate,
    queue_rows,
    render,
    require_change,
    require_view,
    segment,
    unsegment,
)
from django_cogworker.errors import RedisRefused


def queues(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    listed = api.Queue.all()
    # The figures and the rows of one page only: 20,000 queues took 14 s.
    search, page = page_by_name(request, listed)
    ctx = context(
        request,
        model_admin,
        title="Queues",
        tab="queues",
        queues=queue_rows(model_admin, page.object_list),
        page=page,
        page_links=page_links(page),
        search=search,
        queue_count=len(listed),
        list_url=admin_url(model_admin, "queues"),
    )
    ctx["malformed_notes"] = malformed_notes(ctx["stats"].skipped, listed.skipped)
    return render(request, model_admin, "queues.html", ctx)


@dataclass(frozen=True)
class QueuedRow:
    record: api.JobRecord
    args: str
    enqueued: When | None


def queue(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_view(request, model_admin)
    the_queue = api.Queue(unsegment(name))
    page = paginate(request, lambda offset, limit: (the_queue.size, the_queue.page(offset, limit)))
    rows = [QueuedRow(r, args_text(r), When.of(r.enqueued_at)) for r in page.object_list]
    ctx = context(
        request,
        model_admin,
        title=f"Queue {the_queue.name}",
        tab="queues",
        crumbs=[(the_queue.name, None)],
        queue=the_queue,
        paused=the_queue.paused,
        latency=duration_text(the_queue.latency),
        page=page,
        page_links=page_links(page),
        rows=rows,
        action_url=admin_url(model_admin, "queue_action", segment(the_queue.name)),
        clear_url=admin_url(model_admin, "queue_clear", segment(the_queue.name)),
    )
    ctx["malformed_notes"] = malformed_notes(ctx["stats"].skipped, api.Queue.all().skipped)
    return render(request, model_admin, "queue.html", ctx)


@require_POST
def queue_action(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_change(request, model_admin)
    the_queue = api.Queue(unsegment(name))
    action = request.POST.get("action")
    if action not in ("pause", "unpause"):
        messages.error(request, "Unknown queue action.")
        return HttpResponseRedirect(admin_url(model_admin, "queues"))
    try:
        if action == "pause":
            the_queue.pause()
        else:
            the_queue.unpause()
    except RedisRefused as exc:
        # N:paused of the wrong type: say why, on the page that notes it.
        messages.error(request, f"Could not {action} queue {the_queue.name}: {exc}")
    else:
        done = "paused: workers fetch nothing from it." if action == "pause" else "unpaused."
        messages.success(request, f"Queue {the_queue.name} {done}")
    return HttpResponseRedirect(admin_url(model_admin, "queues"))


def queue_clear(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_change(request, model_admin)
    the_queue = api.Queue(unsegment(name))
    if request.method == "POST":
        cleared = the_queue.clear()
        messages.success(request, f"Queue {the_queue.name} cleared: {cleared} jobs deleted.")
        return HttpResponseRedirect(admin_url(model_admin, "queues"))
    ctx = context(
        request,
        model_admin,
        title=f"Clear queue {the_queue.name}?",
        tab="queues",
        crumbs=[(the_queue.name, admin_url(model_admin, "queue", segment(the_queue.name))), ("Clear", None)],
        queue=the_queue,
        size=the_queue.size,
        queues_url=admin_url(model_admin, "queues"),
    )
    return render(request, model_admin, "queue_clear.html", ctx)
