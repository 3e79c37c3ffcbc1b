"""The batches' Prometheus figures (issue 27): ``cogworker_batches_open``
and ``cogworker_batch_callbacks_total{event}``, from real batches run by a
real worker, read through the endpoint as a scraper reads them."""

from __future__ import annotations

import pytest
from django.urls import path

from django_cogworker import api, batch, views
from testproject.testapp import workflow_jobs as wf
from tests.conftest import CogEnv, wait_for
from tests.test_metrics_endpoint import TOKEN, URL, samples, scrape

urlpatterns = [path(URL.lstrip("/"), views.metrics)]
pytestmark = pytest.mark.urls(__name__)


def figures(cog: CogEnv) -> tuple[float, dict[str, float]]:
    got = samples(scrape(Authorization=f"Bearer {TOKEN}"))
    callbacks = {
        dict(labels)["event"]: value
        for (name, labels), value in got.items()
        if name == "cogworker_batch_callbacks_total"
    }
    return got[("cogworker_batches_open", ())], callbacks


def test_open_batches_and_callbacks_enqueued_by_event(cog: CogEnv) -> None:
    cog.configure(METRICS_TOKEN=TOKEN)
    assert figures(cog) == (0, {"success": 0, "complete": 0, "death": 0, "settled": 0})
    every = {f"on_{event}": wf.callback.s(event) for event in ("success", "complete", "death", "settled")}
    with batch(**every) as ok:
        for i in range(3):
            wf.member.delay(i)
    with batch(**every) as failing:
        wf.die.delay("x")
        wf.member.delay("y")
    with batch(on_success=wf.callback.s("never")) as parked:
        wf.member.set(queue="parked").delay("z")  # a queue no worker serves: stays open
    assert figures(cog) == (3, {"success": 0, "complete": 0, "death": 0, "settled": 0})
    cog.start_worker()
    both = (ok.bid, failing.bid)
    wait_for(lambda: all(api.Batch(bid).settled for bid in both), 30, "two batches to settle")
    opened, callbacks = figures(cog)
    assert opened == 1 and not api.Batch(parked.bid).settled
    # ok: success, complete, settled; failing: death, complete, settled.
    assert callbacks == {"success": 1, "complete": 2, "death": 1, "settled": 2}
    # Deleting the open batch from the admin's API takes it off the gauge.
    assert api.Batch(parked.bid).delete()
    assert figures(cog)[0] == 0


def test_garbage_in_the_batch_keys_reads_as_zeros_not_a_500(cog: CogEnv) -> None:
    cog.configure(METRICS_TOKEN=TOKEN)
    cog.redis.set(cog.key("batches:open"), "not a sorted set")
    cog.redis.hset(cog.key("stat:batch_callbacks"), mapping={"success": "many", "complete": "7", "\xff": "1"})
    assert figures(cog) == (0, {"success": 0, "complete": 7, "death": 0, "settled": 0})
    cog.redis.set(cog.key("stat:batch_callbacks"), "not a hash")
    assert figures(cog) == (0, {"success": 0, "complete": 0, "death": 0, "settled": 0})
