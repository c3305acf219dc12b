"""RabbitMQ's own faults, with real `celery beat` and `celery worker` processes on a
private RabbitMQ node (``tests.e2e.rabbitmq.PrivateRabbitMQ``):

- its consumer timeout: a run that works longer than ``consumer_timeout`` with
  ``acks_late`` has its channel closed under it, and RabbitMQ delivers the message
  again to another consumer while the first still runs it;
- a restart mid-run: every connection closes, durable queues and persistent messages
  survive, the leader's publishes fail until it is back.

Neither may make a second execution or lose a fire time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.plain_runs import CANCELLED_ON_CONNECTION_LOSS
from tests.chaos.servers import workspace
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.rabbitmq import PrivateRabbitMQ, private_rabbitmq
from tests.e2e.test_crash_fast import longest_gap_between_publications
from tests.e2e.test_ha_cluster import assert_each_fire_time_once, create_second_schedules
from tests.e2e.test_network_partitions import EACH_STARTED_ONCE, rows_of_the_test
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

#: RabbitMQ closes a channel whose delivery is unacknowledged this long (seconds).
CONSUMER_TIMEOUT = 4.0
#: How long the test's long runs work: past the consumer timeout, within a run's lease.
LONG_RUN = 10.0
FAST = {"HABEAT_LOCK_TTL": "5", "HABEAT_MAX_WAIT": "1"}
UNFINISHED = {RunState.PENDING.value, RunState.QUEUED.value, RunState.RUNNING.value}


@pytest.fixture
def short_consumer_timeout() -> Iterator[PrivateRabbitMQ]:
    with (
        workspace() as workdir,
        private_rabbitmq(workdir, consumer_timeout=CONSUMER_TIMEOUT) as node,
    ):
        yield node


@pytest.fixture
def rabbitmq_node() -> Iterator[PrivateRabbitMQ]:
    with workspace() as workdir, private_rabbitmq(workdir) as node:
        yield node


def start_long_runs(cluster: Cluster, store: Store, concurrency: int) -> None:
    """An idempotent and a plain long run, both running on ``worker0``, led by ``beat0``."""
    schedules = Schedules(store)
    schedules.create("idempotent", "e2e.long", in_seconds=2, args=["idempotent", LONG_RUN])
    schedules.create("plain", "e2e.plain_long", in_seconds=2, args=["plain", LONG_RUN])
    cluster.worker("worker0", concurrency=concurrency, pool="prefork")
    cluster.beat("beat0")
    wait_until(
        lambda: {row.state for row in rows_of_the_test(store)} == {RunState.RUNNING.value},
        timeout=60,
        interval=0.2,
    )


def all_ended(store: Store) -> bool:
    return all(row.state not in UNFINISHED for row in rows_of_the_test(store))


def test_a_run_past_rabbitmqs_consumer_timeout_is_not_executed_again(
    cluster: Cluster, store: Store, short_consumer_timeout: PrivateRabbitMQ
) -> None:
    """The channel of a worker running an ``acks_late`` message closes when the
    consumer timeout passes (PRECONDITION_FAILED), and RabbitMQ delivers the message
    again, to the spare worker, while the body still runs. That delivery is no proof
    the first is gone: the guard (idempotent base) or the receipt (a plain task taken
    by a worker) drops it. Celery counts the closed channel as an unrecoverable error:
    the worker stops once its runs end, and what it held goes back to the queue
    unacknowledged. A worker started later takes it and drops it too: every body
    starts once, and nothing is left in the queue."""
    cluster.settings = FAST | {"CELERY_BROKER_URL": short_consumer_timeout.url}
    start_long_runs(cluster, store, concurrency=2)
    timed_out_worker = cluster.process_for_worker("worker0")
    # Both runs are on worker0: the spare is there to be given them again.
    cluster.worker("spare", concurrency=2, pool="prefork")

    wait_until(lambda: all_ended(store), timeout=LONG_RUN + 60, interval=0.5)
    timed_out = "PRECONDITION_FAILED" in cluster.logs()
    rows = rows_of_the_test(store)
    assert {row.state for row in rows} == {RunState.SUCCEEDED.value}, [
        (row.task, row.state, row.error) for row in rows
    ]
    cluster.worker("later", concurrency=2, pool="prefork")  # takes what went back unacked
    wait_until(lambda: not any(short_consumer_timeout.messages().values()), timeout=60)
    assert cluster.labels() == EACH_STARTED_ONCE, "each body started once and had its effect once"
    assert timed_out, "RabbitMQ's consumer timeout closed no channel: the test proved nothing"
    wait_until(lambda: not timed_out_worker.alive(), timeout=30)  # Celery stops it, as documented
    assert "Unrecoverable error: PreconditionFailed" in timed_out_worker.output()


def test_a_rabbitmq_restart_mid_run_loses_no_fire_time_and_runs_none_twice(
    cluster: Cluster, store: Store, rabbitmq_node: PrivateRabbitMQ
) -> None:
    """RabbitMQ stopped and started again while runs are queued and running (its
    queues are durable, its messages persistent): the leader's publishes fail while it
    is down and the runs wait in the outbox; the workers reconnect. Every fire time
    runs once, its effect once. The runs running at the stop are cancelled by Celery
    (``worker_cancel_long_running_tasks_on_connection_loss``, as this app sets it, so
    the copy RabbitMQ delivers again never runs beside them): the idempotent run is
    run again and has its effect once; the plain run, which may have had its effect,
    ends ``lost`` and never starts again."""
    cluster.settings = FAST | {"CELERY_BROKER_URL": rabbitmq_node.url}
    anchor = create_second_schedules(store)
    start_long_runs(cluster, store, concurrency=4)

    stopped_at = store.now()
    rabbitmq_node.restart()
    down_for = (store.now() - stopped_at).total_seconds()
    time.sleep(6)  # the leader's next publishes go through, the worker reconnects
    until = store.now()

    wait_until(lambda: all_ended(store), timeout=LONG_RUN + 60, interval=0.5)
    assert_each_fire_time_once(store, anchor, until)
    sent = {str(row.id) for row in run_rows(store, task="e2e.record") if row.state != "pending"}
    wait_until(lambda: set(cluster.effects()) >= sent, timeout=60, interval=0.5)
    assert {cluster.effects()[run_id] for run_id in sent} == {1}, "a run executed twice"

    outcomes = {row.task: (row.state, row.error) for row in rows_of_the_test(store)}
    assert outcomes == {
        "e2e.long": (RunState.SUCCEEDED.value, None),
        "e2e.plain_long": (RunState.LOST.value, CANCELLED_ON_CONNECTION_LOSS),
    }
    effects = cluster.labels()
    gap = longest_gap_between_publications(store, stopped_at)
    print(f"RabbitMQ stopped and started in {down_for:.1f} s; longest gap between publications")
    print(f"{gap:.1f} s; the long runs' starts and effects: {effects}")
    assert effects.get("idempotent") == 1, "the idempotent run had its effect once"
    assert effects.get("plain:start") == 1, "the cancelled plain run never started again"
    assert "plain" not in effects, "the plain run was cancelled before its end"
