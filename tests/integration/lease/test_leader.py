"""The Redis lease against real Redis: acquisition, renewal, loss, release, epochs."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from beat.errors import LeaseUnavailable
from beat.lease.holder import LeaderLease, epoch_key, lock_key
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration


def lease(client: redis.Redis, prefix: str, ttl: float = 3.0, **kwargs: object) -> LeaderLease:
    return LeaderLease(client, prefix=prefix, ttl=ttl, **kwargs)  # type: ignore[arg-type]


def test_one_holder_at_a_time_with_increasing_epochs(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    first, second = (
        lease(redis_client, test_env.key_prefix),
        lease(redis_client, test_env.key_prefix),
    )
    assert first.try_acquire(0) == 1
    assert first.is_held()
    assert second.try_acquire(0) is None
    assert not second.is_held()
    assert redis_client.get(lock_key(test_env.key_prefix)) == first.holder.encode()
    assert first.release()
    assert not first.is_held()
    assert second.try_acquire(0) == 2
    assert not first.release(), "releasing someone else's lease does nothing"
    assert second.current_holder() == second.holder


def test_epoch_never_goes_below_the_floor_from_postgres(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """A Redis restarted empty would hand out epoch 1 again; the floor prevents it."""
    holder = lease(redis_client, test_env.key_prefix)
    assert holder.try_acquire(41) == 42
    redis_client.delete(epoch_key(test_env.key_prefix))  # the counter is lost
    assert holder.bump_epoch(42) == 43, "the holder can raise its epoch above what PostgreSQL saw"
    other = lease(redis_client, test_env.key_prefix)
    assert other.bump_epoch(100) is None, "only the holder may bump"


def test_renewal_keeps_the_lease_past_its_ttl(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    holder = lease(redis_client, test_env.key_prefix, ttl=1.2)
    assert holder.try_acquire(0)
    holder.start_renewing()
    time.sleep(3)
    assert holder.is_held()
    assert 0 < redis_client.pttl(lock_key(test_env.key_prefix)) <= 1200
    holder.release()


def test_without_renewal_the_lease_lapses_and_another_takes_it(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    holder = lease(redis_client, test_env.key_prefix, ttl=1.0)
    assert holder.try_acquire(0)
    time.sleep(1.1)
    assert not holder.is_held(), "the holder stops believing it leads by its own clock"
    other = lease(redis_client, test_env.key_prefix, ttl=1.0)
    assert other.try_acquire(0) == 2


def test_a_stolen_lease_is_noticed_at_the_next_renewal(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    lost = threading.Event()
    reasons: list[str] = []

    def on_lost(reason: str) -> None:
        reasons.append(reason)
        lost.set()

    holder = lease(redis_client, test_env.key_prefix, ttl=1.5, on_lost=on_lost)
    assert holder.try_acquire(0)
    holder.start_renewing()
    redis_client.set(lock_key(test_env.key_prefix), "intruder")
    assert lost.wait(2), "the renewer saw the lease was no longer ours"
    assert not holder.is_held()
    assert "another process" in reasons[0]
    assert redis_client.get(lock_key(test_env.key_prefix)) == b"intruder", (
        "never deletes another's lease"
    )


def test_own_leftover_lease_is_taken_again_with_a_new_epoch(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    holder = lease(redis_client, test_env.key_prefix, ttl=5)
    assert holder.try_acquire(0) == 1
    holder.abandon("test: lost track locally")
    assert holder.try_acquire(0) == 2


def test_unreachable_redis_is_a_clear_error() -> None:
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    with pytest.raises(
        LeaseUnavailable,
        match=r"Redis at 127\.0\.0\.1:1/0 is unreachable .*docker compose up -d redis",
    ):
        lease(client, "x").try_acquire(0)


def test_time_left_is_the_holders_remaining_ttl_and_none_for_anyone_else(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    lost: list[str] = []
    holder = lease(redis_client, test_env.key_prefix, ttl=3.0, on_lost=lost.append)
    other = lease(redis_client, test_env.key_prefix)
    assert holder.try_acquire(0) == 1

    left = holder.time_left()
    assert left is not None
    assert 0 < left <= 3.0
    assert other.time_left() is None

    redis_client.set(lock_key(test_env.key_prefix), other.holder, px=3000)  # taken over
    assert holder.time_left() is None
    assert not holder.is_held()
    assert lost, "the holder learns it lost the lease at once"
