from __future__ import annotations

from testproject.testapp import jobs
from tests.conftest import wait_for


def test_worker_runs_a_job(cog):
    jid = jobs.record.delay("hello")
    worker = cog.start_worker()
    runs = wait_for(lambda: cog.notes(), 20, "the job to run")
    assert runs[0]["jid"] == jid
    assert runs[0]["tag"] == "hello"
    worker.signal(15)
    assert worker.wait(15) == 0
