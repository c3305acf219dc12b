"""The audit log against real PostgreSQL: every change to a schedule, from every entry,
recorded with who, from where and what, in the transaction of the change; nothing for
a claim's own writes; restores; retention."""

from __future__ import annotations

import getpass
import socket
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from beat.claim.policies import plan_fires
from beat.errors import InvalidSchedule, ScheduleExists, ScheduleNotFound
from beat.models import ChangeAction, ChangeEntry, DueSchedule, FirePlan, RunState
from beat.ops.schedules import Schedules
from beat.records import ScheduleChange
from beat.schedule.define import define
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from beat.store.schedule_changes import ONE_OFF_FIRED
from beat.store.tables import schedule_changes, schedules
from tests.integration.helpers import finished_runs

pytestmark = pytest.mark.integration

TASK = "tasks.demo.add"


@pytest.fixture
def api(store: Store) -> Schedules:
    return Schedules(store)


def changes_of(api: Schedules, name: str) -> list[ScheduleChange]:
    """Oldest first."""
    return list(reversed(api.audit(name)))


def test_each_change_from_the_python_api_is_recorded_with_who_where_and_what(
    api: Schedules,
) -> None:
    api.create("report", TASK, cron="0 2 * * *", allow_unregistered=True, kwargs={"fmt": "pdf"})
    api.update("report", cron="30 2 * * *", allow_unregistered=True)
    api.pause("report", note="migrating the reports table")
    api.resume("report")
    api.delete("report")

    log = changes_of(api, "report")

    assert [(c.action, c.version) for c in log] == [
        (ChangeAction.CREATE, 1),
        (ChangeAction.UPDATE, 2),
        (ChangeAction.PAUSE, 3),
        (ChangeAction.RESUME, 4),
        (ChangeAction.DELETE, 4),
    ]
    assert {(c.actor, c.entry, c.host) for c in log} == {
        (getpass.getuser(), ChangeEntry.PYTHON, socket.gethostname())
    }
    created, updated, paused, resumed, deleted = log
    assert created.before is None
    assert created.after is not None
    assert created.after["cron"] == "0 2 * * *"
    assert created.after["kwargs"] == {"fmt": "pdf"}
    assert updated.differences == {"cron": ("0 2 * * *", "30 2 * * *")}
    assert paused.note == "migrating the reports table"
    assert paused.differences == {
        "enabled": (True, False),
        "disabled_reason": (None, "migrating the reports table"),
    }
    assert resumed.differences == {
        "enabled": (False, True),
        "disabled_reason": ("migrating the reports table", None),
    }
    assert deleted.after is None
    assert deleted.before == resumed.after
    # What a claim writes, and what only the database sets, is no part of a change.
    assert not {"next_fire_at", "runs_count", "updated_at", "version", "id"} & set(created.after)


def test_a_schedule_s_version_rises_with_each_change_and_only_then(api: Schedules) -> None:
    assert api.create("nightly", TASK, every=60, allow_unregistered=True).version == 1
    assert api.update("nightly", every=120, allow_unregistered=True).version == 2
    # Pausing a paused schedule changes nothing, so nothing is recorded.
    assert api.pause("nightly").version == 3
    assert api.pause("nightly").version == 3
    assert [c.version for c in changes_of(api, "nightly")] == [1, 2, 3]


def test_a_claim_records_nothing_but_a_schedule_that_ends_is_the_scheduler_s(
    store: Store, api: Schedules
) -> None:
    api.create("often", TASK, every=1, allow_unregistered=True)
    api.create("once", TASK, at=store.now() - timedelta(seconds=5), allow_unregistered=True)
    api.create("bounded", TASK, every=1, max_runs=1, allow_unregistered=True)
    with store.engine.begin() as conn:  # due 10 s ago: a claim's own column, not a change
        conn.execute(
            update(schedules)
            .where(schedules.c.name.in_(["often", "bounded"]))
            .values(next_fire_at=schedules.c.next_fire_at - timedelta(seconds=10))
        )
    assert store.take_leadership(1, "leader")

    def planner(due: DueSchedule, now: datetime, until: datetime | None = None) -> FirePlan:
        return plan_fires(due, now, until=until, misfire_grace=3600, max_catchup=100)

    while store.claim_due(1, batch=1000, plan=planner).schedules_claimed:
        pass  # as a leader does, until nothing more is due

    assert [c.action for c in changes_of(api, "often")] == [ChangeAction.CREATE]
    assert api.get("often").version == 1
    for name in ("once", "bounded"):
        ended = changes_of(api, name)[-1]
        assert (ended.action, ended.actor, ended.entry) == (
            ChangeAction.END,
            "system:end",
            ChangeEntry.SYSTEM,
        )
        assert ended.version == 2
        assert api.get(name).version == 2
        assert ended.before is None
        assert ended.after is None
    assert changes_of(api, "once")[-1].note == ONE_OFF_FIRED
    assert changes_of(api, "bounded")[-1].note == api.get("bounded").disabled_reason
    assert not api.get("bounded").definition.enabled


