"""What a worker process loads that it does not use.

A worker's memory is mostly Django's and redis-py's; of django-cogworker's
own, the admin's pages (and the api under them) and croniter (with dateutil)
load only where they are used: the pages when the admin's URLs are built,
croniter when a cron expression is read. Each check runs in a fresh
interpreter, so that nothing another test imported hides an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from django_cogworker import connection, registry
from django_cogworker.conf import get_config
from testproject.testapp import jobs
from tests.conftest import CogEnv, Worker, cpu_seconds, manage_env, wait_for
from tests.test_timeouts import TIMEOUT_CLASS, filed
from tests.test_worker_logs import bare_project

ROOT = Path(__file__).resolve().parent.parent

#: Modules a worker with no periodic entry and no URLconf loaded never needs.
UNUSED = ["croniter", "dateutil", "django_cogworker.admin.urls", "django_cogworker.api"]

#: What ``manage.py cogworker`` imports before its first job, but the system
#: checks (the URL checks load the project's URLconf, and with it the admin's).
WORKER_START = """
import json, sys
import django
django.setup()
import django_cogworker.launcher, django_cogworker.supervisor
import django_cogworker.management.commands.cogworker
{then}
print(json.dumps(sorted(sys.modules)))
"""


def loaded(then: str = "", settings: str = "testproject.settings", path: Path = ROOT) -> set[str]:
    """What a worker's start loads, and then ``then``, in a fresh interpreter
    on ``settings`` (importable from ``path`` or this checkout)."""
    out = subprocess.run(
        [sys.executable, "-c", WORKER_START.format(then=then)],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": settings, "PYTHONPATH": f"{ROOT}{os.pathsep}{path}"},
        cwd=path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_worker_with_no_periodic_entry_loads_neither_croniter_nor_the_admin_pages() -> None:
    modules = loaded()
    assert "django_cogworker.admin" in modules  # the admin's autodiscovery ran
    assert "django_cogworker.processor" in modules  # the worker's own modules are there
    assert [name for name in UNUSED if name in modules] == []


def test_croniter_and_the_admin_pages_load_where_they_are_used() -> None:
    modules = loaded(
        "from django_cogworker.cron import Schedule; Schedule('*/5 * * * *').next_run(0.0)\n"
        "from django.contrib import admin; admin.site.get_urls()"
    )
    assert [name for name in UNUSED if name not in modules] == []


# -- features loaded when used ------------------------------------------------------

#: Modules of features that a worker loads only when it uses them: the
#: building side of workflows (``batch()``, ``chain``, ``job.s()``), the
#: entries of periodic jobs (and the cron parser), the sharded layout, the
#: Sentinel client, and the runner of an ``async def`` job outside the loop.
FEATURES = [
    "django_cogworker.workflows.batch",
    "django_cogworker.workflows.canvas",
    "django_cogworker.workflows.signature",
    "django_cogworker.periodic.entry",
    "django_cogworker.periodic.enqueue",
    "django_cogworker.cron",
    "django_cogworker.shards",
    "django_cogworker.layouts",
    "django_cogworker.limits.sharded",
    "django_cogworker.sentinel",
    "django_cogworker.arun",
]

#: A project of one app with one plain job, and no Tasks backend.
PLAIN_SETTINGS = """
from testproject.settings import *  # noqa: F403

