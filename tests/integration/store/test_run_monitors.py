"""The run monitors' pass against real PostgreSQL (``beat.store.leader.run_monitors``):
overran, late and missed incidents opened once, resolved when the runs say so, a run
past its max_runtime ended before it is revoked, every write fenced by the epoch and
every time the database's."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import delete, insert, select, update

from beat.errors import StaleEpoch
from beat.models import IncidentKind, RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.leader.run_monitors import RunMonitorReport
from beat.store.runs import RunStore
from beat.store.tables import incidents, notifications, runs, schedules
from tests.conftest import SessionEnv

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"


@pytest.fixture
def api(store: Store) -> Schedules:
    assert store.take_leadership(1, "leader")
    return Schedules(store)


def watch(store: Store, epoch: int = 1) -> RunMonitorReport:
    return store.watch_runs(epoch, idle_timeout=5)


def run(
    store: Store,
    name: str,
    *,
    fired: timedelta,
    state: RunState,
    started: timedelta | None = None,
    claimed: timedelta | None = None,
    sent: bool = True,
    owner: str | None = None,
    lease: timedelta = timedelta(minutes=5),
    **columns: Any,
) -> uuid.UUID:
    """A run of ``name`` that fired ``fired`` ago (the database's now), started
    ``started`` ago, claimed ``claimed`` ago (by default a second before it fired),
    held by ``owner`` for ``lease`` from now."""
    schedule = store.get_schedule(name)
    now = store.now()
    run_id = uuid.uuid4()
    finished = state.value in ("succeeded", "failed", "lost", "expired", "skipped", "cancelled")
    values: dict[str, Any] = {
        "id": run_id,
        "schedule_id": schedule.id,
        "schedule_name": name,
        "task": TASK,
        "state": state.value,
        "fire_at": now - fired,
        "claimed_at": now - (claimed if claimed is not None else fired + timedelta(seconds=1)),
        "published_at": (now - fired) if sent else None,
        "started_at": None if started is None else now - started,
        # As the outbox and the worker's start keep them (the first of each).
        "first_published_at": (now - fired) if sent else None,
        "first_started_at": None if started is None else now - started,
        "finished_at": now if finished else None,
        "attempt": 1 if started is not None else 0,
        "lease_owner": owner,
        "lease_expires_at": now + lease if owner else None,
    }
    values.update(columns)
    with store.engine.begin() as conn:
        conn.execute(insert(runs).values(**values))
    return run_id


def open_incidents(store: Store, kind: IncidentKind) -> list[Any]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                select(incidents)
                .where(incidents.c.kind == kind.value, incidents.c.resolved_at.is_(None))
                .order_by(incidents.c.id)
            )
        )


def run_row(store: Store, run_id: uuid.UUID) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(select(runs).where(runs.c.id == run_id)).one()


def end(store: Store, run_id: uuid.UUID, state: RunState = RunState.SUCCEEDED) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(state=state.value, finished_at=store.now())
        )


# -- overran ---------------------------------------------------------------------------


def hung_run(store: Store, api: Schedules, *, owner: str | None = None) -> uuid.UUID:
    """A run of schedule ``hung`` (revoked past its max_runtime of a minute), running for
    two minutes under ``owner``'s lease."""
    api.create(
        "hung",
        TASK,
        every=3600,
        allow_unregistered=True,
        max_runtime=60,
        revoke_after_max_runtime=True,
    )
    return run(
        store,
        "hung",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
        owner=owner,
    )


def test_a_run_past_its_max_runtime_opens_one_overran_incident_resolved_when_it_ends(
    store: Store, api: Schedules
) -> None:
    api.create("etl", TASK, every=3600, allow_unregistered=True, max_runtime=60)
    slow = run(
        store,
        "etl",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
    )

    opened = watch(store)
    again = watch(store)

    assert opened.opened == [("etl", IncidentKind.OVERRAN)]
    assert again.opened == []
    assert again.resolved == []
    [incident] = open_incidents(store, IncidentKind.OVERRAN)
    assert str(slow) in incident.last_error
    assert "past its max_runtime of 1m" in incident.last_error
    assert opened.revoke == []
    assert run_row(store, slow).state == RunState.RUNNING.value

    end(store, slow)
    resolved = watch(store)

    assert resolved.resolved == [("etl", IncidentKind.OVERRAN)]
    assert open_incidents(store, IncidentKind.OVERRAN) == []


def test_a_run_within_its_max_runtime_or_without_one_is_no_incident(
    store: Store, api: Schedules
) -> None:
    api.create("quick", TASK, every=3600, allow_unregistered=True, max_runtime=600)
    api.create("free", TASK, every=3600, allow_unregistered=True)
    run(
        store,
        "quick",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
    )
    run(store, "free", fired=timedelta(hours=3), started=timedelta(hours=2), state=RunState.RUNNING)

    assert watch(store).opened == []


def test_a_run_past_max_runtime_ends_failed_before_its_revoke_and_its_worker_cannot_record_it(
    store: Store, api: Schedules, test_env: SessionEnv
) -> None:
    hung = hung_run(store, api, owner="worker-1")

    report = watch(store)

    assert report.revoke == [str(hung)]
    ended = run_row(store, hung)
    assert (ended.state, ended.lease_owner, ended.lease_expires_at) == ("failed", None, None)
    assert ended.error == "revoked: it ran past its max_runtime of 1m"
    assert ended.duration_seconds == pytest.approx(120, abs=5)
    [incident] = open_incidents(store, IncidentKind.OVERRAN)
    assert "revoked" in incident.last_error
    worker = RunStore.connect(test_env.database_url)
    try:
        assert not worker.heartbeat(hung, owner="worker-1", lease_seconds=30)
        assert not worker.finish(hung, owner="worker-1", state=RunState.SUCCEEDED)
    finally:
        worker.dispose()
    assert run_row(store, hung).state == "failed"
    # Revoked once: the next pass finds nothing running past max_runtime.
    assert watch(store).revoke == []


def test_a_deposed_leader_neither_opens_incidents_nor_ends_runs(
    store: Store, api: Schedules
) -> None:
    hung = hung_run(store, api)
    assert store.take_leadership(2, "newer")

    with pytest.raises(StaleEpoch):
        watch(store, epoch=1)

    assert run_row(store, hung).state == RunState.RUNNING.value
    assert open_incidents(store, IncidentKind.OVERRAN) == []


# -- late ------------------------------------------------------------------------------


def test_a_run_started_past_late_after_opens_a_late_incident_and_an_on_time_one_resolves_it(
    store: Store, api: Schedules
) -> None:
    api.create("report", TASK, every=60, allow_unregistered=True, late_after=30)
    run(
        store,
        "report",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=1, seconds=30),
        state=RunState.SUCCEEDED,
    )

    assert watch(store).opened == [("report", IncidentKind.LATE)]
    [incident] = open_incidents(store, IncidentKind.LATE)
    assert "started 1m 30s after it was due (late after 30s)" in incident.last_error

    run(
        store,
        "report",
        fired=timedelta(minutes=1),
        started=timedelta(seconds=55),
        state=RunState.SUCCEEDED,
    )
    assert watch(store).resolved == [("report", IncidentKind.LATE)]


