"""No secret in what a failure leaves behind: the locals a traceback
captures (Sentry's events, Django's DEBUG page), the messages of the system
checks and the commands, whatever the form of a mistyped setting.

Captured as those tools capture them: ``traceback.TracebackException(...,
capture_locals=True)``, formatted, of a real failure (a port nobody listens
on, a server that wants another password), with a distinct secret in every
place one can be set.
"""

from __future__ import annotations

import io
import json
import threading
import traceback
from typing import Any

import pytest
from django.core.management import call_command

from django_cogworker import redis_url
from django_cogworker.conf import get_config
from django_cogworker.connection import reset
from django_cogworker.errors import CogworkerError
from testproject.testapp import jobs
from tests.conftest import free_port

SECRET = "s3cr3t-pw-XYZ"


def captured(exc: BaseException) -> str:
    """``exc`` as Sentry or Django's DEBUG page see it: every frame of the
    chain with its locals."""
    return "".join(
        traceback.TracebackException(type(exc), exc, exc.__traceback__, capture_locals=True).format()
    )


def secret_settings(url: str) -> dict[str, Any]:
    """Every setting that can hold a secret, each holding one."""
    return {
        "REDIS_URL": url,
        "REDIS_OPTIONS": {"password": f"{SECRET}-options", "socket_connect_timeout": 1},
        "SENTINEL_OPTIONS": {"password": f"{SECRET}-sentinels", "ssl_password": f"{SECRET}-ssl"},
        "METRICS_TOKEN": f"{SECRET}-token",
        "ENQUEUE_ON_COMMIT": False,
    }


def dead_url(form: str) -> str:
    """A URL of ``form`` with a password, to a port nobody listens on."""
    port = free_port()
    return {
        "plain": f"redis://:{SECRET}-url@127.0.0.1:{port}/0",
        "tls": f"rediss://user:{SECRET}-url@127.0.0.1:{port}/0?ssl_password={SECRET}-query",
        "sentinel": f"redis+sentinel://:{SECRET}-url@127.0.0.1:{port}/mymaster",
        "cluster": f"redis+cluster://:{SECRET}-url@127.0.0.1:{port}",
    }[form]


def test_a_config_shows_every_setting_but_no_secret(settings):
    settings.COGWORKER = {
        **secret_settings(f"rediss://:{SECRET}-url@redis.example.com:6380/0?ssl_password={SECRET}-query"),
        "REDIS_OPTIONS": {
            "password": f"{SECRET}-options",
            "ssl_password": f"{SECRET}-ssl",
            "socket_timeout": 5,
        },
    }
    shown = repr(get_config())
    assert SECRET not in shown, shown
    assert "redis_url='rediss://:***@redis.example.com:6380/0?ssl_password=***'" in shown
    assert "redis_options={'password': '***', 'ssl_password': '***', 'socket_timeout': 5}" in shown
    assert "sentinel_options={'password': '***', 'ssl_password': '***'}" in shown
    assert "metrics_token='***'" in shown and "namespace='cogworker'" in shown


@pytest.mark.parametrize("form", ["plain", "tls", "sentinel", "cluster"])
def test_a_failed_delay_leaves_no_secret_in_its_captured_locals(cog, form):
    # No secret in a local of this frame: its locals are captured too.
    cog.configure(**secret_settings(dead_url(form)))
    reset()
    with pytest.raises(CogworkerError) as raised:
        jobs.record.delay("nowhere")
    text = captured(raised.value)
    assert "config = Config(" in text, "the push path's locals were captured"
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line]


def test_a_delay_refused_for_its_password_leaves_no_secret_in_its_captured_locals(cog, own_redis):
    """redis-py holds the password in a local while it sends AUTH: its
    frames are left out of the error's traceback."""
    server = own_redis()
    cog.redis.config_set("requirepass", "the-right-one")
    cog.configure(**secret_settings(f"redis://:{SECRET}-url@127.0.0.1:{server.port}/0"))
    reset()
    with pytest.raises(CogworkerError) as raised:
        jobs.record.delay("refused")
    text = captured(raised.value)
    assert "invalid username-password pair" in text and "config = Config(" in text
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line]


def test_a_failed_admin_page_leaves_no_secret_in_its_captured_locals(cog, superclient, monkeypatch):
    """Redis down: the page answers 503; the error it met, with the locals
    of every frame from the view down, holds no secret either."""
    from django_cogworker.admin import urls

    met: list[BaseException] = []
    real = urls.when_redis_answers

    def recording(request: Any, model_admin: Any, view: Any) -> Any:
        def answer() -> Any:
            try:
                return view()
            except Exception as exc:
                met.append(exc)
                raise

        return real(request, model_admin, answer)

    monkeypatch.setattr(urls, "when_redis_answers", recording)
    cog.configure(**secret_settings(dead_url("plain")))
    reset()
    response = superclient.get("/admin/django_cogworker/job/dashboard/")
    assert response.status_code == 503 and len(met) == 1
    text = captured(met[0])
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line]


