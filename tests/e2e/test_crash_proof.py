"""Crash detection acts only on proof (issue 38): a server restart, a session timeout
or a pooler closes a living worker's connections, and its run is never reclaimed for
that; a worker behind a pooler runs with crash detection off, its runs reclaimed by
their lease. Real `celery worker` and `celery beat` processes on a private PostgreSQL
and Redis that the tests restart."""

from __future__ import annotations

import contextlib
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.db import SERVER_INCARNATION
from tests.chaos.servers import PrivatePostgres, PrivateRedis, private_servers, workspace
from tests.e2e.cluster import Cluster, cluster_on, wait_until
from tests.e2e.pgbouncer import PgBouncer, running_pgbouncer
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

#: Short enough for a test, long enough that a server restart (1 to 2 s) does not outlast
#: a run's lease: a reclaim within the run is then crash detection's alone.
SETTINGS = {"HABEAT_LEASE_TIMEOUT": "10", "HABEAT_LOCK_TTL": "3", "HABEAT_MAX_WAIT": "0.5"}
#: Seconds the run under test works: the faults happen while it runs.
JOB_SECONDS = 14.0
#: What a beat or worker says when its crash detection is off.
DETECTION_OFF = "crash detection is off"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[PrivatePostgres, PrivateRedis]]:
    """A private PostgreSQL and Redis for the module (the tests restart them)."""
    with workspace() as workdir, private_servers(workdir) as both:
        yield both


@pytest.fixture
def private_cluster(
    servers: tuple[PrivatePostgres, PrivateRedis], tmp_path: Path
) -> Iterator[Cluster]:
    """A cluster on a database of its own on the private servers (which a test may
    restart), with short leases."""
    postgres, redis_server = servers
    prefix = f"proof-{uuid.uuid4().hex[:8]}"
    with cluster_on(
        postgres, redis_server.url(), tmp_path, prefix=prefix, settings=SETTINGS
    ) as cluster:
        yield cluster


def run_row(store: Store, task_id: str) -> Any:
    with contextlib.suppress(Exception):  # the server may be restarting
        rows = run_rows(store, id=uuid.UUID(task_id))
        return rows[0] if rows else None
    return None


def state_of(store: Store, task_id: str) -> str | None:
    row = run_row(store, task_id)
    return None if row is None else str(row.state)


def start_slow_run(cluster: Cluster, *, seconds: float = JOB_SECONDS) -> str:
    """Send an idempotent job that works ``seconds``; its task ID once a worker runs it."""
    task_id = str(uuid.uuid4())
    cluster.app().send_task("e2e.slow", args=["proof", seconds], task_id=task_id)
    wait_until(lambda: state_of(cluster.store, task_id) == RunState.RUNNING.value, timeout=60)
    return task_id


def start_watched_run(cluster: Cluster, *, seconds: float = JOB_SECONDS) -> str:
    """A slow run whose worker's beacon is recorded: its death would be seen at once."""
    task_id = start_slow_run(cluster, seconds=seconds)
    with cluster.store.engine.connect() as conn:
        recorded = conn.execute(
            text(
                "SELECT count(*) FROM beat_runs r JOIN beat_beacons b ON b.name = r.beacon"
                " WHERE r.id = :id"
            ),
            {"id": uuid.UUID(task_id)},
        ).scalar_one()
    assert recorded == 1, "crash detection is on: the run names its worker's beacon"
    return task_id


def start_cluster(cluster: Cluster, pool: str) -> None:
    cluster.beat("beat0")
    cluster.worker("worker0", concurrency=2, pool=pool)
    wait_until(lambda: cluster.leading_process() is not None, timeout=60, interval=0.2)
    wait_until(lambda: " ready." in cluster.processes[-1].output(), timeout=60, interval=0.2)


def restart_postgres(postgres: PrivatePostgres) -> None:
    postgres.stop("fast")
    postgres.start()


def restart_redis(redis_server: PrivateRedis) -> None:
    redis_server.stop()
    redis_server.start()


def wait_for_presences_on_the_server(cluster: Cluster, workers: int) -> None:
    """Wait until ``workers`` workers' presences name a beacon opened on the server
    answering now: what the reaper reads to tell a whole worker's death. The heartbeat
    opens a lost half again within a second (a third of the lease before: 20 s here)."""

    def recorded() -> int:
        with cluster.store.engine.connect() as conn:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM beat_workers w"
                        " JOIN beat_beacons b ON b.name = w.beacon"
                        f" WHERE b.postgres_server = ({SERVER_INCARNATION})"
                    )
                ).scalar_one()
            )

    wait_until(lambda: recorded() == workers, timeout=10, interval=0.2)


def assert_ran_once(cluster: Cluster, task_id: str) -> None:
    """The run succeeded on its first attempt, never reclaimed, its effect once."""
    wait_until(
        lambda: state_of(cluster.store, task_id) == RunState.SUCCEEDED.value,
        timeout=JOB_SECONDS + 40,
        interval=0.5,
    )
    row = run_row(cluster.store, task_id)
    assert (row.attempt, row.interruptions) == (1, 0), (
        f"the run was reclaimed while its worker lived: attempt {row.attempt},"
        f" interruptions {row.interruptions}"
    )
    assert cluster.effects() == {task_id: 1}


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_postgres_restart_does_not_reclaim_a_living_workers_run(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis], pool: str
) -> None:
    """issue 38, finding 2: PostgreSQL restarts under a running idempotent run on a
    `-P threads` (or `-P solo`) worker; the worker reopens its beacon's database
    session, and its run, whose worker never stopped, is not reclaimed: body once."""
    postgres, _ = servers
    start_cluster(private_cluster, pool)
    task_id = start_watched_run(private_cluster)
    time.sleep(2)
    restart_postgres(postgres)
    assert_ran_once(private_cluster, task_id)


