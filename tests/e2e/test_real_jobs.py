"""Jobs as real projects write them, on real `celery beat` and `celery worker`
processes: plain tasks, retries, ``expires``, chains, caller-chosen task IDs and
messages the broker lost. A test that guards a finding of issue 15 names it in its docstring."""

from __future__ import annotations

import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.publish.dispatch import ATTEMPT_HEADER, FIRE_AT_HEADER, SCHEDULE_HEADER
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.e2e.cluster import Cluster, wait_until
from tests.integration.helpers import broker_messages, run_rows, task_ids

pytestmark = pytest.mark.e2e

#: A short visibility timeout makes kombu redeliver quickly, as the findings were seen.
FAST = {
    "HABEAT_LEASE_TIMEOUT": "4",
    "HABEAT_MAX_WAIT": "1",
    "HABEAT_VISIBILITY_TIMEOUT": "5",
}


def runs_of(store: Store, schedule: str) -> list[Any]:
    return run_rows(store, schedule_name=schedule)


def one_run(store: Store, schedule: str) -> Any:
    rows = runs_of(store, schedule)
    assert len(rows) == 1, rows
    return rows[0]


def start_cluster(cluster: Cluster, *, workers: int = 1, **settings: str) -> None:
    cluster.settings = FAST | settings
    cluster.beat("beat0")
    for index in range(workers):
        cluster.worker(f"worker{index}", concurrency=2)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)


def test_a_plain_task_runs_once_and_its_run_is_recorded(cluster: Cluster, store: Store) -> None:
    """A plain task runs once and its run is recorded. Finding 1 of issue 15."""
    start_cluster(cluster)
    Schedules(store).create(
        "plain", "e2e.plain_record", at=datetime.now(UTC), args=["p"], allow_unregistered=True
    )
    wait_until(
        lambda: runs_of(store, "plain") and one_run(store, "plain").state == "succeeded",
        timeout=30,
    )
    # Long past 2 x the visibility timeout: the run is never sent again.
    time.sleep(16)
    run = one_run(store, "plain")
    assert run.state == RunState.SUCCEEDED.value
    assert run.plain
    assert None not in (run.received_at, run.started_at, run.finished_at)
    assert run.worker.startswith("worker0")
    assert cluster.effects() == {str(run.id): 1}


def test_a_plain_run_whose_worker_dies_is_not_run_again(cluster: Cluster, store: Store) -> None:
    """A plain run whose worker dies ends lost and is not run again. Finding 1 of issue 15."""
    start_cluster(cluster, workers=2)
    Schedules(store).create(
        "plain-slow",
        "e2e.plain_slow",
        at=datetime.now(UTC),
        args=["p", 6],
        allow_unregistered=True,
    )
    wait_until(
        lambda: runs_of(store, "plain-slow") and one_run(store, "plain-slow").state == "running",
        timeout=30,
    )
    victim = cluster.process_for_worker(one_run(store, "plain-slow").worker)
    time.sleep(1)
    victim.signal(signal.SIGKILL)
    # The lease expires (4 s), the message comes back from kombu's unacked hash (5 s):
    # the run ends lost, and the copy is dropped at receipt by the other worker.
    wait_until(lambda: one_run(store, "plain-slow").state == "lost", timeout=40)
    time.sleep(15)
    run = one_run(store, "plain-slow")
    assert run.state == RunState.LOST.value
    assert "plain task is not sent again" in run.error
    assert cluster.effects() == {}, "the body that was killed never finished, and never ran again"


def test_a_plain_task_that_retries_ends_succeeded_once(cluster: Cluster, store: Store) -> None:
    """A plain task that retries ends succeeded, its effect once. Finding 1 of issue 15."""
    start_cluster(cluster)
    Schedules(store).create(
        "plain-flaky",
        "e2e.plain_flaky",
        at=datetime.now(UTC),
        args=["p", 2],
        allow_unregistered=True,
    )
    wait_until(
        lambda: (
            runs_of(store, "plain-flaky") and one_run(store, "plain-flaky").state == "succeeded"
        ),
        timeout=40,
    )
    run = one_run(store, "plain-flaky")
    assert run.retries == 2
    assert cluster.effects() == {str(run.id): 1}


def test_a_retry_that_expires_ends_the_run_expired(cluster: Cluster, store: Store) -> None:
    """A retry that expires ends the run expired, with no effect. Finding 2a of issue 15."""
    start_cluster(cluster)
    Schedules(store).create(
        "expiring-retry",
        "e2e.retry_now",
        at=datetime.now(UTC),
        args=["r", 1, 6],  # retry in 6 s: past the 3-s expiry Celery copies into it
        options={"expires": 3},
        allow_unregistered=True,
    )
    wait_until(
        lambda: (
            runs_of(store, "expiring-retry") and one_run(store, "expiring-retry").state == "expired"
        ),
        timeout=40,
    )
    run = one_run(store, "expiring-retry")
    assert "expired" in run.reason
    assert cluster.effects() == {}


