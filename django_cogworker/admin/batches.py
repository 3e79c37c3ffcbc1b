"""The batches tab (SPEC section 13): every batch, open ones first, with its
description, age, figures and a progress bar; one batch's page with its
figures, its pending members linked to where each is now (a queue, the
retry or schedule set, dead, unsettled, running on a process, a child
batch), its dead members, its callbacks and when each fired; and its
actions: retry the dead members, delete the batch (a POST each, the delete
confirmed on a page first)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.views.decorators.http import require_POST

from django_cogworker import api
from django_cogworker.admin.display import When, json_line, malformed_notes
from django_cogworker.admin.helpers import (
    admin_url,
    context,
    page_links,
    paginate,
    render,
    require_change,
    require_view,
    segment,
    unsegment,
)
from django_cogworker.errors import RedisRefused

#: Pending (and dead) members listed, with their place, on a batch's page.
MEMBERS_SHOWN = 50

#: The states the list can be narrowed to (``?state=``); "" is every batch, open first.
STATES = {"": "All, open first", "open": "Open", "settled": "Settled"}


@dataclass(frozen=True)
class BatchRow:
    figures: api.BatchFigures
    url: str
    created: When | None
    settled: When | None
    #: The progress bar's parts, as CSS widths (an empty batch is all done).
    succeeded_percent: str
    dead_percent: str


def _percent(part: int, total: int) -> str:
    # Clamped: sets that garbage made larger than the total still draw a bar.
    return f"{min(100.0, max(0.0, 100.0 * part / total)):.1f}" if total > 0 else "0"


def _row(model_admin: ModelAdmin, figures: api.BatchFigures) -> BatchRow:
    empty_done = figures.total == 0 and figures.settled
    return BatchRow(
        figures,
        admin_url(model_admin, "batch", segment(figures.bid)),
        When.of(figures.created_at),
        When.of(figures.settled_at),
        "100" if empty_done else _percent(figures.succeeded, figures.total),
        _percent(figures.dead, figures.total),
    )


def batches_page(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    state = request.GET.get("state", "")
    state = state if state in STATES else ""
    skipped: list[str] = []

    def fetch(offset: int, limit: int) -> tuple[int, list[api.BatchFigures]]:
        count, found = api.BatchSet().page(offset, limit, state=state or None)
        skipped.extend(found.skipped)
        return count, found

    page = paginate(request, fetch)
    list_url = admin_url(model_admin, "batches")
    ctx = context(
        request,
        model_admin,
        title="Batches",
        tab="batches",
        rows=[_row(model_admin, f) for f in page.object_list],
        page=page,
        page_links=page_links(page),
        state=state,
        states=[
            (key, label, f"{list_url}?state={key}" if key else list_url) for key, label in STATES.items()
        ],
    )
    ctx["malformed_notes"] = malformed_notes(
        ctx["stats"].skipped, skipped, *(f.malformed for f in page.object_list)
    )
    return render(request, model_admin, "batches.html", ctx)


@dataclass(frozen=True)
class MemberRow:
    place: api.Place
    #: Where it is, as the page says it, and the page that shows it there ("" when none).
    label: str
    url: str


def _member_row(model_admin: ModelAdmin, place: api.Place) -> MemberRow:
    record = place.record
    sets = {"retry": "retries", "scheduled": "scheduled", "dead": "dead", "unsettled": "unsettled"}
    if place.kind in sets and record is not None:
        slug = sets[place.kind]
        label = {"retry": "waiting for a retry", "scheduled": "scheduled"}.get(place.kind, place.kind)
        return MemberRow(place, label, admin_url(model_admin, "job", slug, segment(record.id)))
    if place.kind == "queue":
        return MemberRow(
            place, f"in queue {place.where}", admin_url(model_admin, "queue", segment(place.where))
        )
    if place.kind == "running":
        url = admin_url(model_admin, "running_job", segment(place.where), segment(place.jid))
        return MemberRow(place, f"running on {place.where}", url)
    if place.kind == "batch":
        return MemberRow(place, "a child batch", admin_url(model_admin, "batch", segment(place.where)))
    return MemberRow(place, "not found: moving, waiting for a limiter, or far down its queue", "")


def _batch(bid: str) -> api.Batch:
    try:
        return api.Batch(unsegment(bid))
    except api.BatchNotFound as exc:
        raise Http404(str(exc)) from None


def batch_page(request: HttpRequest, model_admin: ModelAdmin, bid: str) -> HttpResponse:
    require_view(request, model_admin)
    batch = _batch(bid)
    figures = batch.figures()
    pending = batch.pending_jids(MEMBERS_SHOWN)
    dead = batch.dead_jids(MEMBERS_SHOWN)
    placed = api.places(batch.bid, [*pending, *dead])
    query = urlencode({"bid": batch.bid})
    ctx = context(
        request,
        model_admin,
        title=f"Batch {figures.description or batch.bid}",
        tab="batches",
        crumbs=[(figures.description or batch.bid, None)],
        row=_row(model_admin, figures),
        parent_url=admin_url(model_admin, "batch", segment(figures.parent)) if figures.parent else "",
        expires=When.of(None if figures.expires_in_s is None else time.time() + figures.expires_in_s),
        pending=[_member_row(model_admin, p) for p in placed[: len(pending)]],
        dead=[_member_row(model_admin, p) for p in placed[len(pending) :]],
        callbacks=[(c, json_line(c.args, c.kwargs), When.of(c.fired_at)) for c in figures.callbacks],
        retries_url=f"{admin_url(model_admin, 'set', 'retries')}?{query}",
        dead_url=f"{admin_url(model_admin, 'set', 'dead')}?{query}",
        action_url=admin_url(model_admin, "batch_action", segment(batch.bid)),
        members_shown=MEMBERS_SHOWN,
    )
    ctx["malformed_notes"] = malformed_notes(figures.malformed, pending.skipped, dead.skipped)
    return render(request, model_admin, "batch.html", ctx)


@require_POST
def batch_action(request: HttpRequest, model_admin: ModelAdmin, bid: str) -> HttpResponse:
    """``retry_dead`` (back to the batch's page) or ``delete``: confirmed on
    a page first (``post=yes`` then deletes), back to the list."""
    require_change(request, model_admin)
    batch = _batch(bid)
    back = admin_url(model_admin, "batch", segment(batch.bid))
    action = request.POST.get("action")
    if action == "retry_dead":
        settled = batch.figures().settled
        try:
            retried = batch.retry_dead()
        except RedisRefused as exc:
            if exc.full:
                raise  # the page that says Redis is full (urls.when_redis_answers)
            messages.error(request, f"Batch {batch.bid}: {exc}")
            return HttpResponseRedirect(back)
        if not retried:
            messages.warning(request, f"Batch {batch.bid}: no dead member to retry.")
        else:
            plural = "s" if retried != 1 else ""
            after = ": the batch had settled, so they run as plain jobs" if settled else ""
            messages.success(request, f"Batch {batch.bid}: {retried} dead member{plural} retried{after}.")
        return HttpResponseRedirect(back)
    if action != "delete":
        messages.error(request, "Unknown batch action.")
        return HttpResponseRedirect(back)
    if request.POST.get("post") != "yes":
        figures = batch.figures()
        ctx = context(
            request,
            model_admin,
            title=f"Delete batch {figures.description or batch.bid}?",
            tab="batches",
            crumbs=[(figures.description or batch.bid, back), ("Delete", None)],
            row=_row(model_admin, figures),
            action_url=admin_url(model_admin, "batch_action", segment(batch.bid)),
            back_url=back,
        )
        return render(request, model_admin, "batch_delete.html", ctx)
    batch.delete()
    messages.success(request, f"Batch {batch.bid} deleted: its callbacks will not fire.")
    return HttpResponseRedirect(admin_url(model_admin, "batches"))
