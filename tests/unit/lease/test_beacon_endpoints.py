"""How a beacon tells that a server sees its connection as it is (``beat.lease.holder``):
the address a server prints for its client must be the socket's own."""

from __future__ import annotations

import pytest

from beat.lease.holder import same_endpoint


@pytest.mark.parametrize(
    ("shown", "host", "port"),
    [
        ("127.0.0.1:5432", "127.0.0.1", 5432),
        ("[::1]:6379", "::1", 6379),  # PostgreSQL's and Redis's ways of printing IPv6
        ("::1:6379", "::1", 6379),
        ("[::ffff:10.0.0.7]:40000", "10.0.0.7", 40000),  # a dual-stack socket's view
        ("[fe80::1%eth0]:5432", "fe80::1", 5432),
    ],
)
def test_the_same_endpoint_is_recognised(shown: str, host: str, port: int) -> None:
    assert same_endpoint(shown, host, port)


@pytest.mark.parametrize(
    ("shown", "host", "port"),
    [
        ("127.0.0.1:5433", "127.0.0.1", 5432),  # a pooler's own connection, another port
        ("10.0.0.8:5432", "10.0.0.7", 5432),  # a proxy's address
        ("/tmp/redis.sock:0", "127.0.0.1", 0),
        ("", "127.0.0.1", 5432),
    ],
)
def test_another_endpoint_is_not(shown: str, host: str, port: int) -> None:
    assert not same_endpoint(shown, host, port)
