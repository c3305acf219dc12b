"""The stall incident of the whole cluster against real PostgreSQL
(``beat.store.leader.stall``): opened once when enabled schedules wait unclaimed past the
threshold, by the database's clock, however many processes look at once; told to every
channel; resolved when none waits; never resolved by the failing monitor's pass."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from beat.models import IncidentKind
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.tables import notifications, schedules

pytestmark = pytest.mark.integration

AFTER = timedelta(seconds=60)


def overdue_by(store: Store, name: str, late: timedelta) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(schedules)
            .where(schedules.c.name == name)
            .values(next_fire_at=store.now() - late)
        )


def test_fire_times_unclaimed_past_the_threshold_open_one_stall_and_a_claim_resolves_it(
    store: Store,
) -> None:
    api = Schedules(store)
    api.add_webhook("hook", "https://hooks.example.com/habeat")
    for name in ("a", "b"):
        api.create(name, "tasks.demo.add", every=60, allow_unregistered=True)
    overdue_by(store, "a", AFTER - timedelta(seconds=5))
    assert store.watch_stall(stall_after=AFTER).opened is False

    overdue_by(store, "a", AFTER + timedelta(seconds=70))
    overdue_by(store, "b", AFTER + timedelta(seconds=5))
    first = store.watch_stall(stall_after=AFTER)
    again = store.watch_stall(stall_after=AFTER)

    assert (first.opened, first.overdue) == (True, 2)
    assert first.detail == "2 schedules wait unclaimed, the oldest due 2m10s ago"
    assert again.opened is False
    [incident] = api.incidents()
    assert (incident.kind, incident.schedule_name) == (IncidentKind.STALL, "(cluster)")
    with store.engine.connect() as conn:
        [payload] = conn.execute(select(notifications.c.payload)).scalars()
    assert payload["text"] == (
        "No fire time is being claimed: 2 schedules wait unclaimed, the oldest due 2m10s ago"
    )

    for name in ("a", "b"):
        overdue_by(store, name, -timedelta(seconds=30))  # claimed: due again later
    resolved = store.watch_stall(stall_after=AFTER)

    assert resolved.resolved is True
    assert api.incidents() == []
    with store.engine.connect() as conn:
        events = list(
            conn.execute(select(notifications.c.event).order_by(notifications.c.id)).scalars()
        )
    assert events == ["opened", "resolved"]


def test_processes_looking_at_once_open_one_stall(store: Store) -> None:
    api = Schedules(store)
    api.create("a", "tasks.demo.add", every=60, allow_unregistered=True)
    overdue_by(store, "a", AFTER * 2)
    opened: list[bool] = []
    start = threading.Barrier(4)

    def look() -> None:
        start.wait()
        opened.append(store.watch_stall(stall_after=AFTER).opened)

    threads = [threading.Thread(target=look) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(opened) == [False, False, False, True]
    assert len(api.incidents()) == 1


def test_the_failing_monitor_does_not_resolve_a_stall(store: Store) -> None:
    api = Schedules(store)
    api.create("a", "tasks.demo.add", every=60, allow_unregistered=True)
    overdue_by(store, "a", AFTER * 2)
    store.watch_stall(stall_after=AFTER)
    assert store.take_leadership(1, "leader")

    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)

    [incident] = api.incidents()
    assert incident.kind is IncidentKind.STALL