def test_a_run_still_waiting_past_late_after_is_late_before_it_starts(
    store: Store, api: Schedules
) -> None:
    api.create("queued", TASK, every=60, allow_unregistered=True, late_after=30)
    run(store, "queued", fired=timedelta(seconds=10), state=RunState.QUEUED)
    assert watch(store).opened == []  # not known yet

    with store.engine.begin() as conn:
        conn.execute(update(runs).values(fire_at=store.now() - timedelta(minutes=2)))
    assert watch(store).opened == [("queued", IncidentKind.LATE)]
    [incident] = open_incidents(store, IncidentKind.LATE)
    assert "has not started 2m after it was due" in incident.last_error


# -- missed ----------------------------------------------------------------------------


def set_next_fire(store: Store, name: str, ago: timedelta) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(schedules).where(schedules.c.name == name).values(next_fire_at=store.now() - ago)
        )


def test_a_fire_time_left_unclaimed_past_missed_after_opens_a_missed_incident(
    store: Store, api: Schedules
) -> None:
    api.create("hourly", TASK, every=3600, allow_unregistered=True, missed_after=120)
    set_next_fire(store, "hourly", timedelta(minutes=1))
    assert watch(store).opened == []

    set_next_fire(store, "hourly", timedelta(minutes=5))
    assert watch(store).opened == [("hourly", IncidentKind.MISSED)]
    [incident] = open_incidents(store, IncidentKind.MISSED)
    assert "was not claimed" in incident.last_error

    api.pause("hourly")
    resolved = watch(store)
    assert resolved.resolved == [("hourly", IncidentKind.MISSED)]


