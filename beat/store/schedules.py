"""The schedules table: create, read, change and delete schedules, and sync those
defined in code; list the quarantined ones; queue the runs an operator asks of a
schedule (a manual trigger, a backfill). Callers get domain objects and domain
errors (``beat.errors``), never rows or driver exceptions; time is the
database's ``now()``.

A manual trigger or a backfill is an outbox entry: ``pending`` runs with no
epoch. The leader publishes pending runs of any other epoch at its next tick
(see ``LeaderStore.pending_runs``), and the ``NOTIFY`` sent in the same
transaction wakes it at once. The schedule's ``next_fire_at`` is not touched."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    Select,
    Text,
    any_,
    bindparam,
    cast,
    delete,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, TEXT
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import IntegrityError

from beat.errors import (
    InvalidSchedule,
    ScheduleExists,
    ScheduleNotFound,
    StoreError,
)
from beat.models import (
    MisfirePolicy,
    Origin,
    OverlapPolicy,
    RunState,
    Schedule,
    ScheduleDefinition,
    TriggerKind,
)
from beat.schedule.document import definition_values
from beat.schedule.options import check_publish_options
from beat.schedule.payload import decoded_json, stored_payload
from beat.schedule.timing import Every, parse_zone
from beat.store import schema
from beat.store.db import (
    StoreConnection,
    create_store_engine,
    first_line,
    is_unique_violation,
)
from beat.store.history import RunRecord, record_from_row
from beat.store.rows import (
    SCHEDULE_TIMES,
    finite,
    infinite_times,
    new_run_values,
    preview,
    run_copy_columns,
    stored_times_problem,
    trigger_from_row,
)
from beat.store.tables import FAILED_SQL, SCHEDULES_CHANNEL, runs, schedules

logger = logging.getLogger(__name__)

#: Serialises the sync of code-defined schedules between beat processes starting together.
SYNC_LOCK_ID = 0x6861_6265_6174_01
#: ``reason`` of a run made by :meth:`ScheduleStore.trigger`, to tell it from scheduled ones.
TRIGGER_REASON = "triggered manually"
BACKFILL_REASON = "backfill"


@dataclass(frozen=True, kw_only=True, slots=True)
class SyncReport:
    created: list[str]
    updated: list[str]
    unchanged: list[str]
    removed: list[str]
    #: Code schedules whose name is taken by a schedule created at runtime (left alone).
    conflicts: list[str]


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
class UnreadableSchedule:
    """A stored schedule whose row cannot be read as a schedule: written around the
    API (with psql), it holds what the API refuses (a time of ``infinity``, a cron that
    never fires, an infinite interval, an unknown zone, args over the limits). It is
    listed with its problem in place of its fire times, never hiding the others; the
    claim quarantines it. Its values are as stored, as text, cut to ``PREVIEW_CHARS``."""

    id: int
    name: str
    task: str
    #: Why it cannot be read, and what to do.
    problem: str
    #: Its timing as stored, e.g. ``cron 0 0 30 2 *``.
    timing: str
    timezone: str
    enabled: bool
    origin: Origin
    args: str
    kwargs: str
    options: str
    #: None where the stored time cannot be read (``problem`` names it).
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    runs_count: int
    disabled_reason: str | None
    quarantined_at: datetime | None


#: A row of the schedules table, as read.
StoredSchedule = Schedule | UnreadableSchedule


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


class ScheduleStore(StoreConnection):
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
        self, build: Callable[[datetime], tuple[ScheduleDefinition, datetime | None]]
    ) -> Schedule:
        """Insert a new schedule: ``build(now)`` gives its definition and next fire time
        from the database time of the inserting transaction."""
        try:
            with self._transaction() as conn:
                now = conn.execute(select(func.now())).scalar_one()
                definition, next_fire_at = build(now)
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
            raise StoreError(
                f"the schedule was refused by PostgreSQL: {first_line(exc.orig)}"
            ) from exc
        return schedule_from_row(row)

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
            failing = [name for (name,) in conn.execute(failing_names())] if where.failing else None
            conditions = _filter_conditions(where, failing)
            count = select(func.count()).select_from(schedules).where(*conditions)
            total = conn.execute(count).scalar_one()
            page = (
                select(*stored_columns())
                .where(*conditions)
                .order_by(schedules.c.name)
                .offset(offset)
                .limit(limit)
            )
            rows = conn.execute(page).all() if offset < total else []
        return [stored_schedule(row) for row in rows], total

    def replace_schedule(
        self,
        name: str,
        build: Callable[[Schedule, datetime], tuple[ScheduleDefinition, datetime | None]],
    ) -> Schedule:
        """Update one schedule under a row lock: ``build(current, now)`` gives the new
        definition and next fire time (so concurrent updates cannot interleave)."""
        with self._transaction() as conn:
            now = conn.execute(select(func.now())).scalar_one()
            row = conn.execute(
                select(*stored_columns()).where(schedules.c.name == name).with_for_update()
            ).one_or_none()
            if row is None:
                raise schedule_not_found(name)
            current = readable(stored_schedule(row))
            definition, next_fire_at = build(current, now)
            runs_count = row.runs_count
            if row.enabled and not definition.enabled:
                _cancel_unreleased(conn, row.id, "its schedule was paused")
            elif definition != current.definition:
                retimed = _timing(definition) != _timing(current.definition)
                next_fire_at, runs_count = _withdraw_unreleased(
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
                    disabled_reason=None if definition.enabled else schedules.c.disabled_reason,
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

    def delete_schedule(self, name: str) -> None:
        """Delete a schedule made at runtime; its run history stays (``schedule_id``
        becomes NULL). One defined in code is refused: the next sync would create it
        again, so it is removed from the code, or paused."""
        with self._transaction() as conn:
            row = conn.execute(
                select(schedules.c.id, schedules.c.origin)
                .where(schedules.c.name == name)
                .with_for_update()
            ).one_or_none()
            if row is None:
                raise schedule_not_found(name)
            if row.origin == Origin.CODE.value:
                raise InvalidSchedule(
                    f"schedule '{name}' is defined in code (beat_schedule or @periodic) and the"
                    f" next sync would bring it back: remove it from the code (then `celery -A"
                    f" app schedules sync`), or pause it (`celery -A app schedules pause {name}`)"
                )
            # First: the runs lose their schedule_id with it (ON DELETE SET NULL).
            _cancel_unreleased(conn, row.id, "its schedule was deleted")
            conn.execute(delete(schedules).where(schedules.c.id == row.id))

    def sync_code_schedules(
        self,
        definitions: Sequence[tuple[ScheduleDefinition, str]],
        first_fire: Callable[[ScheduleDefinition, datetime], datetime | None],
    ) -> SyncReport:
        """Make the code-defined schedules in the database match ``definitions``.

        Each comes with a hash of its code definition. A schedule whose hash is
        unchanged is left as it is, so runtime changes (a pause, an edited
        argument) survive restarts; one whose code changed takes the new
        definition, but keeps its paused/enabled state; code schedules no longer
        in code are removed (like celery beat); runtime-created schedules are
        never touched.
        """
        report = SyncReport(created=[], updated=[], unchanged=[], removed=[], conflicts=[])
        names = [definition.name for definition, _ in definitions]
        with self._transaction() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": SYNC_LOCK_ID})
            now = conn.execute(select(func.now())).scalar_one()
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
                    _cancel_unreleased(conn, existing[name].id, removed)
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
            values_["next_fire_at"], values_["runs_count"] = _withdraw_unreleased(
                conn,
                row,
                next_fire_at,
                retimed=isinstance(stored, UnreadableSchedule)
                or _timing(definition) != _timing(stored.definition),
            )
            conn.execute(
                update(schedules)
                .where(schedules.c.id == row.id)
                .values(**values_, updated_at=func.now())
            )
            report.updated.append(definition.name)

    # -- runs asked by an operator (see the module docstring) ---------------------

    def trigger(self, name: str, *, run_id: uuid.UUID | None = None) -> RunRecord:
        """Queue one run of schedule ``name`` now, outside its timing (even if paused).

        One ``INSERT ... SELECT`` plus a ``NOTIFY`` that wakes the leader, in one
        transaction; the leader publishes the run at its next tick.

        ``run_id`` makes the trigger idempotent: a second trigger with the same ID
        (a form posted twice, a retried request) returns the run the first queued
        rather than queuing another. InvalidSchedule if that ID is another
        schedule's run.
        """

        chosen = run_id or uuid.uuid4()
        values = run_copy_columns(
            id=literal(chosen, runs.c.id.type),
            fire_at=func.now(),
            state=literal(RunState.PENDING.value),
            reason=literal(TRIGGER_REASON),
        )
        source = select(*values.values()).where(schedules.c.name == name)
        statement = (
            pg_insert(runs)
            .from_select(list(values), source)
            .on_conflict_do_nothing(index_elements=[runs.c.id])
            .returning(*runs.c)
        )
        with self._transaction() as conn:
            _check_runnable(conn, name)
            row = conn.execute(statement).one_or_none()
            if row is None:
                return self._triggered_before(conn, name, chosen)
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "trigger")))
        return record_from_row(row)

    def _triggered_before(self, conn: Connection, name: str, run_id: uuid.UUID) -> RunRecord:
        """The run an earlier trigger with ``run_id`` queued (nothing was inserted)."""
        earlier = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
        if earlier is None:
            raise schedule_not_found(name)
        if earlier.schedule_name != name:
            raise InvalidSchedule(
                f"run ID {run_id} is a run of another schedule: trigger without a run ID,"
                " or with a new one"
            )
        return record_from_row(earlier)

    def backfill(
        self, name: str, fire_times: Callable[[datetime], list[datetime]]
    ) -> list[RunRecord]:
        """Queue one run of schedule ``name`` per fire time, skipping fire times that
        already have a run (unique per schedule and fire time), and wake the leader.

        ``fire_times(now)`` gives them at the database's ``now()`` of the writing
        transaction; what it raises refuses the backfill, nothing written."""

        with self._transaction() as conn:
            now = conn.execute(select(func.now())).scalar_one()
            schedule = conn.execute(select(schedules).where(schedules.c.name == name)).one_or_none()
            if schedule is None:
                raise schedule_not_found(name)
            rows = [
                new_run_values(
                    schedule,
                    fire_at=fire_at,
                    state=RunState.PENDING,
                    reason=BACKFILL_REASON,
                    max_attempts=schedule.max_attempts,
                )
                for fire_at in fire_times(now)
            ]
            inserted = (
                list(
                    conn.execute(
                        pg_insert(runs)
                        .on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at")
                        .returning(*runs.c),
                        rows,
                    )
                )
                if rows
                else []
            )
            conn.execute(select(func.pg_notify(SCHEDULES_CHANNEL, "backfill")))
        return sorted((record_from_row(row) for row in inserted), key=lambda r: r.fire_at or 0)


def _filter_conditions(
    where: ScheduleFilter, failing: list[str] | None
) -> list[ColumnElement[bool]]:
    """SQL conditions of ``where``; ``failing``: the names of the failing schedules,
    read once (by :func:`failing_names`) for both the count and the page."""
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


def failing_names() -> Select[str]:
    """The names of the schedules whose newest run (by fire time) failed or was lost.

    The candidates are the schedules with a failed or lost run at all (the partial
    failures index: as many entries as failed runs kept); only their newest run is
    looked up, one entry of the history index each, not every schedule's. The newest
    is the first entry, as for :meth:`beat.store.runs.RunStore.last_runs`: breaking a
    tie of fire times by run ID would sort at every probe (2.5 times the cost), for
    runs that cannot tie at a schedule's newest fire time short of a schedule removed,
    made again under its name and backfilled past its own runs.
    """
    candidates = (
        select(runs.c.schedule_name)
        # The index's predicate, as literal SQL: a bound parameter would keep a generic
        # plan from using the partial index.
        .where(text(FAILED_SQL), runs.c.schedule_name.is_not(None))
        .distinct()
        .subquery("candidates")
    )
    newest = (
        select(runs.c.state)
        .where(runs.c.schedule_name == candidates.c.schedule_name)
        .order_by(runs.c.fire_at.desc())
        .limit(1)
        .lateral("newest")
    )
    failed = [RunState.FAILED.value, RunState.LOST.value]
    return (
        select(candidates.c.schedule_name)
        .join_from(candidates, newest, true())
        .where(newest.c.state.in_(failed))
    )


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


#: The payload columns, read as PostgreSQL's text of them: a value Python's ``json``
#: cannot read (nested too deep) fails its row, not the whole result.
_AS_TEXT = ("args", "kwargs", "options")


def stored_columns() -> list[ColumnElement[Any]]:
    """The columns of a schedule as :func:`stored_schedule` reads them: times that
    psycopg can load (see :func:`finite`), the payload as text, and which times are
    infinite."""
    read: list[ColumnElement[Any]] = []
    for column in schedules.c:
        if column in SCHEDULE_TIMES:
            read.append(finite(column))
        elif column.name in _AS_TEXT:
            read.append(cast(column, Text).label(column.name))
        else:
            read.append(column)
    return [*read, infinite_times(*SCHEDULE_TIMES)]


def stored_schedule(row: Row[Any]) -> StoredSchedule:
    """A row of :func:`stored_columns` as a schedule, or, when it holds what the API
    refuses, as an :class:`UnreadableSchedule` with its problem."""
    try:
        return schedule_from_row(row)
    except InvalidSchedule as exc:
        return unreadable_schedule(row, preview(str(exc)))  # it may quote 10 MB


def readable(stored: StoredSchedule) -> Schedule:
    """``stored`` if it could be read; InvalidSchedule saying what to do otherwise."""
    if isinstance(stored, UnreadableSchedule):
        raise InvalidSchedule(
            f"schedule {stored.name!r:.200} cannot be read: {stored.problem}; fix its row,"
            f" or remove it (`celery -A app schedules remove {stored.name:.200}`)"
        )
    return stored


def _check_runnable(conn: Connection, name: str) -> None:
    """InvalidSchedule if schedule ``name`` exists and its row cannot be read: a run
    of it would carry what the API refuses (10 MB of args) to the broker."""
    row = conn.execute(select(*stored_columns()).where(schedules.c.name == name)).one_or_none()
    if row is not None:
        readable(stored_schedule(row))


def unreadable_schedule(row: Row[Any], problem: str) -> UnreadableSchedule:
    return UnreadableSchedule(
        id=row.id,
        name=row.name,
        task=row.task,
        problem=problem,
        timing=_stored_timing(row),
        timezone=row.timezone,
        enabled=row.enabled,
        origin=Origin(row.origin),
        args=preview(row.args),
        kwargs=preview(row.kwargs),
        options=preview(row.options),
        next_fire_at=row.next_fire_at,
        last_fire_at=row.last_fire_at,
        runs_count=row.runs_count,
        disabled_reason=row.disabled_reason,
        quarantined_at=row.quarantined_at,
    )


def _stored_timing(row: Row[Any]) -> str:
    """A row's timing as stored, for people to read."""
    if row.trigger_kind == TriggerKind.CRON.value:
        return preview(f"cron {row.cron}")
    if row.trigger_kind == TriggerKind.EVERY.value:
        return f"every {row.every_seconds:g}s"
    return f"at {'-' if row.run_at is None else row.run_at.isoformat()}"


