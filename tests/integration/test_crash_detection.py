"""Crash detection against real PostgreSQL and Redis: a leader whose beacon (database
session and Redis connection) is gone is replaced at once; a live one never is, nor
one that lost one link only; a leader that lost its session steps down; where the
servers cannot tell, standbys wait for the TTL. The same for a worker's run."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
import redis
from sqlalchemy import text

from beat import liveness
from beat.leader import lock_key
from beat.liveness import Session, SessionBeacon
from beat.models import RunState
from beat.run_store import RunStore, Started
from beat.store import Store
from tests.conftest import SessionEnv
from tests.integration.conftest import SchedulerFactory
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

#: Far longer than a test: a takeover within it did not wait for the lease.
LONG_TTL = 60.0


def kill_leader_session(store: Store) -> None:
    """What the kernel does for a leader process that dies: its session ends."""
    with store.engine.begin() as conn:
        ended = conn.execute(
            text(
                "SELECT pg_terminate_backend(session_pid) FROM beat_leader"
                " WHERE session_pid IS NOT NULL"
            )
        ).scalar_one()
    assert ended, "the leader recorded a live session"


def wait_until_gone(store: Store) -> None:
    """pg_terminate_backend signals the backend; it is gone once it exits."""
    for _ in range(200):
        with store.engine.begin() as conn:
            listed = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity a JOIN beat_leader l"
                    " ON a.pid = l.session_pid"
                )
            ).scalar_one()
        if not listed:
            return
    raise AssertionError("the leader's session did not end")


def test_a_standby_takes_over_at_once_from_a_leader_whose_beacon_is_gone(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    test_env: SessionEnv,
) -> None:
    crashed = make_scheduler(lock_ttl=LONG_TTL)
    crashed.tick()
    old_epoch = crashed.epoch
    assert old_epoch is not None
    # What the kernel does for a process that dies: both its connections close, and
    # it renews nothing.
    crashed.lease.abandon("simulated crash")
    crashed.crash_detection.close_beacon()
    wait_until_gone(store)

    standby = make_scheduler(lock_ttl=LONG_TTL)
    standby.tick()

    assert standby.epoch is not None
    assert standby.epoch > old_epoch
    holder = redis_client.get(lock_key(test_env.key_prefix))
    assert holder == standby.lease.holder.encode(), "the dead holder's lease was replaced"


def test_a_live_leader_is_never_evicted(make_scheduler: SchedulerFactory) -> None:
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    assert leader.is_leader
    standby = make_scheduler(lock_ttl=LONG_TTL)
    for _ in range(3):
        standby.tick()
    assert not standby.is_leader
    assert leader.is_leader


def test_a_leader_cut_from_postgres_only_is_not_taken_for_dead(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Its database session is gone, its Redis connection lives: a cut link, not a
    crash. The standby waits for the lease; the leader, seeing its session closed,
    steps down by itself."""
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    leader.lease.abandon("the link is cut: no renewal reaches Redis")
    kill_leader_session(store)
    wait_until_gone(store)
    standby = make_scheduler(lock_ttl=LONG_TTL)
    standby.tick()
    assert not standby.is_leader, "one connection gone is not a crash: the lease decides"