def test_a_change_written_with_psql_is_the_database_user_s(store: Store, api: Schedules) -> None:
    api.create("by-hand", TASK, every=60, allow_unregistered=True)
    with store.engine.begin() as conn:
        conn.execute(update(schedules).where(schedules.c.name == "by-hand").values(max_attempts=7))
        user = conn.execute(text("SELECT session_user")).scalar_one()

    [_, edited] = changes_of(api, "by-hand")

    assert (edited.action, edited.actor, edited.entry) == (
        ChangeAction.UPDATE,
        f"sql:{user}",
        ChangeEntry.SQL,
    )
    assert edited.address == "127.0.0.1"
    assert edited.differences == {"max_attempts": (3, 7)}


def test_each_entry_names_itself(store: Store, api: Schedules) -> None:
    cli = api.acting_as(ChangeEntry.CLI)
    ui = api.acting_as(ChangeEntry.UI, actor="alice", address="192.0.2.7")
    cli.create("shared", TASK, every=60, allow_unregistered=True)
    ui.update("shared", every=90, allow_unregistered=True)
    definition = define("coded", TASK, every=60)
    api.sync_code([(definition, "hash-1")])

    created, updated = changes_of(api, "shared")
    [synced] = changes_of(api, "coded")

    assert (created.entry, created.actor) == (ChangeEntry.CLI, getpass.getuser())
    assert (updated.entry, updated.actor, updated.address) == (
        ChangeEntry.UI,
        "alice",
        "192.0.2.7",
    )
    assert (synced.entry, synced.action) == (ChangeEntry.CODE, ChangeAction.CREATE)
    assert api.change.entry is ChangeEntry.PYTHON, "acting_as leaves the original alone"


def test_a_pause_after_failures_in_a_row_is_the_scheduler_s_with_its_reason(
    store: Store, api: Schedules
) -> None:
    assert store.take_leadership(1, "leader")
    api.create("flaky", TASK, every=60, allow_unregistered=True, pause_after_failures=2)
    finished_runs(store, "flaky", [RunState.FAILED] * 2, error="KeyError: 'rates'")

    assert store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5).paused

    paused = changes_of(api, "flaky")[-1]
    assert (paused.action, paused.actor, paused.entry) == (
        ChangeAction.PAUSE,
        "system:auto-pause",
        ChangeEntry.SYSTEM,
    )
    assert paused.note is not None
    assert "2 failures in a row" in paused.note


def test_a_refused_change_records_nothing(store: Store, api: Schedules) -> None:
    api.create("unique", TASK, every=60, allow_unregistered=True)
    with pytest.raises(ScheduleExists):
        api.create("unique", TASK, every=30, allow_unregistered=True)
    with pytest.raises(InvalidSchedule):
        api.update("unique", every=-1, allow_unregistered=True)
    with pytest.raises(InvalidSchedule):
        api.pause("unique", note="two\nlines")

    assert [c.action for c in changes_of(api, "unique")] == [ChangeAction.CREATE]


