"""The thread a coroutine job's synchronous calls run in (SPEC section 15,
G14): one of its own, made at its first ``sync_to_async`` call and ended
with the job, in the job's context alone; none for a job that makes no such
call; an enclosing ``ThreadSensitiveContext`` (Django's ASGI handler
enters one for each request) used and kept as asgiref keeps it."""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import SyncToAsync, ThreadSensitiveContext, sync_to_async

from django_cogworker import arun, job, registry
from django_cogworker.conf import get_config
from django_cogworker.job import Job
from django_cogworker.payload import encode

#: jid -> the threads its synchronous calls ran in, and the context it ran for.
seen: dict[str, tuple[set[threading.Thread], object]] = {}


@job
async def call_twice_in_a_thread(jid: str) -> None:
    first = await sync_to_async(threading.current_thread)()
    second = await sync_to_async(threading.current_thread)()
    seen[jid] = ({first, second}, SyncToAsync.thread_sensitive_context.get(None))
    await asyncio.sleep(0.05)  # the other jobs run meanwhile


@job
async def call_nothing(jid: str) -> None:
    seen[jid] = (set(), SyncToAsync.thread_sensitive_context.get(None))


def raw(made: Job, jid: str) -> bytes:
    assert registry.get(made.name) is made
    return encode(made.payload([jid], {}))


async def run_all(*raws: bytes) -> list[str]:
    outcomes = await asyncio.gather(*(arun.aexecute(r, get_config()) for r in raws))
    return [o.kind for o in outcomes]


def test_each_coroutine_job_calls_synchronous_code_in_a_thread_of_its_own_that_ends_with_it() -> None:
    seen.clear()
    kinds = asyncio.run(run_all(*(raw(call_twice_in_a_thread, f"j{i}") for i in range(3))))
    assert kinds == ["ack"] * 3
    threads = [seen[f"j{i}"][0] for i in range(3)]
    contexts = [seen[f"j{i}"][1] for i in range(3)]
    # One thread per job, for both of its calls; never the loop's.
    assert [len(t) for t in threads] == [1, 1, 1]
    assert len(set().union(*threads)) == 3
    assert threading.current_thread() not in set().union(*threads)
    assert all(isinstance(c, ThreadSensitiveContext) for c in contexts) and len(set(map(id, contexts))) == 3
    # Ended with the job: asgiref holds no executor for them, and the threads are gone.
    assert not any(c in SyncToAsync.context_to_thread_executor for c in contexts)
    assert not any(thread.is_alive() for thread in set().union(*threads))


def test_a_coroutine_job_that_calls_no_synchronous_code_makes_no_thread_and_leaves_no_context() -> None:
    seen.clear()
    before = set(threading.enumerate())

    async def go() -> tuple[list[str], object]:
        # Awaited in this task, not in one of their own: in this context.
        kinds = [(await arun.aexecute(raw(call_nothing, jid), get_config())).kind for jid in "ab"]
        return kinds, SyncToAsync.thread_sensitive_context.get(None)

    kinds, after = asyncio.run(go())
    assert kinds == ["ack", "ack"]
    assert isinstance(seen["a"][1], ThreadSensitiveContext) and seen["a"][1] is not seen["b"][1]
    assert after is None  # reset in the caller's context
    # asgiref's executors name their threads so; another part of the suite may start others.
    made = [t for t in set(threading.enumerate()) - before if t.name.startswith("ThreadPoolExecutor")]
    assert not made


def test_a_coroutine_job_inside_an_enclosing_thread_sensitive_context_uses_it_and_leaves_it_open() -> None:
    seen.clear()

    async def go() -> tuple[ThreadSensitiveContext, object, threading.Thread]:
        async with ThreadSensitiveContext() as outer:
            mine = await sync_to_async(threading.current_thread)()
            await arun.aexecute(raw(call_twice_in_a_thread, "inner"), get_config())
            # The enclosing context and its thread are still the caller's.
            again = await sync_to_async(threading.current_thread)()
            assert again == mine
            return outer, SyncToAsync.thread_sensitive_context.get(None), mine

    outer, during, mine = asyncio.run(go())
    assert during is outer
    assert seen["inner"][1] is outer
    assert seen["inner"][0] == {mine}
    assert not mine.is_alive()  # ended by the enclosing context's exit, not the job's
