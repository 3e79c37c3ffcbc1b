"""The key layout of SPEC section 16: the names every release wrote stay
byte for byte when ``SHARDING`` is off; under ``SHARDING = "queues"`` the
keys of one queue group share a slot of their own and the shared keys keep
the ``{cogworker}`` names; and the checks of ``SHARDING`` and ``QUEUE_GROUPS``."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.checks import Error
from django.test import override_settings
from redis.crc import key_slot

from django_cogworker.checks import check_settings
from django_cogworker.connection import get_keys
from django_cogworker.keys import Keys
from django_cogworker.layouts import keys

CLUSTER_URL = "redis+cluster://127.0.0.1:7000"

#: What each attribute of the keys named before section 16, for the namespace "ns".
UNSHARDED = {
    "queues": "ns:queues",
    "paused": "ns:paused",
    "schedule": "ns:schedule",
    "retry": "ns:retry",
    "dead": "ns:dead",
    "unsettled": "ns:unsettled",
    "repeat_orphans": "ns:repeat_orphans",
    "inprogress_identities": "ns:inprogress_identities",
    "forgotten": "ns:forgotten",
    "processes": "ns:processes",
    "last_beat": "ns:last_beat",
    "beats": "ns:beats",
    "replicated": "ns:replicated",
    "recovery_report": "ns:recovery",
    "periodic_last": "ns:periodic:last",
    "limits": "ns:limits",
    "batches": "ns:batches",
}

UNSHARDED_CALLS = [
    (lambda k: k.queue("mail"), "ns:queue:mail"),
    (lambda k: k.inprogress("host:1:ab"), "ns:inprogress:host:1:ab"),
    (lambda k: k.process("host:1:ab"), "ns:process:host:1:ab"),
    (lambda k: k.suspect("host:1:ab"), "ns:suspect:host:1:ab"),
    (lambda k: k.orphanings("j1"), "ns:orphanings:j1"),
    (lambda k: k.unique("d1"), "ns:unique:d1"),
    (lambda k: k.periodic_running("p1"), "ns:periodic:running:p1"),
    (lambda k: k.periodic_slot("p1", 7), "ns:periodic:slot:p1:7"),
    (lambda k: k.limit_waiting("api", "mail"), "ns:limit:api:waiting:mail"),
    (lambda k: k.limit("api", "holders"), "ns:limit:api:holders"),
    (lambda k: k.queue_clearing("mail", "t1"), "ns:clearing:t1:mail"),
    (lambda k: k.batch("b1", "members"), "ns:batch:b1:members"),
    (lambda k: k.workers("host:1:ab"), "ns:workers:host:1:ab"),
]

#: A group's own keys, each read from the group's ``Keys``.
GROUP_CALLS = [
    lambda k: k.queue(k.group_name),
    lambda k: k.queue("mail_bulk"),
    lambda k: k.schedule,
    lambda k: k.retry,
    lambda k: k.dead,
    lambda k: k.unsettled,
    lambda k: k.repeat_orphans,
    lambda k: k.inprogress("host:1:ab"),
    lambda k: k.process("host:1:ab"),
    lambda k: k.suspect("host:1:ab"),
    lambda k: k.orphanings("j1"),
    lambda k: k.unique("d1"),
    lambda k: k.periodic_running("p1"),
    lambda k: k.periodic_slot("p1", 7),
    lambda k: k.limit_waiting("api", "mail_bulk"),
    lambda k: k.queue_clearing("mail_bulk", "t1"),
    lambda k: k.inprogress_identities,
    lambda k: k.forgotten,
    lambda k: k.last_beat,
    lambda k: k.beats,
    lambda k: k.replicated,
]


def sharded(groups: dict[str, str] | None = None) -> Keys:
    return keys("cogworker", tuple(sorted((groups or {}).items())))


@pytest.mark.parametrize(("name", "expected"), UNSHARDED.items())
def test_unsharded_key_names_are_the_ones_every_release_wrote(name, expected):
    assert getattr(keys("ns"), name) == expected


@pytest.mark.parametrize(("call", "expected"), UNSHARDED_CALLS)
def test_unsharded_key_builders_name_the_keys_every_release_wrote(call, expected):
    k = keys("ns")
    assert call(k) == expected
    # Without SHARDING every group is the one layout.
    assert k.group("mail") is k and k.for_queue("anything") is k


def test_sharded_a_queue_gets_a_tag_of_its_own_and_a_group_one_tag_for_its_queues():
    k = sharded({"mail_bulk": "mail"})
    assert k.queue("mail") == "{cogworker:mail}:queue"
    assert k.queue("mail_bulk") == "{cogworker:mail}:queue:mail_bulk"
    assert k.queue("reports") == "{cogworker:reports}:queue"
    assert k.for_queue("mail_bulk") is k.group("mail")
    # Asked of a group, a queue of another group keeps its own tag.
    assert k.group("mail").queue("reports") == "{cogworker:reports}:queue"
    assert k.group("mail").limit_waiting("api", "reports") == "{cogworker:reports}:limit:api:waiting:reports"
    assert k.group("mail").schedule == "{cogworker:mail}:schedule"
    assert k.for_queue("reports").inprogress("h:1:a") == "{cogworker:reports}:inprogress:h:1:a"
    # A blocking pop's reply names the key: back to the queue.
    group = k.group("mail")
    assert group.queue_of(group.queue("mail")) == "mail"
    assert group.queue_of(group.queue("mail_bulk")) == "mail_bulk"


@pytest.mark.parametrize("queue", ["mail", "we}ird", "{braced}", "colon:name", "x" * 300])
def test_sharded_every_key_of_a_group_is_in_one_slot(queue):
    group = sharded({"mail_bulk": queue}).group(queue)
    slots = {key_slot(call(group).encode("utf-8", "surrogateescape")) for call in GROUP_CALLS}
    assert len(slots) == 1


def test_sharded_shared_keys_keep_the_names_of_the_one_slot_cluster_layout():
    """So that turning SHARDING on moves none of them (stats, processes,
    limiters, batches)."""
    k, before = sharded(), keys("{cogworker}")
    for name in ("queues", "paused", "processes", "stat_processed", "recovery_report", "limits", "batches"):
        assert getattr(k, name) == getattr(before, name)
    assert k.limit("api", "holders") == before.limit("api", "holders")
    assert k.batch("b1", "pending") == before.batch("b1", "pending")
    assert k.group("mail").queues == before.queues


def test_sharded_asking_the_shared_keys_for_a_groups_key_is_a_clear_error():
    k = sharded()
    with pytest.raises(AttributeError, match=r"schedule belongs to one queue group under SHARDING"):
        _ = k.schedule
    with pytest.raises(AttributeError, match=r"inprogress_prefix belongs to one queue group"):
        k.inprogress("h:1:a")


def test_get_keys_follows_the_settings():
    with override_settings(COGWORKER={"NAMESPACE": "ns"}):
        assert get_keys().queue("a") == "ns:queue:a"
    with override_settings(
        COGWORKER={"REDIS_URL": CLUSTER_URL, "SHARDING": "queues", "QUEUE_GROUPS": {"mail": ["mail", "bulk"]}}
    ):
        assert get_keys().queue("bulk") == "{cogworker:mail}:queue:bulk"
        assert get_keys().queues == "{cogworker}:queues"


def errors_of(value: dict[str, Any], *ids: str) -> list[Error]:
    with override_settings(COGWORKER=value):
        return [e for e in check_settings() if e.id in ids]


def test_e035_sharding_takes_none_or_queues():
    (e,) = errors_of({"SHARDING": "keys"}, "cogworker.E035")
    assert e.msg == "COGWORKER['SHARDING'] must be None or 'queues', got 'keys'."


def test_e035_sharding_needs_a_cluster_and_a_namespace_without_braces():
    messages = [e.msg for e in errors_of({"SHARDING": "queues", "NAMESPACE": "{app}"}, "cogworker.E035")]
    assert any("REDIS_URL names no cluster" in m for m in messages)
    assert any("'{app}' has braces" in m for m in messages)
    # A braced namespace is what a cluster needs without SHARDING (E024), not with it.
    unbraced = {"REDIS_URL": CLUSTER_URL, "SHARDING": "queues", "NAMESPACE": "app"}
    assert errors_of(unbraced, "cogworker.E024") == []


def test_e035_sharding_on_a_cluster_with_a_plain_namespace_passes():
    assert errors_of({"REDIS_URL": CLUSTER_URL, "SHARDING": "queues"}, "cogworker.E035") == []
    assert (
        errors_of({"REDIS_URL": CLUSTER_URL, "SHARDING": "queues", "NAMESPACE": "app"}, "cogworker.E035")
        == []
    )
    assert errors_of({"REDIS_URL": CLUSTER_URL}, "cogworker.E035") == []


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        (["mail"], "must be a dict"),
        ({"mail": []}, "a non-empty list of queue names"),
        ({"mail": "mail"}, "a non-empty list of queue names"),
        ({"": ["mail"]}, "a non-empty list of queue names"),
        ({"mail": ["mail", 3]}, "lists 3, which is not a queue's name"),
        ({"mail": ["mail"], "bulk": ["bulk", "mail"]}, "lists the queue 'mail' in 'mail' and in 'bulk'"),
    ],
)
def test_e036_queue_groups_lists_each_queue_in_one_group(groups, says):
    (e,) = errors_of({"QUEUE_GROUPS": groups}, "cogworker.E036")
    assert says in e.msg


def test_e036_valid_groups_pass():
    assert errors_of({"QUEUE_GROUPS": {"mail": ["mail", "mail_bulk"]}}, "cogworker.E036") == []


def test_sharded_split_a_process_per_group_with_the_threads_shared_by_weight() -> None:
    from django_cogworker.conf import QueueSpec
    from django_cogworker.layouts import keys
    from django_cogworker.shards import split

    queues = (QueueSpec("default", 3), QueueSpec("mail", 1), QueueSpec("mail_bulk", 2), QueueSpec("low", 1))
    plain = split(keys("app"), queues, 10)
    assert [(s.queues, s.concurrency) for s in plain] == [(queues, 10)], "one process without SHARDING"
    sharded = keys("app", (("mail", "mail"), ("mail_bulk", "mail")))
    shares = split(sharded, queues, 10)
    assert [(s.group, [q.name for q in s.queues], s.concurrency) for s in shares] == [
        ("default", ["default"], 4),
        ("mail", ["mail", "mail_bulk"], 4),
        ("low", ["low"], 2),
    ], "weights 3, 3 and 1: 4.3, 4.3 and 1.4 threads; the tenth to the largest remainder"
    even = split(sharded, (QueueSpec("default", 0), QueueSpec("mail", 0), QueueSpec("low", 0)), 4)
    assert sorted(s.concurrency for s in even) == [1, 1, 2], "every thread asked for, none more"
    assert shares[1].args() == ["-q", "mail,1", "-q", "mail_bulk,2", "-c", "4"]
    strict = split(sharded, (QueueSpec("mail", 0), QueueSpec("low", 0)), 1)
    assert [(s.group, s.concurrency) for s in strict] == [("mail", 1), ("low", 1)], "at least one thread each"
    assert [s.args() for s in split(sharded, (QueueSpec("mail", 0), QueueSpec("mail_bulk", 0)), 5)] == [
        ["-q", "mail", "-q", "mail_bulk", "-c", "5"]
    ]
