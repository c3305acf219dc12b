"""Crash detection: a process's connections are its pulse.

A process that crashes (SIGKILL, an OOM kill) has its sockets closed by the
kernel: PostgreSQL ends its sessions and Redis drops its connections within
milliseconds. A process that hangs (SIGSTOP, a VM pause) keeps them; a link
cut to one server closes the connections to that server only. So a process
keeps a *beacon* for its term: one PostgreSQL session and one named Redis
connection of its own, and records both (the session's backend pid, the
connection's name). When PostgreSQL no longer lists the session AND Redis no
longer lists the connection, the process is dead:

- a standby that finds the lease taken by a dead leader deletes that holder's
  lease (compare-and-delete of its token, so a lease taken meanwhile by anyone
  else is left alone) and takes it with a new epoch, instead of waiting for the
  lease's TTL;
- the leader's reaper reclaims at once a run whose worker process is dead,
  instead of waiting for the run's lease.

Nothing about fencing changes: a process that is alive but lost a link keeps
the other connection, is not judged dead, and is handled by the lease's TTL
and the epoch exactly as before. A leader that sees its own database session
closed steps down. Where the servers cannot tell (a pooler in transaction mode
runs each statement on another backend; a managed Redis refuses CLIENT
commands), the beacon says so once and records nothing: leases decide.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import psycopg
import redis

from beat.db import masked_url, psycopg_conninfo, unreachable
from beat.errors import LeaseUnavailable, StoreUnavailable
from beat.leader import BEACON_PREFIX, open_beacon_connection

if TYPE_CHECKING:
    from beat.leader_store import SessionlessRun

logger = logging.getLogger(__name__)

#: This session's backend: asked twice, it must answer the same (else a pooler in
#: transaction mode hands each statement to another backend).
_WHO_AM_I = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A process's beacon: its PostgreSQL session (as ``pg_stat_activity`` lists it)
    and the name of its own Redis connection."""

    pid: int
    started_at: datetime
    #: The name of the process's own Redis connection.
    beacon: str


class SessionBeacon:
    """The connections a process keeps as its pulse (see the module docstring)."""

    def __init__(
        self,
        database_url: str,
        redis_url: str,
        *,
        database_setting: str = "habeat_database_url",
        redis_setting: str = "habeat_redis_url",
    ) -> None:
        self._conninfo = psycopg_conninfo(database_url)
        self._masked = masked_url(database_url)
        self._database_setting = database_setting
        self._redis_url = redis_url
        self._redis_setting = redis_setting
        self._conn: psycopg.Connection[Any] | None = None
        self._redis: redis.Redis | None = None
        #: False once the servers were seen unable to tell: crash detection is off.
        self._supported = True

    def open(self) -> Session | None:
        """Open the beacon; its session, or None where the servers cannot tell a crash."""
        self.close()
        if not self._supported:
            return None
        conn = self._connect()
        try:
            first = conn.execute(_WHO_AM_I).fetchone()
            second = conn.execute(_WHO_AM_I).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"PostgreSQL at {self._masked}: {exc}") from exc
        if first is None or first != second:
            conn.close()
            self._unsupported(
                f"PostgreSQL at {self._masked} runs one connection's statements on"
                " different sessions (a pooler in transaction mode?)"
            )
            return None
        name = f"{BEACON_PREFIX}{first[0]}:{socket.gethostname()}:{os.getpid()}"
        name = f"{name}:{uuid.uuid4().hex[:8]}"
        try:
            client = open_beacon_connection(self._redis_url, name)
        except LeaseUnavailable:
            conn.close()
            raise
        if client is None:
            conn.close()
            self._unsupported(f"Redis at {masked_url(self._redis_url)} refuses CLIENT commands")
            return None
        self._conn, self._redis = conn, client
        return Session(pid=first[0], started_at=first[1], beacon=name)

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            raise StoreUnavailable(unreachable(self._masked, exc, self._database_setting)) from exc

    def _unsupported(self, why: str) -> None:
        self._supported = False
        logger.warning(
            "crash detection is off: %s; a crashed leader is replaced once its lease"
            " expires (habeat_lock_ttl), a crashed worker's run once its lease does"
            " (habeat_lease_timeout)",
            why,
        )

    def alive(self) -> bool:
        """False once the beacon's database session is known to be gone (without
        blocking: only a socket with something to read, e.g. the server closing
        it, is queried)."""
        conn = self._conn
        if conn is None:
            return True  # no beacon: nothing recorded for others to judge
        if conn.closed:
            return False
        try:
            readable, _, _ = select.select([conn.fileno()], [], [], 0)
            if readable:
                conn.execute("SELECT 1")
        except (psycopg.Error, OSError, ValueError):
            self.close()
            return False
        return True

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()
        client, self._redis = self._redis, None
        if client is not None:
            with contextlib.suppress(redis.RedisError):
                client.close()