INSTALLED_APPS = [app for app in INSTALLED_APPS if not app.startswith("testproject.")] + ["plainapp"]
TASKS = {}
"""
PLAIN_JOBS = "from django_cogworker import job\n\n@job\ndef noop():\n    pass\n"
AUTODISCOVER = "from django_cogworker import registry; registry.autodiscover()\n"


def loaded_by_a_plain_project(tmp_path: Path, then: str = "") -> set[str]:
    (tmp_path / "plain_settings.py").write_text(PLAIN_SETTINGS)
    (tmp_path / "plainapp").mkdir(exist_ok=True)
    (tmp_path / "plainapp" / "__init__.py").write_text("")
    (tmp_path / "plainapp" / "jobs.py").write_text(PLAIN_JOBS)
    return loaded(f"{AUTODISCOVER}{then}", "plain_settings", tmp_path)


def test_a_worker_of_plain_jobs_loads_no_feature_it_does_not_use(tmp_path: Path) -> None:
    modules = loaded_by_a_plain_project(tmp_path)
    assert "plainapp.jobs" in modules  # autodiscovery ran
    assert "django_cogworker.processor" in modules  # the worker's own modules are there
    assert [name for name in FEATURES if name in modules] == []


#: What using a feature in the plain project loads, with a check that it works.
USES = {
    "django_cogworker.workflows.canvas": (
        "import django_cogworker as cw, django_cogworker.workflows.canvas as canvas\n"
        "assert cw.chain is canvas.chain and cw.group is canvas.group and cw.chord is canvas.chord\n"
    ),
    "django_cogworker.workflows.batch": (
        "from django_cogworker import batch, current_batch\nassert current_batch() is None\n"
    ),
    "django_cogworker.workflows.signature": (
        "from django_cogworker import Signature\n"
        "from plainapp.jobs import noop\n"
        "assert type(noop.s()) is Signature\n"
    ),
    "django_cogworker.cron": (
        "from django_cogworker.periodic.entry import parse_setting\n"
        "assert parse_setting({'cron': '0 3 * * *', 'job': 'plainapp.jobs.noop'}).job\n"
    ),
    "django_cogworker.periodic.enqueue": (
        "from django_cogworker.periodic.enqueue import PUSHED, enqueue_slot\n"
        "assert PUSHED and callable(enqueue_slot)\n"
    ),
    "django_cogworker.layouts": (
        "from django.test import override_settings\n"
        "from django.conf import settings\n"
        "from django_cogworker import connection\n"
        "with override_settings(COGWORKER={**settings.COGWORKER, 'SHARDING': 'queues'}):\n"
        "    assert connection.get_keys().sharded\n"
    ),
}


@pytest.mark.parametrize("module", sorted(USES))
def test_a_feature_loads_its_modules_when_it_is_used(tmp_path: Path, module: str) -> None:
    assert module not in loaded_by_a_plain_project(tmp_path)
    assert module in loaded_by_a_plain_project(tmp_path, USES[module])


def test_a_name_the_package_does_not_export_is_still_an_attribute_error() -> None:
    import django_cogworker

    with pytest.raises(AttributeError, match="has no attribute 'chian'"):
        django_cogworker.chian  # noqa: B018


# -- a real worker ----------------------------------------------------------------

#: Modules a worker of plain jobs never needs, though the modules that run
#: jobs are loaded: ``ctypes`` sends a ``JobTimeout`` (a job past its
#: ``timeout``), the event loop's modules run ``async def`` jobs (a worker
#: that registered one; tests/test_async_jobs.py runs them).
TIMEOUT_ONLY = ["ctypes"]
ASYNC_ONLY = ["django_cogworker.coroutines", "django_cogworker.loop_watch"]
UNUSED_BY_PLAIN_JOBS = [*TIMEOUT_ONLY, *ASYNC_ONLY]

#: What only Django's system checks load, which the worker runs in a child
#: process: the URLconf (and the admin's pages and the api under it), each
#: app's template tags, the migration autodetector (Django 5.2's check of
#: the migrate command).
LOADED_BY_THE_CHECKS = [
    "testproject.urls",
    "django_cogworker.admin.urls",
    "django_cogworker.api",
    "django.contrib.admin.templatetags.admin_list",
    "django.db.migrations.autodetector",
    "django_cogworker.checks",  # ours: registered by system_checks.py, imported when they run
]

#: ``manage.py cogworker -c 1`` as where neither colorama (which Django's
#: colour module imports) nor the OpenTelemetry SDK (which redis-py imports)
#: is installed: both load ctypes themselves, and the test environment has them.
WORKER = (
    "import sys; sys.modules['colorama'] = sys.modules['opentelemetry'] = None\n"
    "from django.core.management import execute_from_command_line\n"
    "execute_from_command_line(['manage.py', 'cogworker', '-c', '1'])\n"
)


def start_worker(cog: CogEnv) -> Worker:
    """The worker, on the test project's settings less ``TASKS``, whose
    backend would register testapp's ``async def`` task."""
    env = {**manage_env(cog), **bare_project(cog, cog.tmp, extra="TASKS = {}\n")}
    log_path = cog.tmp / "worker.log"
    with open(log_path, "wb") as log:
        argv = [sys.executable, "-c", WORKER]
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    worker = Worker(proc, log_path, cog)
    cog.workers.append(worker)  # killed by the fixture
    return worker


def modules_of(worker: Worker, path: Path) -> set[str]:
    """The worker's ``sys.modules`` once it has run everything before this
    (one processor thread: in order)."""
    jobs.write_loaded_modules.delay(str(path))
    wait_for(path.exists, 30, "the worker to write its modules", progress=lambda: cpu_seconds(worker.pid))
    names = set(json.loads(path.read_text()))
    path.unlink()
    return names


def test_a_worker_of_plain_jobs_loads_nothing_they_do_not_use(cog: CogEnv, tmp_path: Path) -> None:
    worker = start_worker(cog)
    for tag in range(20):
        jobs.record.delay(tag)
    modules = modules_of(worker, tmp_path / "modules.json")
    assert len(cog.notes()) == 20
    assert "django_cogworker.timeouts" in modules  # the code that runs jobs is there
    assert [name for name in UNUSED_BY_PLAIN_JOBS if name in modules] == []
    assert [name for name in LOADED_BY_THE_CHECKS if name in modules] == []
    assert "System check identified" not in worker.log()  # the checks passed, silently

    # A job past its timeout gets its JobTimeout, loading what sends it.
    jobs.spin_about_timeout.delay(0.2)
    modules = modules_of(worker, tmp_path / "modules.json")
    assert [name for name in TIMEOUT_ONLY if name not in modules] == []
    assert [d["error_class"] for d in filed(cog, "dead")] == [TIMEOUT_CLASS]


def test_a_tasks_backend_of_django_itself_is_not_imported_at_startup(settings: Any) -> None:
    # Django 6's default TASKS names its ImmediateBackend: a module of
    # Django's own adds no hook of ours, so the worker leaves it (0.4 MB,
    # django.tasks with it) to whoever uses the backend. Another module of
    # Django's, one no test imports, stands for it on every Django version.
    module = "django.contrib.humanize.templatetags.humanize"
    assert module not in sys.modules
    settings.TASKS = {"default": {"BACKEND": f"{module}.Backend"}}
    registry.autodiscover()
    assert module not in sys.modules


@pytest.mark.parametrize(("options", "expected"), [({}, 8192), ({"socket_read_size": 65536}, 65536)])
def test_a_client_reads_replies_into_8_kib_unless_redis_options_say(
    cog: CogEnv, options: Any, expected: int
) -> None:
    # Each connection holds a read buffer of this size for its life: at
    # redis-py's 32 KiB, 0.3 MB for a worker's dozen connections.
    cog.configure(REDIS_OPTIONS=options)
    client = connection.build(get_config())
    try:
        assert client.ping()
        assert client.connection_pool.connection_kwargs["socket_read_size"] == expected
    finally:
        client.close()
