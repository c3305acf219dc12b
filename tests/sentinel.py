"""A Redis primary, its replica and three ``redis-sentinel`` processes watching them,
started by a test on free ports and removed at its end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.chaos.servers import free_port, wait_for
from tests.conftest import IN_CI

#: The name the sentinels know the primary by (``?master_name=`` in the URL).
MASTER = "beat"
#: The Redis servers' settings: loopback, nothing kept on disk.
PLAIN = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
NOT_INSTALLED = "redis-sentinel is not installed: apt-get install -y redis-sentinel"


@dataclass
class SentinelCluster:
    primary_port: int
    replica_port: int
    sentinel_ports: list[int]
    processes: dict[str, subprocess.Popen[bytes]]
    workdir: Path
    redis_server: str

    @property
    def url(self) -> str:
        sentinels = ";".join(f"sentinel://127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"{sentinels}/0?master_name={MASTER}"

    def primary(self) -> tuple[str, int]:
        client = redis.Redis(port=self.sentinel_ports[0], socket_timeout=1, decode_responses=True)
        try:
            host, port = client.sentinel_get_master_addr_by_name(MASTER)
        finally:
            client.close()
        return str(host), int(port)

    def kill_primary_and_wait_for_the_failover(self, timeout: float = 60) -> None:
        """SIGKILL the primary; return once the sentinels name the replica instead."""
        before = self.primary()
        os.kill(self.processes["primary"].pid, signal.SIGKILL)
        wait_for(lambda: self.primary() != before, "the sentinels' failover", timeout)

    def fail_over(self, down: float, timeout: float = 60) -> None:
        """SIGKILL whichever server is the primary now, wait for the sentinels to promote
        the other, keep the killed one down ``down`` seconds more, then start it again:
        the sentinels make it a replica of the new primary (a failover that can be
        repeated, as a fleet's servers come back after one)."""
        _, port = self.primary()
        name = "primary" if port == self.primary_port else "replica"
        os.kill(self.processes[name].pid, signal.SIGKILL)
        self.processes[name].wait(10)
        wait_for(lambda: self.primary()[1] != port, "the sentinels' failover", timeout)
        time.sleep(down)
        self.processes[name] = _start(
            name, [self.redis_server, "--port", str(port), *PLAIN], self.workdir
        )
        wait_for(lambda: _replicating(port), "the old primary replicating again", timeout)


def _start(name: str, args: list[str], workdir: Path) -> subprocess.Popen[bytes]:
    with (workdir / f"{name}.log").open("ab") as log:  # the child keeps its own copy
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)


@pytest.fixture
def sentinels() -> Iterator[SentinelCluster]:
    """A primary, a replica and three sentinels (quorum 2, down after 1 s); skipped
    (failed in CI) without ``redis-sentinel``. A fixture: import it into a test module."""
    if shutil.which("redis-server") is None or shutil.which("redis-sentinel") is None:
        if IN_CI:
            pytest.fail(NOT_INSTALLED, pytrace=False)
        pytest.skip(NOT_INSTALLED)
    with running_sentinels() as cluster:
        yield cluster


@contextmanager
def running_sentinels() -> Iterator[SentinelCluster]:
    """The ``sentinels`` fixture's servers, for code outside pytest (the chaos harness);
    raises RuntimeError (``NOT_INSTALLED``) without ``redis-sentinel``."""
    server, sentinel = shutil.which("redis-server"), shutil.which("redis-sentinel")
    if server is None or sentinel is None:
        raise RuntimeError(NOT_INSTALLED)
    workdir = Path(tempfile.mkdtemp(prefix="habeat-sentinel-"))
    primary, replica = free_port(), free_port()
    cluster = SentinelCluster(
        primary, replica, [free_port() for _ in range(3)], {}, workdir=workdir, redis_server=server
    )
    try:
        cluster.processes["primary"] = _start(
            "primary", [server, "--port", str(primary), *PLAIN], workdir
        )
        cluster.processes["replica"] = _start(
            "replica",
            [server, "--port", str(replica), *PLAIN, "--replicaof", "127.0.0.1", str(primary)],
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
    client = redis.Redis(port=port, socket_timeout=1)
    try:
        return client.info("replication").get("master_link_status") == "up"
    finally:
        client.close()


def _sentinels_agree(cluster: SentinelCluster) -> bool:
    for port in cluster.sentinel_ports:
        client = redis.Redis(port=port, socket_timeout=1)
        try:
            master = client.sentinel_master(MASTER)
        finally:
            client.close()
        if int(master["num-other-sentinels"]) < 2 or int(master["num-slaves"]) < 1:
            return False
    return True
