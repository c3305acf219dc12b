"""The beacon on a private PostgreSQL and Redis whose settings the tests change. It
outlives the servers' idle timeouts (issue 38, findings 5 and 6): Redis's ``timeout``
and PostgreSQL's ``idle_session_timeout`` close idle connections, never the beacon's
halves (a pub/sub client; a session that turned the timeout off for itself). Over the
server's own unix socket, the session is the connection's own: crash detection is on.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator

import psycopg
import pytest
import redis

from beat.lease.beacon import SessionBeacon
from beat.store.all_roles import Store
from tests.chaos.servers import PrivatePostgres, PrivateRedis, private_servers, workspace

pytestmark = pytest.mark.integration

DATABASE = "beacon_servers"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PrivatePostgres, PrivateRedis]]:
    with workspace() as workdir, private_servers(workdir) as (postgres, redis_server):
        with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        store = Store.connect(postgres.url(DATABASE))
        store.migrate()
        store.dispose()
        yield postgres, redis_server


def test_the_beacon_survives_the_servers_idle_timeouts(
    servers: tuple[PrivatePostgres, PrivateRedis],
) -> None:
    postgres, redis_server = servers
    client = redis.Redis.from_url(redis_server.url())
    client.config_set("timeout", 1)
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {DATABASE} SET idle_session_timeout = '1s'")
    beacon = SessionBeacon(postgres.url(DATABASE), redis_server.url())
    try:
        first = beacon.keep()
        assert first is not None
        idle = redis.Redis.from_url(redis_server.url())
        idle.client_setname("an-idle-client")
        time.sleep(3)  # Redis looks for idle clients 10 times a second (hz)

        names = [entry["name"] for entry in client.client_list()]
        assert "an-idle-client" not in names, "the timeout closes an idle client"
        assert first.beacon in names
        assert beacon.keep() == first, "neither half was closed: the same session"
    finally:
        beacon.close()
        client.close()


def test_over_a_unix_socket_the_beacon_is_recorded(
    servers: tuple[PrivatePostgres, PrivateRedis],
) -> None:
    """The session a unix socket reaches is the connection's own when the socket is the
    server's (``unix_socket_directories`` with its ``port``): crash detection is on."""
    postgres, redis_server = servers
    url = f"postgresql+psycopg://postgres@/{DATABASE}?host={postgres.datadir}&port={postgres.port}"
    beacon = SessionBeacon(url, redis_server.url())
    try:
        session = beacon.keep()
        assert session is not None, "a unix socket of the server's own is no proxy"
    finally:
        beacon.close()


def test_a_partition_cannot_end_the_beacons_postgres_half_before_an_hour(
    servers: tuple[PrivatePostgres, PrivateRedis],
) -> None:
    """Neither side ends the PostgreSQL half over a silent link within the leases' time
    (``beat.lease.beacon``, rule 4): the server's keepalives for this session are an
    hour, whatever the server's own (2 s here), and this side's probes give up only
    after an hour (a reset of ours would reach the server over a one-way partition)."""
    postgres, redis_server = servers
    with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {DATABASE} SET tcp_keepalives_idle = 2")
    beacon = SessionBeacon(postgres.url(DATABASE), redis_server.url())
    try:
        assert beacon.keep() is not None
        conn = beacon._conn  # the half itself: what its server and its socket were told
        assert conn is not None
        rows = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name LIKE 'tcp_keepalives_%'"
        ).fetchall()
        server_side = {name: int(setting) for name, setting in rows}
        assert (
            alive_for(
                server_side["tcp_keepalives_idle"],
                server_side["tcp_keepalives_interval"],
                server_side["tcp_keepalives_count"],
            )
            >= 3600
        ), "the server's side"
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as ours:
            idle, interval, count = (
                ours.getsockopt(socket.IPPROTO_TCP, option)
                for option in (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT)
            )
        assert alive_for(idle, interval, count) >= 3600
        assert idle <= 60, "an idle half still carries packets for middleboxes' timers"
    finally:
        beacon.close()
        with psycopg.connect(postgres.admin_dsn, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {DATABASE} RESET tcp_keepalives_idle")


def alive_for(idle: int, interval: int, count: int) -> int:
    """Seconds of silence before TCP gives the connection up."""
    return idle + interval * count