def test_retries_with_no_countdown_all_succeed_once(cluster: Cluster, store: Store) -> None:
    start_cluster(cluster)
    schedules = Schedules(store)
    now = datetime.now(UTC)
    for index in range(6):
        schedules.create(
            f"retry-now-{index}", "e2e.retry_now", at=now, args=["r", 2], allow_unregistered=True
        )

    def all_succeeded() -> bool:
        states = [run.state for index in range(6) for run in runs_of(store, f"retry-now-{index}")]
        return states == ["succeeded"] * 6

    wait_until(all_succeeded, timeout=60)
    effects = cluster.effects()
    assert sorted(effects.values()) == [1] * 6


def test_an_expired_run_ends_expired_and_never_runs_late(cluster: Cluster, store: Store) -> None:
    """An expired run ends expired and never runs late. Finding 3 of issue 15."""
    cluster.settings = FAST
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    Schedules(store).create(
        "expires",
        "e2e.record",
        at=datetime.now(UTC),
        args=["late"],
        options={"expires": 2},
        allow_unregistered=True,
    )
    wait_until(lambda: runs_of(store, "expires"), timeout=20)
    time.sleep(3)  # no worker until the run expired
    cluster.worker("worker0", concurrency=2)
    wait_until(lambda: one_run(store, "expires").state == "expired", timeout=30)
    time.sleep(15)  # past 2 x the visibility timeout: nothing is sent again
    run = one_run(store, "expires")
    assert run.state == RunState.EXPIRED.value
    assert cluster.effects() == {}


def test_a_chain_on_the_idempotent_base_survives_its_worker(cluster: Cluster, store: Store) -> None:
    """A chain on the idempotent base survives its worker's death. Finding 7 of issue 15."""
    start_cluster(cluster, workers=2)
    app = cluster.app()
    first, second = str(uuid.uuid4()), str(uuid.uuid4())
    chain = app.signature("e2e.slow", args=["link-1", 5], immutable=True).set(
        task_id=first
    ) | app.signature("e2e.record", args=["link-2"], immutable=True).set(task_id=second)
    chain.apply_async()
    wait_until(
        lambda: (
            run_rows(store, id=uuid.UUID(first))
            and run_rows(store, id=uuid.UUID(first))[0].state == "running"
        ),
        timeout=30,
    )
    victim = cluster.process_for_worker(run_rows(store, id=uuid.UUID(first))[0].worker)
    time.sleep(1)
    victim.signal(signal.SIGKILL)
    wait_until(lambda: cluster.effects().get(second) == 1, timeout=60, interval=0.2)
    assert cluster.effects() == {first: 1, second: 1}


def test_a_reclaimed_run_keeps_its_callers_task_id(cluster: Cluster, store: Store) -> None:
    """A reclaimed run keeps its caller's task ID. Finding 13 of issue 15."""
    start_cluster(cluster, workers=2)
    task_id = f"order-{uuid.uuid4().hex[:8]}"
    cluster.app().send_task("e2e.slow", args=["keyed", 5], task_id=task_id)
    wait_until(lambda: run_rows(store, task="e2e.slow"), timeout=30)
    wait_until(lambda: run_rows(store, task="e2e.slow")[0].state == "running", timeout=30)
    run = run_rows(store, task="e2e.slow")[0]
    assert run.task_id == task_id
    time.sleep(1)
    cluster.process_for_worker(run.worker).signal(signal.SIGKILL)
    wait_until(lambda: cluster.effects().get(task_id) == 1, timeout=60, interval=0.2)
    assert cluster.effects() == {task_id: 1}, "the second attempt ran under the caller's task ID"


def test_a_beat_run_whose_record_was_pruned_does_not_run_again(
    cluster: Cluster, store: Store
) -> None:
    """A beat run whose record was pruned does not run again. Finding 11 of issue 15."""
    cluster.settings = FAST
    cluster.worker("worker0", concurrency=2)
    pruned = str(uuid.uuid4())
    cluster.app().send_task(
        "e2e.record",
        args=["pruned"],
        task_id=pruned,
        headers={
            SCHEDULE_HEADER: "daily",
            FIRE_AT_HEADER: (datetime.now(UTC) - timedelta(days=40)).isoformat(),
            ATTEMPT_HEADER: 1,
        },
    )
    wait_until(lambda: "its record is gone" in cluster.logs(), timeout=30)
    assert cluster.effects() == {}
    assert run_rows(store, id=uuid.UUID(pruned)) == []


def _delete_from_broker(env: SessionEnv, queue: str = "celery") -> int:
    """Delete every message of ``queue`` and every unacked one, like a Redis that lost keys."""
    client = redis.Redis.from_url(env.redis_url)
    prefix = env.broker_key_prefix
    deleted = int(client.delete(f"{prefix}{queue}", f"{prefix}unacked", f"{prefix}unacked_index"))
    client.close()
    return deleted


