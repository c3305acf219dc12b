"""Syncing the schedules defined in code (``beat_schedule``, ``@periodic``) into the
schedules table, at every start of beat: created, updated when their code changed,
removed when gone from the code; a schedule made at runtime is never touched."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    delete,
    func,
    insert,
    or_,
    select,
    text,
    update,
)

from beat.models import (
    Origin,
    ScheduleDefinition,
)
from beat.records import ChangeContext
from beat.schedule.document import definition_values
from beat.schedule.timing import Every
from beat.store.db import StoreConnection
from beat.store.schedule_changes import acting_as
from beat.store.stored_schedules import (
    UnreadableSchedule,
    stored_columns,
    stored_schedule,
)
from beat.store.tables import schedules
from beat.store.unreleased_runs import cancel_unreleased, timing, withdraw_unreleased

#: Serialises the sync of code-defined schedules between beat processes starting together.
SYNC_LOCK_ID = 0x6861_6265_6174_01


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncReport:
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    removed: list[str]
    #: Code schedules whose name is taken by a schedule created at runtime (left alone).
    conflicts: list[str]


class CodeSync(StoreConnection):
    """The sync of code-defined schedules (see the module docstring)."""

    def sync_code_schedules(
        self,
        definitions: Sequence[tuple[ScheduleDefinition, str]],
        first_fire: Callable[[ScheduleDefinition, datetime], datetime | None],
        *,
        change: ChangeContext | None = None,
    ) -> SyncReport:
        """Make the code-defined schedules in the database match ``definitions``.

        Each comes with a hash of its code definition. A schedule whose hash is
        unchanged is left as it is, so runtime changes (a pause, an edited
        argument) survive restarts; one whose code changed takes the new
        definition, but keeps its paused/enabled state; code schedules no longer
        in code are removed (like celery beat); runtime-created schedules are
        never touched. The audit log records each change as ``change``'s.
        """
        report = SyncReport(created=[], updated=[], unchanged=[], removed=[], conflicts=[])
        names = [definition.name for definition, _ in definitions]
        with self._transaction() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": SYNC_LOCK_ID})
            now = acting_as(conn, change)
            existing = {
                row.name: row
                for row in conn.execute(
                    select(*stored_columns())
                    .where(
                        or_(schedules.c.name.in_(names), schedules.c.origin == Origin.CODE.value)
                    )
                    # A claim in flight must not advance next_fire_at under the sync's feet.
                    .with_for_update()
                )
            }
            for definition, code_hash in definitions:
                row = existing.get(definition.name)
                self._sync_one(conn, row, definition, code_hash, now, first_fire, report)
            stale = [
                name
                for name, row in existing.items()
                if row.origin == Origin.CODE.value and name not in names
            ]
            if stale:
                for name in stale:
                    removed = "its schedule was removed from code"
                    cancel_unreleased(conn, existing[name].id, removed)
                conn.execute(delete(schedules).where(schedules.c.name.in_(stale)))
                report.removed.extend(sorted(stale))
        return report

    @staticmethod
    def _sync_one(
        conn: Connection,
        row: Row[Any] | None,
        definition: ScheduleDefinition,
        code_hash: str,
        now: datetime,
        first_fire: Callable[[ScheduleDefinition, datetime], datetime | None],
        report: SyncReport,
    ) -> None:
        values_ = definition_values(definition) | {"code_hash": code_hash}
        if row is None:
            conn.execute(
                insert(schedules).values(**values_, next_fire_at=first_fire(definition, now))
            )
            report.created.append(definition.name)
        elif row.origin != Origin.CODE.value:
            report.conflicts.append(definition.name)
        elif row.code_hash == code_hash:
            report.unchanged.append(definition.name)
        else:
            definition = _with_stored_anchor(definition, row)
            values_ = definition_values(definition) | {"code_hash": code_hash}
            values_.pop("enabled")  # a pause made at runtime survives a code change
            stored = stored_schedule(row)
            # A row that cannot be read (written with psql) takes the code's timing anew.
            retimed = isinstance(stored, UnreadableSchedule) or any(
                values_[name] != row._mapping[name] for name in TIMING_COLUMNS
            )
            next_fire_at = row.next_fire_at
            if retimed:
                next_fire_at = next_fire_after_retiming(
                    row.next_fire_at, first_fire(definition, now), definition, now
                )
            # Otherwise the next fire time stays: fire times missed while no beat ran
            # (a deploy) are claimed late and go through the misfire policy. Runs
            # claimed ahead under the old definition are claimed again under this one.
            values_["next_fire_at"], values_["runs_count"] = withdraw_unreleased(
                conn,
                row,
                next_fire_at,
                retimed=isinstance(stored, UnreadableSchedule)
                or timing(definition) != timing(stored.definition),
            )
            conn.execute(
                update(schedules)
                .where(schedules.c.id == row.id)
                .values(**values_, updated_at=func.now())
            )
            report.updated.append(definition.name)


#: The columns that decide when a schedule fires; a change of any moves its next fire time.
TIMING_COLUMNS = (
    "trigger_kind",
    "cron",
    "cron_both_days",
    "every_seconds",
    "anchor_at",
    "run_at",
    "timezone",
    "start_at",
    "end_at",
)


def next_fire_after_retiming(
    current: datetime | None,
    recomputed: datetime | None,
    definition: ScheduleDefinition,
    now: datetime,
) -> datetime | None:
    """The next fire time of a schedule whose timing changed at database time ``now``.

    The new timing applies from now on (``recomputed``), except for a fire time the
    old timing made due that no beat claimed (``current <= now``: every beat was down
    during a deploy, say). That one stays the next fire time, so the claim runs or
    records it, and the new timing's fire times since, under the misfire policy
    rather than losing them silently; unless the new window (start_at, end_at)
    leaves it out, which says those times are no longer wanted.
    """
    if current is None or current > now or (recomputed is not None and recomputed <= current):
        return recomputed
    if definition.start_at is not None and current < definition.start_at:
        return recomputed
    if definition.end_at is not None and current > definition.end_at:
        return recomputed
    return current


def _with_stored_anchor(definition: ScheduleDefinition, row: Row[Any]) -> ScheduleDefinition:
    """An interval without start_at keeps the anchor it got when first synced (code
    gives it the time of collection): its phase does not move at every deploy."""
    trigger = definition.trigger
    if not isinstance(trigger, Every) or definition.start_at is not None or row.anchor_at is None:
        return definition
    return replace(definition, trigger=Every(seconds=trigger.seconds, anchor=row.anchor_at))
