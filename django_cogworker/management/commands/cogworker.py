"""``manage.py cogworker``: run a worker process (or N under a supervisor)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_cogworker import affinity, connection, logs
from django_cogworker.conf import QueueSpec, get_config, parse_queue, queue_list_problems
from django_cogworker.errors import RedisAccessRefused
from django_cogworker.fetch import STRATEGIES

logger = logging.getLogger("django_cogworker")


class Command(BaseCommand):
    help = "Run a django-cogworker worker: fetch jobs from Redis and run them."
    requires_system_checks = "__all__"

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "-q",
            "--queue",
            action="append",
            dest="queues",
            metavar="NAME[,WEIGHT]",
            help="queue to work on (repeatable); overrides COGWORKER['QUEUES']",
        )
        parser.add_argument("-c", "--concurrency", type=int, help="processor threads")
        parser.add_argument("--fetch", choices=list(STRATEGIES), help="fetch strategy")
        parser.add_argument(
            "-t",
            "--shutdown-timeout",
            type=float,
            dest="shutdown_timeout",
            help="seconds SIGTERM waits for running jobs",
        )
        parser.add_argument("--tag", default="", help="a label shown in the admin's process list")
        parser.add_argument(
            "--processes", type=int, default=1, help="run N worker processes under one supervisor"
        )
        parser.add_argument(
            "--reload",
            action="store_true",
            help="development: restart the worker when a Python file changes, as runserver does",
        )
        # None when -v is not given: a project's own LOGGING then keeps its levels.
        parser.set_defaults(verbosity=None)

    def handle(self, *args: Any, **options: Any) -> None:
        logs.configure(options["verbosity"])
        processes = options["processes"]
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        config = get_config()
        queues = self.queues(options)
        concurrency = options["concurrency"] or config.concurrency
        keys, shares = connection.get_keys(), []
        if keys.sharded:
            from django_cogworker import shards  # a process per queue group: only under SHARDING

            shares = shards.split(keys, queues or config.queues, concurrency)
        if processes > 1 or options["reload"] or len(shares) > 1:
            from django_cogworker.supervisor import Supervisor

            child, each = self.child_args(sys.argv), None
            if len(shares) > 1:
                # Under SHARDING, a process per queue group (shards.split).
                child = self.strip(child, ("-q", "--queue", "-c", "--concurrency"))
                each = [share.args() for share in shares for _ in range(processes)]
                groups = ", ".join(f"{s.group} ({s.concurrency} threads)" for s in shares)
                logger.info("queues in %d groups, a process for each: %s", len(shares), groups)
            timeout_s = options["shutdown_timeout"]
            if timeout_s is None:
                timeout_s = config.shutdown_timeout_s
            cpus = affinity.plan(config.cpu_affinity, len(each) if each else processes)
            sys.exit(Supervisor(cpus, child, timeout_s, reload=options["reload"], each=each).run())
        self.run_one(options, queues)

    @staticmethod
    def queues(options: dict[str, Any]) -> tuple[QueueSpec, ...] | None:
        """The queues of ``--queue``, refused as the QUEUES check (E013,
        E014) refuses them; None without the flag."""
        if not options["queues"]:
            return None
        try:
            queues = tuple(parse_queue(q) for q in options["queues"])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        problems = queue_list_problems(queues)
        if problems.mixed:
            raise CommandError(
                "--queue mixes weighted and unweighted queues: give every queue a weight, or none"
            )
        if problems.repeated:
            raise CommandError("--queue names a queue more than once: give it a weight instead")
        return queues

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, run in a forked child where one can be
        forked: what they import (the project's URLconf and every view under
        it, each app's template tags, the migration autodetector) then takes
        no memory in the worker, which serves no page. What they print and
        decide is the same: a child that passes prints its warnings (only a
        pass prints anything); otherwise they run again here, and stop the
        worker with the message, or the exception, they stop it with."""
        # A fork with threads running could copy a lock held by one of them.
        if not hasattr(os, "fork") or threading.active_count() > 1:
            super().check(*args, **kwargs)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child leaves through os._exit)
            status = 1
            try:
                super().check(*args, **kwargs)
                sys.stdout.flush()
                sys.stderr.flush()
                status = 0
            finally:
                os._exit(status)  # never the parent's cleanup, nor its exit
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            super().check(*args, **kwargs)

    @staticmethod
    def child_args(argv: list[str]) -> list[str]:
        """The command line minus ``--processes`` and ``--reload`` (and what
        precedes the command name)."""
        try:
            rest = argv[argv.index("cogworker") + 1 :]
        except ValueError:
            rest = argv[1:]
        return [a for a in Command.strip(rest, ("--processes",)) if a != "--reload"]

    @staticmethod
    def strip(args: list[str], options: tuple[str, ...]) -> list[str]:
        """``args`` without the options named (each with its value, in any
        of argparse's spellings: ``-q a``, ``-qa``, ``--queue a``, ``--queue=a``)."""
        out: list[str] = []
        skip = False
        for arg in args:
            if skip:
                skip = False
            elif arg in options:
                skip = True
            elif not any(arg.startswith(f"{o}=") or (len(o) == 2 and arg.startswith(o)) for o in options):
                out.append(arg)
        return out

    @staticmethod
    def wait_for_redis() -> bool:
        """The client made before the worker starts (a Cluster client needs a
        node that answers): SIGTERM or SIGINT meanwhile stops the wait, and
        the process exits 0 as a stopped worker does."""
        stop = threading.Event()
        names = (signal.SIGTERM, signal.SIGINT)
        if threading.current_thread() is not threading.main_thread():
            return connection.wait_for_client(stop)  # only the main thread takes signals
        before = {n: signal.signal(n, lambda *_: stop.set()) for n in names}
        try:
            return connection.wait_for_client(stop)
        finally:
            for name, handler in before.items():
                signal.signal(name, handler)

    def run_one(self, options: dict[str, Any], queues: tuple[QueueSpec, ...] | None) -> None:
        from django_cogworker.launcher import Launcher

        config = get_config()
        affinity.apply(config.cpu_affinity)  # before the worker starts its threads
        if not self.wait_for_redis():
            return
        launcher = Launcher(
            config,
            queues=queues,
            concurrency=options["concurrency"],
            fetch=options["fetch"],
            shutdown_timeout_s=options["shutdown_timeout"],
            tag=options["tag"],
        )
        try:
            launcher.run()
        except RedisAccessRefused as exc:
            raise CommandError(str(exc)) from None  # exit status 1, the message, no traceback
        if launcher.exit_status:
            # A thread stuck in a C call may never return: the process
            # leaves it behind (processor threads are daemons).
            sys.exit(launcher.exit_status)