def test_triggers_and_backfills_are_recorded_at_the_schedule_s_version(
    store: Store, api: Schedules
) -> None:
    start = store.now() - timedelta(minutes=10)
    api.create("hourly", TASK, every=60, start_at=start, allow_unregistered=True)
    run = api.trigger_run("hourly")
    made = api.backfill("hourly", start=start, end=start + timedelta(minutes=2))

    _, triggered, backfilled = changes_of(api, "hourly")

    assert (triggered.action, triggered.version, triggered.note) == (
        ChangeAction.TRIGGER,
        1,
        f"run {run.id}",
    )
    assert triggered.before is None
    assert triggered.after is None
    assert backfilled.action is ChangeAction.BACKFILL
    assert backfilled.note is not None
    assert backfilled.note.startswith(f"{len(made)} runs from ")


def test_an_earlier_version_is_restored_as_a_new_change(store: Store, api: Schedules) -> None:
    api.create("report", TASK, cron="0 2 * * *", allow_unregistered=True, kwargs={"fmt": "pdf"})
    api.update("report", cron="30 4 * * *", kwargs={"fmt": "csv"}, allow_unregistered=True)
    api.pause("report")

    restored = api.restore("report", 1, allow_unregistered=True)

    assert restored.definition.kwargs == {"fmt": "pdf"}
    assert restored.definition.trigger.expression == "0 2 * * *"  # type: ignore[union-attr]
    assert not restored.definition.enabled, "a restore keeps whether it is paused"
    assert restored.version == 4
    last = api.audit("report")[0]
    assert (last.action, last.note) == (ChangeAction.RESTORE, "to version 1")
    assert set(last.differences) == {"cron", "kwargs"}


def test_a_deleted_schedule_is_restored_as_it_was(store: Store, api: Schedules) -> None:
    api.create("gone", TASK, every=60, allow_unregistered=True, args=[1, 2])
    api.delete("gone")

    restored = api.restore("gone", 1, allow_unregistered=True)

    assert restored.definition.args == (1, 2)
    assert restored.definition.enabled
    assert restored.next_fire_at is not None
    with pytest.raises(ScheduleNotFound, match="schedules audit gone"):
        api.restore("gone", 9, allow_unregistered=True)


def test_changes_older_than_the_retention_are_pruned_with_the_runs(
    store: Store, api: Schedules
) -> None:
    api.create("old", TASK, every=60, allow_unregistered=True)
    api.update("old", every=120, allow_unregistered=True)
    with store.engine.begin() as conn:
        conn.execute(
            update(schedule_changes)
            .where(schedule_changes.c.version == 1, schedule_changes.c.schedule_name == "old")
            .values(changed_at=datetime.now(UTC) - timedelta(days=40))
        )
    assert store.take_leadership(1, "leader")

    report = store.prune(timedelta(days=30))

    assert report.changes == 1
    assert [c.version for c in api.audit("old")] == [2]


def test_the_log_is_read_newest_first_since_a_time_and_across_schedules(
    store: Store, api: Schedules
) -> None:
    api.create("a", TASK, every=60, allow_unregistered=True)
    middle = store.now()
    api.create("b", TASK, every=60, allow_unregistered=True)
    api.update("a", every=30, allow_unregistered=True)

    assert [(c.schedule_name, c.version) for c in api.audit()] == [("a", 2), ("b", 1), ("a", 1)]
    assert [(c.schedule_name, c.version) for c in api.audit(since=middle)] == [
        ("a", 2),
        ("b", 1),
    ]
    assert len(api.audit(limit=1)) == 1


def _recorded_columns(store: Store) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(
            select(text("pg_get_triggerdef(oid)"))
            .select_from(text("pg_trigger"))
            .where(text("tgname = 'beat_schedules_recorded_update'"))
        ).scalar_one()


def test_the_update_trigger_watches_every_column_a_change_records(store: Store) -> None:
    from beat.store.schedule_changes import UNRECORDED

    definition = _recorded_columns(store)
    missing = [
        column.name
        for column in schedules.c
        if column.name not in UNRECORDED and f"old.{column.name}" not in definition.lower()
    ]
    assert not missing, f"create the update trigger again with these columns: {missing}"


def test_the_sync_of_code_schedules_at_beat_start_is_the_scheduler_s(
    make_scheduler: Callable[..., HAScheduler], api: Schedules
) -> None:
    code = {"beat_schedule": {"job": {"task": "tasks.demo.add", "schedule": 60.0}}}
    make_scheduler(code).tick()
    changed = {"beat_schedule": {"job": {"task": "tasks.demo.add", "schedule": 90.0}}}
    make_scheduler(changed).tick()

    created, updated = changes_of(api, "job")

    assert {(c.actor, c.entry, c.host) for c in (created, updated)} == {
        ("system:code-sync", ChangeEntry.CODE, socket.gethostname())
    }
    assert updated.differences["every_seconds"] == (60.0, 90.0)


