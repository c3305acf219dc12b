"""Crash detection: the leader's database session is its pulse.

A process that crashes (SIGKILL, an OOM kill) has its sockets closed by the
kernel, and PostgreSQL ends its sessions within milliseconds. A process that
hangs (SIGSTOP, a VM pause) or is cut off by the network keeps its sessions
until TCP gives up. So a leader holds one connection of its own for its whole
term, its *beacon*, and records that session (backend pid and start) in the
leader row. A standby that finds the lease taken asks PostgreSQL whether the
recorded session still exists; when it does not, the leader's process is
gone: the standby deletes the dead holder's lease in Redis (compare-and-delete
of that holder's token, so a lease taken meanwhile by anyone else is left
alone) and takes it with a new epoch, as after a clean hand-over, instead of
waiting for the lease's TTL.

Nothing about fencing changes. The dead process cannot claim; a process that
lost its beacon but lives (its connection cut) is fenced by the new epoch in
every claim, finds its lease gone at its next renewal or at the check before
sending runs claimed ahead, and steps down by itself as soon as it sees its
beacon closed. The TTL stays the bound for a leader that hangs or is cut off
with its session still open.

Where sessions cannot be told apart (a pooler in transaction mode runs each
statement on another backend), the beacon sees it at start, says so once and
records nothing: standbys then wait for the lease's TTL, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import psycopg

from beat.db import masked_url, psycopg_conninfo, unreachable
from beat.errors import StoreUnavailable

logger = logging.getLogger(__name__)

#: This session's backend: asked twice, it must answer the same (else a pooler in
#: transaction mode hands each statement to another backend).
_WHO_AM_I = "SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()"


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A PostgreSQL session, as ``pg_stat_activity`` lists it."""

    pid: int
    started_at: datetime


class SessionBeacon:
    """The connection a leader holds for its term (see the module docstring)."""

    def __init__(self, url: str, *, setting: str = "habeat_database_url") -> None:
        self._conninfo = psycopg_conninfo(url)
        self._masked = masked_url(url)
        self._setting = setting
        self._conn: psycopg.Connection[Any] | None = None
        #: False once a pooler in transaction mode was seen: crash detection is off.
        self._supported = True

    def open(self) -> Session | None:
        """Open the beacon; its session, or None where sessions cannot be told apart."""
        self.close()
        if not self._supported:
            return None
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
        except psycopg.Error as exc:
            raise StoreUnavailable(unreachable(self._masked, exc, self._setting)) from exc
        try:
            first = conn.execute(_WHO_AM_I).fetchone()
            second = conn.execute(_WHO_AM_I).fetchone()
        except psycopg.Error as exc:
            conn.close()
            raise StoreUnavailable(f"PostgreSQL at {self._masked}: {exc}") from exc
        if first is None or first != second:
            conn.close()
            self._supported = False
            logger.warning(
                "crash detection is off: PostgreSQL at %s runs this connection's statements"
                " on different sessions (a pooler in transaction mode?); a standby takes"
                " over once the leader's lease expires (habeat_lock_ttl)",
                self._masked,
            )
            return None
        self._conn = conn
        return Session(pid=first[0], started_at=first[1])

    def alive(self) -> bool:
        """False once the beacon's session is known to be gone (without blocking: only
        a socket with something to read, e.g. the server closing it, is queried)."""
        conn = self._conn
        if conn is None:
            return True  # no beacon: nothing recorded for standbys to judge
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


_process_beacons: dict[tuple[int, str], SessionBeacon] = {}
_process_sessions: dict[tuple[int, str], Session | None] = {}
_process_lock = threading.Lock()


def process_session(url: str, *, setting: str = "habeat_database_url") -> Session | None:
    """The session this process keeps open for its life (a worker process recording
    the runs it starts), opened on first use and again if it was lost; None where
    sessions cannot be told apart or PostgreSQL cannot be reached now (the run's
    lease then decides, as without it). A forked pool child opens its own."""
    key = (os.getpid(), url)
    with _process_lock:
        beacon = _process_beacons.get(key)
        if beacon is None:
            beacon = _process_beacons[key] = SessionBeacon(url, setting=setting)
        elif beacon.alive() and key in _process_sessions:
            return _process_sessions[key]
        try:
            session = beacon.open()
        except StoreUnavailable:
            _process_sessions.pop(key, None)
            return None
        _process_sessions[key] = session
        return session


class DeadLeaders(Protocol):
    """Who leads according to PostgreSQL, if its session is gone (``LeaderStore``)."""

    def dead_leader(self) -> str | None: ...


class Evicting(Protocol):
    """Deletes a dead holder's lease (``beat.leader.LeaderLease.evict``)."""

    def evict(self, holder: str) -> bool: ...


class CrashDetection:
    """A leader's beacon, and a standby's check for a leader that crashed."""

    def __init__(self, beacon: SessionBeacon, leaders: DeadLeaders, lease: Evicting) -> None:
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
        holder = self._leaders.dead_leader()
        if holder is None or not self._lease.evict(holder):
            return False
        logger.warning(
            "the leader %s crashed (its database session is gone): taking over without"
            " waiting for its lease",
            holder,
            extra={"holder": holder},
        )
        return True