def test_a_failed_worker_start_leaves_no_secret_in_its_captured_locals(cog, own_redis):
    """A password the server refuses stops the worker at boot: neither the
    error nor the redis-py error under it keeps a password in a local."""
    from django_cogworker.launcher import Launcher

    server = own_redis()
    cog.redis.config_set("requirepass", "the-right-one")
    cog.configure(**secret_settings(f"redis://:{SECRET}-url@127.0.0.1:{server.port}/0"))
    reset()
    met: list[BaseException] = []

    def boot() -> None:
        try:
            Launcher(get_config()).run()
        except Exception as exc:
            met.append(exc)

    thread = threading.Thread(target=boot)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and len(met) == 1, met
    text = captured(met[0])
    assert "cogworker cannot start" in text and "self = <django_cogworker.launcher.Launcher" in text
    assert SECRET not in text, [line for line in text.splitlines() if SECRET in line]


# -- mistyped URLs: item by item, the password never shown --------------------------------


MISTYPED = [
    f":{SECRET}@127.0.0.1:6379/0",
    f"redis:/:{SECRET}@127.0.0.1",
    [f"redis://:{SECRET}@127.0.0.1:6379/0"],
    (f"redis://:{SECRET}@127.0.0.1:6379/0",),
    f"user:{SECRET}@127.0.0.1:6379",
    b"redis://:" + SECRET.encode() + b"@127.0.0.1",
]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (f":{SECRET}@host:6379/0", ":***@host:6379/0"),
        (f"redis:/:{SECRET}@host", "redis:/:***@host"),
        ([f"redis://:{SECRET}@host/0"], "['redis://:***@host/0']"),
        ((f"redis://:{SECRET}@host/0",), "('redis://:***@host/0',)"),
        (f"('redis://:{SECRET}@host/0',)", "('redis://:***@host/0',)"),
        (f"rediss://host/0?ssl_password={SECRET}&db=1", "rediss://host/0?ssl_password=***&db=1"),
        (f"rediss://host/0?ssl_keyfile_password={SECRET}", "rediss://host/0?ssl_keyfile_password=***"),
        (f"redis://app:{SECRET}@host", "redis://app:***@host"),
        (f"redis://{SECRET}@host", "redis://***@host"),
        (f"redis://:p@{SECRET}@host", "redis://:***@host"),
        (b"redis://:" + SECRET.encode() + b"@host", "b'redis://:***@host'"),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("unix:///tmp/redis.sock?db=2", "unix:///tmp/redis.sock?db=2"),
        (6379, "6379"),
    ],
)
def test_masked_hides_whatever_could_be_credentials(value, shown):
    assert redis_url.masked(value) == shown


def run_command(name: str, *args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(name, *args, stdout=out, stderr=err)
    return int(exited.value.code or 0), out.getvalue() + err.getvalue()


@pytest.mark.parametrize(
    "url", MISTYPED, ids=["no-scheme", "one-slash", "list", "tuple", "no-colon", "bytes"]
)
def test_a_mistyped_url_shows_no_password_in_checks_status_or_mark_deploy(cog, url):
    from django_cogworker.checks import check_settings

    cog.configure(REDIS_URL=url)
    reset()
    errors = check_settings()
    assert [e.id for e in errors] == ["cogworker.E008"]
    assert SECRET not in errors[0].msg + str(errors[0].hint) and "***" in errors[0].msg
    for args in (("cogworker_status",), ("cogworker_status", "--json"), ("cogworker_mark_deploy", "v1")):
        status, said = run_command(*args)
        assert status == 2 and SECRET not in said and "***" in said, (args, said)
        if "--json" in args:
            assert SECRET not in json.loads(said.splitlines()[0])["redis"]


def test_tls_query_passwords_are_masked_in_status_and_mark_deploy(cog):
    cog.configure(REDIS_URL=f"rediss://127.0.0.1:{free_port()}/0?ssl_certfile=/nowhere&ssl_password={SECRET}")
    reset()
    for args in (("cogworker_status",), ("cogworker_status", "--json"), ("cogworker_mark_deploy", "v1")):
        status, said = run_command(*args)
        assert status == 2 and SECRET not in said and "ssl_password=***" in said, (args, said)