def test_a_quarantine_by_the_claim_is_the_scheduler_s_with_its_reason(
    store: Store, api: Schedules
) -> None:
    """A row written with psql that cannot be planned: the claim quarantines it, and
    records that itself (the claim's transaction leaves the trigger out)."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
                " next_fire_at, jitter_seconds) VALUES ('bad-jitter', 'tasks.demo.add',"
                " 'every', 1, now(), now(), 1e15)"
            )
        )
    assert store.take_leadership(1, "leader")

    def planner(due: DueSchedule, now: datetime, until: datetime | None = None) -> FirePlan:
        return plan_fires(due, now, until=until, misfire_grace=3600, max_catchup=100)

    store.claim_due(1, batch=100, plan=planner)
    store.claim_due(1, batch=100, plan=planner)  # quarantined once, recorded once

    created, quarantined = changes_of(api, "bad-jitter")
    assert created.actor.startswith("sql:")
    assert (quarantined.action, quarantined.actor, quarantined.version) == (
        ChangeAction.QUARANTINE,
        "system:quarantine",
        2,
    )
    assert quarantined.note is not None
    assert "jitter" in quarantined.note
    assert set(quarantined.differences) == {"enabled", "quarantined_at", "disabled_reason"}
    with store.engine.connect() as conn:
        assert conn.execute(select(schedules.c.version)).scalar_one() == 2


def test_a_restore_never_runs_a_one_off_whose_time_has_passed(store: Store, api: Schedules) -> None:
    """A review's finding: restoring a removed one-off inserted it due in the past, so it
    ran again at once (its old runs hold no schedule ID for the unique check)."""
    api.create("once", TASK, at=store.now() - timedelta(seconds=5), allow_unregistered=True)
    api.delete("once")
    restored = api.restore("once", 1, allow_unregistered=True)
    assert restored.next_fire_at is None

    api.create("moved", TASK, at=store.now() - timedelta(seconds=5), allow_unregistered=True)
    api.update("moved", at=store.now() + timedelta(hours=1), allow_unregistered=True)
    assert api.restore("moved", 1, allow_unregistered=True).next_fire_at is None


def test_a_name_made_again_goes_on_from_its_last_version(api: Schedules) -> None:
    """A review's finding: versions began at 1 again, so two changes had one version."""
    api.create("again", TASK, every=60, allow_unregistered=True)
    api.update("again", every=90, allow_unregistered=True)
    api.delete("again")
    made = api.create("again", TASK, every=30, allow_unregistered=True)
    assert made.version == 3
    assert [c.version for c in changes_of(api, "again")] == [1, 2, 2, 3]
    assert api.restore("again", 2, allow_unregistered=True).definition.trigger.seconds == 90  # type: ignore[union-attr]


def test_a_pause_note_never_replaces_the_reason_of_a_quarantine(
    store: Store, api: Schedules
) -> None:
    api.create("sick", TASK, every=60, allow_unregistered=True)
    with store.engine.begin() as conn:
        conn.execute(
            update(schedules)
            .where(schedules.c.name == "sick")
            .values(enabled=False, disabled_reason="cannot be planned", quarantined_at=func.now())
        )
    assert api.pause("sick", note="looking into it").disabled_reason == "cannot be planned"


def test_a_retried_create_is_not_built_again(store: Store, api: Schedules) -> None:
    """A review's finding: a retried create was validated again first, so a one-off
    whose time had passed since was refused instead of returned."""
    first, made = api.create_once("key-1", "once", TASK, every=60, allow_unregistered=True)

    def never(now: datetime) -> Any:
        raise AssertionError("a retry is not built again")

    with store.engine.connect() as conn:
        stored = conn.execute(text("SELECT request_hash FROM beat_idempotency_keys")).scalar_one()
    again, made_again = store.insert_schedule_once("key-1", stored, never)
    assert (made, made_again) == (True, False)
    assert again.id == first.id
