"""The audit log of schedules (``beat_schedule_changes``): who is changing them, told
to the triggers that record each change (migration 0019), and the log as read.

The triggers record every change to a schedule's fields in the transaction that
makes it, whatever makes it, so no write path can forget one. A writer tells them who
it is with :func:`acting_as` before its first write; a transaction that does not is
recorded as the database user's (``sql:<user>``), or as the scheduler's for a
quarantine or an end. A trigger or a backfill changes no field: it is recorded here,
in the transaction that queues its runs (:func:`record_runs_made`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, Text, func, insert, literal, select, text

from beat.errors import ScheduleNotFound
from beat.models import ChangeAction, ChangeEntry, ScheduleDefinition
from beat.records import ChangeContext, ScheduleChange
from beat.store.db import StoreConnection
from beat.store.pg_arrays import bigint_array, text_array
from beat.store.stored_schedules import schedule_from_row, stored_columns
from beat.store.tables import schedule_changes, schedules

#: The setting the triggers read who makes the change from (transaction-local).
CHANGE_SETTING = "habeat.change"
#: Set (``on``) by a transaction that records its changes itself, set-wise: the update
#: trigger leaves its rows alone (a claim, a quarantine).
RECORDED_SETTING = "habeat.recorded"
#: Columns of ``beat_schedules`` a change does not record: a claim writes them, or only
#: the database sets them (the migration's trigger leaves the same ones out).
UNRECORDED = frozenset(
    {"id", "next_fire_at", "last_fire_at", "runs_count", "created_at", "updated_at", "version"}
)
#: Most changes one read returns.
MAX_CHANGES = 1000


def acting_as(conn: Connection, change: ChangeContext | None) -> datetime:
    """Tell the triggers who makes this transaction's changes; the database's now (one
    round trip for both: every write path reads it first)."""
    if change is None:
        now: datetime = conn.execute(select(func.now())).scalar_one()
        return now
    document = json.dumps(change.document())
    row = conn.execute(select(func.now(), func.set_config(CHANGE_SETTING, document, True))).one()
    told: datetime = row[0]
    return told


def record_runs_made(
    conn: Connection,
    name: str,
    action: ChangeAction,
    change: ChangeContext | None,
    note: str,
) -> None:
    """Record that ``change``'s actor queued runs of schedule ``name`` (a trigger or a
    backfill), in the transaction that queues them, at the schedule's version."""
    who = change or ChangeContext(actor="sql", entry=ChangeEntry.SQL)
    conn.execute(
        insert(schedule_changes).from_select(
            ["schedule_name", "version", "action", "actor", "entry", "host", "address", "note"],
            select(
                schedules.c.name,
                schedules.c.version,
                _literal(action.value),
                _literal(who.actor),
                _literal(who.entry.value),
                _literal(who.host),
                _literal(who.address),
                _literal(who.note or note),
            ).where(schedules.c.name == name),
        )
    )


#: The schedule's recorded fields, as the triggers write them (``s``: its row).
_FIELDS = "to_jsonb(s) - CAST(:unrecorded AS text[])"

#: What an end's note says of a schedule left with no fire time (a one-off that fired);
#: a window's end gives its own reason.
ONE_OFF_FIRED = "it has no fire time left (a one-off that fired)"
#: An end records its reason, not the fields: a one-off's are the same before and after
#: (its next fire time is no field of a change), a window's differ only in being
#: disabled; and writing two documents a row would cost a claim of 100,000 one-offs
#: seconds. The version before it holds the same fields, to restore.
_RECORD_ENDS = text(
    "INSERT INTO beat_schedule_changes (schedule_name, version, action, actor, entry, note)"
    " SELECT s.name, s.version + 1, 'end', 'system:end', 'system',"
    " coalesce(ended.reason, CAST(:fired AS text))"
    " FROM unnest(CAST(:ids AS bigint[]), CAST(:reasons AS text[])) AS ended(id, reason)"
    " JOIN beat_schedules AS s ON s.id = ended.id"
)

_RECORD_QUARANTINE = text(
    "INSERT INTO beat_schedule_changes"
    " (schedule_name, version, action, actor, entry, note, before, after)"
    " SELECT s.name, s.version + 1, 'quarantine', 'system:quarantine', 'system', :reason,"
    " fields.before, fields.before || jsonb_build_object('enabled', false,"
    " 'quarantined_at', now(), 'disabled_reason', CAST(:reason AS text))"
    " FROM beat_schedules AS s"
    f" CROSS JOIN LATERAL (SELECT {_FIELDS} AS before) AS fields"
    " WHERE s.id = :schedule_id AND s.quarantined_at IS NULL"
)