def schedule_from_row(row: Row[Any]) -> Schedule:
    """A row of :func:`stored_columns` as a schedule; InvalidSchedule naming what the
    API would refuse in it."""
    stored_times_problem(row.infinite_times)
    parse_zone(row.timezone)
    args, kwargs = stored_payload(row.args, row.kwargs)
    definition = ScheduleDefinition(
        name=row.name,
        task=row.task,
        trigger=trigger_from_row(row),
        timezone=row.timezone,
        args=tuple(args),
        kwargs=kwargs,
        options=check_publish_options(decoded_json(row.options, "options")),
        enabled=row.enabled,
        misfire_policy=MisfirePolicy(row.misfire_policy),
        max_attempts=row.max_attempts,
        origin=Origin(row.origin),
        overlap_policy=OverlapPolicy(row.overlap_policy),
        jitter_seconds=row.jitter_seconds,
        start_at=row.start_at,
        end_at=row.end_at,
        max_runs=row.max_runs,
    )
    return Schedule(
        id=row.id,
        definition=definition,
        next_fire_at=row.next_fire_at,
        last_fire_at=row.last_fire_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
        runs_count=row.runs_count,
        disabled_reason=row.disabled_reason,
        quarantined_at=row.quarantined_at,
    )


def schedule_not_found(name: str) -> ScheduleNotFound:
    """The error for a schedule name that is not stored, with where to look."""
    return ScheduleNotFound(
        f"no schedule named {name!r:.200}: `celery -A app schedules list` shows them"
    )


