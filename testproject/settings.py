"""Settings of the demo site, also used by the test suite.

Environment variables:

- ``COGWORKER_REDIS_URL``: the Redis server (default ``"embedded"``: a local
  server started on demand, kept in ``.cogworker/`` next to this file).
- ``COGWORKER_OVERRIDES``: a JSON object merged over ``COGWORKER`` (the tests
  configure worker subprocesses with it).
- ``COGWORKER_TASKS_OPTIONS``: a JSON object, the ``OPTIONS`` of the cogworker
  Tasks backend (when Django's Tasks framework is installed).
- ``COGWORKER_DB_PATH``: the SQLite database file (default ``db.sqlite3`` here).
- ``COGWORKER_LOG_LEVEL``: level of the ``django_cogworker`` logger (default INFO).
- ``DJANGO_DEBUG``: ``0``/``false`` turns debug mode off (default on).
"""

import importlib.util
import json
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent

DEBUG = os.environ.get("DJANGO_DEBUG", "1").strip().lower() not in {"0", "false", "no", "off", ""}

# A fixed key: this project is a local demo and a test fixture, never deployed.
SECRET_KEY = "django-insecure-cogworker-demo-key-do-not-use-in-production"

ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_cogworker",
    "testproject.demo",
    "testproject.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("COGWORKER_DB_PATH") or BASE_DIR / "db.sqlite3",
        # Web server and worker write to the same file: wait for the lock.
        "OPTIONS": {"timeout": 20},
    }
}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

COGWORKER = {
    "REDIS_URL": os.environ.get("COGWORKER_REDIS_URL", "embedded"),
    "QUEUES": ["default", "mail", "low"],
    # Where the embedded Redis keeps its socket, pid file and AOF.
    "EMBEDDED_DIR": str(BASE_DIR / ".cogworker"),
}
COGWORKER.update(json.loads(os.environ.get("COGWORKER_OVERRIDES", "{}")))
# The tests' workers fetch only "default" (FAST in tests/conftest.py), while
# testapp's jobs use other queues too, on purpose: the warning about a queue
# QUEUES does not list has tests of its own (tests/test_first_hour.py).
SILENCED_SYSTEM_CHECKS = ["cogworker.W001"]

# Django's Tasks framework on cogworker: django.tasks on Django >= 6.0, the
# django-tasks backport on 5.2; left out when neither is installed.
_HAS_DJANGO_TASKS = importlib.util.find_spec("django.tasks") is not None
if _HAS_DJANGO_TASKS or importlib.util.find_spec("django_tasks") is not None:
    if not _HAS_DJANGO_TASKS:
        INSTALLED_APPS.append("django_tasks")
    TASKS = {
        "default": {
            "BACKEND": "django_cogworker.tasks.CogworkerBackend",
            "QUEUES": ["default"],
            "OPTIONS": json.loads(os.environ.get("COGWORKER_TASKS_OPTIONS", "{}")),
        }
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "django_cogworker": {
            "handlers": ["console"],
            "level": os.environ.get("COGWORKER_LOG_LEVEL", "INFO").upper(),
            "propagate": False,
        },
    },
}
