"""The audit log of schedules as operators use it, the part of
:class:`beat.ops.schedules.Schedules` that reads it and restores an earlier version.

The log itself is written by PostgreSQL (``beat.store.schedule_changes``): every
change to a schedule, from any entry, in the transaction that makes it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from beat.errors import ScheduleNotFound
from beat.models import ChangeAction, Schedule, ScheduleDefinition
from beat.ops.schedule_commands import ScheduleCommands, next_fire_when_redefined
from beat.records import ScheduleChange
from beat.schedule.define import first_fire_at


class ScheduleAudit(ScheduleCommands):
    """Who changed which schedule, when, from where, and what; and restores."""

    def audit(
        self,
        name: str | None = None,
        *,
        since: datetime | timedelta | None = None,
        limit: int = 100,
    ) -> list[ScheduleChange]:
        """The changes to schedule ``name`` (to every schedule if None), newest first:
        those made at or after ``since`` (a duration counts back from the database's
        now), at most ``limit``. A deleted schedule's changes stay until the run
        history's retention removes them."""
        if isinstance(since, timedelta):
            since = self.store.now() - since
        return self.store.changes(name, since=since, limit=limit)

    def version_now(self, name: str) -> int | None:
        """The version of schedule ``name`` now (None once it is removed)."""
        return self.store.schedule_version(name)

    def restore(
        self,
        name: str,
        version: int,
        *,
        allow_unregistered: bool = False,
        if_version: str | None = None,
    ) -> Schedule:
        """Make the fields of ``version`` of schedule ``name`` its own again, as a new
        change (the log records it as a restore). Its task, timing, arguments, options,
        policies and monitors come back; whether it is paused stays as it is now. A
        deleted schedule is created again as that version was, paused or not."""
        _, restored = self.store.version_of(name, version)
        self.check_channels(restored.channels)
        if not allow_unregistered:
            self.check_task_registered(restored.task)
            self.check_arguments(restored)
        change = replace(self.change, action=ChangeAction.RESTORE, note=f"to version {version}")

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = replace(restored, enabled=current.definition.enabled)
            return definition, next_fire_when_redefined(current, definition, now)

        def create(now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            return restored, first_fire_at(restored, now)

        try:
            return self.store.replace_schedule(name, build, change=change, if_version=if_version)
        except ScheduleNotFound:
            return self.store.insert_schedule(create, change=change)
