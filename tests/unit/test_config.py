"""The scheduler's settings: one table, read from app.conf and the environment."""

from __future__ import annotations

import redis

from beat.config import BeatConfig
from beat.leader import LeaderLease


def test_the_lease_renews_at_the_interval_it_is_given_else_a_third_of_its_ttl() -> None:
    client = redis.Redis()  # never connected: building a lease sends nothing
    assert LeaderLease(client, prefix="p", ttl=9.0).renew_interval == 3.0
    config = BeatConfig(lock_ttl=12.0)
    lease = LeaderLease(
        client, prefix="p", ttl=config.lock_ttl, renew_interval=config.renew_interval
    )
    assert lease.renew_interval == 4.0
    assert LeaderLease(client, prefix="p", ttl=9.0, renew_interval=1.5).renew_interval == 1.5
