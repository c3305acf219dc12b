"""Crash detection: a process's connections are its pulse, counted only on proof.

A process that crashes (SIGKILL, an OOM kill) has its sockets closed by the
kernel: PostgreSQL ends its sessions and Redis drops its connections within
milliseconds. A process that hangs (SIGSTOP, a VM pause) keeps them; a link
cut to one server closes the connections to that server only. So a process
keeps a *beacon*: one PostgreSQL session and one named Redis connection of its
own. When neither server lists its half any more, the process is dead:

- a standby that finds the lease taken by a dead leader deletes that holder's
  lease (compare-and-delete of its token) and takes it with a new epoch,
  instead of waiting for the lease's TTL;
- the leader's reaper reclaims at once a run whose worker process is dead,
  instead of waiting for the run's lease.

A connection also closes while its process lives: a server restart or
failover, a pooler or proxy closing its own upstream, a server's idle timeout
(PostgreSQL's ``idle_session_timeout``, Redis's ``timeout``), ``CLIENT KILL``,
``pg_terminate_backend``. Reclaiming a living process's run executes it twice,
so absence counts only as proof, and these are the rules that make it one:

1. **A beacon is a name, its halves follow it.** The name (the Redis
   connection's, ``habeat-beacon:host:pid:random``) is what runs, the worker's
   presence and the leader row record; the halves are in ``beat_beacons``, one
   row per beacon, written by the beacon's own PostgreSQL session
   (``pg_backend_pid()`` in the statement itself). A lost half is opened again
   alone: the Redis half under the same name, the PostgreSQL half with a new
   backend whose row update is the same statement. So every record of the
   process follows the newest session at once, and a reopen never closes the
   other half (closing both made a restart of PostgreSQL read as a death).
2. **Absence is proof only on the server that listed it.** Each half records
   the identity of the server it was opened on: PostgreSQL's
   ``pg_postmaster_start_time()`` with ``pg_stat_bgwriter.stats_reset`` (a
   backend crash makes the postmaster end every session and start again
   without a new start time, but it resets those statistics), Redis's
   ``run_id`` (a restart or a failover is another ``run_id``). A half whose
   server is not the one it was opened on is *unknown*, never gone, until its
   process opens it again on the new server and records that. Both halves must
   be proven gone at one moment: PostgreSQL is asked, then Redis, then
   PostgreSQL again (a session recorded gone before and after Redis answered
   was gone when it did).
3. **Both halves are kept, not only opened.** A living process looks at its
   halves on its existing timers (the leader each pass, a worker's presence
   heartbeat, a run's lease heartbeat, each run's start) and opens again a
   lost one; looking is non-blocking (a closed socket is readable). A leader
   that lost its PostgreSQL half steps down only if it cannot open another.
4. **No timeout closes a half.** The PostgreSQL half sets
   ``idle_session_timeout`` and ``idle_in_transaction_session_timeout`` to 0
   for itself (both user-settable). The Redis half subscribes to a channel of
   its own name: Redis exempts pub/sub clients from its idle ``timeout``
   (``clientsCronHandleTimeout`` in the server's ``timeout.c`` skips clients
   flagged ``CLIENT_PUBSUB``), and nothing publishes there. Nor does a
   partition: a server whose TCP keepalives are short (``tcp_keepalives_idle``
   of seconds, ``tcp-keepalive`` in Redis) ends a silent peer's sessions, a
   living process's cut off by a network as soon as a dead one's. The
   PostgreSQL half sets its own server side's keepalives to an hour
   (``SERVER_SIDE_KEEPALIVES``, user-settable too; a server that refuses them
   turns crash detection off), and this side's probes give up only after an hour
   too (``KEEPALIVE_*``: when only the servers' packets are dropped, this side's
   reset would reach both servers). So both halves can be gone together over a
   partition only long after every lease has decided (Redis's setting is the
   server's alone: one half suffices to hold back).
5. **Nothing stands between a half and its server.** A pooler (PgBouncer in
   transaction or statement mode runs each statement on some backend; in
   session mode the backend outlives the client) or a TCP proxy (its upstream
   closes on the proxy's timers) makes the server's session another's. The
   server must see the connection as we do: over TCP, the session's client
   address and port (``pg_stat_activity.client_addr``/``client_port``, Redis's
   ``CLIENT INFO`` ``addr``) are our socket's local ones and the server's port
   (``inet_server_port()``, ``laddr``) our peer's; over a unix socket, the path
   we reached is the server's own (``unix_socket_directories`` with ``port``;
   Redis's ``laddr``). A NAT that keeps the source (a Kubernetes service)
   passes; anything that opens connections of its own does not. Where it does
   not hold, or Redis refuses CLIENT commands, the beacon says so once and
   records nothing: crash detection is off and leases decide.

Where the signals disagree (one half gone, one unknown), the leases decide, as
without a beacon. What remains unproven: both halves closed by something other
than the process's death on servers that did not restart (an operator's
``pg_terminate_backend`` together with a ``CLIENT KILL``, a connection tracker
resetting both) within one of the process's looks at its halves.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import psycopg

from beat.errors import LeaseUnavailable, StoreUnavailable
from beat.lease.holder import (
    BEACON_PREFIX,
    KEEPALIVE_COUNT,
    KEEPALIVE_IDLE,
    KEEPALIVE_INTERVAL,
    BeaconConnection,
    open_beacon_connection,
)
from beat.process_locks import ForkSafeLock
from beat.records import Session
from beat.redis_urls import is_sentinel
from beat.sockets import readable
from beat.store.db import (
    SERVER_INCARNATION,
    masked_url,
    open_idle_connection,
    own_session,
    psycopg_conninfo,
)

if TYPE_CHECKING:
    from beat.config import BeatConfig
    from beat.records import RedisHalf, SessionlessRun

logger = logging.getLogger(__name__)

#: SQL: the server's TCP keepalives on the PostgreSQL half (see the module docstring,
#: 4): a silent peer's session is ended after an hour and five minutes, not within the
#: seconds some servers are set to, nor by a short ``tcp_user_timeout`` (the kernel's
#: own retransmission limit, about 15 minutes, still applies to a send). Only the
#: settings the server has (``tcp_user_timeout`` is PostgreSQL 12's).
SERVER_SIDE_KEEPALIVES = (
    "SELECT set_config(name, CASE name WHEN 'tcp_keepalives_idle' THEN '3600'"
    " WHEN 'tcp_keepalives_interval' THEN '60' WHEN 'tcp_keepalives_count' THEN '5'"
    " ELSE '0' END, false) FROM pg_settings WHERE name IN ('tcp_keepalives_idle',"
    " 'tcp_keepalives_interval', 'tcp_keepalives_count', 'tcp_user_timeout')"
)

#: The beacon's row, written by its PostgreSQL half itself: the session recorded is the
#: one writing.
_RECORD = f"""
INSERT INTO beat_beacons AS b
    (name, session_pid, session_started_at, postgres_server, redis_server, recorded_at)
