"""An error handler that reports job failures to Sentry.

Duties:
- :func:`report`, for ``COGWORKER["ERROR_HANDLERS"]``: send every failure
  of a job (each one that will be retried too) to Sentry, in a scope of its
  own, tagged ``cogworker.job``, ``cogworker.queue``, ``cogworker.jid`` and
  ``cogworker.retry_count``, with the same four in a ``cogworker`` context,
  and grouped per job (an error raised in shared code by two jobs is two
  issues);
- never send the job's arguments. They may hold personal data (an email
  address, a name, a message), and a Sentry project is often seen by more
  people, and kept for longer, than the database they came from. They are
  left out of the tags and context, and the local variables of the stack
  frames are dropped from these events: the job's own frame holds its
  arguments, and the worker's frames hold the whole payload, whatever
  ``include_local_variables`` (SDK 2) or ``data_collection``'s
  ``stack_frame_variables`` (SDK 3) says. A project that wants them sent writes
  its own handler (see docs/middleware.md).

What else an event carries (release, environment, breadcrumbs, the
exception's message, which is the job's own text) follows the project's
``sentry_sdk.init()`` options, as for any other event.

Install with ``pip install "django-cogworker[sentry]"``, and call
``sentry_sdk.init()`` in the settings, as for the web processes: a worker
loads the same settings.
"""

from __future__ import annotations

from typing import Any

try:
    import sentry_sdk
except ImportError as exc:
    raise ImportError(
        "django_cogworker.contrib.sentry needs the Sentry SDK, which is not installed: "
        'pip install "django-cogworker[sentry]"',
        name=exc.name,
    ) from exc

#: The keys of an error handler's context that are sent (never ``payload``).
SENT = ("job", "queue", "jid", "retry_count")


def report(exc: BaseException, context: dict[str, Any]) -> None:
    """Sends one failure of a job to Sentry (an ERROR_HANDLERS callable)."""
    sent = {key: context.get(key) for key in SENT}
    with sentry_sdk.new_scope() as scope:
        for key, value in sent.items():
            # Tag values are text in Sentry (an int is searched as text there too).
            scope.set_tag(f"cogworker.{key}", "" if value is None else str(value))
        scope.set_context("cogworker", sent)
        scope.fingerprint = ["{{ default }}", str(sent["job"])]
        scope.add_event_processor(_without_local_variables)
        sentry_sdk.capture_exception(exc)


def _without_local_variables(event: Any, hint: Any) -> Any:
    """The event with no frame's ``vars``: they hold the job's arguments."""
    for section in ("exception", "threads"):
        values = event.get(section, {}).get("values", ())
        for value in values:
            for frame in (value.get("stacktrace") or {}).get("frames", ()):
                frame.pop("vars", None)
    return event
