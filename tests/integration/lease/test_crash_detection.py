"""Crash detection against real PostgreSQL and Redis: a leader whose beacon (database
session and Redis connection) is proven gone is replaced at once; a live one never
is, nor one that lost one link only, nor one whose halves were on a server that
restarted since; a leader that lost its session opens another, and steps down only
if it cannot; behind a proxy, standbys wait for the TTL. The same for a worker's run,
and a living process's runs follow its beacon when it opens a half again."""

from __future__ import annotations

import logging
import os
import resource
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from beat.errors import LeaseUnavailable
from beat.lease import beacon as liveness
from beat.lease.beacon import SessionBeacon
from beat.lease.holder import lock_key
from beat.models import RunState
from beat.records import Session
from beat.store.all_roles import Store
from beat.store.run_guard import Started
from beat.store.runs import RunStore
from tests.conftest import SessionEnv
from tests.e2e.proxy import CuttableProxy
from tests.integration.conftest import SchedulerFactory
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

#: Far longer than a test: a takeover within it did not wait for the lease.
LONG_TTL = 60.0


def end_sessions(store: Store, names: list[str]) -> None:
    """End the database sessions of these beacons, as the server sees a process that
    died (or a link cut to it), and wait until PostgreSQL no longer lists them."""
    with store.engine.begin() as conn:
        ended = conn.execute(
            text("SELECT pg_terminate_backend(session_pid) FROM beat_beacons WHERE name = ANY(:n)"),
            {"n": names},
        ).all()
    assert len(ended) == len(names), "each beacon recorded its session"
    for _ in range(200):
        with store.engine.begin() as conn:
            listed = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity a JOIN beat_beacons b"
                    " ON a.pid = b.session_pid WHERE b.name = ANY(:n)"
                ),
                {"n": names},
            ).scalar_one()
        if not listed:
            return
        time.sleep(0.01)
    raise AssertionError("the sessions did not end")


def drop_connections(client: redis.Redis, names: list[str]) -> None:
    """Close these beacons' Redis connections from the server's side."""
    for entry in client.client_list(_type="pubsub"):
        if entry.get("name") in names:
            client.client_kill_filter(_id=entry["id"])


def crash(store: Store, client: redis.Redis, *names: str) -> None:
    """What the servers see of a process that dies: both its connections close."""
    end_sessions(store, list(names))
    drop_connections(client, list(names))


def leader_beacon(store: Store) -> str:
    with store.engine.begin() as conn:
        beacon: str = conn.execute(text("SELECT beacon FROM beat_leader")).scalar_one()
    return beacon


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
    # What a process that dies shows: both its connections close, and it renews nothing.
    crashed.lease.abandon("simulated crash")
    crash(store, redis_client, leader_beacon(store))

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
    crash. The standby waits for the lease."""
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    leader.lease.abandon("the link is cut: no renewal reaches Redis")
    end_sessions(store, [leader_beacon(store)])
    standby = make_scheduler(lock_ttl=LONG_TTL)
    standby.tick()
    assert not standby.is_leader, "one connection gone is not a crash: the lease decides"


def test_a_leader_whose_session_was_ended_opens_another_and_leads_on(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis
) -> None:
    """A session timeout or an operator ends the leader's database session: it opens
    another under the same beacon, which follows it (issue 38, finding 6). Its death
    is then seen as before."""
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    epoch = leader.epoch
    beacon = leader_beacon(store)
    end_sessions(store, [beacon])

    leader.tick()

    assert leader.epoch == epoch, "no step-down"
    assert leader_beacon(store) == beacon
    leader.lease.abandon("simulated crash")
    crash(store, redis_client, beacon)
    standby = make_scheduler(lock_ttl=LONG_TTL)
    standby.tick()
    assert standby.is_leader, "the new session is the one recorded: its end is seen"


def test_a_leader_that_cannot_open_another_session_steps_down(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    proxy = CuttableProxy("127.0.0.1", make_url(test_env.database_url).port or 5432)
    try:
        behind = make_url(test_env.database_url).set(port=proxy.port)
        leader = make_scheduler(
            lock_ttl=LONG_TTL, database_url=behind.render_as_string(hide_password=False)
        )
        leader.tick()
        assert leader.is_leader
        proxy.cut()  # a link cut to PostgreSQL: new connections are refused too

        leader.tick()

        assert not leader.is_leader
        assert redis_client.get(lock_key(test_env.key_prefix)) is None, "it gave its lease back"
    finally:
        proxy.close()


def test_behind_a_proxy_nothing_is_recorded_and_standbys_wait_for_the_lease(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    test_env: SessionEnv,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A proxy (or a pooler) opens the server's session itself: the session the server
    lists is not the process's, its end proves nothing (issue 38, finding 3)."""
    proxy = CuttableProxy("127.0.0.1", make_url(test_env.database_url).port or 5432)
    try:
        behind = make_url(test_env.database_url).set(port=proxy.port)
        with caplog.at_level(logging.WARNING, logger="beat.lease.beacon"):
            crashed = make_scheduler(
                lock_ttl=LONG_TTL, database_url=behind.render_as_string(hide_password=False)
            )
            crashed.tick()
            crashed.tick()
        assert crashed.is_leader
        off = [r for r in caplog.records if "crash detection is off" in r.getMessage()]
        assert len(off) == 1, "said once"
        with store.engine.begin() as conn:
            assert conn.execute(text("SELECT beacon FROM beat_leader")).scalar_one() is None
        crashed.lease.abandon("simulated crash")
        proxy.cut()

        standby = make_scheduler(lock_ttl=LONG_TTL)
        standby.tick()

        assert not standby.is_leader, "nothing tells a crash from a hang: the TTL decides"
    finally:
        proxy.close()


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


