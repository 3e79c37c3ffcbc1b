"""django_cogworker.contrib.sentry, against a real Redis: a failing job run
through the real failure path reaches Sentry with its tags, never with its
arguments.

Sentry is initialised per test with a transport that keeps the envelopes in
a list, and without integrations (they patch Django and redis-py for the
rest of the process); the client is taken off again after each test."""

from __future__ import annotations

import importlib
import json
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

from django_cogworker import job, testing
from django_cogworker.contrib import sentry
from testproject.testapp import jobs
from tests.conftest import wait_for

REPORT = "django_cogworker.contrib.sentry.report"
SECRET = "ada@example.com"
FAIL_WITH_SECRET = "tests.test_contrib_sentry.fail_with_secret"

#: The option that has the frames' local variables sent: its name changed
#: with the SDK's major version (2: ``include_local_variables``; 3:
#: ``data_collection``'s ``stack_frame_variables``).
LOCAL_VARIABLES_SENT: dict[str, Any] = (
    {"include_local_variables": True}
    if int(sentry_sdk.VERSION.split(".")[0]) < 3
    else {"data_collection": {"stack_frame_variables": True}}
)


@job(retry=0)
def fail_with_secret(email: str, *, note: str = "") -> None:
    account = {"email": email, "note": note}  # a local holding the arguments
    raise LookupError(f"no such account ({len(account)} fields)")


class KeepEnvelopes(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.envelopes: list[Envelope] = []

    def capture_envelope(self, envelope: Envelope) -> None:
        self.envelopes.append(envelope)

    def events(self) -> list[Any]:
        return [e for e in (envelope.get_event() for envelope in self.envelopes) if e is not None]


@pytest.fixture
def transport(cog: Any) -> Iterator[KeepEnvelopes]:
    kept = KeepEnvelopes()
    # Sending the frames' local variables is Sentry's default, named here:
    # report() must drop them even so.
    sentry_sdk.init(
        transport=kept,
        default_integrations=False,
        auto_enabling_integrations=False,
        **LOCAL_VARIABLES_SENT,
    )
    cog.configure(ERROR_HANDLERS=[REPORT])
    yield kept
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def test_a_failure_is_reported_with_its_tags_and_without_its_arguments(cog, transport):
    jid = fail_with_secret.delay(SECRET, note=SECRET)
    assert testing.drain() == 1
    (event,) = transport.events()
    (exception,) = event["exception"]["values"]
    assert exception["type"] == "LookupError"
    assert exception["value"] == "no such account (2 fields)"
    assert event["tags"] == {
        "cogworker.job": FAIL_WITH_SECRET,
        "cogworker.queue": "default",
        "cogworker.jid": jid,
        "cogworker.retry_count": "0",
    }
    assert event["contexts"]["cogworker"] == {
        "job": FAIL_WITH_SECRET,
        "queue": "default",
        "jid": jid,
        "retry_count": 0,
    }
    assert event["fingerprint"] == ["{{ default }}", FAIL_WITH_SECRET]
    frames = exception["stacktrace"]["frames"]
    assert frames[-1]["function"] == "fail_with_secret"  # the stack trace is sent...
    assert all("vars" not in frame for frame in frames)  # ...without the frames' variables
    assert SECRET not in json.dumps(event, default=str)


def test_every_failure_is_reported_with_its_retry_count(cog, transport):
    jid = jobs.fail.delay("boom")
    assert testing.drain() == 1
    # The retry is due in 0.1 s.
    wait_for(lambda: testing.drain(include_scheduled=True), what="the retry to run")
    events = transport.events()
    assert [e["tags"]["cogworker.retry_count"] for e in events] == ["0", "1"]
    assert {e["tags"]["cogworker.jid"] for e in events} == {jid}


def test_the_tags_stay_in_the_scope_of_the_report(cog, transport):
    fail_with_secret.delay(SECRET)
    testing.drain()
    sentry_sdk.capture_message("later")
    report, later = transport.events()
    assert "cogworker.job" in report["tags"]
    assert not any(tag.startswith("cogworker.") for tag in later.get("tags", {}))
    assert "cogworker" not in later.get("contexts", {})


def test_without_sentry_initialised_report_sends_nothing_and_raises_nothing():
    sentry.report(ValueError("x"), {"jid": "j", "job": "a.b", "queue": "default", "retry_count": 0})


def test_without_sentry_sdk_the_import_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentry_sdk", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "django_cogworker.contrib.sentry")
    with pytest.raises(ImportError, match=re.escape('pip install "django-cogworker[sentry]"')):
        importlib.import_module("django_cogworker.contrib.sentry")
