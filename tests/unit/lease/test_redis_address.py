"""An unreachable lease Redis is named so a user can find it, Sentinel included."""

from __future__ import annotations

from beat.lease.redis_url import redis_address, redis_client


def test_a_plain_url_is_named_by_host_port_and_database() -> None:
    client = redis_client("redis://10.0.0.5:6380/3")
    assert redis_address(client) == "10.0.0.5:6380/3"


def test_a_sentinel_url_is_named_by_its_primary_and_sentinels() -> None:
    client = redis_client("sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380/2?master_name=beat")
    assert redis_address(client) == (
        "the primary 'beat'/2 of sentinels 10.0.0.1:26379, 10.0.0.2:26380"
    )
