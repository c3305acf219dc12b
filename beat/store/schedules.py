"""The schedules table, as one store (:class:`ScheduleStore`) composed of its parts:
here, create, read, change and delete schedules, list the quarantined and the
overdue ones; the sync of those defined in code (``beat.store.code_sync``); the
runs an operator asks of a schedule, a manual trigger or a backfill
(``beat.store.operator_runs``). Callers get domain objects and domain errors
(``beat.errors``), never rows or driver exceptions; time is the database's
``now()``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    any_,
    bindparam,
    delete,
    false,
    func,
    insert,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, TEXT
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError

from beat.errors import (
    IdempotencyKeyReused,
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
    VersionConflict,
)
from beat.models import (
    Origin,
    Schedule,
    ScheduleDefinition,
    version_tag,
)
from beat.records import ChangeContext
from beat.schedule.document import definition_values
from beat.store import schema
from beat.store.code_sync import CodeSync
from beat.store.db import (
    create_store_engine,
    first_line,
    is_unique_violation,
)
from beat.store.imports import ImportStore
from beat.store.operator_runs import OperatorRuns
from beat.store.schedule_changes import ScheduleChanges, acting_as
from beat.store.schedule_outcomes import failing_names
from beat.store.stored_schedules import (
    StoredSchedule,
    readable,
    schedule_from_row,
    schedule_not_found,
    stored_columns,
    stored_schedule,
)
from beat.store.tables import idempotency_keys, schedules
from beat.store.unreleased_runs import cancel_unreleased, timing, withdraw_unreleased

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleFilter:
    """Which schedules a page of the schedule list shows; every condition given must hold."""

    #: A case-insensitive substring of the schedule's name or of its task.
    search: str | None = None
    #: True: only the paused (disabled) schedules; False: only the enabled ones.
    paused: bool | None = None
    #: Only the schedules whose newest run (by fire time) failed or was lost.
    failing: bool = False
    origin: Origin | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class QuarantinedSchedule:
    """A schedule the scheduler disabled because it could not be planned or published."""

    name: str
    reason: str | None
    quarantined_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class OverdueSchedule:
    """An enabled schedule whose fire time passed a while ago and is still unclaimed."""

    name: str
    next_fire_at: datetime
    #: How long before the database's now it was due.
    overdue_by: timedelta


@dataclass(frozen=True, kw_only=True, slots=True)
class OverdueSchedules:
    """The oldest overdue schedules (at most as many as asked), and how many there are."""

    schedules: list[OverdueSchedule]
    total: int


class ScheduleStore(CodeSync, OperatorRuns, ImportStore, ScheduleChanges):
    """PostgreSQL access to the schedules table (and the schema)."""

    @classmethod
    def connect(
        cls, url: str, *, pool_size: int = 5, setting: str = "habeat_database_url"
    ) -> ScheduleStore:
        """A store on ``url``; no connection is made until first use."""
        return cls(create_store_engine(url, pool_size=pool_size), setting=setting)

    # -- schema -------------------------------------------------------------------

    def migrate(self) -> str:
        """Create the database if it is missing, then upgrade the schema to the newest revision."""
        with self._translated_errors():
            if schema.ensure_database(self.engine):
                logger.warning("created database %s", self.engine.url.database)
            return schema.migrate(self.engine)

    def check_schema(self) -> None:
        with self._translated_errors():
            schema.check_schema(self.engine)

    def now(self) -> datetime:
        with self._transaction() as conn:
            return conn.execute(select(func.now())).scalar_one()

    # -- schedules ----------------------------------------------------------------

    def insert_schedule(
        self,
        build: Callable[[datetime], tuple[ScheduleDefinition, datetime | None]],
        *,
        change: ChangeContext | None = None,
    ) -> Schedule:
        """Insert a new schedule: ``build(now)`` gives its definition and next fire time
        from the database time of the inserting transaction; the audit log records it
        as ``change``'s."""
        with self._transaction() as conn:
            now = acting_as(conn, change)
            return _inserted(conn, *build(now))

    def insert_schedule_once(
        self,
        key: str,
        request_hash: str,
        build: Callable[[datetime], tuple[ScheduleDefinition, datetime | None]],
        *,
        change: ChangeContext | None = None,
    ) -> tuple[Schedule, bool]:
        """Insert a new schedule once per idempotency ``key``: the schedule, and whether
        this call made it. A second call with the key and the same ``request_hash``
        gets the schedule the first made (it waits for the first to commit);
        IdempotencyKeyReused if the hash differs, ScheduleNotFound if that schedule was
        removed since."""
        with self._transaction() as conn:
            now = acting_as(conn, change)
            known = conn.execute(
                select(idempotency_keys.c.key).where(idempotency_keys.c.key == key)
            ).scalar_one_or_none()
            if known is not None:
                # A retry: what it made, not built again (a one-off's time may have
                # passed since, a channel may be gone: the retry still gets the schedule).
                return _made_before(conn, key, request_hash), False
            definition, next_fire_at = build(now)
            taken = conn.execute(
                pg_insert(idempotency_keys)
                .values(key=key, request_hash=request_hash, schedule_name=definition.name)
                .on_conflict_do_nothing()
                .returning(idempotency_keys.c.key)
            ).scalar_one_or_none()
            if taken is None:
                return _made_before(conn, key, request_hash), False
            return _inserted(conn, definition, next_fire_at), True

    def get_schedule(self, name: str) -> Schedule:
        """Schedule ``name``; InvalidSchedule if its row cannot be read (see
        :meth:`stored_schedule`)."""
        return readable(self.stored_schedule(name))

    def stored_schedule(self, name: str) -> StoredSchedule:
        """Schedule ``name`` as stored: an :class:`UnreadableSchedule` if its row
        cannot be read as a schedule."""
        with self._transaction() as conn:
            row = conn.execute(
                select(*stored_columns()).where(schedules.c.name == name)
            ).one_or_none()
        if row is None:
            raise schedule_not_found(name)
        return stored_schedule(row)

    def list_schedules(self) -> list[StoredSchedule]:
        with self._transaction() as conn:
            rows = conn.execute(select(*stored_columns()).order_by(schedules.c.name)).all()
        return [stored_schedule(row) for row in rows]

    def page_schedules(
        self, where: ScheduleFilter, *, offset: int, limit: int
    ) -> tuple[list[StoredSchedule], int]:
        """The schedules matching ``where`` by name, ``limit`` of them from ``offset``,
        and how many match in all (counted in the same transaction)."""
        with self._transaction() as conn:
            failing = failing_names(conn) if where.failing else None
            names, total = _page_names(conn, _filter_conditions(where, failing), offset, limit)
            # The columns of the page's rows only: reading them for every row skipped by
            # the offset too cost 70 ms at the last of 2,000 pages.
            page = (
                select(*stored_columns())
                .where(schedules.c.name == any_(bindparam("names", names, type_=ARRAY(TEXT))))
                .order_by(schedules.c.name)
            )
            rows = conn.execute(page).all() if names else []
        return [stored_schedule(row) for row in rows], total

    def replace_schedule(
        self,
        name: str,
        build: Callable[[Schedule, datetime], tuple[ScheduleDefinition, datetime | None]],
        *,
        change: ChangeContext | None = None,
        disabled_reason: str | None = None,
        if_version: str | None = None,
    ) -> Schedule:
        """Update one schedule under a row lock: ``build(current, now)`` gives the new
        definition and next fire time (so concurrent updates cannot interleave); the
        audit log records it as ``change``'s. A schedule it pauses keeps
        ``disabled_reason`` (a pause's note) if one is given. With ``if_version``,
        VersionConflict unless the schedule is still that version (``Schedule.tag``)."""
        with self._transaction() as conn:
            now = acting_as(conn, change)
            row = conn.execute(
                select(*stored_columns()).where(schedules.c.name == name).with_for_update()
            ).one_or_none()
            if row is None:
                raise schedule_not_found(name)
            current = readable(stored_schedule(row))
            check_version(name, current.tag, if_version)
            definition, next_fire_at = build(current, now)
            runs_count = row.runs_count
            if row.enabled and not definition.enabled:
                cancel_unreleased(conn, row.id, "its schedule was paused")
            elif definition != current.definition:
                retimed = timing(definition) != timing(current.definition)
                next_fire_at, runs_count = withdraw_unreleased(
                    conn, row, next_fire_at, retimed=retimed
                )
            values_ = definition_values(definition)
            values_.pop("origin")  # a schedule keeps its origin
            values_.pop("code_hash")
            updated = conn.execute(
                update(schedules)
                .where(schedules.c.id == row.id)
                .values(
                    **values_,
                    next_fire_at=next_fire_at,
                    runs_count=runs_count,
                    updated_at=func.now(),
                )
                .values(
                    # A schedule enabled again starts afresh: its old disable reason goes,
                    # and so does its quarantine.
                    # A pause's note is the reason of a pause only: a schedule already
                    # disabled (quarantined, its window ended) keeps its first cause.
                    disabled_reason=_disabled_reason(
                        definition.enabled, disabled_reason if row.enabled else None
                    ),
                    quarantined_at=None if definition.enabled else schedules.c.quarantined_at,
                )
                .returning(*stored_columns())
            ).one()
        return schedule_from_row(updated)

    def quarantined(self) -> list[QuarantinedSchedule]:
        """The quarantined schedules, oldest quarantine first."""
        query = (
            select(schedules.c.name, schedules.c.disabled_reason, schedules.c.quarantined_at)
            .where(schedules.c.quarantined_at.is_not(None))
            .order_by(schedules.c.quarantined_at, schedules.c.name)
        )
        with self._transaction() as conn:
            return [
                QuarantinedSchedule(
                    name=row.name, reason=row.disabled_reason, quarantined_at=row.quarantined_at
                )
                for row in conn.execute(query)
            ]

    def overdue(self, *, grace: timedelta, limit: int) -> OverdueSchedules:
        """Enabled schedules due more than ``grace`` before now: a leader claims a fire
        time within moments, so these wait for one that does not come (or cannot keep
        up). Oldest first, at most ``limit``, with their total; on the partial index
        of due schedules, whose predicate the query repeats."""
        before = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, grace.total_seconds())
        query = (
            select(
                schedules.c.name,
                schedules.c.next_fire_at,
                (func.now() - schedules.c.next_fire_at).label("overdue_by"),
                func.count().over().label("total"),
            )
            .where(schedules.c.enabled, schedules.c.next_fire_at.is_not(None))
            .where(schedules.c.next_fire_at < before)
            # -infinity (written with psql) has no lateness; the claim quarantines it.
            .where(func.isfinite(schedules.c.next_fire_at))
            .order_by(schedules.c.next_fire_at, schedules.c.name)
            .limit(limit)
        )
        with self._transaction() as conn:
            rows = list(conn.execute(query))
        found = [
            OverdueSchedule(name=row.name, next_fire_at=row.next_fire_at, overdue_by=row.overdue_by)
            for row in rows
        ]
        return OverdueSchedules(schedules=found, total=rows[0].total if rows else 0)

    def delete_schedule(
        self, name: str, *, change: ChangeContext | None = None, if_version: str | None = None
    ) -> None:
        """Delete a schedule made at runtime; its run history stays (``schedule_id``
        becomes NULL), and so does its audit log. One defined in code is refused: the
        next sync would create it again, so it is removed from the code, or paused."""
        with self._transaction() as conn:
            acting_as(conn, change)
            row = conn.execute(
                select(schedules.c.id, schedules.c.origin, schedules.c.version)
                .where(schedules.c.name == name)
                .with_for_update()
            ).one_or_none()
            if row is None:
                raise schedule_not_found(name)
            check_version(name, version_tag(row.id, row.version), if_version)
            if row.origin == Origin.CODE.value:
                raise InvalidSchedule(
                    f"schedule '{name}' is defined in code (beat_schedule or @periodic) and the"
                    f" next sync would bring it back: remove it from the code (then `celery -A"
                    f" app schedules sync`), or pause it (`celery -A app schedules pause {name}`)"
                )
            # First: the runs lose their schedule_id with it (ON DELETE SET NULL).
            cancel_unreleased(conn, row.id, "its schedule was deleted")
            conn.execute(delete(schedules).where(schedules.c.id == row.id))


