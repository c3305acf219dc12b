"""Which beat processes are up, leading or standing by: each announces itself in Redis.

Nothing else records a standby: the lease names the leader only. So every beat
process keeps an entry under its cluster's key prefix:

- ``{prefix}:beats``, a sorted set: the process's holder ID (``beat.lease.holder``)
  scored with the time its entry expires (Redis ``TIME``, milliseconds);
- ``{prefix}:beats:info``, a hash: holder ID -> a small JSON document (host,
  pid, when the process started, the package's version).

A process refreshes its entry from its loop, at most every ``interval``, in one
script that also drops the entries of processes that stopped refreshing theirs
(and their info), so the hash does not grow with every restart (each one has a
new holder ID). An entry outlives its last refresh by ``lifetime``: missing a
few refreshes does not make a live process vanish. A clean shutdown removes it.

Presence is for people to read, never for the leadership: the lease alone
decides who leads, and a refresh that fails is logged once and forgotten.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from importlib import metadata
from typing import Any

import redis

from beat.errors import LeaseUnavailable
from beat.lease.redis_url import redis_client
from beat.store.db import masked_url

logger = logging.getLogger(__name__)

#: Seconds a Redis call of a presence read may take (as a lease status read).
READ_TIMEOUT = 3.0
#: Most expired entries one script drops (the rest go at the next refresh or read):
#: bounds the script's run time and the arguments of one HDEL.
PRUNE_BATCH = 1000

# Drop the entries that expired by ``now`` (KEYS[1] the sorted set, KEYS[2] the hash).
_PRUNE = f"""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, {PRUNE_BATCH})
if #gone > 0 then
  redis.call('ZREM', KEYS[1], unpack(gone))
  redis.call('HDEL', KEYS[2], unpack(gone))
end
"""

# ARGV[1] holder, ARGV[2] lifetime ms, ARGV[3] info JSON. Both keys expire with their
# latest entry, so a cluster that is gone leaves nothing behind.
_REFRESH = (
    _PRUNE
    + """
local expires = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], expires, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
redis.call('PEXPIREAT', KEYS[1], last)
redis.call('PEXPIREAT', KEYS[2], last)
return expires
"""
)

# The live entries: {{holder, expiry ms, ...}, {info, ...}} (an info is nil if missing).
_READ = (
    _PRUNE
    + """
local live = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local holders = {}
for i = 1, #live, 2 do holders[#holders + 1] = live[i] end
local infos = {}
if #holders > 0 then infos = redis.call('HMGET', KEYS[2], unpack(holders)) end
return {live, infos}
"""
)


def beats_key(prefix: str) -> str:
    return f"{prefix}:beats"


def info_key(prefix: str) -> str:
    return f"{prefix}:beats:info"


@dataclass(frozen=True, kw_only=True, slots=True)
class BeatProcess:
    """A beat process that announced itself (times are Redis's clock, except
    ``started_at``: its own host's)."""

    #: Its holder ID: the lease's value while it leads.
    holder: str
    host: str
    pid: int
    started_at: datetime
    #: Its last refresh.
    seen_at: datetime
    #: When its entry goes unless refreshed again.
    expires_at: datetime
    #: The version of celery-habeat it runs (None if not installed as a package).
    version: str | None = None


@cache
def package_version() -> str | None:
    try:
        return metadata.version("celery-habeat")
    except metadata.PackageNotFoundError:
        return None


class BeatPresence:
    """This process's entry (see the module docstring): ``refresh`` from the loop,
    ``leave`` on a clean shutdown; neither ever raises."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        holder: str,
        lifetime: float,
        interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._keys = [beats_key(prefix), info_key(prefix)]
        self.holder = holder
        #: Seconds the entry outlives its last refresh.
        self.lifetime = lifetime
        #: Least seconds between two refreshes (attempts, failed ones too).
        self.interval = interval
        self._clock = clock
        self._next_refresh = -float("inf")
        self._failing = False
        self._refresh = client.register_script(_REFRESH)
        self._info = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": datetime.now(UTC).isoformat(),
                "version": package_version(),
                "lifetime_ms": int(lifetime * 1000),
            },
            separators=(",", ":"),
        )

    def refresh(self) -> None:
        """Announce this process again, unless it did less than ``interval`` ago: one
        script call. A failure is logged (at debug, once until a refresh succeeds)."""
        now = self._clock()
        if now < self._next_refresh:
            return
        self._next_refresh = now + self.interval
        try:
            self._refresh(
                keys=self._keys, args=[self.holder, int(self.lifetime * 1000), self._info]
            )
        except Exception as exc:  # presence is informative: nothing may fail because of it
            if not self._failing:
                logger.debug("could not announce this beat process in Redis: %s", exc)
            self._failing = True
        else:
            self._failing = False

    def leave(self) -> None:
        """Remove this process's entry (a clean shutdown); its lifetime removes it else."""
        with contextlib.suppress(Exception):  # shutting down: the entry expires anyway
            pipe = self._client.pipeline(transaction=True)
            pipe.zrem(self._keys[0], self.holder)
            pipe.hdel(self._keys[1], self.holder)
            pipe.execute()


def read_beats(
    redis_url: str,
    *,
    prefix: str,
    setting: str = "habeat_redis_url",
    timeout: float = READ_TIMEOUT,
) -> list[BeatProcess]:
    """The live beat processes of the cluster of key prefix ``prefix``, by holder ID,
    after dropping the expired entries (one script); LeaseUnavailable, naming
    ``setting``, if Redis does not answer."""
    client = redis_client(
        redis_url, setting, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        live, infos = client.register_script(_READ)(keys=[beats_key(prefix), info_key(prefix)])
    except redis.RedisError as exc:
        raise LeaseUnavailable(
            f"Redis at {masked_url(redis_url)} is unreachable ({exc}): start it"
            f" (`docker compose up -d redis`) or check {setting}"
        ) from exc
    finally:
        client.close()
    return beats_from_entries(live, infos)


def beats_from_entries(live: Sequence[Any], infos: Sequence[Any]) -> list[BeatProcess]:
    """BeatProcesses of ``live`` (holder, expiry ms, holder, expiry ms...) and their
    info documents; an entry whose info is missing or unreadable is left out."""
    pairs = zip(live[0::2], live[1::2], strict=True)
    found = (
        _beat_process(_text(holder), int(float(expiry)), raw)
        for (holder, expiry), raw in zip(pairs, infos, strict=True)
    )
    return sorted((beat for beat in found if beat is not None), key=lambda beat: beat.holder)


def _beat_process(holder: str, expires_ms: int, raw: Any) -> BeatProcess | None:
    if raw is None:
        return None
    try:
        info = json.loads(raw)
        return BeatProcess(
            holder=holder,
            host=str(info["host"]),
            pid=int(info["pid"]),
            started_at=datetime.fromisoformat(info["started_at"]),
            seen_at=_from_ms(expires_ms - int(info["lifetime_ms"])),
            expires_at=_from_ms(expires_ms),
            version=info.get("version"),
        )
    except (ValueError, KeyError, TypeError):  # written by something else: not ours to show
        return None


def leader_first(beats: Iterable[BeatProcess], leader: str | None) -> list[BeatProcess]:
    """``beats`` with the one holding the lease (holder ``leader``) first, then by start."""
    return sorted(beats, key=lambda beat: (beat.holder != leader, beat.started_at, beat.holder))


def _from_ms(milliseconds: int) -> datetime:
    return datetime.fromtimestamp(0, UTC) + timedelta(milliseconds=milliseconds)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
