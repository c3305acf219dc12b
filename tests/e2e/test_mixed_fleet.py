"""A fleet where some consumer does not have this package: a real `celery worker` started
in an environment where ``import beat`` fails and the package's entry points are not
seen (``tests/e2e/foreign/sitecustomize.py``: a meta-path finder refusing ``beat``,
``app`` and ``tests``, and ``importlib.metadata.entry_points`` filtered), consuming
beat's queue with a plain Celery app (``tests/e2e/foreign/plain_app.py``). Beat is the
in-process scheduler, its lost-message recovery shortened to seconds."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import text

from app.factory import create_app
from beat import metrics
from beat.leader import lost_messages
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from beat.store.leader import MAX_SENDS
from beat.store.plain_runs import TAKEN_UNRECORDED
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

FOREIGN = Path(__file__).resolve().parent / "foreign"
FOREIGN_CELERY = [sys.executable, "-m", "celery", "-A", "plain_app"]


def foreign_env(cluster: Cluster) -> dict[str, str]:
    """The cluster's environment, with only the foreign directory on the path."""
    return cluster.process_env() | {"PYTHONPATH": str(FOREIGN)}


def start_foreign_worker(cluster: Cluster, name: str, **env: str) -> Process:
    """A `celery worker` of ``plain_app`` in an environment without this package."""
    return cluster.start(
        name,
        *("worker", "-l", "info", "-P", "threads", "-c", "2", "-n", f"{name}@%h"),
        program=FOREIGN_CELERY,
        cwd=FOREIGN,
        PYTHONPATH=str(FOREIGN),
        **env,
    )


def assert_without_the_package(cluster: Cluster) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import beat"],
        cwd=FOREIGN,
        env=foreign_env(cluster),
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0
    assert "No module named 'beat'" in probe.stderr


