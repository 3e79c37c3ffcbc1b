#!/usr/bin/env python
"""The side-by-side harness with one more row: ``cogworkerasync``, an ``async def`` no-op.

The harness (``shared/bench``) is not ours to change, and has no row for
``async def`` jobs yet (SPEC section 15). This runs the harness itself
(its ``run.py``: the same Redis server, the same measurements in the same
order, the same table) with one adapter added in memory: the cogworker
row's adapter, venv, settings and worker command, with an app whose job is

    @job
    async def anoop():
        record()

(the harness's ``record()``: one ``RPUSH cogbench:done``), enqueued with
``.delay()`` and ``.delay_many()`` as the cogworker row's ``noop`` is. By
default the run holds the asyncio peers (arq, SAQ, streaQ, taskiq), the
cogworker row and the async row, so that "vs best peer" is the async row
against the best asyncio peer of the same run. Every option of the harness
passes through.

    python3 tools/bench_async.py                            # shared/ beside the checkout
    python3 tools/bench_async.py --repeat 3 --out async.json
    python3 tools/bench_async.py --systems cogworker,cogworkerasync --jobs 2000
    python3 tools/bench_async.py --bench /path/to/shared/bench

``--smoke`` runs the async row alone on a few jobs with this interpreter
(the project's ``.venv``) instead of the harness's venv: a check that the
tool runs, not a figure.
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

SYSTEMS = "arq,saq,streaq,taskiq,cogworker,cogworkerasync"

#: The adapter's name (``--systems``) and its row's key in the JSON.
NAME = "cogworkerasync"
SETTINGS_MODULE = "cogbench_settings_async"
APP = "cogbench_async_app"
MODULE = "cogworkerasync_jobs"

APP_JOBS_PY = '''\
"""The harness's no-op, as an ``async def`` job."""

from django_cogworker import job

from benchlib.recorder import record


@job
async def anoop():
    record()
'''

#: The driver's module: what ``workloads/cogworker_jobs.py`` is to the cogworker row.
WORKLOAD_PY = f'''\
"""The cogworker row's workload with an ``async def`` no-op."""

import django

django.setup()

from {APP}.jobs import anoop  # noqa: E402  (needs django.setup())

DISTRIBUTIONS = ("django-cogworker", "django", "redis", "hiredis")
BULK_API = "delay_many()"


def enqueue_one():
    anoop.delay()


def enqueue_many(n):
    anoop.delay_many([((), {{}})] * n)
'''


def write_app(tmp_dir: str) -> str:
    """Writes the app and the driver's module; returns their directory."""
    where = Path(tmp_dir, "cogworker-async")
    (where / APP).mkdir(parents=True, exist_ok=True)
    (where / APP / "__init__.py").write_text("")
    (where / APP / "jobs.py").write_text(APP_JOBS_PY)
    (where / f"{MODULE}.py").write_text(WORKLOAD_PY)
    return str(where)


def install_adapter(smoke: bool) -> None:
    """Makes ``adapters.cogworkerasync`` importable, for ``adapters.load``.
    Imported from the harness, which must be on ``sys.path`` first."""
    from adapters import CONCURRENCY, Row
    from adapters.cogworker import APPS, CogworkerAdapter, write_settings
    from benchlib.venvs import Venv

    class CogworkerAsyncAdapter(CogworkerAdapter):
        name = NAME  # its venv is the cogworker row's (prepare), its label says "cogworker"

        def prepare(self, ctx: Any) -> Any:
            # --smoke: this interpreter's environment, with the checkout installed.
            return Venv(sys.prefix) if smoke else super().prepare(ctx)

        def rows(self, venv: Any, ctx: Any) -> list[Any]:
            settings_dir = write_settings(ctx, SETTINGS_MODULE, apps=(*APPS, APP))
            argv = [venv.python, "-m", "django", "cogworker"]
            description = f"CONCURRENCY={CONCURRENCY}, ASYNC_CONCURRENCY=100 (default), async def no-op"
            return [
                Row(
                    "cogworker-async",
                    description,
                    MODULE,
                    argv,
                    env={"DJANGO_SETTINGS_MODULE": SETTINGS_MODULE},
                    pythonpath=[settings_dir, write_app(ctx.tmp_dir)],
                    peer=False,
                    notes=["the cogworker row's worker and settings; its job is `async def anoop()`"],
                )
            ]

    module = types.ModuleType(f"adapters.{NAME}")
    module.ADAPTER = CogworkerAsyncAdapter()  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], add_help=False)
    parser.add_argument("--bench", default=str(ROOT.parent / "shared" / "bench"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("-h", "--help", action="store_true")
    options, rest = parser.parse_known_args()
    if options.help:
        print(__doc__)
        return 0
    bench = Path(options.bench)
    if not (bench / "run.py").is_file():
        if options.smoke:
            print(f"bench_async: skipped, no harness at {bench} (--bench)")
            return 0
        sys.exit(f"bench_async: no harness at {bench} (--bench)")
    sys.path.insert(0, str(bench))
    install_adapter(options.smoke)
    import run  # the harness's run.py

    argv = ["--project", str(ROOT), *rest]
    if "--systems" not in rest:
        argv += ["--systems", NAME if options.smoke else SYSTEMS]
    if options.smoke:
        argv += ["--jobs", "20", "--latency-jobs", "3", "--python", sys.executable]
    return int(run.main(argv))


if __name__ == "__main__":
    sys.exit(main())
