"""The set tabs (scheduled, retries, dead, unsettled): lists, job pages, actions.

Duties: what each set page is (``SET_PAGES``: its title, its set in
``django_cogworker.api``, the actions it offers, what an entry's time
means), the paginated list (filter by job name, queue and batch, search by jid
or error text: ``filters``), and the actions on the selected jobs or on every job matching
the filter: retry now, delete, kill, each confirmed on a page first, then a
POST; and one job's page (arguments, keyword arguments, error, backtrace,
the times of its history, the payload as stored) with the same actions on
it alone.

Unfiltered lists read one page by offset (ZRANGE); filtered ones scan with
a server-side pattern (the API's ``filter_page``), so a set of 100,000 jobs
never comes whole into Python to show 25.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.text import Truncator
from django.views.decorators.http import require_POST

from django_cogworker import api
from django_cogworker.admin.display import When, args_text, job_details
from django_cogworker.admin.filters import Filters
from django_cogworker.admin.helpers import (
    PER_PAGE,
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

#: Jobs listed on a confirmation page (the count says how many in all).
CONFIRM_SAMPLE = 10

ACTION_LABELS = {"retry": "Retry now", "delete": "Delete", "kill": "Kill (move to dead)"}
ACTION_DONE = {"retry": "Retried", "delete": "Deleted", "kill": "Killed"}


@dataclass(frozen=True)
class SetPage:
    slug: str
    title: str
    source: type[api.JobSet]
    actions: tuple[str, ...]
    #: What the entry's score means on this page.
    when_label: str
    description: str

    def jobs(self) -> api.JobSet:
        return self.source()


SET_PAGES = {
    "scheduled": SetPage(
        "scheduled",
        "Scheduled",
        api.ScheduledSet,
        ("retry", "delete", "kill"),
        "Due",
        "Jobs enqueued for later (delay_in, delay_at). Retry now puts one on its queue at once.",
    ),
    "retries": SetPage(
        "retries",
        "Retries",
        api.RetrySet,
        ("retry", "delete", "kill"),
        "Next retry",
        "Failed jobs waiting for their next attempt.",
    ),
    "dead": SetPage(
        "dead",
        "Dead",
        api.DeadSet,
        ("retry", "delete"),
        "Died",
        "Jobs that exhausted their retries, could not be read, or kept killing their process.",
    ),
    "unsettled": SetPage(
        "unsettled",
        "Unsettled",
        api.UnsettledSet,
        ("retry", "delete", "kill"),
        "Due",
        "Failed jobs a stopping process could not file in retry or dead; any live process files them.",
    ),
}


def _page_of(set_name: str) -> SetPage:
    page = SET_PAGES.get(set_name)
    if page is None:
        raise Http404("no such set")
    return page


def _list_url(model_admin: ModelAdmin, page: SetPage, filters: Filters | None = None) -> str:
    url = admin_url(model_admin, "set", page.slug)
    return f"{url}?{filters.query}" if filters and filters.query else url


@dataclass(frozen=True)
class JobRow:
    record: api.JobRecord
    url: str
    when: When | None
    args: str
    error: str


def _error_line(record: api.JobRecord) -> str:
    if record.unreadable:
        return f"Unreadable: {record.unreadable}"
    if not record.error_class and not record.error_message:
        return ""
    return f"{record.error_class or 'Error'}: {record.error_message or ''}"


def _row(model_admin: ModelAdmin, page: SetPage, record: api.JobRecord) -> JobRow:
    return JobRow(
        record=record,
        url=admin_url(model_admin, "job", page.slug, segment(record.id)),
        when=When.of(record.score),
        args=args_text(record),
        error=_error_line(record),
    )


def _fetch(jobs: api.JobSet, filters: Filters, offset: int, limit: int) -> tuple[int, list[api.JobRecord]]:
    """(how many, the page at ``offset``): filtered, from one scan; else ZCARD and one ZRANGE."""
    if filters.active:
        return filters.page(jobs, offset, limit)
    return jobs.size, jobs.page(offset, limit)


# -- the list --------------------------------------------------------------------


def set_list(request: HttpRequest, model_admin: ModelAdmin, set_name: str) -> HttpResponse:
    require_view(request, model_admin)
    page_def = _page_of(set_name)
    jobs = page_def.jobs()
    filters = Filters.of(request.GET)
    page = paginate(request, lambda offset, limit: _fetch(jobs, filters, offset, limit))
    action_url = admin_url(model_admin, "set_action", page_def.slug)
    ctx = context(
        request,
        model_admin,
        title=page_def.title,
        tab=page_def.slug,
        set_page=page_def,
        filters=filters,
        page=page,
        page_links=page_links(page),
        rows=[_row(model_admin, page_def, r) for r in page.object_list],
        count=page.paginator.count,
        action_url=f"{action_url}?{filters.query}" if filters.query else action_url,
        actions=[(a, ACTION_LABELS[a]) for a in page_def.actions],
        job_names=api.job_names(),
        queue_names=[q.name for q in api.Queue.all()],
        list_url=_list_url(model_admin, page_def),
        per_page=PER_PAGE,
        batch_url=admin_url(model_admin, "batch", segment(filters.bid)) if filters.bid else "",
    )
    return render(request, model_admin, "set.html", ctx)


@require_POST
def set_action(request: HttpRequest, model_admin: ModelAdmin, set_name: str) -> HttpResponse:
    """Bulk action: confirm first (``post=yes`` then carries it out)."""
    require_change(request, model_admin)
    page_def = _page_of(set_name)
    jobs = page_def.jobs()
    filters = Filters.of(request.GET)
    back = _list_url(model_admin, page_def, filters)
    action = request.POST.get("action", "")
    if action not in page_def.actions:
        messages.warning(request, "Choose an action to run on the selected jobs.")
        return HttpResponseRedirect(back)
    across = request.POST.get("select_across") == "1"
    ids = request.POST.getlist("_selected_action")
    if not across and not ids:
        messages.warning(request, "Select jobs to act on: no job was changed.")
        return HttpResponseRedirect(back)

    if request.POST.get("post") != "yes":
        if across:
            count, sample = _fetch(jobs, filters, 0, CONFIRM_SAMPLE)
        else:
            found = jobs.get_many(ids)
            count, sample = len(found), found[:CONFIRM_SAMPLE]
        ctx = context(
            request,
            model_admin,
            title="Are you sure?",
            tab=page_def.slug,
            crumbs=[(ACTION_LABELS[action], None)],
            set_page=page_def,
            filters=filters,
            action=action,
            action_label=ACTION_LABELS[action],
            across=across,
            ids=ids,
            count=count,
            rows=[_row(model_admin, page_def, r) for r in sample],
            more=max(0, count - len(sample)),
            list_url=back,
            action_url=request.get_full_path(),
        )
        return render(request, model_admin, "set_confirm.html", ctx)

    if across and action == "delete" and not filters.active and page_def.slug == "dead":
        # Only the dead set is cleared whole: elsewhere a batch's member
        # deleted counts as dead in its batch, one by one (SPEC section 13).
        done = jobs.clear()
    elif across:
        done = api.bulk(filters.matching(jobs), action)
    else:
        records = jobs.get_many(ids)
        done = api.bulk(records, action)
    wanted = "all matching" if across else str(len(ids))
    text = f"{ACTION_DONE[action]} {done} of {wanted} jobs in {page_def.title}."
    if not across and done < len(ids):
        text += " The others had moved already (run, retried or changed by someone else)."
    messages.success(request, text)
    return HttpResponseRedirect(back)


# -- one job ---------------------------------------------------------------------


def job_detail(request: HttpRequest, model_admin: ModelAdmin, set_name: str, record_id: str) -> HttpResponse:
    require_view(request, model_admin)
    page_def = _page_of(set_name)
    record = page_def.jobs().get(unsegment(record_id))
    if record is None:
        messages.warning(
            request, f"That job is no longer in {page_def.title}: it was retried, deleted or moved."
        )
        return HttpResponseRedirect(_list_url(model_admin, page_def))
    times = [
        (page_def.when_label, When.of(record.score)),
        ("Created", When.of(record.created_at)),
        ("Enqueued", When.of(record.enqueued_at)),
        ("Failed", When.of(record.failed_at)),
        ("Retried", When.of(record.retried_at)),
    ]
    ctx = context(
        request,
        model_admin,
        title=f"{page_def.title} job {Truncator(record.jid).chars(40)}",
        tab=page_def.slug,
        crumbs=[(Truncator(record.jid).chars(40), None)],
        set_page=page_def,
        times=[(label, w) for label, w in times if w is not None],
        target_set=record.target_set,
        actions=[(a, ACTION_LABELS[a]) for a in page_def.actions],
        action_url=admin_url(model_admin, "job_action", page_def.slug, segment(record.id)),
        list_url=_list_url(model_admin, page_def),
        **job_details(record),
    )
    return render(request, model_admin, "job.html", ctx)


@require_POST
def job_action(request: HttpRequest, model_admin: ModelAdmin, set_name: str, record_id: str) -> HttpResponse:
    require_change(request, model_admin)
    page_def = _page_of(set_name)
    back = _list_url(model_admin, page_def)
    action = request.POST.get("action", "")
    if action not in page_def.actions:
        messages.error(request, "Unknown action.")
        return HttpResponseRedirect(back)
    record = page_def.jobs().get(unsegment(record_id))
    if record is None or not record.apply(action):
        messages.warning(
            request, f"That job is no longer in {page_def.title}: it was retried, deleted or moved."
        )
    else:
        messages.success(request, f"{ACTION_DONE[action]} job {record.jid} ({record.name}).")
    return HttpResponseRedirect(back)
