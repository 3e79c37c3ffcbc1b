"""Admin pages: the dashboard, queues, busy processes (and the page of a job
running now) and periodic entries, and what every jobs page shares
(context, permissions, pagination, how times, sizes and a job's details
read).

Every page reads Redis through ``django_cogworker.api`` only. Seeing a page
takes the view permission; every change takes the change permission and a
POST (CSRF-checked by ``admin_view``), then redirects with a message. Values
from Redis reach the templates as data and are escaped there.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

import django
from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Page, Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.text import Truncator
from django.utils.timesince import timesince, timeuntil
from django.views.decorators.http import require_POST

from django_cogworker import admin_chart, api

#: Jobs per page of a list.
PER_PAGE = 25

#: Day ranges offered by the dashboard's history chart.
HISTORY_DAYS = (7, 30, 90)

#: Refresh periods offered by the dashboard and busy pages (s).
REFRESH_CHOICES_S = (2, 5, 10, 30, 60)

TEMPLATES = "django_cogworker/admin/"

#: Characters of an unreadable payload's raw text shown in a list.
UNREADABLE_PREVIEW_CHARS = 200


# -- shared ---------------------------------------------------------------------


def segment(value: str) -> str:
    """``value`` as one URL path segment, for the patterns of ``admin.py``.

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


@dataclass(frozen=True)
class When:
    """A moment as the pages show it: a datetime and "3 minutes ago"."""

    at: dt.datetime
    relative: str

    @classmethod
    def of(cls, value: Any) -> When | None:
        """From epoch seconds (as payloads and Redis hold them), or None."""
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            return None
        try:
            at = dt.datetime.fromtimestamp(float(value), tz=dt.UTC)
        except (ValueError, OverflowError, OSError):
            return None
        now = dt.datetime.now(dt.UTC)
        seconds = (at - now).total_seconds()
        # timesince() counts in minutes at best: "0 minutes" tells nothing
        # about a beat that should come every few seconds.
        if abs(seconds) < 1:
            return cls(at, "just now")
        if abs(seconds) < 60:
            return cls(at, f"in {int(seconds)} s" if seconds > 0 else f"{int(-seconds)} s ago")
        if seconds > 0:
            return cls(at, "in " + timeuntil(at, now))
        return cls(at, timesince(at, now) + " ago")


