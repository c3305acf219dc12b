"""The deployments a chaos run puts its fleet on, each with the faults of its servers.

- ``direct``: every process reaches one PostgreSQL and one Redis (the lease and the
  broker) itself; each beat through proxies that can cut or stall its links.
- ``rabbitmq``: the broker is a private RabbitMQ node (durable queues, persistent
  messages, publisher confirms); the lease stays on Redis. RabbitMQ restarts mid-run.
  The message-loss fault is left out: it deletes keys of kombu's Redis transport, and
  a confirmed message in a durable queue is not lost by RabbitMQ. With the broker off
  Redis, the lease's Redis goes down for longer than the leader row's hold (the
  election outage): scheduling must go on through a beat that leads on the row.
- ``sentinel``: the lease and the broker on Redis Sentinel (a primary, a replica, three
  sentinels), every process with the ``sentinel://`` URL. The primary is SIGKILLed and
  the sentinels promote the replica; asynchronous replication may lose the newest
  writes (the lease key, messages), which the epoch in PostgreSQL and the lost-message
  recovery must make up for. Left out: the beats' Redis cuts and stalls (a Sentinel
  client reaches the server the sentinels name, not a proxy) and the plain Redis
  restart (the failover is this topology's).
- ``pgbouncer``: every beat and worker reaches PostgreSQL through PgBouncer in
  transaction mode, as managed PostgreSQL offers it; PgBouncer restarts mid-run. Crash
  detection is off behind it (a session is not the process's own), so the leases
  decide; ``LISTEN`` does not reach the leader, so it polls every ``max_wait``.

Network partitions that drop packets need processes in network namespaces; they are
tested by ``tests/e2e/test_network_partitions.py``, not by this harness.
"""

from __future__ import annotations

import contextlib
import enum
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.chaos.faults import DIRECT_KINDS, FaultKind
from tests.chaos.servers import MissingBinaries, PrivatePostgres, PrivateRedis
from tests.e2e.pgbouncer import PgBouncer
from tests.e2e.rabbitmq import PrivateRabbitMQ
from tests.sentinel import NOT_INSTALLED, SentinelCluster, running_sentinels


class Topology(enum.StrEnum):
    DIRECT = "direct"
    RABBITMQ = "rabbitmq"
    SENTINEL = "sentinel"
    PGBOUNCER = "pgbouncer"


def _direct_but(*left_out: FaultKind) -> tuple[FaultKind, ...]:
    return tuple(kind for kind in DIRECT_KINDS if kind not in left_out)


#: The fault kinds each topology injects (the module docstring says why some are left out).
KINDS: dict[Topology, tuple[FaultKind, ...]] = {
    Topology.DIRECT: DIRECT_KINDS,
    Topology.RABBITMQ: (
        *_direct_but(FaultKind.BROKER_MESSAGE_LOSS),
        FaultKind.RABBITMQ_RESTART,
        FaultKind.REDIS_OUTAGE,
    ),
    Topology.SENTINEL: (
        *_direct_but(FaultKind.BEAT_REDIS_CUT, FaultKind.BEAT_REDIS_STALL, FaultKind.REDIS_RESTART),
        FaultKind.SENTINEL_FAILOVER,
    ),
    Topology.PGBOUNCER: (*DIRECT_KINDS, FaultKind.PGBOUNCER_RESTART),
}


@dataclass(kw_only=True)
class Endpoints:
    """Where a topology's processes reach their servers, and the servers it added."""

    topology: Topology
    postgres: PrivatePostgres
    redis: PrivateRedis
    database: str
    rabbitmq: PrivateRabbitMQ | None = None
    sentinels: SentinelCluster | None = None
    pgbouncer: PgBouncer | None = None

    @property
    def postgres_port(self) -> int:
        """Where the processes' PostgreSQL connections go (the beats' through a proxy)."""
        return self.pgbouncer.port if self.pgbouncer is not None else self.postgres.port

    @property
    def beats_proxy_redis(self) -> bool:
        """Whether a beat reaches Redis through its proxy (not through Sentinel)."""
        return self.sentinels is None

    def broker_url(self, redis_url: str) -> str:
        """The broker URL of a process whose plain Redis URL is ``redis_url``."""
        if self.rabbitmq is not None:
            return self.rabbitmq.url
        return self.lease_url(redis_url)

    def lease_url(self, redis_url: str) -> str:
        return self.sentinels.url if self.sentinels is not None else redis_url

    def database_url(self, port: int) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{port}/{self.database}"

    def worker_env(self) -> dict[str, str]:
        """The servers of a worker (and of the harness's own Celery app)."""
        redis_url = self.redis.url()
        return {
            "DATABASE_URL": self.database_url(self.postgres_port),
            "REDIS_URL": self.lease_url(redis_url),
            "CELERY_BROKER_URL": self.broker_url(redis_url),
        }

    def broker_redis_port(self) -> int:
        """The Redis server holding the broker's keys now (the Sentinel primary)."""
        if self.rabbitmq is not None:
            raise RuntimeError("the broker is RabbitMQ: it has no Redis keys to delete")
        return self.sentinels.primary()[1] if self.sentinels is not None else self.redis.port


@contextlib.contextmanager
def topology_servers(
    topology: Topology, workdir: Path, postgres: PrivatePostgres, redis: PrivateRedis, database: str
) -> Iterator[Endpoints]:
    """Start the servers ``topology`` adds to the private PostgreSQL and Redis; stop them
    at the end. Raises MissingBinaries naming what to install."""
    endpoints = Endpoints(topology=topology, postgres=postgres, redis=redis, database=database)
    with contextlib.ExitStack() as stack:
        if topology is Topology.RABBITMQ:
            endpoints.rabbitmq = stack.enter_context(_rabbitmq(workdir / "rabbitmq"))
        elif topology is Topology.SENTINEL:
            endpoints.sentinels = stack.enter_context(_sentinels())
        elif topology is Topology.PGBOUNCER:
            # PgBouncer answers for a database only once the server has it.
            with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{database}"')
            endpoints.pgbouncer = stack.enter_context(
                _pgbouncer(workdir, endpoints.database_url(postgres.port))
            )
        yield endpoints


@contextlib.contextmanager
def _rabbitmq(workdir: Path) -> Iterator[PrivateRabbitMQ]:
    workdir.mkdir()
    node = PrivateRabbitMQ(workdir)
    try:
        node.start()
    except (RuntimeError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        node.close()
        raise MissingBinaries(
            f"a private RabbitMQ node did not start ({exc}): apt-get install -y rabbitmq-server"
        ) from exc
    try:
        yield node
    finally:
        node.close()


@contextlib.contextmanager
def _sentinels() -> Iterator[SentinelCluster]:
    if shutil.which("redis-sentinel") is None:
        raise MissingBinaries(NOT_INSTALLED)
    with running_sentinels() as cluster:
        yield cluster


@contextlib.contextmanager
def _pgbouncer(workdir: Path, upstream: str) -> Iterator[PgBouncer]:
    if shutil.which("pgbouncer") is None:
        raise MissingBinaries("pgbouncer is not installed: apt-get install -y pgbouncer")
    bouncer = PgBouncer(workdir, upstream, "transaction")
    try:
        yield bouncer
    finally:
        bouncer.stop()
