"""The lease on Redis Sentinel, with real servers: a primary, a replica and three
``redis-sentinel`` processes started here. ``habeat_redis_url`` names the sentinels
(``sentinel://...;sentinel://...?master_name=``); the primary is SIGKILLed and the
sentinels promote the replica. The lease follows the new primary; whether the key was
replicated or lost, a new holder's epoch is above the old one's (its floor is
PostgreSQL's), and PostgreSQL refuses the old leader's fenced writes: the claims stay
single (RedBeat #163: two schedulers after a Sentinel failover)."""

from __future__ import annotations

import time

import pytest

from beat.errors import ConfigError, StaleEpoch
from beat.lease.holder import LeaderLease
from beat.lease.redis_url import redis_client
from beat.redis_urls import parse_sentinel_url
from beat.store.all_roles import Store
from tests.sentinel import SentinelCluster, sentinels

pytestmark = pytest.mark.integration

__all__ = ["sentinels"]  # the fixture, for this module's tests

TTL = 2.0


def lease(url: str, holder: str) -> LeaderLease:
    client = redis_client(url, socket_timeout=1, socket_connect_timeout=1)
    return LeaderLease(client, prefix="habeat-sentinel-test", ttl=TTL, holder=holder)


def test_after_a_sentinel_failover_the_lease_follows_the_new_primary_and_the_epoch_fences(
    sentinels: SentinelCluster, store: Store
) -> None:
    first = lease(sentinels.url, "beat-a")
    epoch_a = first.try_acquire(store.current_epoch())
    assert epoch_a is not None
    assert store.take_leadership(epoch_a, "beat-a")
    sentinels.kill_primary_and_wait_for_the_failover()
    assert sentinels.primary() == ("127.0.0.1", sentinels.replica_port)

    second = lease(sentinels.url, "beat-b")
    epoch_b: int | None = None
    deadline = time.monotonic() + 30
    while epoch_b is None and time.monotonic() < deadline:
        # The key came over with the replica (then it lapses within the TTL) or was lost.
        try:
            epoch_b = second.try_acquire(store.current_epoch())
        except Exception:  # the new primary is still taking over
            epoch_b = None
        time.sleep(0.2)
    assert epoch_b is not None, "no process took the lease on the new primary"
    assert epoch_b > epoch_a
    assert store.take_leadership(epoch_b, "beat-b")

    with pytest.raises(StaleEpoch):
        store.watch_runs(epoch_a, idle_timeout=5)  # the old leader's claims: refused
    assert not first.renew(), "the old holder learns it no longer leads"
    assert second.is_held()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("sentinel://127.0.0.1:26379/0", "needs the primary's name: add ?master_name=NAME"),
        ("sentinel://127.0.0.1:26379;redis://x:1/0?master_name=b", "is not sentinel://host:port"),
        ("sentinel://127.0.0.1:26379/zero?master_name=b", "the database of a sentinel:// URL"),
    ],
)
def test_a_sentinel_url_without_what_it_needs_is_refused_naming_the_fix(
    url: str, says: str
) -> None:
    with pytest.raises(ConfigError, match=says.replace("?", r"\?")):
        parse_sentinel_url(url)


def test_a_sentinel_url_names_its_sentinels_primary_database_and_password() -> None:
    spec = parse_sentinel_url(
        "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2/2?master_name=beat"
    )
    assert spec.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379))
    assert (spec.master_name, spec.db, spec.password) == ("beat", 2, "s3cret")
