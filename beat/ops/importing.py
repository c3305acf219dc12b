"""Moving in from another scheduler: the import part of
:class:`beat.ops.schedules.Schedules`. A source (``beat.sources``) is read, each of
its schedules is matched with the one of the same name here, and what to create,
update, leave or refuse is decided and written in one transaction: all of it, or
nothing at all (a refused row or a conflict stops it, unless told otherwise).

Importing again changes nothing: a schedule imported before from the same source
row, whose definition is unchanged there, is left as it is (its history here too).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from beat.errors import ConfigError, SourceError
from beat.models import ChangeEntry, Schedule, ScheduleDefinition
from beat.ops.schedules_base import SchedulesBase
from beat.schedule.code import beat_schedule_entries, definition_hash
from beat.sources.records import Found, ReadContext, Refusal, ScheduleSource, SourceSchedule
from beat.store.imports import ImportTarget, ImportWrites


class OnConflict(enum.StrEnum):
    """What an import does with a schedule of the same name that it did not make."""

    SKIP = "skip"
    UPDATE = "update"
    FAIL = "fail"


class ImportAction(enum.StrEnum):
    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"
    SKIP = "skip"
    #: A schedule of the same name is in the way (``--on-conflict fail``).
    CONFLICT = "conflict"
    #: The source's row cannot be carried over with its meaning.
    REFUSE = "refuse"


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportLine:
    """What the import does with one schedule of the source, and why."""

    action: ImportAction
    #: Its name here (with ``--prefix``), or in the source for a refused one.
    name: str
    source_id: str
    reason: str
    #: The schedule as it is written (create, update) or would be (the others).
    schedule: SourceSchedule | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportReport:
    source: str
    lines: list[ImportLine]
    dry_run: bool
    #: Refused rows are listed and left out rather than stopping the import.
    skip_invalid: bool

    @property
    def stopped(self) -> bool:
        """Nothing is written: a conflict, or a refused row without ``--skip-invalid``."""
        return any(
            line.action is ImportAction.CONFLICT
            or (line.action is ImportAction.REFUSE and not self.skip_invalid)
            for line in self.lines
        )

    @property
    def written(self) -> bool:
        return not self.dry_run and not self.stopped

    def count(self, action: ImportAction) -> int:
        return sum(line.action is action for line in self.lines)


class ScheduleImports(SchedulesBase):
    """Import the schedules of another scheduler (see the module docstring)."""

    def import_schedules(
        self,
        source: ScheduleSource,
        *,
        dry_run: bool = False,
        only: Collection[str] = (),
        prefix: str = "",
        on_conflict: OnConflict = OnConflict.FAIL,
        skip_invalid: bool = False,
    ) -> ImportReport:
        """Import what ``source`` holds (only the schedules named in ``only`` if given,
        each named ``prefix`` + its name). Nothing is written on a dry run, nor when
        the report says the import stopped. SourceError when the source cannot be read."""
        if self.app is not None:
            self.app.loader.import_default_modules()  # the tasks a row names must be known
        context = ReadContext(
            app=self.app,
            now=self.store.now(),
            default_tz=self.default_tz,
            defaults=self.defaults,
            prefix=prefix,
            code=self._code_entries(),
        )
        found = _only(source.read(context), only)
        names = [item.definition.name for item in found if isinstance(item, SourceSchedule)]

        def plan(targets: Mapping[str, ImportTarget]) -> tuple[ImportReport, ImportWrites]:
            lines = [_line(item, targets.get(_name(item)), on_conflict) for item in found]
            report = ImportReport(
                source=source.describe(), lines=lines, dry_run=dry_run, skip_invalid=skip_invalid
            )
            return report, ImportWrites() if report.stopped else _writes(lines)

        change = replace(self.change, entry=ChangeEntry.IMPORT, note=f"from {source.describe()}")
        return self.store.import_schedules(names, plan, write=not dry_run, change=change)

    def _code_entries(self) -> dict[str, tuple[ScheduleDefinition, str]]:
        """The app's ``beat_schedule`` entries that are schedules here, as beat's sync
        of the code defines them."""
        if self.app is None:
            return {}
        entries = beat_schedule_entries(
            self.app, default_tz=self.default_tz, defaults=self.defaults
        )
        return _valid_entries(entries)


def _valid_entries(
    entries: Mapping[str, tuple[ScheduleDefinition, str] | ConfigError],
) -> dict[str, tuple[ScheduleDefinition, str]]:
    return {name: entry for name, entry in entries.items() if not isinstance(entry, ConfigError)}


def _only(found: list[Found], only: Collection[str]) -> list[Found]:
    if not only:
        return found
    missing = sorted(set(only) - {item.source_name for item in found})
    if missing:
        raise SourceError(
            f"--only {missing[0]!r}: the source has no schedule of that name (its names are"
            " listed by a --dry-run without --only)"
        )
    return [item for item in found if item.source_name in only]


def _name(item: Found) -> str:
    return item.definition.name if isinstance(item, SourceSchedule) else item.source_name


def _line(item: Found, target: ImportTarget | None, on_conflict: OnConflict) -> ImportLine:
    if isinstance(item, Refusal):
        return ImportLine(
            action=ImportAction.REFUSE,
            name=item.source_name,
            source_id=item.source_id,
            reason=item.reason,
        )
    line = ImportLine(
        action=ImportAction.CREATE,
        name=item.definition.name,
        source_id=item.source_id,
        reason="new",
        schedule=item,
    )
    if target is None:
        return line
    if _imported_before(item, target):
        return replace(
            line, action=ImportAction.UNCHANGED, reason="imported before, unchanged since"
        )
    why = _in_the_way(item, target)
    if on_conflict is OnConflict.SKIP:
        return replace(line, action=ImportAction.SKIP, reason=f"{why}: kept as it is")
    if on_conflict is OnConflict.FAIL:
        return replace(
            line,
            action=ImportAction.CONFLICT,
            reason=f"{why}: give --on-conflict update to write over it, or skip to keep it",
        )
    return replace(
        line, action=ImportAction.UPDATE, reason=why, schedule=_history_kept(item, target)
    )


def _imported_before(item: SourceSchedule, target: ImportTarget) -> bool:
    stored = target.schedule
    return (
        isinstance(stored, Schedule)
        and (target.source, target.source_id) == (item.source, item.source_id)
        and definition_hash(stored.definition) == definition_hash(item.definition)
        and stored.description == item.description
    )


def _in_the_way(item: SourceSchedule, target: ImportTarget) -> str:
    if target.source is None:
        made = "defined in code" if target.code_hash is not None else "made here"
        return f"a schedule of that name exists, {made}"
    if (target.source, target.source_id) == (item.source, item.source_id):
        return "imported before, and changed since (here or in the source)"
    return f"a schedule of that name was imported from {target.source} {target.source_id!r}"


def _history_kept(item: SourceSchedule, target: ImportTarget) -> SourceSchedule:
    """An update keeps the history here when it is newer than the source's: the
    schedule ran here since (its timing unchanged), so it must not fire again."""
    stored = target.schedule
    if not isinstance(stored, Schedule) or stored.last_fire_at is None:
        return item
    newer = item.last_fire_at is None or stored.last_fire_at >= item.last_fire_at
    same_timing = (stored.definition.trigger, stored.definition.timezone) == (
        item.definition.trigger,
        item.definition.timezone,
    )
    if not (newer and same_timing):
        return item
    return replace(
        item,
        next_fire_at=stored.next_fire_at,
        last_fire_at=stored.last_fire_at,
        runs_count=stored.runs_count,
    )


def _writes(lines: list[ImportLine]) -> ImportWrites:
    def rows(action: ImportAction) -> list[SourceSchedule]:
        return [
            line.schedule for line in lines if line.action is action and line.schedule is not None
        ]

    return ImportWrites(creates=rows(ImportAction.CREATE), updates=rows(ImportAction.UPDATE))
