"""Settings of the demo site (``rundemo.py`` runs every command with them).

They are ``testproject.settings``, which the test suite uses unchanged, with
two differences that only make sense for the demo:

- ``testproject.testapp`` (the jobs the tests run) is not installed, so the
  admin's job filters offer the demo's jobs only;
- a periodic entry, so that the admin's Periodic page has something to show:
  ``testproject.demo.jobs.note`` every minute.
"""

from testproject.settings import *  # noqa: F403
from testproject.settings import COGWORKER, INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "testproject.testapp"]

COGWORKER = {
    **COGWORKER,
    "PERIODIC": [
        *COGWORKER.get("PERIODIC", []),
        {
            "cron": "* * * * *",
            "job": "testproject.demo.jobs.note",
            "args": ["periodic entry: every minute, from COGWORKER['PERIODIC']"],
        },
    ],
}
