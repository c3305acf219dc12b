"""Schedules imported from another scheduler (``beat.ops.importing``), written in one
transaction: every schedule of an import, or none. The rows an import may write over
are locked first and handed to the caller, which decides what to create and update
(and, for a dry run, writes nothing)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, Row, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from beat.errors import ScheduleExists
from beat.models import ScheduleDefinition
from beat.records import ChangeContext
from beat.schedule.document import definition_values
from beat.store.db import StoreConnection, is_unique_violation
from beat.store.schedule_changes import acting_as
from beat.store.stored_schedules import (
    StoredSchedule,
    UnreadableSchedule,
    stored_columns,
    stored_schedule,
)
from beat.store.tables import schedules
from beat.store.unreleased_runs import cancel_unreleased, timing, withdraw_unreleased

PlanT = TypeVar("PlanT")


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportTarget:
    """A stored schedule whose name an import uses, and where it came from."""

    schedule: StoredSchedule
    #: The scheduler it was imported from, and its identity there (None: made here).
    source: str | None
    source_id: str | None
    code_hash: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportedRow:
    """What an import writes for one schedule: its definition and its history."""

    definition: ScheduleDefinition
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    runs_count: int
    #: The scheduler it came from (``django-celery-beat``, ``redbeat``, ``celery-beat``)
    #: and its identity there: a row id, a Redis key, an entry name.
    source: str
    source_id: str
    #: For an entry of the app's ``beat_schedule``: its code hash.
    code_hash: str | None = None
    description: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ImportWrites:
    creates: Sequence[ImportedRow] = ()
    updates: Sequence[ImportedRow] = ()


class ImportStore(StoreConnection):
    """The writes of ``schedules import``."""

    def import_schedules(
        self,
        names: Sequence[str],
        plan: Callable[[Mapping[str, ImportTarget]], tuple[PlanT, ImportWrites]],
        *,
        write: bool,
        change: ChangeContext | None = None,
    ) -> PlanT:
        """Lock the schedules called ``names``, give them to ``plan``, and write what it
        returns (only if ``write``), all in one transaction, recorded in the audit log as
        ``change``'s; what ``plan`` made of them."""
        with self._transaction() as conn:
            acting_as(conn, change)
            rows = {
                row.name: row
                for row in conn.execute(
                    select(*stored_columns()).where(schedules.c.name.in_(names)).with_for_update()
                )
            }
            outcome, writes = plan({name: _target(row) for name, row in rows.items()})
            if write:
                for created in writes.creates:
                    _insert(conn, created)
                for updated in writes.updates:
                    _update(conn, rows[updated.definition.name], updated)
        return outcome


def _target(row: Row[Any]) -> ImportTarget:
    return ImportTarget(
        schedule=stored_schedule(row),
        source=row.source,
        source_id=row.source_id,
        code_hash=row.code_hash,
    )


def _values(imported: ImportedRow) -> dict[str, Any]:
    return definition_values(imported.definition) | {
        "code_hash": imported.code_hash,
        "source": imported.source,
        "source_id": imported.source_id,
        "next_fire_at": imported.next_fire_at,
        "last_fire_at": imported.last_fire_at,
        "runs_count": imported.runs_count,
        "description": imported.description,
    }


def _insert(conn: Connection, imported: ImportedRow) -> None:
    try:
        conn.execute(insert(schedules).values(**_values(imported)))
    except IntegrityError as exc:
        if is_unique_violation(exc, "beat_schedules_name_key"):
            raise ScheduleExists(
                f"a schedule named '{imported.definition.name}' was created while importing:"
                " import again (nothing was written)"
            ) from exc
        raise


def _update(conn: Connection, row: Row[Any], imported: ImportedRow) -> None:
    """Write over a stored schedule; its runs claimed ahead are cancelled or withdrawn as
    an update through the API does it (``ScheduleStore.replace_schedule``)."""
    values = _values(imported)
    current = stored_schedule(row)
    if row.enabled and not imported.definition.enabled:
        cancel_unreleased(conn, row.id, "its schedule was paused by an import")
    else:
        retimed = isinstance(current, UnreadableSchedule) or timing(imported.definition) != timing(
            current.definition
        )
        next_fire_at, runs_count = withdraw_unreleased(
            conn, row, imported.next_fire_at, retimed=retimed
        )
        values["next_fire_at"] = next_fire_at
        if imported.runs_count == row.runs_count:  # the history kept is this scheduler's
            values["runs_count"] = runs_count
    conn.execute(
        update(schedules)
        .where(schedules.c.id == row.id)
        .values(**values, updated_at=func.now(), disabled_reason=None, quarantined_at=None)
    )
