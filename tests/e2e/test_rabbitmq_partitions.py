"""Partitions between RabbitMQ and a worker or the leader alone, packets dropped
(``tests.e2e.netns``) while PostgreSQL and Redis stay reachable: the process keeps
its leases, the broker and the process each take the other for gone after two
missed heartbeats (the private node proposes 4 s), and RabbitMQ delivers what the
cut worker held again. No delivery is proof that another is gone: the run's lease
decides. Every body starts once or, idempotent, has its effect once; every fire
time runs once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from beat.models import RunState
from beat.ops.schedules import Schedules
from tests.chaos.servers import workspace
from tests.e2e.cluster import START_UP, wait_until
from tests.e2e.rabbitmq import PrivateRabbitMQ, private_rabbitmq
from tests.e2e.test_crash_fast import longest_gap_between_publications
from tests.e2e.test_ha_cluster import (
    assert_each_fire_time_once,
    assert_each_run_executed_once,
    create_second_schedules,
)
from tests.e2e.test_network_partitions import (
    LOCK_TTL,
    LONGEST_STEP,
    MAX_WAIT,
    PartitionedCluster,
    partitioned,
    rows_of_the_test,
)

pytestmark = pytest.mark.e2e

__all__ = ["partitioned"]  # the fixture, for this module's tests

#: The heartbeat the private node proposes: a silent peer is gone after two (seconds).
HEARTBEAT = 4
#: How long the cut lasts: past two heartbeats on both sides.
CUT = 3 * HEARTBEAT
#: How long the test's runs work: past the cut.
LONG_RUN = 20.0
UNFINISHED = {RunState.PENDING.value, RunState.QUEUED.value, RunState.RUNNING.value}


@pytest.fixture
def rabbitmq_across(partitioned: PartitionedCluster) -> Iterator[PrivateRabbitMQ]:
    """A private RabbitMQ node that listens on the namespace's link too."""
    address = partitioned.host.server_address
    with (
        workspace() as workdir,
        private_rabbitmq(workdir, heartbeat=HEARTBEAT, addresses=(address,)) as node,
    ):
        yield node


def test_a_worker_cut_from_rabbitmq_alone_starts_each_body_once(
    partitioned: PartitionedCluster, rabbitmq_across: PrivateRabbitMQ
) -> None:
    """A worker running an idempotent and a plain long run is cut from RabbitMQ, both
    ways, while it still reaches PostgreSQL and Redis. RabbitMQ closes its connection
    and delivers both messages again, to the spare worker, while the bodies still run
    on the cut one, whose leases live: the guard and the receipt drop those copies.
    The cut worker finds its connection dead and Celery cancels its runs
    (``worker_cancel_long_running_tasks_on_connection_loss``): the idempotent run is
    run again and has its effect once; the plain run, whose body may have had its
    effect, ends ``lost``, never started twice."""
    cluster, store = partitioned.cluster, partitioned.cluster.store
    cluster.settings = {"CELERY_BROKER_URL": rabbitmq_across.url}
    schedules = Schedules(store)
    schedules.create("idempotent", "e2e.long", in_seconds=2, args=["idempotent", LONG_RUN])
    schedules.create("plain", "e2e.plain_long", in_seconds=2, args=["plain", LONG_RUN])
    across_url = rabbitmq_across.url_at(partitioned.host.server_address)
    partitioned.worker_across_the_link(
        "across", concurrency=2, pool="prefork", CELERY_BROKER_URL=across_url
    )
    cluster.beat("beat0")
    wait_until(
        lambda: {row.state for row in rows_of_the_test(store)} == {RunState.RUNNING.value},
        timeout=60,
        interval=0.2,
    )
    assert all(row.worker.startswith("across@") for row in rows_of_the_test(store))
    cluster.worker("spare", concurrency=2, pool="prefork")
    time.sleep(START_UP)

    partitioned.host.partition("both", port=rabbitmq_across.port)
    time.sleep(CUT)
    partitioned.host.heal()

    wait_until(
        lambda: all(row.state not in UNFINISHED for row in rows_of_the_test(store)),
        timeout=LONG_RUN + 90,
        interval=0.5,
    )
    outcomes = {row.task: (row.state, row.error) for row in rows_of_the_test(store)}
    effects = cluster.labels()
    print(f"worker cut from RabbitMQ: outcomes {outcomes}; starts and effects {effects}")
    assert outcomes["e2e.long"] == (RunState.SUCCEEDED.value, None)
    assert effects["idempotent"] == 1, "the idempotent run had its effect once"
    assert effects["plain:start"] == 1, "the plain body started once"
    assert effects.get("plain", 0) <= 1
    assert outcomes["e2e.plain_long"][0] in {RunState.SUCCEEDED.value, RunState.LOST.value}
    wait_until(lambda: not any(rabbitmq_across.messages().values()), timeout=60, interval=1)


def test_a_leader_cut_from_rabbitmqs_answers_loses_no_fire_time_and_runs_none_twice(
    partitioned: PartitionedCluster, rabbitmq_across: PrivateRabbitMQ
) -> None:
    """The leader cut from RabbitMQ's answers (its publishes may arrive, never
    confirmed: the harder cut of the two, a cut both ways only fails them), while it
    still reaches PostgreSQL and Redis: its publishes time out, its ticks fail, and it
    lets the lease go; the standby takes over and sends what waited in the outbox, a
    message that did arrive included, under the same task ID. Every fire time runs
    once, every run's effect exists once."""
    direction = "from-servers"
    cluster, store = partitioned.cluster, partitioned.cluster.store
    cluster.settings = {
        "HABEAT_LOCK_TTL": str(LOCK_TTL),
        "HABEAT_MAX_WAIT": str(MAX_WAIT),
        "CELERY_BROKER_URL": rabbitmq_across.url,
    }
    anchor = create_second_schedules(store)
    cluster.worker("worker0")
    across_url = rabbitmq_across.url_at(partitioned.host.server_address)
    cut_off = partitioned.beat_across_the_link("beat0", CELERY_BROKER_URL=across_url)
    wait_until(lambda: cluster.leading_process() is cut_off, timeout=30)
    cluster.beat("beat1")
    time.sleep(START_UP)

    cut_at = store.now()
    partitioned.host.partition(direction, port=rabbitmq_across.port)
    time.sleep(CUT)
    partitioned.host.heal()
    time.sleep(LONGEST_STEP)  # what waited in the outbox goes out

    holder = cluster.leader_holder()
    gap = longest_gap_between_publications(store, cut_at)
    leading = "the cut one" if cluster.leading_process() is cut_off else "the standby"
    print(f"leader cut from RabbitMQ ({direction}): longest gap between publications")
    print(f"{gap:.2f} s; leading after: {leading} (epoch {holder and holder[0]})")
    assert cut_off.alive()
    assert gap <= CUT + LONGEST_STEP, "fire times waited past the cut and a leader's longest step"
    until = store.now() - timedelta(seconds=1)
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)
