"""The leader lease: one Redis key, renewed on a timer, fenced by an epoch.

- acquire: ``SET key token NX PX ttl`` and, in the same script, ``INCR`` the
  epoch counter (raised above the newest epoch PostgreSQL has seen, so a Redis
  that restarted empty cannot hand out an old epoch);
- renew: compare-and-pexpire every ttl/3 from a thread of its own, so a slow
  tick never loses the lease (the failure mode of celery-redbeat #230);
- release: compare-and-delete on clean shutdown, so a standby takes over at once;
- time_left: compare-and-PTTL, asked just before an action that must not outlive
  the lease (sending runs claimed ahead).

Redis cannot fence a holder that pauses past its TTL: that is the job of the
epoch, which PostgreSQL checks in every claim. Locally, the holder stops
believing it leads once ``ttl`` (less a margin) has passed since the last renewal
it *sent*, without waiting for Redis to tell it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import redis

from beat.errors import LeaseUnavailable
from beat.lease.redis_url import redis_address
from beat.sockets import readable, same_endpoint
from beat.store.db import masked_url

logger = logging.getLogger(__name__)

#: Fraction of the TTL a holder stops short of, against clock-rate drift between it and Redis.
DRIFT_MARGIN = 0.1

# KEYS[1] lock, KEYS[2] epoch counter; ARGV[1] token, ARGV[2] ttl ms, ARGV[3] epoch floor.
# A leftover lock of our own token counts as free: we restart the term with a new epoch.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return false end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
return epoch
"""

# Raise the epoch while still holding the lock (PostgreSQL has seen a newer one).
_BUMP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
local epoch = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[2])
if epoch <= floor then
  epoch = floor + 1
  redis.call('SET', KEYS[2], epoch)
end
return epoch
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Milliseconds the lock has left if ARGV[1] holds it, else false (nil).
_TIME_LEFT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PTTL', KEYS[1])
end
return false
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def lock_key(prefix: str) -> str:
    return f"{prefix}:leader:lock"


def epoch_key(prefix: str) -> str:
    return f"{prefix}:leader:epoch"


#: Prefix of the names of the Redis connections processes keep as crash beacons.
BEACON_PREFIX = "habeat-beacon:"
#: Replies a beacon's check reads at most, looking for its PING's among messages.
_MESSAGES_READ = 100


class BeaconConnection:
    """A process's own Redis connection, named ``name`` (``CLIENT SETNAME``) and
    subscribed to a channel of that name (``beat.lease.beacon``). Subscribed, it is a
    pub/sub client, which Redis never closes for its idle ``timeout``."""

    def __init__(self, connection: Any, *, server: str, direct: bool) -> None:
        self._connection = connection
        #: The ``run_id`` of the server that took it: another one is another server (a
        #: restart, a failover), which never listed it.
        self.server = server
        #: The server sees it from this end's address: nothing stands between them.
        self.direct = direct

    def lost(self) -> bool:
        """True once the server closed it. Non-blocking while nothing arrived: only a
        readable socket (the server closing it, or a message someone published to its
        channel) is asked, with a PING, whose answer follows any such message."""
        sock = self._connection._sock  # redis-py keeps the socket here
        if sock is None:
            return True
        try:
            if not readable(sock.fileno()):
                return False
            self._connection.send_command("PING")
            for _ in range(_MESSAGES_READ):
                if self._connection.read_response() == [b"pong", b""]:
                    return False
        except (redis.ConnectionError, ConnectionError):
            return True  # the server closed it, or the kernel reset it: proof
        except (redis.RedisError, OSError):
            return False  # a slow answer proves nothing: the half is kept
        return False  # more messages than read: the connection answers, it is open

    def close(self) -> None:
        with contextlib.suppress(redis.RedisError, OSError):
            self._connection.disconnect()


#: TCP keepalives of a beacon's halves (seconds): an idle connection still carries
#: packets, so a load balancer's or a firewall's idle timer never ends it (they reset
#: both halves at once, which would read as the process's death). Unanswered, the
#: probes go on for an hour before this side closes the half itself: a partition that
#: drops only the servers' packets would otherwise have this process reset both halves
#: within a minute, and its reset reach the servers as if it had died
#: (``beat.lease.beacon``, rule 4).
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 60, 60


def _keepalive(url: str) -> dict[str, Any]:
    """redis-py's options for TCP keepalives on ``url`` (none over a unix socket)."""
    if not url.startswith(("redis://", "rediss://")):
        return {}
    options = {
        name: value
        for name, value in (
            ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
            ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
            ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        )
        if hasattr(socket, name)
    }
    return {
        "socket_keepalive": True,
        "socket_keepalive_options": {
            getattr(socket, name): value for name, value in options.items()
        },
    }