def _unreleased(schedule_id: int) -> list[ColumnElement[bool]]:
    """The runs of a schedule claimed but not released yet: ``pending`` with a
    ``not_before`` to come (claimed ahead of their fire time, or held back by jitter)."""
    return [
        runs.c.schedule_id == schedule_id,
        runs.c.state == RunState.PENDING.value,
        runs.c.not_before > func.now(),
    ]


def _cancel_unreleased(conn: Connection, schedule_id: int, why: str) -> None:
    """Cancel the runs of a schedule that are claimed but not released yet: claimed
    ahead of their fire time (minutes ahead of a large burst, ``beat.claim.window``)
    or held back by their jitter. The leader may still send one it holds in memory;
    the worker's guard refuses a cancelled run. A run already released (its time has
    come) goes on: what was due before the change runs."""
    conn.execute(
        update(runs)
        .where(*_unreleased(schedule_id))
        .values(
            state=RunState.CANCELLED.value,
            finished_at=func.now(),
            reason=f"{why} before its fire time",
        )
    )


def _withdraw_unreleased(
    conn: Connection, row: Row[Any], next_fire_at: datetime | None, *, retimed: bool
) -> tuple[datetime | None, int]:
    """A schedule's definition changed: delete its runs claimed but not released yet
    (claimed ahead, or held back by jitter), so that their fire times run under the
    new definition. The schedule's next fire time and count of runs to set: with the
    same timing, its next fire time goes back to the earliest withdrawn one (claimed
    again, with the new arguments); with a new timing, the withdrawn fire times of the
    old one are dropped. The leader may still send a message it built for one: the
    worker's guard refuses a run that has no row."""
    withdrawn = list(
        conn.scalars(delete(runs).where(*_unreleased(row.id)).returning(runs.c.fire_at))
    )
    fire_times = [fire_at for fire_at in withdrawn if fire_at is not None]
    if fire_times and not retimed:
        earliest = min(fire_times)
        next_fire_at = earliest if next_fire_at is None else min(next_fire_at, earliest)
    return next_fire_at, max(0, row.runs_count - len(fire_times))


def _timing(definition: ScheduleDefinition) -> tuple[Any, ...]:
    """What decides a schedule's fire times (its window, start_at and end_at, only
    bounds them: the claim applies it to a fire time claimed again)."""
    return (definition.trigger, definition.timezone)
