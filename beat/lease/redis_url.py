"""The Redis client of ``habeat_redis_url``: ``redis://``, ``rediss://`` (TLS) and
``unix://`` as redis-py reads them, or Redis Sentinel as kombu spells it, with the name
of the primary the sentinels watch::

    sentinel://:password@10.0.0.1:26379;sentinel://:password@10.0.0.2:26379/0?master_name=beat

The sentinels are asked which server is the primary, again after a failover: the lease
follows it. A failover may lose the lease key or hand it out twice (Redis replicates
asynchronously); the epoch PostgreSQL checks in every claim keeps the claims single.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from beat.errors import ConfigError

SENTINEL_SCHEME = "sentinel"


@dataclass(frozen=True, kw_only=True, slots=True)
class SentinelSpec:
    """What a ``sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int = 0
    password: str | None = None
    username: str | None = None


def is_sentinel(url: str) -> bool:
    return url.split(":", 1)[0].lower() == SENTINEL_SCHEME


def parse_sentinel_url(url: str, setting: str = "habeat_redis_url") -> SentinelSpec:
    """The sentinels (each ``sentinel://host:port``, separated by ``;``), the primary's
    name (``?master_name=``), its database and password; ConfigError naming the fix."""
    parts = [part for part in url.split(";") if part.strip()]
    sentinels: list[tuple[str, int]] = []
    query: dict[str, list[str]] = {}
    db, password, username = 0, None, None
    for part in parts:
        split = urlsplit(part.strip())
        if split.scheme.lower() != SENTINEL_SCHEME or not split.hostname:
            raise ConfigError(
                f"{setting}: {part.strip()[:80]!r} is not sentinel://host:port: list each"
                " sentinel as sentinel://host:port, separated by ';'"
            )
        sentinels.append((split.hostname, split.port or 26379))
        query.update(parse_qs(split.query))
        if split.path.strip("/"):
            db = _database(split.path.strip("/"), setting)
        if split.password is not None:
            password = unquote(split.password)
            username = unquote(split.username) if split.username else None
    master_name = (query.get("master_name") or [""])[0]
    if not master_name:
        raise ConfigError(
            f"{setting}: a sentinel:// URL needs the primary's name: add"
            " ?master_name=NAME (the name the sentinels monitor)"
        )
    return SentinelSpec(
        sentinels=tuple(sentinels),
        master_name=master_name,
        db=db,
        password=password,
        username=username,
    )


def _database(text: str, setting: str) -> int:
    if not text.isdigit():
        raise ConfigError(
            f"{setting}: the database of a sentinel:// URL is a number, not {text!r:.20}"
        )
    return int(text)


def redis_client(url: str, setting: str = "habeat_redis_url", **options: Any) -> redis.Redis:
    """A client of the Redis ``url`` names (``options``: redis-py's, e.g. timeouts);
    with Sentinel, one that asks the sentinels for the primary."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, **options)
    spec = parse_sentinel_url(url, setting)
    timeouts = {
        key: value
        for key, value in options.items()
        if key in ("socket_timeout", "socket_connect_timeout")
    }
    sentinel = Sentinel(list(spec.sentinels), sentinel_kwargs=timeouts, **options)
    client: redis.Redis = sentinel.master_for(
        spec.master_name, db=spec.db, password=spec.password, username=spec.username
    )
    return client


def redis_address(client: redis.Redis) -> str:
    """Where ``client`` connects, for an error a user acts on: ``host:port/db``, or
    for Sentinel the primary's name and the sentinels asked for it."""
    pool = client.connection_pool
    kwargs = pool.connection_kwargs
    if isinstance(pool, SentinelConnectionPool):
        sentinels = ", ".join(
            f"{each.connection_pool.connection_kwargs.get('host')}"
            f":{each.connection_pool.connection_kwargs.get('port')}"
            for each in pool.sentinel_manager.sentinels
        )
        return f"the primary {pool.service_name!r}/{kwargs.get('db', 0)} of sentinels {sentinels}"
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}/{kwargs.get('db', 0)}"
