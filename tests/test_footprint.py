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


def loaded(then: str = "") -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", WORKER_START.format(then=then)],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_worker_with_no_periodic_entry_loads_neither_croniter_nor_the_admin_pages() -> None:
    modules = loaded()
    assert "django_cogworker.admin" in modules  # the admin's autodiscovery ran
    assert "django_cogworker.periodic.ticker" in modules  # the worker's own modules are there
    assert [name for name in UNUSED if name in modules] == []


def test_croniter_and_the_admin_pages_load_where_they_are_used() -> None:
    modules = loaded(
        "from django_cogworker.cron import Schedule; Schedule('*/5 * * * *').next_run(0.0)\n"
        "from django.contrib import admin; admin.site.get_urls()"
    )
    assert [name for name in UNUSED if name not in modules] == []
