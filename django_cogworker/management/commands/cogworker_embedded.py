"""``manage.py cogworker_embedded start|stop|status``: the embedded Redis."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_cogworker import embedded
from django_cogworker.conf import get_config


class Command(BaseCommand):
    help = "Start, stop or check the embedded Redis server (REDIS_URL = 'embedded')."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args: Any, **options: Any) -> None:
        directory = get_config().embedded_dir
        action = options["action"]
        if action == "start":
            path = embedded.ensure_running(directory)
            self.stdout.write(f"embedded Redis running on unix://{path}")
        elif action == "stop":
            stopped = embedded.stop(directory)
            self.stdout.write("embedded Redis stopped" if stopped else "embedded Redis was not running")
        else:
            running = embedded.is_running(directory)
            self.stdout.write(f"embedded Redis {'running' if running else 'not running'} ({directory})")
