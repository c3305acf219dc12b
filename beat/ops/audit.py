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
from beat.schedule.timing import Once
from beat.store.schedules import check_version


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
        deleted schedule is created again as that version was, paused or not (its
        window's count of runs starts afresh, as a new schedule's). A one-off whose time
        has passed comes back with no fire time: a restore never runs it again (trigger
        it to). With ``if_version``, VersionConflict unless the schedule is still that
        version, or if it was removed."""
        _, restored = self.store.version_of(name, version)
        self.check_channels(restored.channels)
        if not allow_unregistered:
            self.check_task_registered(restored.task)
            self.check_arguments(restored)
        change = replace(self.change, action=ChangeAction.RESTORE, note=f"to version {version}")

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = replace(restored, enabled=current.definition.enabled)
            next_fire_at = next_fire_when_redefined(current, definition, now)
            if definition.trigger == current.definition.trigger:
                return definition, next_fire_at  # its own fire time, due or not, stays
            return definition, _never_past(definition, next_fire_at, now)

        def create(now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            return restored, _never_past(restored, first_fire_at(restored, now), now)

        try:
            return self.store.replace_schedule(name, build, change=change, if_version=if_version)
        except ScheduleNotFound:
            check_version(name, "removed", if_version)
            return self.store.insert_schedule(create, change=change)


def _never_past(
    definition: ScheduleDefinition, next_fire_at: datetime | None, now: datetime
) -> datetime | None:
    """No fire time for a restored one-off whose time has passed: it ran, or its time
    went by while it was another version; a restore must not run it now."""
    if isinstance(definition.trigger, Once) and definition.trigger.at <= now:
        return None
    return next_fire_at