SELECT %(name)s, pid, backend_start, {SERVER_INCARNATION}, %(redis_server)s, now()
FROM pg_stat_activity WHERE pid = pg_backend_pid()
ON CONFLICT (name) DO UPDATE SET
    session_pid = excluded.session_pid,
    session_started_at = excluded.session_started_at,
    postgres_server = excluded.postgres_server,
    redis_server = excluded.redis_server,
    recorded_at = excluded.recorded_at
RETURNING session_pid, session_started_at, postgres_server
"""

#: Rows of beacons of processes long dead (their session gone, or of another server)
#: that nothing running refers to any more.
_PRUNE = f"""
DELETE FROM beat_beacons b
WHERE b.recorded_at < now() - interval '1 hour'
  AND (b.postgres_server <> {SERVER_INCARNATION}
       OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = b.session_pid))
  AND NOT EXISTS (SELECT 1 FROM beat_runs r WHERE r.state = 'running' AND r.beacon = b.name)
  AND NOT EXISTS (SELECT 1 FROM beat_workers w WHERE w.beacon = b.name)
  AND NOT EXISTS (SELECT 1 FROM beat_leader l WHERE l.beacon = b.name)
"""

_FORGET = "DELETE FROM beat_beacons WHERE name = %(name)s"


class _Unsupported(Exception):
    """The servers cannot tell this process's death (the message says why)."""


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
        self.name = f"{BEACON_PREFIX}{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._conn: psycopg.Connection[Any] | None = None
        self._redis: BeaconConnection | None = None
        #: The halves as recorded in ``beat_beacons``; None while the row is not up to date.
        self._session: Session | None = None
        #: The Redis server last recorded: a database session opened again while Redis
        #: cannot be reached is recorded with it (its row then names the new session).
        self._redis_server = ""
        #: False once the servers were seen unable to tell: crash detection is off.
        self._supported = True
        #: Whether the open database connection was checked as its server's own session.
        self._checked = False

    def keep(self) -> Session | None:
        """Open again whichever half was lost, record the halves if they changed; the
        beacon as recorded, or None where the servers cannot tell a crash (the database
        session is kept even then: a leader watches its own link with it). Raises
        StoreUnavailable (PostgreSQL) or LeaseUnavailable (Redis) when a lost half
        cannot be opened again now; the other half is kept."""
        if self._conn is not None and not self._pg_alive(self._conn):
            self._close_pg()
        if self._redis is not None and self._redis.lost():
            self._close_redis()
        if self._conn is None:
            self._conn = self._open_pg()
        if not self._supported:
            return None
        redis_down: LeaseUnavailable | None = None
        try:
            if not self._checked:  # once a connection: not again while Redis is away
                self._check_own_session(self._conn)
                self._checked = True
            if self._redis is None:
                try:
                    self._redis = self._open_redis()
                except LeaseUnavailable as exc:
                    redis_down = exc  # the database half is recorded all the same
            server = self._redis_server if self._redis is None else self._redis.server
            if server and (self._session is None or self._session.redis_server != server):
                self._session = self._record(self._conn, server)
        except _Unsupported as why:
            self._close_redis()
            self._unsupported(str(why))
            return None
        if redis_down is not None:
            raise redis_down
        return self._session

    def _open_pg(self) -> psycopg.Connection[Any]:
        self._session = None  # a new backend: its row is written next
        self._checked = False
        return open_idle_connection(
            self._conninfo,
            self._masked,
            self._database_setting,
            keepalives=(KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT),
        )

    def _check_own_session(self, conn: psycopg.Connection[Any]) -> None:
        """Raise _Unsupported unless the server's session is this connection's own (see
        the module docstring, 5); prune the rows of long-dead beacons."""
        try:
            if not own_session(conn):
                raise _Unsupported(
                    f"PostgreSQL at {self._masked} does not see this connection as its own"
                    " session (a pooler or a proxy between them?)"
                )
            self._keep_server_side_keepalives(conn)
            with contextlib.suppress(psycopg.Error):
                conn.execute(_PRUNE)  # housekeeping, at most once per opening
        except psycopg.Error as exc:
            self._close_pg()
            raise StoreUnavailable(f"PostgreSQL at {self._masked}: {exc}") from exc

    def _keep_server_side_keepalives(self, conn: psycopg.Connection[Any]) -> None:
        """Set the session's server-side keepalives (the module docstring, 4); a server
        that refuses them cannot tell a partition from a death: crash detection is off."""
        try:
            conn.execute(SERVER_SIDE_KEEPALIVES)
        except psycopg.Error as exc:
            if conn.closed:
                raise  # a lost connection, not a refusal
            raise _Unsupported(
                f"PostgreSQL at {self._masked} refuses this session's keepalive settings ({exc})"
            ) from exc

    def _open_redis(self) -> BeaconConnection:
        where = masked_url(self._redis_url)
        if is_sentinel(self._redis_url):
            # Which server holds the beacon changes with a failover: no proof to act on.
            raise _Unsupported(f"Redis at {where} is reached through Sentinel")
        connection = open_beacon_connection(self._redis_url, self.name)
        if connection is None:
            raise _Unsupported(f"Redis at {where} refuses CLIENT commands")
        if not connection.direct or not connection.server:
            connection.close()
            raise _Unsupported(
                f"Redis at {where} does not see this connection as its own client"
                " (a proxy between them?)"
            )
        return connection

    def _record(self, conn: psycopg.Connection[Any], redis_server: str) -> Session:
        try:
            row = conn.execute(
                _RECORD, {"name": self.name, "redis_server": redis_server}
            ).fetchone()
        except psycopg.Error as exc:
            self._close_pg()
            raise StoreUnavailable(f"PostgreSQL at {self._masked}: {exc}") from exc
        if row is None:  # pg_stat_activity does not list this session: nothing to prove
            raise _Unsupported(f"PostgreSQL at {self._masked} does not list this session")
        pid, started_at, postgres_server = row
        self._redis_server = redis_server
        return Session(
            beacon=self.name,
            pid=pid,
            started_at=started_at,
            postgres_server=postgres_server,
            redis_server=redis_server,
        )

    @staticmethod
    def _pg_alive(conn: psycopg.Connection[Any]) -> bool:
        """False once the session is known gone (only a readable socket is queried)."""
        if conn.closed:
            return False
        try:
            if readable(conn.fileno()):
                conn.execute("SELECT 1")
        except (psycopg.Error, OSError):
            return False  # readable, and it would not answer: the server closed it
        return True

    def _unsupported(self, why: str) -> None:
        self._supported = False
        logger.warning(
            "crash detection is off: %s; a crashed leader is replaced once its lease"
            " expires (habeat_lock_ttl), a crashed worker's run once its lease does"
            " (habeat_lease_timeout)",
            why,
        )

    def close(self) -> None:
        """Close both halves; the row goes first (a clean end is no crash to detect)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                conn.execute(_FORGET, {"name": self.name})
        self._close_pg()
        self._close_redis()

    def _close_pg(self) -> None:
        conn, self._conn = self._conn, None
        self._session = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _close_redis(self) -> None:
        client, self._redis = self._redis, None
        if client is not None:
            client.close()


_process_beacons: dict[tuple[int, str], SessionBeacon] = {}
_process_lock = ForkSafeLock()


def process_session(config: BeatConfig) -> Session | None:
    """The beacon this process keeps for its life (a worker process records it with
    the runs it starts and its presence), opened on first use and its lost halves
    opened again on every call; None where the servers cannot tell a crash or cannot
    be reached now (the run's lease then decides, as without it). A forked pool child
    opens its own."""
    key = (os.getpid(), config.database_url)
    with _process_lock:
        beacon = _process_beacons.get(key)
        if beacon is None:
            beacon = _process_beacons[key] = SessionBeacon(
                config.database_url,
                config.redis_url,
                database_setting=config.database_setting,
                redis_setting=config.redis_setting,
            )
        try:
            return beacon.keep()
        except (StoreUnavailable, LeaseUnavailable):
            return None
        except Exception:
            # Whatever else a look at the halves meets (a descriptor limit, a socket reset
            # mid-check) must not end the heartbeat that calls it: the leases still hold.
            logger.warning("could not keep this process's beacon", exc_info=True)
            return None


class SessionRecords(Protocol):
    """The recorded beacons whose database session is gone (``LeaderStore``)."""

    def leader_without_session(self) -> tuple[str, RedisHalf] | None: ...
    def runs_without_session(self, *, limit: int) -> list[SessionlessRun]: ...


class Evicting(Protocol):
    """The lease (``beat.lease.holder.LeaderLease``): gone beacons and eviction."""

    def gone_beacons(self, recorded: Mapping[str, str]) -> set[str]: ...
    def evict(self, holder: str) -> bool: ...


class CrashDetection:
    """A leader's beacon; a standby's check for a crashed leader; the reaper's for
    crashed workers."""

    def __init__(self, beacon: SessionBeacon, leaders: SessionRecords, lease: Evicting) -> None:
        self._beacon = beacon
        self._leaders = leaders
        self._lease = lease

    def open_beacon(self) -> Session | None:
        return self._beacon.keep()

    def keep_beacon(self) -> bool:
        """Keep the leader's beacon (its lost halves opened again); False only when its
        database session is gone and no other can be opened: then it cannot lead."""
        try:
            self._beacon.keep()
        except StoreUnavailable:
            return False
        except LeaseUnavailable:
            return True  # the lease's renewals meet the same Redis: the lease decides
        return True

    def close_beacon(self) -> None:
        self._beacon.close()

    def evict_dead_leader(self) -> bool:
        """Delete the lease of a leader whose beacon is proven gone; True if one was."""
        found = self._leaders.leader_without_session()
        if found is None:
            return False
        holder, half = found
        gone = self._lease.gone_beacons({half.name: half.server})
        if half.name not in gone or self._leaders.leader_without_session() != found:
            return False  # its Redis connection lives, or may: a cut link, a restart
        if not self._lease.evict(holder):
            return False
        logger.warning(
            "the leader %s crashed (its database session and Redis connection are gone):"
            " taking over without waiting for its lease",
            holder,
            extra={"holder": holder},
        )
        return True

    def dead_runs(self, *, limit: int) -> WorkerDeaths:
        """Running runs whose worker process is dead: both halves of its beacon are
        proven gone at once (its session gone before and after Redis no longer lists
        its connection; one gone alone is a cut link, a half on a restarted server is
        unknown: leases decide). A run whose worker's main process died too was
        interrupted; one whose pool process died under a living worker crashed it (an
        attempt)."""
        candidates = self._leaders.runs_without_session(limit=limit)
        if not candidates:
            return WorkerDeaths()
        halves = {run.beacon.name: run.beacon.server for run in candidates}
        halves |= {
            run.worker_beacon.name: run.worker_beacon.server
            for run in candidates
            if run.worker_beacon is not None
        }
        gone = self._lease.gone_beacons(halves)
        dead = [run for run in candidates if run.beacon.name in gone]
        if dead:  # and their sessions were still gone after Redis said so: at once
            still = {run.id for run in self._leaders.runs_without_session(limit=limit)}
            dead = [run for run in dead if run.id in still]
        return WorkerDeaths(
            runs=[run.id for run in dead],
            interrupted=[
                run.id
                for run in dead
                if run.worker_beacon is not None and run.worker_beacon.name in gone
            ],
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerDeaths:
    """Running runs whose worker process died, and those whose whole worker died."""

    runs: list[uuid.UUID] = field(default_factory=list)
    interrupted: list[uuid.UUID] = field(default_factory=list)
