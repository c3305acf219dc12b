"""The records that cross layers: what the stores hand the leader's loop, the
crash detection and the publisher, written here once so that none of them imports
another for a type. Values only: no I/O."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class DatabaseClock:
    """PostgreSQL's ``now()`` placed on this host's monotonic clock: ``now`` as a query
    read it, and ``time.monotonic()`` just after. From then on the database's time is
    that reading plus the monotonic seconds since, whatever this host's wall clock says
    (set wrong, stepped by NTP). The leader takes one with every claim
    (``Claim.now``, ``Claim.clock``): a run claimed ahead is sent when the monotonic
    clock reaches its fire time, and a message's time to live is its expiry less the
    database's time at the send (``beat.publish.dispatch``)."""

    now: datetime
    clock: float

    def monotonic_at(self, moment: datetime) -> float:
        """The monotonic time at which the database's clock shows ``moment``."""
        return self.clock + (moment - self.now).total_seconds()

    def now_at(self, monotonic: float) -> datetime:
        """The database's time when the monotonic clock shows ``monotonic``."""
        return self.now + timedelta(seconds=monotonic - self.clock)


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A process's beacon as last recorded: its name (what runs, the worker's presence
    and the leader row record) and its halves (as ``beat_beacons`` holds them)."""

    beacon: str
    pid: int
    started_at: datetime
    #: The PostgreSQL server's identity when the session was opened.
    postgres_server: str
    #: The Redis server's ``run_id`` when the connection was opened.
    redis_server: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisHalf:
    """A beacon's Redis connection as recorded (``beat.lease.beacon``)."""

    #: The connection's name (the beacon's).
    name: str
    #: The ``run_id`` of the Redis server it was opened on.
    server: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionlessRun:
    """A running run whose worker process's database session is proven gone."""

    id: uuid.UUID
    #: The beacon of the process running it.
    beacon: RedisHalf
    #: The beacon of its worker's main process, if that session is proven gone too.
    worker_beacon: RedisHalf | None