@pytest.fixture
def beacons(test_env: SessionEnv) -> Iterator[Callable[[], SessionBeacon]]:
    """Beacons of simulated processes, closed at the end."""
    opened: list[SessionBeacon] = []

    def beacon() -> SessionBeacon:
        opened.append(SessionBeacon(test_env.database_url, test_env.redis_url))
        return opened[-1]

    yield beacon
    for each in opened:
        each.close()


def test_runs_of_a_dead_worker_are_reclaimed_at_once_and_of_a_cut_one_are_not(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    beacons: Callable[[], SessionBeacon],
) -> None:
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    epoch = leader.epoch
    assert epoch is not None
    names = ("dying", "cut", "alive", "pool child", "its worker")
    sessions = {name: beacons().keep() for name in names}
    beacon = {name: session.beacon for name, session in sessions.items() if session is not None}
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
    crash(store, redis_client, beacon["dying"], beacon["pool child"])
    end_sessions(store, [beacon["cut"]])  # a link cut to PostgreSQL

    deaths = leader.crash_detection.dead_runs(limit=10)
    reclaim = store.reclaim(
        epoch,
        stale_queued_after=3600,
        limit=10,
        dead=deaths.runs,
        interrupted=deaths.interrupted,
    )

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


def test_a_living_process_opens_its_lost_halves_again_and_its_runs_follow(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    beacons: Callable[[], SessionBeacon],
) -> None:
    """Both halves closed while the process lives (issue 38, findings 2 and 5): its
    next look opens them again, the Redis one under the same name, and the run it
    recorded follows; its death after that is seen."""
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    process = beacons()
    first = process.keep()
    assert first is not None
    run = start_run(store, first)
    drop_connections(redis_client, [first.beacon])
    time.sleep(0.1)
    again = process.keep()
    end_sessions(store, [first.beacon])
    again = process.keep()

    assert again is not None
    assert again.beacon == first.beacon
    assert again.pid != first.pid
    assert leader.crash_detection.dead_runs(limit=10).runs == []
    crash(store, redis_client, first.beacon)
    assert leader.crash_detection.dead_runs(limit=10).runs == [run]


@pytest.mark.parametrize("server", ["postgres_server", "redis_server"])
def test_a_half_opened_on_another_server_is_unknown_not_gone(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    beacons: Callable[[], SessionBeacon],
    server: str,
) -> None:
    """A half recorded on a server that is not the one answering now (it restarted or
    failed over since) proves nothing by its absence: leases decide."""
    leader = make_scheduler(lock_ttl=LONG_TTL)
    leader.tick()
    session = beacons().keep()
    assert session is not None
    start_run(store, session)
    with store.engine.begin() as conn:
        conn.execute(
            text(f"UPDATE beat_beacons SET {server} = 'a server since restarted'"),
        )
    crash(store, redis_client, session.beacon)
    assert leader.crash_detection.dead_runs(limit=10).runs == []


def test_a_session_opened_again_while_redis_is_down_is_recorded_at_once(
    store: Store,
    redis_client: redis.Redis,
    beacons: Callable[[], SessionBeacon],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both halves closed, Redis unreachable from the process: its new database
    session is recorded all the same, so the beacon never reads as dead meanwhile."""
    process = beacons()
    first = process.keep()
    assert first is not None
    crash(store, redis_client, first.beacon)

    def unreachable(url: str, name: str) -> None:
        raise LeaseUnavailable("Redis is unreachable")

    monkeypatch.setattr(liveness, "open_beacon_connection", unreachable)
    with pytest.raises(LeaseUnavailable):
        process.keep()

    with store.engine.begin() as conn:
        listed = conn.execute(
            text(
                "SELECT b.session_pid FROM beat_beacons b JOIN pg_stat_activity a"
                " ON a.pid = b.session_pid WHERE b.name = :name"
            ),
            {"name": first.beacon},
        ).scalar_one_or_none()
    assert listed is not None
    assert listed != first.pid


def test_while_redis_was_never_reached_the_session_is_checked_once(
    store: Store, beacons: Callable[[], SessionBeacon], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's heartbeat keeps its beacon every second: while Redis cannot be
    reached from the start, its database session is checked as the server's own (and
    old rows pruned) once for the connection, not at every keep."""
    checks: list[object] = []
    own_session = liveness.own_session

    def counted(conn: object) -> bool:
        checks.append(conn)
        return own_session(conn)  # type: ignore[arg-type]

    def unreachable(url: str, name: str) -> None:
        raise LeaseUnavailable("Redis is unreachable")

    monkeypatch.setattr(liveness, "own_session", counted)
    monkeypatch.setattr(liveness, "open_beacon_connection", unreachable)
    process = beacons()
    for _ in range(3):
        with pytest.raises(LeaseUnavailable):
            process.keep()
    assert len(checks) == 1


def test_a_process_with_many_open_files_keeps_its_halves(
    beacons: Callable[[], SessionBeacon], redis_client: redis.Redis
) -> None:
    """A worker with 1,024 or more open descriptors (``-P threads``, tasks holding many
    sockets): the look at its halves must not read a descriptor ``select`` refuses as a
    closed connection, close both halves itself and open new ones on every heartbeat,
    each time leaving a moment when both are gone on servers that did not restart."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        process = beacons()
        first = process.keep()
        assert first is not None
        clients = {entry["name"]: entry["id"] for entry in redis_client.client_list()}
        assert process.keep() == first, "the same session"
        again = {entry["name"]: entry["id"] for entry in redis_client.client_list()}
        assert again[first.beacon] == clients[first.beacon], "the same Redis connection"
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
