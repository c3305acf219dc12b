"""The cluster page's overview against real PostgreSQL and Redis: the beat processes
(leader and standbys) announced in Redis, the workers that are up, the schedules nobody
claims, the queues no worker takes from, and what is left out when a server is down."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import text

from app.factory import create_app
from beat.config import BeatConfig
from beat.lease.presence import BeatPresence, beats_key, info_key, read_beats
from beat.ops.rendering import cluster_document
from beat.ops.schedules import QueueBacklog, Schedules
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.conftest import SchedulerFactory

pytestmark = pytest.mark.integration

#: Nothing listens there: connections are refused at once.
CLOSED_REDIS = "redis://127.0.0.1:1/0"
CLOSED_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/nowhere"


def cluster(
    test_env: SessionEnv, store: Store, *, conf: dict[str, Any] | None = None, **settings: Any
) -> Schedules:
    """The facade as the web UI makes it, with the lease TTL of ``make_scheduler``."""
    app = create_app(test_env.settings(**{"lock_ttl": 2.0, **settings}))
    app.conf.update(conf or {})
    return Schedules(store, app=app, config=BeatConfig.from_celery_conf(app.conf))


def holders(test_env: SessionEnv) -> list[str]:
    return [beat.holder for beat in read_beats(test_env.redis_url, prefix=test_env.key_prefix)]


def unreachable_presence(holder: str, test_env: SessionEnv) -> BeatPresence:
    """A presence whose Redis refuses every connection, refreshed at every pass."""
    client = redis.Redis.from_url(CLOSED_REDIS, socket_connect_timeout=0.5)
    return BeatPresence(
        client, prefix=test_env.key_prefix, holder=holder, lifetime=10.0, interval=0.0
    )


def due_ago(store: Store, seconds_ago: dict[str, float]) -> None:
    """Set the next fire time of each schedule that many seconds before now."""
    with store.engine.begin() as conn:
        for name, ago in seconds_ago.items():
            conn.execute(
                text(
                    "UPDATE beat_schedules SET next_fire_at = now() - make_interval(secs => :ago)"
                    " WHERE name = :name"
                ),
                {"name": name, "ago": ago},
            )


def add_run(
    store: Store,
    *,
    task: str = "tasks.demo.add",
    state: str = "queued",
    options: dict[str, Any] | None = None,
    published_ago: float = 120.0,
    received: bool = False,
) -> datetime:
    """A run published ``published_ago`` seconds ago; its published_at."""
    with store.engine.begin() as conn:
        published_at: datetime = conn.execute(
            text(
                "INSERT INTO beat_runs (id, task, state, options, published_at, received_at)"
                " VALUES (:id, :task, :state, CAST(:options AS jsonb),"
                " now() - make_interval(secs => :ago),"
                " CASE WHEN :received THEN now() END)"
                " RETURNING published_at"
            ),
            {
                "id": uuid.uuid4(),
                "task": task,
                "state": state,
                "options": json.dumps(options or {}),
                "ago": published_ago,
                "received": received,
            },
        ).scalar_one()
    return published_at


# -- beat processes ---------------------------------------------------------------------


def test_a_leader_and_its_standby_are_listed_the_leader_first(
    make_scheduler: SchedulerFactory, store: Store, test_env: SessionEnv
) -> None:
    leader, standby = make_scheduler(), make_scheduler(standby_poll=0.1)
    # The standby's entry is made first: it started earlier, yet the leader comes first.
    assert standby.presence.holder == standby.lease.holder
    leader.tick()
    standby.tick()
    assert leader.is_leader
    assert not standby.is_leader

    overview = cluster(test_env, store).cluster_overview()

    assert overview.problems == []
    assert overview.status is not None
    assert overview.status.lease.holder == leader.lease.holder
    assert [beat.holder for beat in overview.beats] == [leader.lease.holder, standby.lease.holder]
    assert overview.beats[1].started_at < overview.beats[0].started_at
    for beat in overview.beats:
        assert (beat.host, beat.pid) == (socket.gethostname(), os.getpid())
        assert beat.seen_at <= overview.status.now < beat.expires_at
    document = json.loads(json.dumps(cluster_document(overview)))
    assert [beat["leading"] for beat in document["beats"]] == [True, False]
    assert document["status"]["leader"]["holder"] == leader.lease.holder


def test_a_process_that_closes_leaves_the_list(
    make_scheduler: SchedulerFactory, test_env: SessionEnv
) -> None:
    leader, standby = make_scheduler(), make_scheduler(standby_poll=0.1)
    leader.tick()
    standby.tick()
    assert sorted(holders(test_env)) == sorted([leader.lease.holder, standby.lease.holder])

    standby.close()
    assert holders(test_env) == [leader.lease.holder]
    leader.close()
    assert holders(test_env) == []


def test_an_entry_no_longer_refreshed_expires_and_is_pruned(
    redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """A process that died (killed: no close) stops refreshing: its entry and its info go
    once its lifetime is over, at the next refresh of another process or read."""
    prefix = test_env.key_prefix
    crashed = BeatPresence(redis_client, prefix=prefix, holder="crashed", lifetime=0.3, interval=0)
    alive = BeatPresence(redis_client, prefix=prefix, holder="alive", lifetime=30, interval=0)
    crashed.refresh()
    alive.refresh()
    assert holders(test_env) == ["alive", "crashed"]

    time.sleep(0.35)
    alive.refresh()
    assert redis_client.zrange(beats_key(prefix), 0, -1) == [b"alive"]
    assert redis_client.hkeys(info_key(prefix)) == [b"alive"]
    assert holders(test_env) == ["alive"]


def test_reading_prunes_expired_entries(redis_client: redis.Redis, test_env: SessionEnv) -> None:
    prefix = test_env.key_prefix
    alive = BeatPresence(redis_client, prefix=prefix, holder="alive", lifetime=30, interval=0)
    crashed = BeatPresence(redis_client, prefix=prefix, holder="crashed", lifetime=0.2, interval=0)
    alive.refresh()
    crashed.refresh()
    time.sleep(0.25)
    assert sorted(redis_client.hkeys(info_key(prefix))) == [b"alive", b"crashed"]
    assert holders(test_env) == ["alive"]
    assert redis_client.hkeys(info_key(prefix)) == [b"alive"]


def test_a_failing_refresh_neither_fails_a_pass_nor_unseats_the_leader(
    make_scheduler: SchedulerFactory, test_env: SessionEnv, caplog: pytest.LogCaptureFixture
) -> None:
    leader, standby = make_scheduler(standby_poll=0.1), make_scheduler(standby_poll=0.1)
    for scheduler in (leader, standby):
        scheduler._presence = unreachable_presence(scheduler.lease.holder, test_env)
    caplog.set_level(logging.DEBUG, logger="beat.lease.presence")

    leader.tick()
    epoch = leader.epoch
    for _ in range(3):
        assert leader.tick() == 0.0, "no back-off: the pass succeeded"
        assert standby.tick() == 0.0
    assert leader.epoch == epoch
    assert epoch is not None
    assert not standby.is_leader
    logged = [record for record in caplog.records if record.name == "beat.lease.presence"]
    assert len(logged) == 2, "once per process for the whole streak of failures"
    assert holders(test_env) == []


# -- workers, overdue schedules, stuck queues ----------------------------------------------


def test_workers_seen_within_their_lease_are_listed(store: Store, test_env: SessionEnv) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM beat_workers"))
        conn.execute(
            text(
                "INSERT INTO beat_workers (name, pid, booted_at, seen_at) VALUES"
                " ('up@host', 11, now() - interval '1 hour', now()),"
                " ('gone@host', 12, now() - interval '2 hours', now() - interval '1 hour')"
            )
        )
    workers = cluster(test_env, store).cluster_overview().workers
    assert [(worker.name, worker.pid) for worker in workers] == [("up@host", 11)]
    assert workers[0].booted_at < workers[0].seen_at


def test_overdue_lists_enabled_schedules_due_long_ago_oldest_first(
    store: Store, test_env: SessionEnv
) -> None:
    schedules = cluster(test_env, store)
    for name in ("older", "old", "paused", "just-due", "later"):
        schedules.create(name, "tasks.demo.add", every=60, allow_unregistered=True)
    schedules.pause("paused")
    due_ago(store, {"older": 3600, "old": 600, "paused": 7200, "just-due": 1, "later": -60})

    overview = schedules.cluster_overview()
    assert [entry.name for entry in overview.overdue] == ["older", "old"]
    assert overview.overdue_total == 2
    assert timedelta(hours=1) <= overview.overdue[0].overdue_by < timedelta(hours=1, minutes=1)

    limited = schedules.cluster_overview(overdue_limit=1)
    assert [entry.name for entry in limited.overdue] == ["older"]
    assert limited.overdue_total == 2, "the total counts those beyond the limit"

    no_grace = schedules.cluster_overview(overdue_grace=timedelta(0))
    assert [entry.name for entry in no_grace.overdue] == ["older", "old", "just-due"]


def test_stuck_queues_group_runs_no_worker_received_by_their_queue(
    store: Store, test_env: SessionEnv
) -> None:
    oldest_default = add_run(store, published_ago=300)
    add_run(store, published_ago=120)
    add_run(store, task="tasks.demo.other", published_ago=90)  # another task, same queue
    oldest_reports = add_run(store, options={"queue": "reports"}, published_ago=200)
    add_run(store, options={"queue": "reports", "priority": 5}, published_ago=100)
    routed = add_run(store, task="tasks.routed", published_ago=150)
    add_run(store, published_ago=5)  # not waiting long yet
    add_run(store, published_ago=500, received=True)  # a worker has it
    add_run(store, state="running", published_ago=500)
    schedules = cluster(
        test_env,
        store,
        conf={"task_default_queue": "jobs", "task_routes": {"tasks.routed": {"queue": "routed"}}},
    )

    assert schedules.cluster_overview().stuck_queues == [
        QueueBacklog(queue="jobs", waiting=3, oldest_published_at=oldest_default),
        QueueBacklog(queue="reports", waiting=2, oldest_published_at=oldest_reports),
        QueueBacklog(queue="routed", waiting=1, oldest_published_at=routed),
    ]
    assert schedules.cluster_overview(stuck_after=timedelta(seconds=250)).stuck_queues == [
        QueueBacklog(queue="jobs", waiting=1, oldest_published_at=oldest_default)
    ]
    # Without the app, its routes and default queue are not known: Celery's default stands in.
    without_app = Schedules(store).cluster_overview().stuck_queues
    assert [(backlog.queue, backlog.waiting) for backlog in without_app] == [
        ("celery", 4),
        ("reports", 2),
    ]


# -- a server down ---------------------------------------------------------------------


def test_with_redis_down_the_postgres_parts_are_still_read(
    store: Store, test_env: SessionEnv
) -> None:
    schedules = cluster(test_env, store, redis_url=CLOSED_REDIS)
    schedules.create("old", "tasks.demo.add", every=60, allow_unregistered=True)
    due_ago(store, {"old": 600})
    add_run(store, published_ago=120)

    overview = schedules.cluster_overview()

    assert overview.status is None
    assert overview.beats == []
    assert [entry.name for entry in overview.overdue] == ["old"]
    assert [backlog.waiting for backlog in overview.stuck_queues] == [1]
    assert len(overview.problems) == 2
    assert overview.problems[0].startswith("redis: lease: Redis at 127.0.0.1:1/0 is unreachable")
    assert overview.problems[1] == "redis: beat processes: not read (reading the lease failed)"
    assert cluster_document(overview)["status"] is None


def test_with_postgres_down_the_beat_processes_are_still_read(
    make_scheduler: SchedulerFactory, test_env: SessionEnv
) -> None:
    leader = make_scheduler()
    leader.tick()
    down = Store.connect(CLOSED_POSTGRES, leader_name=test_env.key_prefix)
    app = create_app(test_env.settings(database_url=CLOSED_POSTGRES))
    schedules = Schedules(down, app=app, config=BeatConfig.from_celery_conf(app.conf))
    try:
        overview = schedules.cluster_overview()
    finally:
        down.dispose()

    assert overview.status is None
    assert [beat.holder for beat in overview.beats] == [leader.lease.holder]
    assert (overview.workers, overview.overdue, overview.stuck_queues) == ([], [], [])
    assert [problem.split(":")[:2] for problem in overview.problems] == [
        ["postgres", " leader row"],
        ["postgres", " workers"],
        ["postgres", " overdue schedules"],
        ["postgres", " stuck queues"],
    ]
    assert "is unreachable" in overview.problems[0]
    assert cluster_document(overview)["beats"][0]["leading"] is None