def open_beacon_connection(url: str, name: str) -> BeaconConnection | None:
    """The connection a process keeps for its life or term (``beat.lease.beacon``), in one
    round trip: named, its address as the server sees it, the server's ``run_id``, then
    subscribed. None where the server refuses CLIENT commands (some managed Redis
    services). Raises LeaseUnavailable when Redis cannot be reached."""
    pool = redis.ConnectionPool.from_url(
        # RESP2: a subscribed connection answers with plain replies, and takes no command
        # but PING and (UN)SUBSCRIBE.
        url,
        protocol=2,
        socket_timeout=2,
        socket_connect_timeout=2,
        **_keepalive(url),
    )
    connection: Any = pool.make_connection()  # redis-py's connection API is untyped
    commands = [
        ("CLIENT", "SETNAME", name),
        ("CLIENT", "INFO"),
        ("INFO", "server"),
        ("SUBSCRIBE", name),
    ]
    try:
        connection.connect()
        connection.send_packed_command(connection.pack_commands(commands))
        replies = [connection.read_response() for _ in commands]
    except redis.ResponseError:
        connection.disconnect()
        return None
    except (redis.RedisError, OSError) as exc:
        connection.disconnect()
        raise LeaseUnavailable(f"Redis at {masked_url(url)}: {exc}") from exc
    info = _fields(replies[1], " ")
    return BeaconConnection(
        connection,
        server=_fields(replies[2], "\r\n").get("run_id", ""),
        direct=_seen_from_here(connection._sock, info.get("addr", ""), info.get("laddr", "")),
    )


def _fields(reply: object, separator: str) -> dict[str, str]:
    """``key=value`` (CLIENT INFO) or ``key:value`` (INFO) fields of a reply."""
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    pairs = (re.split("[=:]", item.strip(), maxsplit=1) for item in text.split(separator))
    return {pair[0]: pair[1] for pair in pairs if len(pair) == 2}


def _seen_from_here(sock: socket.socket | None, addr: str, laddr: str) -> bool:
    """Does the server see this socket as it is (``addr``: its client's address,
    ``laddr``: the server's own end)? Over TCP, the client's address and port must be
    ours and the server's port our peer's; over a unix socket, the server's socket path
    must be the one we reached."""
    if sock is None:
        return False
    if sock.family == socket.AF_UNIX:
        return bool(laddr) and laddr.rsplit(":", 1)[0] == sock.getpeername()
    local, peer = sock.getsockname(), sock.getpeername()
    return same_endpoint(addr, local[0], local[1]) and laddr.rsplit(":", 1)[-1] == str(peer[1])


def gone_beacons(client: redis.Redis, recorded: Mapping[str, str]) -> set[str]:
    """The names in ``recorded`` (name → the ``run_id`` of the server its connection was
    opened on) that are proven closed: the server answering has that ``run_id`` before
    and after listing its pub/sub clients, and does not list the name. A name recorded
    on another server (restarted, failed over since), or when Redis cannot tell (CLIENT
    LIST refused, unreachable), is not: leases decide."""
    if not recorded:
        return set()
    try:
        server = client.info("server").get("run_id")
        listed = {str(entry.get("name", "")) for entry in client.client_list(_type="pubsub")}
        if client.info("server").get("run_id") != server:
            return set()  # restarted meanwhile: the list is of another server
    except redis.RedisError:
        return set()
    return {name for name, on in recorded.items() if on == server and name not in listed}


