"""Real `celery worker` processes killed, cut off from PostgreSQL and sent
duplicates: every run completes once and its effect exists once."""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy.engine import make_url

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.proxy import CuttableProxy
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

LEASE = 6.0
MAX_WAIT = 1.0
FAST_RECLAIM = {"HABEAT_LEASE_TIMEOUT": str(LEASE), "HABEAT_MAX_WAIT": str(MAX_WAIT)}


def run_row(store: Store, task_id: str) -> Any:
    rows = run_rows(store, id=uuid.UUID(task_id))
    return rows[0] if rows else None


def state_of(store: Store, task_id: str) -> str | None:
    row = run_row(store, task_id)
    return None if row is None else row.state


def test_one_message_delivered_twice_at_once_runs_its_body_once(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = FAST_RECLAIM
    cluster.worker("worker1", concurrency=1)
    cluster.worker("worker2", concurrency=1)
    time.sleep(4)  # both consuming
    task_id = str(uuid.uuid4())
    app = cluster.app()
    with app.producer_or_acquire() as producer:
        for _ in range(2):
            app.send_task("e2e.slow", args=["twice", 3], task_id=task_id, producer=producer)

    wait_until(
        lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.2
    )
    wait_until(lambda: run_row(store, task_id).duplicate_deliveries >= 1, timeout=30, interval=0.2)
    assert cluster.effects() == {task_id: 1}
    row = run_row(store, task_id)
    assert (row.attempt, row.duplicate_deliveries) == (1, 1), "one ran, one was refused and counted"
    logs = "".join(p.output() for p in cluster.processes)
    assert "skipped a duplicate delivery of run" in logs


def test_a_worker_cut_off_from_postgres_does_not_complete_a_run_taken_over(
    cluster: Cluster, store: Store
) -> None:
    url = make_url(cluster.env.database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    try:
        cluster.settings = FAST_RECLAIM
        cluster.beat("beat0")
        behind_proxy = url.set(port=proxy.port).render_as_string(hide_password=False)
        cluster.worker("worker1", concurrency=1, DATABASE_URL=behind_proxy)
        wait_until(lambda: cluster.leading_process() is not None, timeout=30)
        task_id = str(uuid.uuid4())
        cluster.app().send_task("e2e.slow", args=["partitioned", 12], task_id=task_id)
        wait_until(lambda: state_of(store, task_id) == RunState.RUNNING.value, timeout=30)
        cluster.worker("worker2", concurrency=1)

        proxy.cut()
        wait_until(
            lambda: run_row(store, task_id).worker.startswith("worker2"), timeout=60, interval=0.2
        )
        proxy.heal()  # worker1 comes back while worker2 runs the job

        wait_until(
            lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.5
        )
        time.sleep(LEASE)  # give worker1 every chance to (wrongly) record its completion
        assert cluster.effects() == {task_id: 1}
        row = run_row(store, task_id)
        assert row.worker.startswith("worker2")
        assert row.state == RunState.SUCCEEDED.value
        assert "lost the lease on run" in cluster.processes[1].output()
    finally:
        proxy.close()


def test_celery_autoretry_keeps_the_run_and_counts_attempts(cluster: Cluster, store: Store) -> None:
    cluster.worker("worker1", concurrency=2)
    task_id = str(uuid.uuid4())
    cluster.app().send_task("e2e.flaky", args=["flaky", 2], task_id=task_id)
    wait_until(
        lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.2
    )
    row = run_row(store, task_id)
    assert (row.attempt, row.retries) == (3, 2)
    assert cluster.effects() == {task_id: 1}


def test_attempts_exhausted_end_lost_and_nothing_loops(cluster: Cluster, store: Store) -> None:
    """A job that kills the pool process running it, under a worker that lives on (what
    a poison job does): each such attempt counts, and the run ends lost."""
    cluster.settings = FAST_RECLAIM | {"HABEAT_MAX_ATTEMPTS": "2"}
    cluster.beat("beat0")
    cluster.worker("worker1", concurrency=1, pool="prefork")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    task_id = str(uuid.uuid4())
    cluster.app().send_task("e2e.crash", args=["doomed"], task_id=task_id)

    wait_until(lambda: state_of(store, task_id) == RunState.LOST.value, timeout=90, interval=0.2)
    time.sleep(LEASE + 2 * MAX_WAIT)
    row = run_row(store, task_id)
    assert row.state == RunState.LOST.value
    assert row.attempt == 2
    assert row.interruptions == 0, "its worker lived on: the run crashed it"
    assert "attempts exhausted" in row.error
    assert "is lost" in cluster.processes[0].output()


def test_a_run_whose_worker_is_killed_does_not_use_up_its_attempts(
    cluster: Cluster, store: Store
) -> None:
    """A killed worker's run uses none of its attempts. Finding 966478 (chaos seed) of issue 15."""
    cluster.settings = FAST_RECLAIM | {"HABEAT_MAX_ATTEMPTS": "1"}
    cluster.beat("beat0")
    worker = cluster.worker("worker1", concurrency=1)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    task_id = str(uuid.uuid4())
    cluster.app().send_task("e2e.slow", args=["survives", 3], task_id=task_id)
    wait_until(lambda: state_of(store, task_id) == RunState.RUNNING.value, timeout=30)
    worker.signal(signal.SIGKILL)
    cluster.worker("worker2", concurrency=1)

    wait_until(
        lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.2
    )
    row = run_row(store, task_id)
    assert (row.attempt, row.interruptions) == (2, 1)
    assert cluster.effects() == {task_id: 1}


def report_missing(store: Store, store_env: SessionEnv, effects: dict[str, int]) -> None:
    """Say where the runs without an effect are stuck (printed with the test's output)."""
    rows = run_rows(store, task="e2e.record")
    missing = [row for row in rows if str(row.id) not in effects]
    states: dict[str, int] = {}
    for row in missing:
        states[row.state] = states.get(row.state, 0) + 1
    client = redis.Redis.from_url(store_env.redis_url)
    prefix = store_env.broker_key_prefix
    print(
        f"soak: {len(rows)} runs, {len(missing)} without an effect {states};"
        f" broker queue {client.llen(prefix + 'celery')},"
        f" unacked {client.hlen(prefix + 'unacked')}"
    )
    client.close()


@pytest.fixture
def rng() -> random.Random:
    seed = int(time.time())
    print(f"soak seed {seed}")
    return random.Random(seed)


def test_soak_2000_runs_with_random_worker_kills(
    cluster: Cluster, store: Store, rng: random.Random
) -> None:
    """2,000 one-off schedules firing over 20 s, three workers killed at random.

    Every run comes from beat, so even a message the broker loses outright
    (kombu's Redis transport pops a message before it records it as unacked:
    a worker killed in between loses it) has a run row, and the reaper
    publishes it again once it has been queued for twice the visibility timeout.
    """
    total = 2000
    cluster.settings = FAST_RECLAIM | {"HABEAT_VISIBILITY_TIMEOUT": "15"}
    schedules = Schedules(store)
    first_fire = store.now() + timedelta(seconds=10)
    for index in range(total):
        schedules.create(
            f"soak-{index}",
            "e2e.record",
            at=first_fire + timedelta(milliseconds=10 * index),
            args=[f"soak-{index}"],
            allow_unregistered=True,
        )
    names = ["worker1", "worker2", "worker3"]
    for name in names:
        cluster.worker(name, concurrency=4)
    cluster.beat("beat0")
    stop = threading.Event()
    kills: list[str] = []

    def kill_randomly() -> None:
        while not stop.wait(rng.uniform(1.0, 3.0)):
            name = rng.choice(names)
            cluster.process_for_worker(name).signal(signal.SIGKILL)
            kills.append(name)
            cluster.worker(name, concurrency=4)

    killer = threading.Thread(target=kill_randomly, daemon=True)
    started = time.monotonic()
    killer.start()

    def all_ran() -> bool:
        return len(cluster.effects()) >= total

    with contextlib.suppress(AssertionError):  # kill while the runs fire, 40 s at most
        wait_until(all_ran, timeout=40, interval=1)
    stop.set()  # stop killing; let the reaper and redelivery finish the rest
    killer.join()
    try:
        wait_until(all_ran, timeout=240, interval=1)
    finally:
        report_missing(store, cluster.env, cluster.effects())
    elapsed = time.monotonic() - started

    effects = cluster.effects()
    rows = run_rows(store, task="e2e.record")
    states: dict[str, int] = {}
    for row in rows:
        states[row.state] = states.get(row.state, 0) + 1
    duplicates = sum(row.duplicate_deliveries for row in rows)
    restarted = sum(1 for row in rows if row.attempt > 1)
    print(
        f"soak: {total} runs, {len(kills)} worker kills, {elapsed:.0f}s, states {states},"
        f" {restarted} runs started more than once, {duplicates} duplicate deliveries refused"
    )
    assert len(rows) == total, "one run per one-off schedule"
    assert set(effects) == {str(row.id) for row in rows}, "no run lost"
    assert max(effects.values()) == 1, "no effect doubled"
    assert states == {RunState.SUCCEEDED.value: total}
    assert len(kills) >= 3, "the soak really killed workers"
