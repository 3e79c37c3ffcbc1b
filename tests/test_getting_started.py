"""docs/getting-started.md runs as written (issue 32, item 7): the example
project is built from the page's own code blocks (each names its file on
its first line), with the page's commands, and one order placed through its
view has its receipt sent by a real worker against a real Redis."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, wait_for

PAGE = ROOT / "docs" / "getting-started.md"

#: The first line of a block that is a file of the example: ``# path``,
#: ``# path (add at the end)`` (appended), or ``{# path #}`` (a template).
FILE_MARK = re.compile(r"^(?:# (?P<py>\S+\.py)(?P<add> \(add at the end\))?|\{# (?P<html>\S+\.html) #\})$")

#: The page's commands, run here in its order (each must be on the page).
COMMANDS = [
    ("django-admin startproject mysite", "."),
    ("python manage.py startapp shop", "mysite"),
    ("python manage.py makemigrations shop", "mysite"),
    ("python manage.py migrate", "mysite"),
]

#: What the test does through Django's test client instead of a browser on
#: runserver: the form posted to the checkout view, then the page it leads to.
PLACE_ORDER = """
from django.test import Client

client = Client(HTTP_HOST="localhost")
assert b'name="email"' in client.get("/shop/checkout/").content
response = client.post("/shop/checkout/", {"email": "ada@example.com"}, follow=True)
assert response.status_code == 200, response.status_code
print(response.content.decode())
"""


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```$", markdown, re.S | re.M)


def example_files(markdown: str) -> list[tuple[str, bool, str]]:
    """(path, appended, text) of each block that names a file, in page order."""
    files = []
    for _, text in code_blocks(markdown):
        first, _, _ = text.partition("\n")
        mark = FILE_MARK.match(first)
        if mark:
            files.append((mark["py"] or mark["html"], bool(mark["add"]), text))
    return files


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_getting_started_example_builds_and_runs_a_job(cog, own_redis, tmp_path):
    server = own_redis()
    page = PAGE.read_text()
    commands = [line for lang, text in code_blocks(page) if lang == "sh" for line in text.splitlines()]
    files = example_files(page)
    paths = {path for path, _, _ in files}
    assert {"mysite/settings.py", "shop/models.py", "shop/jobs.py", "shop/views.py", "shop/urls.py"} <= paths
    assert {"mysite/urls.py", "shop/templates/shop/checkout.html", "shop/templates/shop/thanks.html"} <= paths
    env = {
        **os.environ,
        "COGWORKER_REDIS_URL": server.url,
        # The example is its own project: none of the test project's settings.
        "PYTHONPATH": "",
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("COGWORKER_OVERRIDES", None)
    for command, where in COMMANDS:
        assert command in commands, f"the page no longer says {command!r}"
        run(command.replace("python ", f"{sys.executable} ", 1).split(), tmp_path / where, env)
        if command.startswith("python manage.py startapp"):
            # The page's files, once the project and the app exist.
            for path, appended, text in files:
                target = tmp_path / "mysite" / path
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("a" if appended else "w") as f:
                    f.write(("\n" if appended else "") + text)
    project = tmp_path / "mysite"
    checked = run([sys.executable, "manage.py", "check"], project, env)
    assert "System check identified no issues" in checked, checked

    assert "python manage.py cogworker --reload" in commands
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "cogworker"],
            cwd=project,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for(lambda: " starting: " in log_path.read_text(), 30, "the worker's start line")
        thanks = run([sys.executable, "manage.py", "shell", "-c", PLACE_ORDER], project, env)
        assert "Thank you: order 1 is placed, and its receipt goes to ada@example.com." in thanks, thanks

        def receipt_sent() -> bool:
            with sqlite3.connect(project / "db.sqlite3") as db:
                return db.execute("SELECT receipt_sent_at FROM shop_order").fetchone()[0] is not None

        wait_for(receipt_sent, 30, "the receipt job to run")
        wait_for(lambda: " shop.jobs.send_receipt done in " in log_path.read_text(), 10, "the done line")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    log = log_path.read_text()
    assert "Subject: Your receipt" in log and "Thank you for your order 1, placed on " in log, log
    assert re.search(r" starting: queues default,mail, \d+ jobs registered, ", log), log
    assert " ERROR " not in log and "Traceback" not in log, log