def _inserted(
    conn: Connection, definition: ScheduleDefinition, next_fire_at: datetime | None
) -> Schedule:
    """The schedule inserted; ScheduleExists (the transaction then rolls back) if its
    name is taken, StoreError if PostgreSQL refuses it otherwise."""
    try:
        row = conn.execute(
            insert(schedules)
            .values(**definition_values(definition), next_fire_at=next_fire_at)
            .returning(*stored_columns())
        ).one()
    except IntegrityError as exc:
        if is_unique_violation(exc, "beat_schedules_name_key"):
            raise ScheduleExists(
                f"a schedule named '{definition.name}' exists already:"
                " pick another name, or update or remove it"
            ) from exc
        raise StoreError(f"the schedule was refused by PostgreSQL: {first_line(exc.orig)}") from exc
    return schedule_from_row(row)


def _made_before(conn: Connection, key: str, request_hash: str) -> Schedule:
    """The schedule an earlier create with idempotency ``key`` made."""
    earlier = conn.execute(
        select(idempotency_keys).where(idempotency_keys.c.key == key)
    ).one_or_none()
    if earlier is None:  # pruned by retention between the two statements
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r:.80} expired as it was looked at: send the request again"
        )
    if earlier.request_hash != request_hash:
        raise IdempotencyKeyReused(
            f"Idempotency-Key {key!r:.80} was used for another request (schedule"
            f" {earlier.schedule_name!r:.200}): send a new key with a new request"
        )
    row = conn.execute(
        select(*stored_columns()).where(schedules.c.name == earlier.schedule_name)
    ).one_or_none()
    if row is None:
        raise ScheduleNotFound(
            f"schedule {earlier.schedule_name!r:.200}, which Idempotency-Key {key!r:.80}"
            " created, was removed since: send a new key to create it again"
        )
    return schedule_from_row(row)


