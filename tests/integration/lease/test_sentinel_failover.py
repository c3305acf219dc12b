"""The lease on Redis Sentinel, with real servers: a primary, a replica and three
``redis-sentinel`` processes started here. ``habeat_redis_url`` names the sentinels
(``sentinel://...;sentinel://...?master_name=``); the primary is SIGKILLed and the
sentinels promote the replica. The lease follows the new primary; whether the key was
replicated or lost, a new holder's epoch is above the old one's (its floor is
PostgreSQL's), and PostgreSQL refuses the old leader's fenced writes: the claims stay
single (RedBeat #163: two schedulers after a Sentinel failover)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from beat.errors import ConfigError, StaleEpoch
from beat.lease.holder import LeaderLease
from beat.lease.redis_url import parse_sentinel_url, redis_client
from beat.store.all_roles import Store
from tests.chaos.servers import free_port, wait_for
from tests.conftest import IN_CI

pytestmark = pytest.mark.integration

MASTER = "beat"
TTL = 2.0


@dataclass
class SentinelCluster:
    primary_port: int
    replica_port: int
    sentinel_ports: list[int]
    processes: dict[str, subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        sentinels = ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"{sentinels}/0?master_name={MASTER}"

    def primary(self) -> tuple[str, int]:
        client = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1, decode_responses=True)
        host, port = client.sentinel_get_master_addr_by_name(MASTER)
        return str(host), int(port)


def _start(name: str, args: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    with (workdir / f"{name}.log").open("wb") as log:  # the child keeps its own copy
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


@pytest.fixture
def sentinels() -> Iterator[SentinelCluster]:
    server, sentinel = shutil.which("redis-server"), shutil.which("redis-sentinel")
    if server is None or sentinel is None:
        message = "redis-sentinel is not installed: apt-get install -y redis-sentinel"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    workdir = Path(tempfile.mkdtemp(prefix="habeat-sentinel-"))
    primary, replica = free_port(), free_port()
    cluster = SentinelCluster(primary, replica, [free_port() for _ in range(3)], {})
    plain = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    try:
        cluster.processes["primary"] = _start(
            "primary", [server, "--port", str(primary), *plain], workdir
        )
        cluster.processes["replica"] = _start(
            "replica",
            [server, "--port", str(replica), *plain, "--replicaof", "127.0.0.1", str(primary)],
            workdir,
        )
        for index, port in enumerate(cluster.sentinel_ports):
            config = workdir / f"sentinel{index}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
            )
            cluster.processes[f"sentinel{index}"] = _start(
                f"sentinel{index}", [sentinel, str(config)], workdir
            )
        wait_for(lambda: _replicating(replica), "the replica in sync", 20)
        wait_for(lambda: _sentinels_agree(cluster), "three sentinels watching", 30)
        yield cluster
    finally:
        for process in cluster.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def _replicating(port: int) -> bool:
    info = redis.Redis(port=port, socket_timeout=1).info("replication")
    return info.get("master_link_status") == "up"


def _sentinels_agree(cluster: SentinelCluster) -> bool:
    for port in cluster.sentinel_ports:
        client = redis.Redis(port=port, socket_timeout=1)
        master = client.sentinel_master(MASTER)
        if int(master["num-other-sentinels"]) < 2 or int(master["num-slaves"]) < 1:
            return False
    return True


def lease(url: str, holder: str) -> LeaderLease:
    client = redis_client(url, socket_timeout=1, socket_connect_timeout=1)
    return LeaderLease(client, prefix="habeat-sentinel-test", ttl=TTL, holder=holder)


def test_after_a_sentinel_failover_the_lease_follows_the_new_primary_and_the_epoch_fences(
    sentinels: SentinelCluster, store: Store
) -> None:
    first = lease(sentinels.url, "beat-a")
    epoch_a = first.try_acquire(store.current_epoch())
    assert epoch_a is not None
    assert store.take_leadership(epoch_a, "beat-a")
    before = sentinels.primary()

    os.kill(sentinels.processes["primary"].pid, signal.SIGKILL)
    wait_for(lambda: sentinels.primary() != before, "the sentinels' failover", 60)
    assert sentinels.primary() == ("127.0.0.1", sentinels.replica_port)

    second = lease(sentinels.url, "beat-b")
    epoch_b: int | None = None
    deadline = time.monotonic() + 30
    while epoch_b is None and time.monotonic() < deadline:
        # The key came over with the replica (then it lapses within the TTL) or was lost.
        try:
            epoch_b = second.try_acquire(store.current_epoch())
        except Exception:  # the new primary is still taking over
            epoch_b = None
        time.sleep(0.2)
    assert epoch_b is not None, "no process took the lease on the new primary"
    assert epoch_b > epoch_a
    assert store.take_leadership(epoch_b, "beat-b")

    with pytest.raises(StaleEpoch):
        store.watch_runs(epoch_a, idle_timeout=5)  # the old leader's claims: refused
    assert not first.renew(), "the old holder learns it no longer leads"
    assert second.is_held()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://127.0.0.1:26379/0", "needs the primary's name: add ?master_name=NAME"),
        ("sentinel://127.0.0.1:26379;redis://x:1/0?master_name=b", "is not sentinel://host:port"),
        ("sentinel://127.0.0.1:26379/zero?master_name=b", "the database of a sentinel:// URL"),
    ],
)
def test_a_sentinel_url_without_what_it_needs_is_refused_naming_the_fix(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says.replace("?", r"\?")):
        parse_sentinel_url(url)


def test_a_sentinel_url_names_its_sentinels_primary_database_and_password() -> None:
    spec = parse_sentinel_url(
        "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2/2?master_name=beat"
    )
    assert spec.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    assert (spec.master_name, spec.db, spec.password) == ("beat", 2, "s3cret")