_process_beacons: dict[tuple[int, str], SessionBeacon] = {}
_process_sessions: dict[tuple[int, str], Session | None] = {}
_process_lock = threading.Lock()


def process_session(
    database_url: str,
    redis_url: str,
    *,
    database_setting: str = "habeat_database_url",
    redis_setting: str = "habeat_redis_url",
) -> Session | None:
    """The beacon this process keeps for its life (a worker process records it with
    the runs it starts), opened on first use and again if it was lost; None where
    the servers cannot tell a crash or cannot be reached now (the run's lease then
    decides, as without it). A forked pool child opens its own."""
    key = (os.getpid(), database_url)
    with _process_lock:
        beacon = _process_beacons.get(key)
        if beacon is None:
            beacon = _process_beacons[key] = SessionBeacon(
                database_url,
                redis_url,
                database_setting=database_setting,
                redis_setting=redis_setting,
            )
        elif beacon.alive() and key in _process_sessions:
            return _process_sessions[key]
        try:
            session = beacon.open()
        except (StoreUnavailable, LeaseUnavailable):
            _process_sessions.pop(key, None)
            return None
        _process_sessions[key] = session
        return session


class SessionRecords(Protocol):
    """The recorded beacons whose database session is gone (``LeaderStore``)."""

    def leader_without_session(self) -> tuple[str, str] | None: ...
    def runs_without_session(self, *, limit: int) -> list[SessionlessRun]: ...


class Evicting(Protocol):
    """The lease (``beat.leader.LeaderLease``): live beacons and eviction."""

    def live_beacons(self, names: Iterable[str]) -> set[str]: ...
    def evict(self, holder: str) -> bool: ...


class CrashDetection:
    """A leader's beacon; a standby's check for a crashed leader; the reaper's for
    crashed workers."""

    def __init__(self, beacon: SessionBeacon, leaders: SessionRecords, lease: Evicting) -> None:
        self._beacon = beacon
        self._leaders = leaders
        self._lease = lease

    def open_beacon(self) -> Session | None:
        return self._beacon.open()

    def beacon_alive(self) -> bool:
        return self._beacon.alive()

    def close_beacon(self) -> None:
        self._beacon.close()

    def evict_dead_leader(self) -> bool:
        """Delete the lease of a leader whose session is gone; True if one was."""
        found = self._leaders.leader_without_session()
        if found is None:
            return False
        holder, beacon = found
        if self._lease.live_beacons([beacon]) or not self._lease.evict(holder):
            return False  # its Redis connection lives: a cut link, not a crash
        logger.warning(
            "the leader %s crashed (its database session and Redis connection are gone):"
            " taking over without"
            " waiting for its lease",
            holder,
            extra={"holder": holder},
        )
        return True

    def dead_runs(self, *, limit: int) -> WorkerDeaths:
        """Running runs whose worker process is dead: its database session and its
        Redis connection are both gone (one gone alone is a cut link: leases decide).
        A run whose worker's main process died too was interrupted; one whose pool
        process died under a living worker crashed it (an attempt)."""
        candidates = self._leaders.runs_without_session(limit=limit)
        if not candidates:
            return WorkerDeaths()
        names = {run.beacon for run in candidates}
        names |= {run.worker_beacon for run in candidates if run.worker_beacon is not None}
        live = self._lease.live_beacons(names)
        dead = [run for run in candidates if run.beacon not in live]
        return WorkerDeaths(
            runs=[run.id for run in dead],
            interrupted=[
                run.id
                for run in dead
                if run.worker_beacon is not None and run.worker_beacon not in live
            ],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerDeaths:
    """Running runs whose worker process died, and those whose whole worker died."""

    runs: list[uuid.UUID] = field(default_factory=list)
    interrupted: list[uuid.UUID] = field(default_factory=list)