def test_a_run_claimed_in_time_but_never_sent_is_missed_and_one_sent_in_time_resolves(
    store: Store, api: Schedules
) -> None:
    api.create("outbox", TASK, every=3600, allow_unregistered=True, missed_after=60)
    run(store, "outbox", fired=timedelta(minutes=5), state=RunState.PENDING, sent=False)

    assert watch(store).opened == [("outbox", IncidentKind.MISSED)]
    [incident] = open_incidents(store, IncidentKind.MISSED)
    assert "was not sent" in incident.last_error

    run(
        store,
        "outbox",
        fired=timedelta(minutes=2),
        state=RunState.SUCCEEDED,
        started=timedelta(minutes=2),
    )
    assert watch(store).resolved == [("outbox", IncidentKind.MISSED)]


def test_a_skip_by_the_overlap_policy_is_not_a_miss_but_one_by_the_misfire_policy_is(
    store: Store, api: Schedules
) -> None:
    api.create("skips", TASK, every=60, allow_unregistered=True, missed_after=60)
    run(
        store,
        "skips",
        fired=timedelta(minutes=5),
        state=RunState.SUCCEEDED,
        started=timedelta(minutes=5),
    )
    overlap = run(store, "skips", fired=timedelta(minutes=3), state=RunState.SKIPPED, sent=False)
    with store.engine.begin() as conn:
        conn.execute(
            update(runs)
            .where(runs.c.id == overlap)
            .values(reason="overlap (skip): the previous run is still active")
        )
    assert watch(store).opened == []

    misfire = run(store, "skips", fired=timedelta(minutes=2), state=RunState.SKIPPED, sent=False)
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.id == misfire).values(reason="misfire: skip policy"))
    assert watch(store).opened == [("skips", IncidentKind.MISSED)]


# -- all kinds -------------------------------------------------------------------------


def test_turning_a_monitor_off_or_removing_the_schedule_resolves_its_incidents(
    store: Store, api: Schedules
) -> None:
    api.create("gone", TASK, every=3600, allow_unregistered=True, missed_after=60)
    api.create("calm", TASK, every=60, allow_unregistered=True, late_after=30)
    set_next_fire(store, "gone", timedelta(minutes=5))
    run(
        store,
        "calm",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=1),
        state=RunState.SUCCEEDED,
    )
    assert sorted(watch(store).opened) == [
        ("calm", IncidentKind.LATE),
        ("gone", IncidentKind.MISSED),
    ]

    api.update("calm", late_after=None)
    with store.engine.begin() as conn:
        conn.execute(delete(runs))
    api.delete("gone")
    resolved = watch(store)

    assert sorted(resolved.resolved) == [("calm", IncidentKind.LATE), ("gone", IncidentKind.MISSED)]
    with store.engine.connect() as conn:
        resolutions = dict(
            conn.execute(select(incidents.c.schedule_name, incidents.c.resolution)).all()
        )
    assert resolutions == {
        "calm": "its late monitor was turned off",
        "gone": "its schedule was removed",
    }


def test_each_event_is_written_once_per_channel_with_the_finding_in_its_text(
    store: Store, api: Schedules
) -> None:
    api.add_webhook("hook", "https://hooks.example.com/habeat")
    api.create("etl", TASK, every=3600, allow_unregistered=True, max_runtime=60)
    slow = run(
        store,
        "etl",
        fired=timedelta(minutes=3),
        started=timedelta(minutes=2),
        state=RunState.RUNNING,
    )
    watch(store)
    watch(store)
    end(store, slow)
    watch(store)

    with store.engine.connect() as conn:
        written = list(conn.execute(select(notifications).order_by(notifications.c.id)))
    assert [(row.channel, row.event) for row in written] == [
        ("hook", "opened"),
        ("hook", "resolved"),
    ]
    opened, resolved = (row.payload for row in written)
    assert opened["incident"]["kind"] == "overran"
    assert opened["text"].startswith(f"Schedule etl overran: run {slow} has been running for 2m")
    assert resolved["text"] == (
        "Schedule etl no longer overruns: no run of it is past its max_runtime any more"
    )


def test_runs_an_operator_made_are_neither_late_nor_missed(store: Store, api: Schedules) -> None:
    api.create(
        "nightly", TASK, cron="0 3 * * *", allow_unregistered=True, late_after=30, missed_after=60
    )
    now = store.now()
    [backfilled] = api.backfill(
        "nightly", start=now - timedelta(days=2), end=now - timedelta(days=1), limit=1
    )
    triggered = api.trigger_run("nightly")
    with store.engine.begin() as conn:
        # Claimed and started long after the fire time they were given.
        conn.execute(
            update(runs)
            .where(runs.c.id.in_([backfilled.id, triggered.id]))
            .values(state="succeeded", started_at=now, finished_at=now)
        )

    assert watch(store).opened == []