def check_version(name: str, current: str, expected: str | None) -> None:
    """VersionConflict if the caller expects another version of schedule ``name``."""
    if expected is None or expected == current:
        return
    raise VersionConflict(
        f"schedule {name!r:.200} changed since it was read (version {expected}, now"
        f" {current}): read it again and make the change on what it is now; what changed:"
        f" `celery -A app schedules audit {name:.200}`",
        name=name,
        current=current,
        expected=expected,
    )


def _disabled_reason(enabled: bool, given: str | None) -> Any:
    """A schedule enabled has no disable reason; one disabled keeps its own unless a
    reason is given."""
    if enabled:
        return None
    return schedules.c.disabled_reason if given is None else given


def _page_names(
    conn: Connection, conditions: list[ColumnElement[bool]], offset: int, limit: int
) -> tuple[list[str], int]:
    """The names of the page of the schedules matching ``conditions`` and how many
    match. Unfiltered, both from the index of names alone. Filtered, one scan of the
    table gives both (the count a window over the matches): a search reads every
    name and task once, not once for the count and again for the page."""
    ordered = select(schedules.c.name).order_by(schedules.c.name).offset(offset).limit(limit)
    if not conditions:
        total = conn.execute(select(func.count()).select_from(schedules)).scalar_one()
        return list(conn.execute(ordered).scalars()) if offset < total else [], total
    found = conn.execute(ordered.add_columns(func.count().over()).where(*conditions)).all()
    if found:
        return [row[0] for row in found], found[0][1]
    # Past the last match (or none): the window saw no row, count them.
    count = select(func.count()).select_from(schedules).where(*conditions)
    return [], 0 if offset == 0 else conn.execute(count).scalar_one()