@pytest.fixture
def fast_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lost-message recovery in seconds rather than tens of seconds."""
    monkeypatch.setattr(lost_messages, "UNTAKEN_AFTER", 3.0)
    monkeypatch.setattr(lost_messages, "UNRECORDED_AFTER", 3.0)
    monkeypatch.setattr(lost_messages, "CHECK_INTERVAL", 1.0)
    monkeypatch.setattr(lost_messages, "CONFIRM_AFTER", 1.0)
    monkeypatch.setattr(lost_messages, "CONSUMERS_CHECK_INTERVAL", 2.0, raising=False)


@pytest.fixture
def leader(cluster: Cluster) -> Iterator[HAScheduler]:
    """An in-process beat, ticking on a thread of its own until the test ends."""
    app = create_app(cluster.env.settings(lock_ttl=2.0, max_wait=0.2, claim_ahead=1.0))
    scheduler = HAScheduler(app=app)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            scheduler.tick()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    yield scheduler
    stop.set()
    thread.join(timeout=15)
    scheduler.close()
    if scheduler._store is not None:
        scheduler._store.dispose()


def test_a_plain_task_taken_by_a_worker_without_the_package_runs_once_per_fire_time(
    cluster: Cluster,
    store: Store,
    fast_recovery: None,
    leader: HAScheduler,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """issue 38, finding 1: a worker without this package (a rolling deploy, another
    image) takes a plain task's messages and records nothing; lost-message recovery saw
    "no worker recorded it", did not find the message in the queue and published it
    again, without bound (13 executions for 7 runs of a 20-s schedule in 150 s). Here a
    worker with the package consumes the queue too (a rolling deploy). The leader must
    find that the queue has a consumer that does not record runs, fall back to the
    visibility timeout for it, say so once, and send nothing again."""
    assert_without_the_package(cluster)
    foreign = start_foreign_worker(cluster, "foreign")
    upgraded = cluster.worker("upgraded", concurrency=2)  # a rolling deploy: one of each
    for worker in (foreign, upgraded):
        wait_until(lambda w=worker: "ready." in w.output(), timeout=60, interval=0.2)
    schedules = Schedules(store)
    with caplog.at_level(logging.WARNING, logger="beat.leader.lost_messages"):
        schedules.create(
            "plain-every-2s", "e2e.plain_record", every=2, args=["mixed"], allow_unregistered=True
        )
        time.sleep(14)
        schedules.pause("plain-every-2s")
        # Long enough for every run to be looked for, found missing and confirmed twice.
        time.sleep(12)

    runs = run_rows(store, schedule_name="plain-every-2s")
    fired = {str(row.id) for row in runs if row.state != RunState.SKIPPED.value}
    effects = cluster.effects()
    print(f"{len(fired)} runs, effects {sorted(effects.values())}")
    assert len(fired) >= 5
    assert all(count == 1 for count in effects.values()), f"run twice: {effects}"
    assert set(effects) == fired, "each fire time ran once"
    assert "beat.delivery.tracking" not in foreign.output()

    hostname = f"foreign@{socket.gethostname()}"
    warnings = [
        record.getMessage()
        for record in caplog.records
        if record.levelno == logging.WARNING and hostname in record.getMessage()
    ]
    assert len(warnings) == 1, warnings
    assert "celery" in warnings[0]
    assert not [record for record in caplog.records if "upgraded@" in record.getMessage()]

    cluster_schedules = Schedules.for_app(leader.app)
    try:
        health = cluster_schedules.health()
    finally:
        cluster_schedules.close()
    [consumers] = [check for check in health.checks if check.name == "consumers"]
    assert not consumers.ok
    assert hostname in consumers.detail
    assert "celery" in consumers.detail
    assert (
        metrics.REGISTRY.get_sample_value("habeat_unrecorded_consumers", {"queue": "celery"}) == 1.0
    )


def test_copies_of_a_run_taken_by_a_consumer_the_control_cannot_see_are_bounded(
    cluster: Cluster, store: Store, fast_recovery: None, leader: HAScheduler
) -> None:
    """issue 38, finding 1, the bound: the only consumer is a worker without this package
    whose remote control is off, so no check can see it. Each copy of the run is taken
    and run, the broker holds none, and recovery sends it again; but a run's message is
    sent at most MAX_SENDS times: the run then ends ``lost`` with the reason, and is not
    sent again for ever."""
    foreign = start_foreign_worker(cluster, "invisible", FOREIGN_REMOTE_CONTROL="0")
    wait_until(lambda: "ready." in foreign.output(), timeout=60, interval=0.2)
    Schedules(store).create(
        "plain-once", "e2e.plain_record", at=store.now(), args=["once"], allow_unregistered=True
    )

    wait_until(
        lambda: [row.state for row in run_rows(store)] == [RunState.LOST.value],
        timeout=90,
        interval=0.5,
    )
    time.sleep(10)  # long enough for several more looks: nothing more is sent
    [row] = run_rows(store)
    assert row.state == RunState.LOST.value
    assert row.error == (
        f"its message was sent {MAX_SENDS} times and no worker recorded it: a consumer"
        " that does not record runs may have taken it"
    )
    assert cluster.effects() == {str(row.id): MAX_SENDS}


def handed_out_again(client: redis.Redis, cluster: Cluster) -> int:
    """Mark every message waiting in ``celery`` as kombu marks a delivery it restored after
    a consumer took it without acknowledging it; how many there were."""
    key = f"{cluster.env.broker_key_prefix}celery"
    payloads = [json.loads(raw) for raw in client.lrange(key, 0, -1)]
    client.delete(key)
    for payload in payloads:
        payload["headers"]["redelivered"] = True
        payload["properties"]["delivery_info"]["redelivered"] = True
        client.rpush(key, json.dumps(payload))
    return len(payloads)


def test_a_plain_run_handed_out_again_from_a_consumer_that_records_nothing_runs_nowhere(
    cluster: Cluster, store: Store, leader: HAScheduler, redis_client: redis.Redis
) -> None:
    """The chaos suite's mixed fleet ran plain runs twice: a worker without the package
    took a message and ran it, kombu handed the delivery out again across a Redis
    restart, and a worker with the package, finding the run recorded by nobody, ran it
    too. On a queue a consumer that records nothing takes from, such a delivery ends
    its run ``lost`` with the reason, the body not run; a first delivery runs as ever."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_unrecorded_consumers (queue, consumer)"
                " VALUES ('celery', 'celery@old-image')"
            )
        )
    schedules = Schedules(store)
    schedules.create("taken-by-old", "e2e.plain_record", in_seconds=0, args=["old"])
    wait_until(lambda: [row.state for row in run_rows(store)] == ["queued"], timeout=30)
    assert handed_out_again(redis_client, cluster) == 1
    worker = cluster.worker("upgraded", concurrency=2)
    wait_until(lambda: [row.state for row in run_rows(store)] == ["lost"], timeout=60)
    schedules.create("first-delivery", "e2e.plain_record", in_seconds=0, args=["new"])
    wait_until(
        lambda: sorted(row.state for row in run_rows(store)) == ["lost", "succeeded"],
        timeout=60,
    )

    lost = next(row for row in run_rows(store) if row.state == "lost")
    assert lost.error == TAKEN_UNRECORDED
    assert sorted(cluster.effects().values()) == [1], "the first delivery ran, the other not"
    assert "came back from the broker" in worker.output()
