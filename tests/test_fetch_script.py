"""``fetch.lua``, the reliable fetch's one call, against real servers
(Redis 6.2 and 7): a call of many jobs moves them oldest first and leaves
each on exactly one list, the acknowledgements it carries remove those jobs
and no other, a push that Redis refuses takes no job off its queue (G5), a
queue of the wrong type is passed over (G12), and a full Redis still gives
its jobs out (SPEC section 8)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from django_cogworker.scripts import script
from tests.conftest import CogEnv, redis_binary_of

#: More than one LPUSH of the script takes (PUSH_AT_ONCE, 500).
MANY = 1_200


@pytest.fixture(params=["6.2", "7"])
def server(request: pytest.FixtureRequest, cog: CogEnv, own_redis: Any) -> CogEnv:
    own_redis(binary=redis_binary_of(request.param))
    assert cog.redis.info("server")["redis_version"].startswith(request.param)
    return cog


def queue(cog: CogEnv, name: str = "default") -> str:
    return cog.key(f"queue:{name}")


def inprogress(cog: CogEnv) -> str:
    return cog.key("inprogress:probe")


def enqueue(cog: CogEnv, count: int, name: str = "default") -> list[bytes]:
    """``count`` jobs pushed as ``.delay()`` pushes them (LPUSH), oldest first."""
    jobs = [f'{{"jid":"{name}-{n:05d}"}}'.encode() for n in range(count)]
    for first in range(0, count, 500):
        cog.redis.lpush(queue(cog, name), *jobs[first : first + 500])
    return jobs


def fetch(cog: CogEnv, want: int, acks: list[bytes] = (), queues: tuple[str, ...] = ("default",)) -> Any:
    keys = [queue(cog, q) for q in queues] + [inprogress(cog)]
    return script("fetch").run(cog.redis, keys, [len(queues), want, *acks])


def test_g1_a_call_of_many_jobs_moves_them_oldest_first_each_onto_one_list(server: CogEnv) -> None:
    jobs = enqueue(server, MANY + 100)
    reply = fetch(server, MANY)
    assert reply[0] == 1 and reply[1:] == jobs[:MANY]
    # As an LMOVE of each from the queue's tail to the list's head leaves them.
    assert server.redis.lrange(inprogress(server), 0, -1) == jobs[:MANY][::-1]
    assert server.redis.lrange(queue(server), 0, -1) == jobs[MANY:][::-1]
    reply = fetch(server, MANY)
    assert reply[1:] == jobs[MANY:] and not server.redis.exists(queue(server))
    assert fetch(server, MANY) is None  # every queue empty


def test_g6_the_acks_a_call_carries_remove_those_jobs_and_no_other(server: CogEnv) -> None:
    jobs = enqueue(server, 8)
    assert fetch(server, 5)[1:] == jobs[:5]
    reply = fetch(server, 3, acks=[jobs[0], jobs[3], b'{"jid":"never-fetched"}'])
    assert reply[1:] == jobs[5:8]
    held = server.redis.lrange(inprogress(server), 0, -1)
    assert sorted(held) == sorted([jobs[1], jobs[2], jobs[4], *jobs[5:8]])


def test_g5_a_push_redis_refuses_takes_no_job_off_its_queue(server: CogEnv) -> None:
    jobs = enqueue(server, 3)
    server.redis.set(inprogress(server), "not a list")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        fetch(server, 3)
    assert server.redis.lrange(queue(server), 0, -1) == jobs[::-1]


def test_g12_a_queue_of_the_wrong_type_is_passed_over_and_named_when_nothing_is_found(server: CogEnv) -> None:
    server.redis.set(queue(server, "broken"), "not a list")
    jobs = enqueue(server, 2, "second")
    assert fetch(server, 2, queues=("broken", "second")) == [2, *jobs]
    reply = fetch(server, 2, queues=("broken", "second"))
    assert reply[0] == 0 and queue(server, "broken") in reply[1].decode() and "WRONGTYPE" in reply[1].decode()


def test_a_full_redis_gives_out_its_jobs_with_no_ack_to_write_first(server: CogEnv) -> None:
    jobs = enqueue(server, 50)
    server.redis.config_set("maxmemory-policy", "noeviction")
    server.redis.config_set("maxmemory", int(server.redis.info("memory")["used_memory"] * 0.9))
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        server.redis.lpush(queue(server), b"refused")  # full: a write that grows memory is refused
    reply = fetch(server, 10)
    assert reply[1:] == jobs[:10]
    assert server.redis.lrange(inprogress(server), 0, -1) == jobs[:10][::-1]
    assert server.redis.lrange(queue(server), 0, -1) == jobs[10:][::-1]
    # With acknowledgements, written first, as a busy worker's calls are.
    assert fetch(server, 10, acks=jobs[:10])[1:] == jobs[10:20]
    assert server.redis.lrange(inprogress(server), 0, -1) == jobs[10:20][::-1]