#: Default visibility timeout (an hour): recovery must not wait for it.
DEFAULT_VISIBILITY = {"HABEAT_LEASE_TIMEOUT": "4", "HABEAT_MAX_WAIT": "1"}


def test_a_message_the_broker_lost_is_sent_again_within_a_minute(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """A message the broker lost is sent again within a minute. Finding 4 of issue 15."""
    cluster.settings = DEFAULT_VISIBILITY
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    Schedules(store).create(
        "lost-message", "e2e.record", at=datetime.now(UTC), args=["m"], allow_unregistered=True
    )
    wait_until(
        lambda: runs_of(store, "lost-message") and one_run(store, "lost-message").state == "queued",
        timeout=20,
    )
    assert _delete_from_broker(test_env) >= 1, "the message was in the queue"
    lost_at = time.monotonic()
    waited = wait_until(
        lambda: "the broker no longer holds its message" in cluster.logs(), timeout=90
    )
    print(f"published again {time.monotonic() - lost_at:.1f}s after the message was deleted")
    assert waited <= 60
    cluster.worker("worker0", concurrency=2)
    wait_until(lambda: one_run(store, "lost-message").state == "succeeded", timeout=30)
    run = one_run(store, "lost-message")
    assert cluster.effects() == {str(run.id): 1}


def test_a_long_healthy_backlog_gets_no_copies(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """A long but healthy backlog gets no copies. Finding 4 of issue 15."""
    cluster.settings = DEFAULT_VISIBILITY
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    schedules = Schedules(store)
    now = datetime.now(UTC)
    backlog = 300
    for index in range(backlog):
        schedules.create(
            f"backlog-{index:03d}", "e2e.record", at=now, args=["b"], allow_unregistered=True
        )
    client = redis.Redis.from_url(test_env.redis_url)

    def backlog_runs() -> set[str]:
        return {str(run.id) for run in run_rows(store) if run.schedule_name.startswith("backlog")}

    wait_until(lambda: len(backlog_runs()) == backlog, timeout=30)
    expected = backlog_runs()

    def queued_ids() -> list[str]:
        return task_ids(broker_messages(client, test_env.broker_key_prefix))

    wait_until(lambda: expected <= set(queued_ids()), timeout=30)
    time.sleep(55)  # past the look (30 s untaken) and its confirmation, with no worker
    ids = [task_id for task_id in queued_ids() if task_id in expected]
    assert sorted(ids) == sorted(expected), "each message once: no copy of one the broker holds"
    client.close()
    assert "the broker no longer holds its message" not in cluster.logs()


def test_a_retry_whose_message_the_broker_lost_is_sent_again(
    cluster: Cluster, store: Store, test_env: SessionEnv
) -> None:
    """A retry whose message the broker lost is sent again. Finding 2b of issue 15."""
    cluster.settings = DEFAULT_VISIBILITY
    cluster.beat("beat0")
    worker = cluster.worker("worker0", concurrency=2)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    Schedules(store).create(
        "lost-retry",
        "e2e.retry_now",
        at=datetime.now(UTC),
        args=["r", 1, 3],
        allow_unregistered=True,
    )
    wait_until(
        lambda: runs_of(store, "lost-retry") and one_run(store, "lost-retry").retries == 1,
        timeout=30,
    )
    # The worker holds the retry until its countdown ends: stop it, and lose the message.
    worker.signal(signal.SIGKILL)
    worker.popen.wait()
    _delete_from_broker(test_env)
    cluster.worker("worker1", concurrency=2)
    wait_until(lambda: one_run(store, "lost-retry").state == "succeeded", timeout=90)
    run = one_run(store, "lost-retry")
    assert cluster.effects() == {str(run.id): 1}


def test_a_retry_held_by_a_worker_that_dies_is_sent_again_at_its_time(
    cluster: Cluster, store: Store
) -> None:
    """A worker holds a retry until its countdown ends (in kombu's unacked hash): if it
    dies meanwhile, the run is published again at its retry time, not after the
    visibility timeout, and not before its time."""
    cluster.settings = DEFAULT_VISIBILITY
    cluster.beat("beat0")
    holder = cluster.worker("worker0", concurrency=2)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    Schedules(store).create(
        "held-retry",
        "e2e.retry_now",
        at=datetime.now(UTC),
        args=["r", 1, 12],
        allow_unregistered=True,
    )

    def held() -> bool:
        rows = runs_of(store, "held-retry")
        return bool(rows) and rows[0].state == "retrying" and rows[0].lease_owner is not None

    wait_until(held, timeout=30)
    holder.signal(signal.SIGKILL)
    holder.popen.wait()
    killed_at = time.monotonic()
    cluster.worker("worker1", concurrency=2)
    wait_until(lambda: one_run(store, "held-retry").state == "succeeded", timeout=60)
    print(f"the retry succeeded {time.monotonic() - killed_at:.1f}s after its worker was killed")
    run = one_run(store, "held-retry")
    assert run.started_at >= run.retry_due_at, "the retry did not run before its countdown ended"
    assert cluster.effects() == {str(run.id): 1}
