"""The leader lease as Redis holds it now, read by operators (``schedules leader``,
``schedules health``): the lock key's holder and time to live, nothing written.

The holder's side of the lease (acquire, renew, release) is :mod:`beat.lease.holder`;
this is the only other module that talks to Redis about the lease.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from beat.errors import LeaseUnavailable
from beat.lease.holder import lock_key
from beat.lease.redis_url import redis_address, redis_client

#: Seconds a Redis call of a status read may take.
REDIS_TIMEOUT = 3.0


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaseStatus:
    """The lock key of the leader lease as Redis holds it now."""

    key: str
    #: The token stored in the key (the leader's holder ID); None when no one holds it.
    holder: str | None
    #: Milliseconds until the key expires; None when no one holds it.
    ttl_ms: int | None
    #: Where Redis is, password hidden.
    where: str


def read_lease(
    redis_url: str,
    *,
    prefix: str,
    setting: str = "habeat_redis_url",
    timeout: float = REDIS_TIMEOUT,
) -> LeaseStatus:
    """The lock key's value and PTTL, read together (one MULTI), for the cluster of key
    prefix ``prefix``; LeaseUnavailable, naming ``setting``, if Redis does not answer."""
    key = lock_key(prefix)
    client = redis_client(
        redis_url, setting, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    where = redis_address(client)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.get(key)
        pipe.pttl(key)
        value, ttl_ms = pipe.execute()
    except redis.RedisError as exc:
        raise LeaseUnavailable(
            f"Redis at {where} is unreachable ({exc}): start it"
            f" (`docker compose up -d redis`) or check {setting}"
        ) from exc
    finally:
        client.close()
    holder = value.decode() if isinstance(value, bytes) else value
    return LeaseStatus(
        key=key,
        holder=holder,
        ttl_ms=int(ttl_ms) if holder is not None and int(ttl_ms) >= 0 else None,
        where=where,
    )
