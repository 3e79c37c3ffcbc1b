"""``manage.py cogworker_mark_deploy LABEL [--at EPOCH_S]``: marks a deploy
on the admin's Metrics charts (``api.mark_deploy``), from a deploy script.

Exit status 0 when the mark is stored; 2 when Redis cannot be written (the
deploy goes on: a missing mark loses a line on a chart, nothing else).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_cogworker import api
from django_cogworker.conf import get_config
from django_cogworker.connection import describe
from django_cogworker.errors import CogworkerError

#: Exit status when Redis cannot be written (as cogworker_status's).
NO_REDIS = 2


class Command(BaseCommand):
    help = "Mark a deploy (or any event) on the Metrics charts of the jobs admin."
    requires_system_checks: list[str] = []  # a deploy script must not fail on an unrelated check

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("label", help="what was deployed, e.g. v1.4.2 (cut at 200 characters)")
        parser.add_argument("--at", type=float, default=None, help="when, in epoch seconds (default: now)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            mark = api.mark_deploy(options["label"], at=options["at"])
        except ValueError as exc:  # --at nan
            raise CommandError(str(exc)) from None
        except CogworkerError as exc:
            where = describe(get_config())  # never the password
            self.stderr.write(f"cogworker_mark_deploy: cannot write to Redis at {where}: {exc}")
            sys.exit(NO_REDIS)
        self.stdout.write(f"Marked {mark.label!r} at {mark.at:.0f}")