def record_ends(conn: Connection, ends: Sequence[tuple[int, str | None]]) -> None:
    """Record that the claim ends these schedules (id, and the reason it disables one
    with: its window ended; None: a one-off fired), before it writes them; the claim
    raises their versions itself. One statement for the lot."""
    if not ends:
        return
    conn.execute(
        _RECORD_ENDS,
        {
            "ids": bigint_array(schedule_id for schedule_id, _ in ends),
            "reasons": text_array(reason for _, reason in ends),
            "fired": ONE_OFF_FIRED,
        },
    )


def record_quarantines(conn: Connection, quarantines: Sequence[tuple[int, str]]) -> None:
    """Record each first quarantine (schedule id, reason) as the scheduler's, before the
    caller writes it and raises its version; from here on the transaction records its
    changes itself (``RECORDED_SETTING``). The rows are locked first (in the order of
    their IDs, as a claim locks them), so that the version recorded is the one the
    caller's update raises: no change of another transaction commits in between."""
    conn.execute(select(func.set_config(RECORDED_SETTING, "on", True)))
    ids = sorted({schedule_id for schedule_id, _ in quarantines})
    conn.execute(
        select(schedules.c.id)
        .where(schedules.c.id.in_(ids))
        .order_by(schedules.c.id)
        .with_for_update()
    )
    for schedule_id, reason in quarantines:
        conn.execute(
            _RECORD_QUARANTINE,
            {"schedule_id": schedule_id, "reason": reason, "unrecorded": sorted(UNRECORDED)},
        )


def _literal(value: str | None) -> Any:
    return literal(value, Text)


class ScheduleChanges(StoreConnection):
    """The audit log as read: newest first."""

    def changes(
        self,
        name: str | None = None,
        *,
        since: datetime | None = None,
        limit: int = 100,
    ) -> list[ScheduleChange]:
        """The changes to schedule ``name`` (every schedule's if None), made at or after
        ``since``, newest first, at most ``limit`` (up to ``MAX_CHANGES``)."""
        query = select(schedule_changes).order_by(schedule_changes.c.id.desc())
        if name is not None:
            query = query.where(schedule_changes.c.schedule_name == name)
        if since is not None:
            query = query.where(schedule_changes.c.changed_at >= since)
        with self._transaction() as conn:
            rows = conn.execute(query.limit(max(1, min(limit, MAX_CHANGES)))).all()
        return [change_from_row(row) for row in rows]

    def schedule_version(self, name: str) -> int | None:
        """The version of schedule ``name`` now; None if there is no such schedule."""
        with self._transaction() as conn:
            found: int | None = conn.execute(
                select(schedules.c.version).where(schedules.c.name == name)
            ).scalar_one_or_none()
        return found

    def version_of(self, name: str, version: int) -> tuple[ScheduleChange, ScheduleDefinition]:
        """The change that made ``version`` of schedule ``name``, and the definition its
        fields make; ScheduleNotFound naming what the log holds if there is none,
        InvalidSchedule if those fields are no schedule now."""
        query = (
            select(schedule_changes)
            .where(
                schedule_changes.c.schedule_name == name,
                schedule_changes.c.version == version,
                schedule_changes.c.after.is_not(None),
            )
            .order_by(schedule_changes.c.id.desc())
            .limit(1)
        )
        with self._transaction() as conn:
            row = conn.execute(query).one_or_none()
            if row is None:
                raise ScheduleNotFound(
                    f"no version {version} of schedule {name!r:.200} in the audit log:"
                    f" `celery -A app schedules audit {name:.200}` lists the versions it keeps"
                )
            fields = conn.execute(_as_stored(row.id)).one()
        return change_from_row(row), schedule_from_row(fields).definition


def _as_stored(change_id: int) -> Any:
    """The fields a change recorded, read as a row of the schedules table is: a CTE
    named as the table stands in for it, made by PostgreSQL from the change's JSON
    (``jsonb_populate_record``), so the one reading of a row applies."""
    recorded = (
        select(text("fields.*"))
        .select_from(
            text(
                "beat_schedule_changes AS change CROSS JOIN LATERAL"
                " jsonb_populate_record(NULL::beat_schedules, change.after) AS fields"
            )
        )
        .where(text("change.id = :change_id").bindparams(change_id=change_id))
        .cte(schedules.name)
    )
    return select(*stored_columns()).add_cte(recorded)


def change_from_row(row: Row[Any]) -> ScheduleChange:
    return ScheduleChange(
        id=row.id,
        schedule_name=row.schedule_name,
        version=row.version,
        changed_at=row.changed_at,
        action=ChangeAction(row.action),
        actor=row.actor,
        entry=ChangeEntry(row.entry),
        host=row.host,
        address=row.address,
        note=row.note,
        before=_fields(row.before),
        after=_fields(row.after),
    )


def _fields(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if value is None else dict(value)