def duration_text(seconds: float) -> str:
    """How long, for people: "0.4 s", "12 s", "3 min 5 s", "2 h 10 min", "3 d 4 h"."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


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
    reads one page at a time; past the end, the last page."""
    try:
        number = max(1, int(request.GET.get("p", "1")))
    except ValueError:
        number = 1
    count, items = fetch((number - 1) * PER_PAGE, PER_PAGE)
    last = max(1, -(-count // PER_PAGE))
    if number > last:
        number = last
        count, items = fetch((number - 1) * PER_PAGE, PER_PAGE)
    return Paginator(_OnePage(count, items), PER_PAGE).page(number)


def args_text(record: api.JobRecord) -> str:
    """A stored job's arguments on one line, or, when its payload cannot be
    read, the start of its raw text (shown as malformed, not a 500)."""
    if record.unreadable:
        return record.raw[:UNREADABLE_PREVIEW_CHARS]
    return json_line(record.args, record.kwargs)


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
        ("periodic", "Periodic", admin_url(model_admin, "periodic"), None),
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


def render(
    request: HttpRequest, model_admin: ModelAdmin, template: str, ctx: dict[str, Any]
) -> TemplateResponse:
    # {% url "admin:..." %} resolves in this admin site, whatever its name.
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATES + template, ctx)


# -- dashboard ---------------------------------------------------------------------


@dataclass(frozen=True)
class QueueRow:
    name: str
    size: int
    latency: str
    paused: bool
    url: str
    action_url: str
    clear_url: str


def queue_rows(model_admin: ModelAdmin) -> list[QueueRow]:
    rows = []
    for queue in api.Queue.all():
        seg = segment(queue.name)
        rows.append(
            QueueRow(
                name=queue.name,
                size=queue.size,
                latency=duration_text(queue.latency),
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


def dashboard(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    try:
        days = int(request.GET.get("days", "30"))
    except ValueError:
        days = 30
    if days not in HISTORY_DAYS:
        days = 30
    history = api.Stats.history(days)
    ctx = context(
        request,
        model_admin,
        title="Jobs dashboard",
        tab="dashboard",
        days=days,
        history_days=HISTORY_DAYS,
        chart=admin_chart.history_chart(history),
        history_processed=sum(p for _, p, _ in history),
        history_failed=sum(f for _, _, f in history),
        queues=queue_rows(model_admin),
        refresh_choices=REFRESH_CHOICES_S,
    )
    ctx["process_rows"] = process_rows(ctx["processes"])
    ctx["busy"] = sum(p.busy for p in ctx["processes"])
    ctx["threads"] = sum(p.concurrency for p in ctx["processes"])
    return render(request, model_admin, "dashboard.html", ctx)


# -- queues ------------------------------------------------------------------------


def queues(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    ctx = context(request, model_admin, title="Queues", tab="queues", queues=queue_rows(model_admin))
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
    return render(request, model_admin, "queue.html", ctx)


@require_POST
def queue_action(request: HttpRequest, model_admin: ModelAdmin, name: str) -> HttpResponse:
    require_change(request, model_admin)
    the_queue = api.Queue(unsegment(name))
    action = request.POST.get("action")
    if action == "pause":
        the_queue.pause()
        messages.success(request, f"Queue {the_queue.name} paused: workers fetch nothing from it.")
    elif action == "unpause":
        the_queue.unpause()
        messages.success(request, f"Queue {the_queue.name} unpaused.")
    else:
        messages.error(request, "Unknown queue action.")
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


# -- busy --------------------------------------------------------------------------


@dataclass(frozen=True)
class RunningRow:
    job: api.RunningJob
    args: str
    started: When | None
    running_for: str
    url: str | None  # its page, when its jid could be read


def running_url(model_admin: ModelAdmin, job: api.RunningJob) -> str | None:
    if not job.jid or job.unreadable:
        return None
    return admin_url(model_admin, "running_job", segment(job.identity), segment(job.jid))


def busy(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    running = [
        RunningRow(
            j,
            j.args_preview,
            When.of(j.run_at),
            duration_text(j.running_for_s),
            running_url(model_admin, j),
        )
        for j in api.Workers().all()
    ]
    ctx = context(
        request,
        model_admin,
        title="Busy",
        tab="busy",
        running=running,
        signal_url=admin_url(model_admin, "busy_signal"),
        refresh_choices=REFRESH_CHOICES_S,
    )
    ctx["process_rows"] = process_rows(ctx["processes"])
    return render(request, model_admin, "busy.html", ctx)


def running_job(request: HttpRequest, model_admin: ModelAdmin, identity: str, jid: str) -> HttpResponse:
    """A job running now, whole, from its process's in-progress list (the
    busy page has only the summary its heartbeat records). No actions: the
    job is its process's alone while it runs (G2)."""
    require_view(request, model_admin)
    identity, jid = unsegment(identity), unsegment(jid)
    record = api.InProgress(identity).find(jid)
    if record is None:
        messages.warning(
            request, f"Job {jid} is no longer running on {identity}: it finished, or was put back."
        )
        return HttpResponseRedirect(admin_url(model_admin, "busy"))
    times = [("Created", When.of(record.created_at)), ("Enqueued", When.of(record.enqueued_at))]
    short_jid = Truncator(record.jid).chars(40)
    ctx = context(
        request,
        model_admin,
        title=f"Running job {short_jid}",
        tab="busy",
        crumbs=[(short_jid, None)],
        times=[(label, w) for label, w in times if w is not None],
        running_on=identity,
        actions=[],
        **job_details(record),
    )
    return render(request, model_admin, "job.html", ctx)


@require_POST
def busy_signal(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_change(request, model_admin)
    what = request.POST.get("signal", "")
    identity = request.POST.get("identity", "")
    if what not in ("quiet", "stop"):
        messages.error(request, "Unknown signal.")
        return HttpResponseRedirect(admin_url(model_admin, "busy"))
    live = [p.identity for p in api.ProcessSet().all()]
    targets = live if identity == "*" else [i for i in live if i == identity]
    for target in targets:
        api.ProcessSet.signal(target, what)
    if targets:
        verb = "stop fetching" if what == "quiet" else "stop"
        messages.success(
            request,
            f"Sent {what} to {', '.join(targets)}: a process acts on it at its next beat (it will {verb}).",
        )
    else:
        messages.warning(request, "No such live process: it may have stopped already.")
    return HttpResponseRedirect(admin_url(model_admin, "busy"))


# -- periodic ----------------------------------------------------------------------


@dataclass(frozen=True)
class PeriodicRow:
    name: str
    args: str
    cron: str
    tz: str
    queue: str
    next_run: When | None
    last_run: When | None
    running: bool | None


def _first(obj: Any, *names: str) -> Any:
    for name in names:
        value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
        if value is not None:
            return value
    return None


def _when_any(value: Any) -> When | None:
    if isinstance(value, dt.datetime):
        value = value.timestamp()
    return When.of(value)


def periodic_rows() -> list[PeriodicRow] | None:
    """The periodic entries, or None when this installation has no periodic listing."""
    listing = getattr(api, "PeriodicEntries", None)
    if listing is None:
        return None
    entries = listing()
    items = entries.all() if callable(getattr(entries, "all", None)) else list(entries)
    rows = []
    for entry in items:
        running = _first(entry, "running", "in_progress", "is_running")
        rows.append(
            PeriodicRow(
                name=str(_first(entry, "job", "name") or ""),
                args=json_line(_first(entry, "args") or [], _first(entry, "kwargs") or {}),
                cron=str(_first(entry, "cron") or ""),
                tz=str(_first(entry, "tz") or ""),
                queue=str(_first(entry, "queue") or ""),
                next_run=_when_any(_first(entry, "next_run", "next_run_at", "next_at")),
                last_run=_when_any(_first(entry, "last_run", "last_run_at", "last_at")),
                running=None if running is None else bool(running),
            )
        )
    return rows


def periodic(request: HttpRequest, model_admin: ModelAdmin) -> HttpResponse:
    require_view(request, model_admin)
    ctx = context(request, model_admin, title="Periodic jobs", tab="periodic", entries=periodic_rows())
    return render(request, model_admin, "periodic.html", ctx)


# -- formatting --------------------------------------------------------------------


def job_details(record: api.JobRecord) -> dict[str, Any]:
    """What the job page (``job.html``) shows of a stored job, whichever
    list or set holds it."""
    return {
        "record": record,
        "args_json": pretty_json(record.args),
        "kwargs_json": pretty_json(record.kwargs),
        "backtrace": backtrace_text(record.error_backtrace),
        "payload_json": pretty_json(record.payload),
        "raw": record.raw,
    }


def pretty_json(value: Any) -> str:
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (ValueError, RecursionError) as exc:
        return f"(cannot be shown: {type(exc).__name__})"


def backtrace_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(line).rstrip("\n") for line in value)
    return "" if value is None else str(value)


def json_line(args: Any, kwargs: Any) -> str:
    """Arguments on one line, as a call reads: ``1, "x", template="y"``."""

    def one(value: Any) -> str:
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, RecursionError) as exc:
            return f"(cannot be shown: {type(exc).__name__})"

    parts = [one(a) for a in args] if isinstance(args, list) else [one(args)]
    if isinstance(kwargs, dict):
        parts += [f"{k}={one(v)}" for k, v in kwargs.items()]
    elif kwargs:
        parts.append(one(kwargs))
    return ", ".join(parts)
