"""Which channels an incident is told to, against real PostgreSQL: the channels its
schedule names that are still there, else every channel (a schedule that names none,
one whose channels were all removed, the cluster's stall): never nobody."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, update

from beat.errors import InvalidSchedule
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import notifications, schedules
from tests.integration.helpers import finished_runs

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"


@pytest.fixture
def api(store: Store) -> Schedules:
    assert store.take_leadership(1, "leader")
    api = Schedules(store)
    api.add_webhook("ops", "https://hooks.example.com/ops")
    api.add_webhook("team-a", "https://hooks.example.com/a")
    api.add_webhook("team-b", "https://hooks.example.com/b")
    return api


def told(store: Store) -> list[tuple[str, str]]:
    """(schedule, channel) of every notification written, sorted."""
    with store.engine.connect() as conn:
        rows = conn.execute(select(notifications.c.payload, notifications.c.channel)).all()
    return sorted((payload["incident"]["schedule"], channel) for payload, channel in rows)


def fail_three_times(store: Store, *names: str) -> None:
    for name in names:
        finished_runs(store, name, [RunState.FAILED] * 3)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)


def test_an_incident_is_told_to_its_schedules_channels_and_one_that_names_none_to_all(
    store: Store, api: Schedules
) -> None:
    api.create("routed", TASK, every=60, allow_unregistered=True, channels=["team-a", "team-b"])
    api.create("everyone", TASK, every=60, allow_unregistered=True)

    fail_three_times(store, "routed", "everyone")

    assert told(store) == [
        ("everyone", "ops"),
        ("everyone", "team-a"),
        ("everyone", "team-b"),
        ("routed", "team-a"),
        ("routed", "team-b"),
    ]


def test_a_channel_removed_is_passed_over_and_none_left_tells_every_channel(
    store: Store, api: Schedules
) -> None:
    api.create("half", TASK, every=60, allow_unregistered=True, channels=["team-a", "team-b"])
    api.create("orphan", TASK, every=60, allow_unregistered=True, channels=["team-b"])
    api.remove_channel("team-b")

    fail_three_times(store, "half", "orphan")

    assert told(store) == [("half", "team-a"), ("orphan", "ops"), ("orphan", "team-a")]


def test_the_cluster_s_stall_is_told_to_every_channel(store: Store, api: Schedules) -> None:
    api.create("routed", TASK, every=60, allow_unregistered=True, channels=["team-a"])
    with store.engine.begin() as conn:
        conn.execute(update(schedules).values(next_fire_at=store.now() - timedelta(minutes=10)))

    assert store.watch_stall(stall_after=timedelta(minutes=1)).opened

    assert told(store) == [("(cluster)", "ops"), ("(cluster)", "team-a"), ("(cluster)", "team-b")]


def test_a_route_to_a_channel_that_does_not_exist_is_refused_and_nothing_is_written(
    store: Store, api: Schedules
) -> None:
    with pytest.raises(InvalidSchedule, match="no channel 'team-c': add it first"):
        api.create("typo", TASK, every=60, allow_unregistered=True, channels=["team-a", "team-c"])
    api.create("fine", TASK, every=60, allow_unregistered=True, channels=["team-a"])
    with pytest.raises(InvalidSchedule, match="no channel 'team-c'"):
        api.update("fine", channels=["team-c"])

    assert [schedule.definition.name for schedule in api.list()] == ["fine"]
    assert api.get("fine").definition.channels == ("team-a",)
    assert api.update("fine", channels=None).definition.channels is None