def _filter_conditions(
    where: ScheduleFilter, failing: list[str] | None
) -> list[ColumnElement[bool]]:
    """SQL conditions of ``where``; ``failing``: the names of the failing schedules,
    read once (by :func:`~beat.store.schedule_outcomes.failing_names`) for both the
    count and the page."""
    conditions: list[ColumnElement[bool]] = []
    if where.search is not None:
        conditions.append(
            or_(contains(schedules.c.name, where.search), contains(schedules.c.task, where.search))
        )
    if where.paused is not None:
        conditions.append(schedules.c.enabled == (false() if where.paused else true()))
    if where.origin is not None:
        conditions.append(schedules.c.origin == where.origin.value)
    if failing is not None:
        conditions.append(
            schedules.c.name == any_(bindparam("failing", failing, type_=ARRAY(TEXT)))
        )
    return conditions


def contains(column: ColumnElement[str], part: str) -> ColumnElement[bool]:
    """``column`` holds ``part``, ignoring case: ``ILIKE '%part%'``, its wildcards
    escaped. Written ``lower(column) LIKE lower(pattern)``, which is what ILIKE does in
    a UTF-8 database, except that ILIKE folds the pattern again for every row (at
    100,000 schedules: 40 ms a scan rather than 90)."""
    pattern = f"%{escape_like(part)}%"
    return func.lower(column).like(func.lower(pattern), escape="\\")


def escape_like(text_: str) -> str:
    """``text_`` matched literally by LIKE with ``ESCAPE '\\'``: its wildcards escaped."""
    return text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
