"""The Redis client of ``habeat_redis_url``: ``redis://``, ``rediss://`` (TLS) and
``unix://`` as redis-py reads them, or Redis Sentinel as kombu spells it, with the name
of the primary the sentinels watch::

    sentinel://:password@10.0.0.1:26379;sentinel://:password@10.0.0.2:26379/0?master_name=beat

The sentinels are asked which server is the primary, again after a failover: the lease
follows it. A failover may lose the lease key or hand it out twice (Redis replicates
asynchronously); the epoch PostgreSQL checks in every claim keeps the claims single.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.sentinel import Sentinel, SentinelConnectionPool

from beat.redis_urls import is_sentinel, parse_sentinel_url


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