def test_a_leader_that_lost_its_session_steps_down_and_claims_nothing(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    assert leader.is_leader
    kill_leader_session(store)
    wait_until_gone(store)

    leader.tick()

    assert not leader.is_leader
    assert redis_client.get(lock_key(test_env.key_prefix)) is None, "it gave its lease back"


def test_without_distinct_sessions_standbys_wait_for_the_lease(
    make_scheduler: SchedulerFactory,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A pooler in transaction mode answers each statement from another session:
    # the two answers of the beacon's question then differ.
    monkeypatch.setattr(liveness, "_WHO_AM_I", "SELECT pg_backend_pid(), clock_timestamp()")
    with caplog.at_level(logging.WARNING, logger="beat.liveness"):
        crashed = make_scheduler(lock_ttl=LONG_TTL)
        crashed.tick()
    assert crashed.is_leader
    assert [r for r in caplog.records if "crash detection is off" in r.getMessage()]
    with store.engine.begin() as conn:
        assert conn.execute(text("SELECT beacon FROM beat_leader")).scalar_one() is None
    crashed.lease.abandon("simulated crash")
    crashed.crash_detection.close_beacon()

    standby = make_scheduler(lock_ttl=LONG_TTL)
    standby.tick()

    assert not standby.is_leader, "nothing tells a crash from a hang: the TTL decides"


def start_run(store: Store, session: Session | None, *, worker: str = "w1@host") -> uuid.UUID:
    """A run started by a worker process whose beacon is ``session``, with one attempt
    and a lease far longer than the test."""
    run_id = uuid.uuid4()
    started = RunStore(store.engine).start(
        run_id,
        owner=f"{worker}:1:abc",
        worker=worker,
        lease_seconds=LONG_TTL,
        task="t",
        args=[],
        kwargs={},
        options={},
        retries=0,
        max_attempts=1,
        session=session,
    )
    assert isinstance(started, Started)
    return run_id


def test_runs_of_a_dead_worker_are_reclaimed_at_once_and_of_a_cut_one_are_not(
    make_scheduler: SchedulerFactory, store: Store, test_env: SessionEnv
) -> None:
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    epoch = leader.epoch
    assert epoch is not None
    beacons = {
        name: SessionBeacon(test_env.database_url, test_env.redis_url)
        for name in ("dying", "cut", "alive", "pool child", "its worker")
    }
    try:
        sessions = {name: beacon.open() for name, beacon in beacons.items()}
        seen = RunStore(store.engine).worker_seen
        booted = store.now()
        # A worker whose runs run in its own process (threads pool): one beacon for both.
        seen("w1@host", pid=1, booted_at=booted, session=sessions["dying"])
        # A prefork worker: its main process and the pool child running the run.
        seen("w2@host", pid=2, booted_at=booted, session=sessions["its worker"])
        dies = start_run(store, sessions["dying"])
        child_dies = start_run(store, sessions["pool child"], worker="w2@host")
        cut_off = start_run(store, sessions["cut"])
        lives = start_run(store, sessions["alive"])
        unknown = start_run(store, None)
        assert leader.crash_detection.dead_runs(limit=10).runs == []
        beacons["dying"].close()  # the worker dies: both its connections close
        beacons["pool child"].close()  # a job kills the pool process running it
        beacons["cut"]._conn.close()  # type: ignore[union-attr]  # a link cut to PostgreSQL
        wait_until_listed_without(store, 3)

        deaths = leader.crash_detection.dead_runs(limit=10)
        reclaim = store.reclaim(
            epoch,
            stale_queued_after=3600,
            limit=10,
            dead=deaths.runs,
            interrupted=deaths.interrupted,
        )
    finally:
        for beacon in beacons.values():
            beacon.close()

    assert sorted(deaths.runs) == sorted([dies, child_dies]), "dead processes only, at once"
    assert deaths.interrupted == [dies], "only there did the whole worker die"
    assert [run.id for run in reclaim.runs] == [dies], "a worker's death is not an attempt"
    assert [lost.id for lost in reclaim.lost] == [child_dies], (
        "a run that killed its pool process under a living worker used its one attempt"
    )
    states = {row.id: row.state for row in run_rows(store)}
    assert states[cut_off] == states[lives] == states[unknown] == RunState.RUNNING.value
    [row] = run_rows(store, id=dies)
    assert row.interruptions == 1


def wait_until_listed_without(store: Store, count: int) -> None:
    """Until ``count`` running runs' sessions are gone from pg_stat_activity."""
    for _ in range(200):
        if len(store.runs_without_session(limit=10)) >= count:
            return
        time.sleep(0.01)
    raise AssertionError("the closed sessions are still listed")
