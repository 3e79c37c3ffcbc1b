"""``manage.py cogworker_migrate [--dry-run]``: moves the jobs of the
one-slot layout to the sharded one (SPEC section 16), for settings with
``SHARDING = "queues"``; see :mod:`django_cogworker.migrate_layout`.

Refuses while a worker of the old layout is alive (stop them first), and
says what it moved, by kind. Safe to run again, and to stop at any point:
a rerun moves what is left and nothing twice.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_cogworker.connection import get_keys, get_redis
from django_cogworker.errors import CogworkerError, redis_boundary
from django_cogworker.migrate_layout import Migration, live_processes, old_keys


class Command(BaseCommand):
    help = "Move the jobs of the one-slot layout to the sharded one (SHARDING = 'queues')."
    # It runs between the old workers' stop and the new ones' start; the
    # checks of the settings are the workers'.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--dry-run", action="store_true", help="count what would move; move nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        new = get_keys()
        if not new.sharded:
            raise CommandError(
                "COGWORKER['SHARDING'] is not 'queues' in these settings, so there is no sharded layout "
                "to move jobs to: set it (with a NAMESPACE without braces) and run this again."
            )
        try:
            with redis_boundary("move the jobs to the sharded layout"):
                client = get_redis()
                old = old_keys(new)
                live = live_processes(client, old)
                if live:
                    shown = ", ".join(live[:5]) + (f" and {len(live) - 5} more" if len(live) > 5 else "")
                    raise CommandError(
                        f"{len(live)} worker process(es) of the one-slot layout are alive ({shown}): "
                        "stop them first, so that none is running a job while its list moves."
                    )
                counts = Migration(client, new, dry=options["dry_run"]).run()
        except CogworkerError as exc:
            raise CommandError(str(exc)) from None
        verb = "would move" if options["dry_run"] else "moved"
        if not counts:
            self.stdout.write(f"nothing to move from the one-slot layout ({old.namespace})")
        for what, n in sorted(counts.items()):
            self.stdout.write(f"{verb} {n} {what}")
