"""Beat publishing on RabbitMQ, with real `celery beat` and `celery worker` processes:
the transport takes the path it supports, and the time to live of a message comes from
the database's clock, not from the beat host's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.clock_skew import skew_overrides
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.e2e.rabbitmq import rabbitmq_vhost
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

FAST = {"HABEAT_LEASE_TIMEOUT": "4", "HABEAT_MAX_WAIT": "1"}
#: A beat host's clock this far ahead of the database's (seconds).
AHEAD = 120.0
FINISHED = {RunState.SUCCEEDED.value, RunState.FAILED.value, RunState.EXPIRED.value}


@pytest.fixture
def rabbitmq() -> Iterator[str]:
    with rabbitmq_vhost() as url:
        yield url


def start_on_rabbitmq(
    cluster: Cluster, broker: str, *, concurrency: int = 4, beat_skew: float = 0.0
) -> Process:
    """A worker and a beat on ``broker``, the beat's wall clock ``beat_skew`` seconds
    ahead of the database's; the beat."""
    cluster.settings = FAST | {"CELERY_BROKER_URL": broker}
    cluster.worker("worker0", concurrency=concurrency)
    skew = skew_overrides(beat_skew, cluster.process_env()["PYTHONPATH"]) if beat_skew else {}
    beat = cluster.beat("beat0", **skew)
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    return beat


def publish_errors(beat: Process) -> list[str]:
    """The lines of ``beat``'s log where a publish failed or stopped."""
    return [
        line
        for line in beat.output().splitlines()
        if "publishing" in line and ("failed" in line or "stopped" in line)
    ]


def next_whole_second(store: Store, *, after: float) -> datetime:
    """A fire time ``after`` seconds or more from the database's now, on a whole second."""
    return (store.now() + timedelta(seconds=after + 1)).replace(microsecond=0)


def settled(store: Store, names: list[str]) -> bool:
    rows = [row for name in names for row in run_rows(store, schedule_name=name)]
    return len(rows) == len(names) and all(row.state in FINISHED for row in rows)


def test_two_runs_of_one_template_at_one_instant_publish_once_each_on_rabbitmq(
    rabbitmq: str, cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 4: on RabbitMQ, two one-offs of one task with the same options
    due at the same second, and a control schedule every 2 s of another task: each run
    is delivered and executed once, none is left pending, no publish fails."""
    beat = start_on_rabbitmq(cluster, rabbitmq)
    schedules = Schedules(store)
    schedules.create("control", "e2e.plain_record", every=2, args=["c"], allow_unregistered=True)
    at = next_whole_second(store, after=4)
    twins = ["twin-a", "twin-b"]
    for name in twins:
        schedules.create(name, "e2e.record", at=at, args=[name], allow_unregistered=True)
    wait_until(lambda: settled(store, twins), timeout=40, interval=0.2)
    time.sleep(6)  # time for a copy sent again to arrive, and for the control to fire

    assert publish_errors(beat) == []
    runs = [row for name in twins for row in run_rows(store, schedule_name=name)]
    assert [row.state for row in runs] == [RunState.SUCCEEDED.value] * 2
    assert [row.duplicate_deliveries for row in runs] == [0, 0]
    control = run_rows(store, schedule_name="control")
    effects = cluster.effects()  # after the control's rows: each succeeded run's is in
    assert sorted(effects.get(str(row.id)) for row in runs) == [1, 1], effects
    assert len(control) >= 5
    # Every control run whose time came was published (one claimed ahead waits for it;
    # the newest may be on its way under a busy CPU).
    due = store.now() - timedelta(seconds=3)
    pending = [row.fire_at for row in control if row.state == RunState.PENDING.value]
    assert [fire_at for fire_at in pending if fire_at < due] == []
    ran = [str(row.id) for row in control if row.state == RunState.SUCCEEDED.value]
    assert len(ran) >= 5
    assert {effects.get(run_id) for run_id in ran} == {1}, "each control run executed once"


def test_a_beat_whose_clock_is_ahead_sends_runs_with_a_short_expiry_on_rabbitmq(
    rabbitmq: str, cluster: Cluster, store: Store
) -> None:
    """issue 38, finding 11: on RabbitMQ, a beat whose wall clock is 2 minutes ahead of
    the database's, one worker busy with an 8-s job at the fire time: three one-offs
    with ``expires=25`` wait in the queue with the time to live their fire time gives
    them by the database's clock, and run once the worker is free."""
    start_on_rabbitmq(cluster, rabbitmq, concurrency=1, beat_skew=AHEAD)
    schedules = Schedules(store)
    at = next_whole_second(store, after=3)
    schedules.create("busy", "e2e.slow", at=at, args=["busy", 8], allow_unregistered=True)
    names = [f"short-{index}" for index in range(3)]
    for index, name in enumerate(names):
        schedules.create(
            name,
            "e2e.record",
            at=at + timedelta(seconds=1 + index),
            args=[name],
            options={"expires": 25},
            allow_unregistered=True,
        )
    # A message dropped by the broker ends its run only once the leader finds it gone:
    # wait for the three to end, or for their expiry to be long past.
    deadline = at + timedelta(seconds=45)
    wait_until(lambda: settled(store, names) or store.now() > deadline, timeout=70, interval=0.2)
    runs = [row for name in names for row in run_rows(store, schedule_name=name)]
    assert [row.state for row in runs] == [RunState.SUCCEEDED.value] * 3, runs
    assert sorted(cluster.effects().values()) == [1, 1, 1, 1]


def test_a_message_routed_to_no_queue_is_noticed_and_its_schedule_quarantined(
    rabbitmq: str, cluster: Cluster, store: Store
) -> None:
    """Issue 28: RabbitMQ drops a message its exchange routes to no queue, and confirms
    it: the run counted as sent, and no worker could ever get it. Beat publishes with
    ``mandatory``: the broker returns it, and the schedule is quarantined with the
    exchange, the routing key and what to do; the other schedules go on."""
    beat = start_on_rabbitmq(cluster, rabbitmq)
    schedules = Schedules(store)
    schedules.create("control", "e2e.plain_record", every=1, args=["c"], allow_unregistered=True)
    schedules.create(
        "unbound",
        "e2e.record",
        every=1,
        args=["u"],
        options={"exchange": "amq.direct", "routing_key": "nobody-listens"},
        allow_unregistered=True,
    )

    wait_until(lambda: schedules.get("unbound").quarantined_at is not None, timeout=30)

    reason = schedules.get("unbound").disabled_reason or ""
    assert "routed its message to no queue" in reason
    assert "'amq.direct'" in reason
    assert "'nobody-listens'" in reason
    runs = run_rows(store, schedule_name="unbound")
    assert runs, "its first fire time was claimed"
    assert {row.state for row in runs} <= {RunState.FAILED.value, RunState.CANCELLED.value}
    assert all(row.published_at is None for row in runs), "never counted as sent"
    assert any("routed its message to no queue" in (row.error or "") for row in runs)
    control = len(run_rows(store, schedule_name="control"))
    time.sleep(3)
    assert len(run_rows(store, schedule_name="control")) >= control + 2, "the others go on"
    assert publish_errors(beat) == []