def test_a_redis_then_a_postgres_restart_do_not_reclaim_a_living_workers_run(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis]
) -> None:
    """issue 38, finding 5: with the prefork pool, Redis restarts under a running run,
    then, seconds later, PostgreSQL: the pool process keeps its beacon's halves (the
    Redis one opened again on the new server), so the run is not reclaimed."""
    postgres, redis_server = servers
    start_cluster(private_cluster, "prefork")
    task_id = start_watched_run(private_cluster, seconds=JOB_SECONDS + 4)
    time.sleep(1)
    restart_redis(redis_server)
    time.sleep(5)  # more than a lease heartbeat (10 s / 3)
    restart_postgres(postgres)
    assert_ran_once(private_cluster, task_id)


def test_idle_session_timeout_neither_unseats_the_leader_nor_reclaims_a_run(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis]
) -> None:
    """issue 38, finding 6: `idle_session_timeout = 2s` on the database ends every idle
    session; the beacons' sessions (and the leader's LISTEN connection) turn it off for
    themselves: the leader never steps down, its wait for changes never fails, and a
    `-P threads` worker's run is not reclaimed."""
    database = make_url(private_cluster.env.database_url).database
    with private_cluster.store.engine.begin() as conn:
        conn.execute(text(f"ALTER DATABASE \"{database}\" SET idle_session_timeout = '2s'"))
    start_cluster(private_cluster, "threads")
    task_id = start_watched_run(private_cluster)
    assert_ran_once(private_cluster, task_id)
    beat_log = private_cluster.processes[0].output()
    assert "stepping down" not in beat_log, "the leader stepped down with no fault at all"
    assert "lost the LISTEN connection" not in beat_log, "the wait for changes is idle too"


# -- behind PgBouncer ---------------------------------------------------------------------


@pytest.fixture
def pgbouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    with running_pgbouncer(cluster.env.database_url, "transaction") as bouncer:
        yield bouncer


def test_behind_pgbouncer_crash_detection_is_off_and_leases_decide(
    cluster: Cluster, store: Store, pgbouncer: PgBouncer
) -> None:
    """issue 38, finding 3: a worker reaches PostgreSQL through PgBouncer in
    transaction mode (idle: the same backend answers twice); its beacon would be a
    pooled backend, so it says once that crash detection is off and records no
    beacon; SIGKILLed mid-run, its run is still reclaimed, by its lease."""
    cluster.settings.update(SETTINGS | {"HABEAT_LEASE_TIMEOUT": "4"})
    cluster.beat("beat0")
    pooled = cluster.worker("worker0", concurrency=1, DATABASE_URL=pgbouncer.url())
    wait_until(lambda: cluster.leading_process() is not None, timeout=60, interval=0.2)
    wait_until(lambda: " ready." in pooled.output(), timeout=60, interval=0.2)
    task_id = start_slow_run(cluster, seconds=3)
    row = run_row(store, task_id)
    assert row.beacon is None, "a beacon behind a pooler proves nothing"
    assert pooled.output().count(DETECTION_OFF) == 1, "said once"
    pooled.signal(signal.SIGKILL)
    cluster.worker("worker1", concurrency=1)
    wait_until(
        lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.5
    )
    row = run_row(store, task_id)
    assert (row.attempt, row.worker.split("@")[0]) == (2, "worker1"), "reclaimed by its lease"


def test_after_both_servers_restarted_a_killed_workers_run_is_still_reclaimed_at_once(
    private_cluster: Cluster, servers: tuple[PrivatePostgres, PrivateRedis]
) -> None:
    """The proof still holds after restarts: the beacons opened again on the new
    servers are recorded with them, so a worker SIGKILLed afterwards is seen dead at
    once, long before its 60-s lease would have expired."""
    postgres, redis_server = servers
    private_cluster.settings["HABEAT_LEASE_TIMEOUT"] = "60"
    start_cluster(private_cluster, "threads")
    private_cluster.worker("worker1", concurrency=1)
    restart_redis(redis_server)
    restart_postgres(postgres)
    wait_for_presences_on_the_server(private_cluster, workers=2)
    task_id = start_watched_run(private_cluster, seconds=3)
    worker = run_row(private_cluster.store, task_id).worker
    private_cluster.process_for_worker(worker).signal(signal.SIGKILL)
    wait_until(
        lambda: (getattr(run_row(private_cluster.store, task_id), "attempt", 0) or 0) >= 2,
        timeout=30,
        interval=0.2,
    )
    wait_until(
        lambda: state_of(private_cluster.store, task_id) == RunState.SUCCEEDED.value,
        timeout=60,
        interval=0.5,
    )
    row = run_row(private_cluster.store, task_id)
    assert row.interruptions == 1, "its worker's death was seen, not its lease's end"