def new_holder_id() -> str:
    """A token unique to this process and term: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class LeaderLease:
    """A Redis lease held by at most one live process at a time (see module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        ttl: float,
        holder: str | None = None,
        on_lost: Callable[[str], None] | None = None,
        setting: str = "habeat_redis_url",
        renew_interval: float | None = None,
    ) -> None:
        self._client = client
        self._setting = setting  # named in the hint when Redis cannot be reached
        self._keys = [lock_key(prefix), epoch_key(prefix)]
        self.ttl = ttl
        #: Seconds between two renewals (default: a third of the TTL).
        self.renew_interval = ttl / 3 if renew_interval is None else renew_interval
        self.holder = holder or new_holder_id()
        self._on_lost = on_lost
        self._acquire = client.register_script(_ACQUIRE)
        self._bump = client.register_script(_BUMP)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._time_left = client.register_script(_TIME_LEFT)
        self._guard = threading.Lock()
        self._valid_until = 0.0  # time.monotonic() past which we no longer lead
        self._term = 0  # incremented on every acquisition, so an old renewer thread stops
        self._stop_renewing = threading.Event()

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl * 1000)

    def is_held(self) -> bool:
        """True while this process may act as leader (Redis-wise; Postgres fences the rest)."""
        with self._guard:
            return time.monotonic() < self._valid_until

    def try_acquire(self, epoch_floor: int) -> int | None:
        """Take the lease if it is free; return the new epoch (> ``epoch_floor``) or None."""
        sent_at = time.monotonic()
        epoch = self._call(self._acquire, self.holder, self.ttl_ms, epoch_floor)
        if epoch is None:
            return None
        with self._guard:
            self._term += 1
            self._valid_until = sent_at + self.ttl * (1 - DRIFT_MARGIN)
        return int(epoch)

    def bump_epoch(self, epoch_floor: int) -> int | None:
        """A new epoch above ``epoch_floor`` if we still hold the lock, else None."""
        epoch = self._call(self._bump, self.holder, epoch_floor)
        return None if epoch is None else int(epoch)

    def renew(self) -> bool:
        """Extend the lease to a full TTL if we still hold it."""
        sent_at = time.monotonic()
        if not self._call(self._renew, self.holder, self.ttl_ms):
            self._drop("another process holds the lease")
            return False
        with self._guard:
            if self._valid_until > 0:
                self._valid_until = sent_at + self.ttl * (1 - DRIFT_MARGIN)
        return True

    def time_left(self) -> float | None:
        """Seconds the lock has left in Redis if this process holds it, else None (and
        the lease is dropped): one round trip, compare and PTTL in one script."""
        left = self._call(self._time_left, self.holder)
        if left is None:
            self._drop("another process holds the lease, or it expired")
            return None
        return int(left) / 1000

    def release(self) -> bool:
        """Give the lease up (compare-and-delete); True if we held it."""
        with self._guard:
            self._valid_until = 0.0
            self._term += 1
        self._stop_renewing.set()
        return bool(self._call(self._release, self.holder))

    def evict(self, holder: str) -> bool:
        """Delete another holder's lock if it still holds it (compare-and-delete): its
        process is known dead (``beat.lease.beacon``). True if the lock was deleted."""
        return bool(self._call(self._release, holder))

    def gone_beacons(self, recorded: Mapping[str, str]) -> set[str]:
        """Which recorded beacons' Redis connections are proven closed (see
        :func:`gone_beacons`)."""
        return gone_beacons(self._client, recorded)

    def abandon(self, reason: str) -> None:
        """Stop leading without touching Redis (e.g. PostgreSQL refused our epoch)."""
        self._drop(reason)

    def current_holder(self) -> str | None:
        try:
            value = self._client.get(self._keys[0])
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc
        return value.decode() if isinstance(value, bytes) else value

    def start_renewing(self, healthy: Callable[[], bool] | None = None) -> threading.Thread:
        """Renew every ``renew_interval`` from a daemon thread until the lease is lost or released.

        ``healthy`` is asked before each renewal. Once it says no (the holder cannot do
        a leader's work: its ticks fail or hang, e.g. it is cut off from PostgreSQL),
        the lease is released rather than renewed, so that a standby which can do
        the work leads instead of nobody."""
        with self._guard:
            term = self._term
        self._stop_renewing.clear()
        thread = threading.Thread(
            target=self._renew_loop,
            args=(term, healthy),
            name="habeat-lease-renewer",
            daemon=True,
        )
        thread.start()
        return thread

    def _renew_loop(self, term: int, healthy: Callable[[], bool] | None) -> None:
        while not self._stop_renewing.wait(self.renew_interval):
            with self._guard:
                if self._term != term or self._valid_until == 0.0:
                    return
            if healthy is not None and not healthy():
                self._drop("this process cannot do a leader's work (see its tick errors)")
                with contextlib.suppress(LeaseUnavailable):  # else the TTL frees it
                    self._call(self._release, self.holder)
                return
            try:
                if not self.renew():
                    return
            except LeaseUnavailable as exc:
                # Keep trying: the lease is still ours until valid_until passes.
                logger.warning("could not renew the leader lease: %s", exc)
                if not self.is_held():
                    self._drop("the lease expired while Redis was unreachable")
                    return

    def _drop(self, reason: str) -> None:
        with self._guard:
            was_held = self._valid_until > 0.0
            self._valid_until = 0.0
            self._term += 1
        if was_held and self._on_lost is not None:
            self._on_lost(reason)

    def _call(self, script: redis.commands.core.Script, *args: str | int | float) -> Any:
        try:
            return script(keys=self._keys, args=list(args))
        except redis.RedisError as exc:
            raise self._unavailable(exc) from exc

    def _unavailable(self, exc: Exception) -> LeaseUnavailable:
        where = redis_address(self._client)
        return LeaseUnavailable(
            f"Redis at {where} is unreachable ({exc}): start it"
            f" (`docker compose up -d redis`) or check {self._setting}"
        )
