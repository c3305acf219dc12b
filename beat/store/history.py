"""The reads of the run history: ``history``, ``run``, ``last_runs``, and for the
pages of a web UI ``run_page`` and ``recent_runs``; the records they return."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    and_,
    bindparam,
    func,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, TEXT

from beat.errors import InvalidSchedule
from beat.models import RunState
from beat.records import RunRecord
from beat.store.db import StoreConnection
from beat.store.rows import lateness_seconds, record_from_row
from beat.store.tables import runs, schedules


@dataclass(frozen=True, kw_only=True, slots=True)
class LastRun:
    """The newest run of a schedule (by fire time)."""

    id: uuid.UUID
    state: RunState
    fire_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class RecentRuns:
    """What the schedule list shows of a schedule's latest runs."""

    #: The newest run (by fire time); None before the first.
    last_run: LastRun | None
    #: Lateness in seconds (published_at - fire_at) of the latest runs, oldest first;
    #: None for a run not (yet) published.
    lateness: list[float | None]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunPage:
    """One page of a schedule's runs, newest first (by fire time, then run ID)."""

    runs: list[RunRecord]
    #: Where the next (older) page starts, for ``before``; None when no run is older.
    next_before: str | None


#: A point in time, or a distance back from the database's ``now()``.
Since = datetime | timedelta


class RunHistory(StoreConnection):
    """The run history, newest first, as shown to an operator."""

    def history(
        self,
        *,
        schedule_name: str | None = None,
        state: RunState | None = None,
        since: Since | None = None,
        limit: int = 20,
    ) -> list[RunRecord]:
        """Runs newest first (by fire time, or claim time for runs without one), the
        run ID breaking ties; of schedule ``schedule_name`` along its history index."""
        if schedule_name is None:
            when = _run_time()
            query = _filtered(select(runs), when, state, since)
            query = query.order_by(when.desc(), runs.c.id).limit(limit)
        else:
            query = _schedule_history(schedule_name, state, since, limit)
        with self._transaction() as conn:
            return [record_from_row(row) for row in conn.execute(query)]

    def run_page(self, schedule_name: str, *, before: str | None, limit: int) -> RunPage:
        """Runs of ``schedule_name`` newest first, ``limit`` of them, older than the
        cursor ``before`` (a ``next_before`` of the page before; None: the newest).

        Keyset paging on ``(fire_at, id)`` along the history index: a page costs
        ``limit`` index entries however deep it is, and no run repeats or goes
        missing from page to page when runs are added meanwhile (a newer run shows
        on the first page only).
        A run of a schedule always has a fire time (claims, triggers and backfills
        set one); one without would come first, where the index puts NULLs.
        InvalidSchedule for a cursor this method did not give.
        """
        query = (
            select(runs)
            .where(runs.c.schedule_name == schedule_name)
            .order_by(*NEWEST_FIRST)
            .limit(limit + 1)  # one more tells whether an older page exists
        )
        if before is not None:
            query = query.where(_older_than(RunCursor.decode(before)))
        with self._transaction() as conn:
            found = [record_from_row(row) for row in conn.execute(query)]
        if len(found) <= limit:
            return RunPage(runs=found, next_before=None)
        last = found[limit - 1]
        cursor = RunCursor(fire_at=last.fire_at, id=last.id)
        return RunPage(runs=found[:limit], next_before=cursor.encode())

    def run(self, run_id: uuid.UUID) -> RunRecord | None:
        with self._transaction() as conn:
            row = conn.execute(select(runs).where(runs.c.id == run_id)).one_or_none()
        return None if row is None else record_from_row(row)

    def last_runs(self) -> dict[str, LastRun]:
        """The newest run of every schedule that has one, by schedule name.

        One index probe per schedule (``LATERAL ... LIMIT 1`` on the history index).
        """
        newest = (
            select(runs.c.id, runs.c.state, runs.c.fire_at)
            .where(runs.c.schedule_name == schedules.c.name)
            .order_by(runs.c.fire_at.desc())
            .limit(1)
            .lateral("newest")
        )
        query = select(schedules.c.name, newest.c.id, newest.c.state, newest.c.fire_at).join(
            newest, true()
        )
        with self._transaction() as conn:
            return {
                row.name: LastRun(id=row.id, state=RunState(row.state), fire_at=row.fire_at)
                for row in conn.execute(query)
            }

    def recent_runs(self, names: Sequence[str], *, count: int) -> dict[str, RecentRuns]:
        """The latest ``count`` runs of each schedule of ``names`` (a page of the list),
        by name: ``count`` entries of the history index per name, never a scan."""
        page = (
            func.unnest(bindparam("names", list(names), type_=ARRAY(TEXT)))
            .table_valued("name")
            .render_derived("page")
        )
        newest = (
            select(runs.c.id, runs.c.state, runs.c.fire_at, lateness_seconds().label("late"))
            .where(runs.c.schedule_name == page.c.name)
            .order_by(*NEWEST_FIRST)
            .limit(count)
            .lateral("newest")
        )
        query = select(page.c.name, newest).join_from(page, newest, true())
        found: dict[str, list[Row[Any]]] = {name: [] for name in names}
        with self._transaction() as conn:
            for row in conn.execute(query):
                found[row.name].append(row)
        return {name: _recent(rows) for name, rows in found.items()}

    # -- what workers write -------------------------------------------------------


def _run_time() -> ColumnElement[datetime]:
    """When a run belongs in history: its fire time, else (a run sent with ``delay()``)
    when it was recorded."""
    return func.coalesce(runs.c.fire_at, runs.c.claimed_at)


#: A schedule's runs newest first: the order of its history index (``fire_at DESC``
#: puts NULLs first), the run ID breaking ties (runs of a schedule deleted and made
#: again under its name may share a fire time).
NEWEST_FIRST = (runs.c.fire_at.desc(), runs.c.id.desc())


@dataclass(frozen=True, slots=True)
class RunCursor:
    """Where a page of runs ends (its oldest run), as an opaque URL-safe text."""

    fire_at: datetime | None
    id: uuid.UUID

    #: Longer text is not a cursor (they are about 80 characters): refused unread.
    MAX_LENGTH = 200

    def encode(self) -> str:
        plain = f"{'' if self.fire_at is None else self.fire_at.isoformat()}|{self.id}"
        return base64.urlsafe_b64encode(plain.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> RunCursor:
        """The cursor ``text`` stands for; InvalidSchedule if it is not one."""
        try:
            if not isinstance(text, str) or len(text) > cls.MAX_LENGTH:
                raise ValueError("not a cursor")
            plain = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
            moment, run_id = plain.split("|")
            fire_at = datetime.fromisoformat(moment) if moment else None
            if fire_at is not None and fire_at.utcoffset() is None:
                raise ValueError("naive time")
            return cls(fire_at=fire_at, id=uuid.UUID(run_id))
        except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
            raise InvalidSchedule(
                f"page cursor {text!r:.80} is not one a page of runs gave (next_before):"
                " start again from the newest page (no cursor)"
            ) from None


def _recent(rows: list[Row[Any]]) -> RecentRuns:
    """The rows of one schedule from ``recent_runs`` (a lateral join's rows come in its
    own order, not promised): sorted as ``NEWEST_FIRST``."""
    ordered = sorted(rows, key=_newest_first_key, reverse=True)
    last = None
    if ordered:
        row = ordered[0]
        last = LastRun(id=row.id, state=RunState(row.state), fire_at=row.fire_at)
    return RecentRuns(last_run=last, lateness=[row.late for row in reversed(ordered)])


def _newest_first_key(row: Row[Any]) -> tuple[bool, datetime, uuid.UUID]:
    """Sorted in reverse, ``NEWEST_FIRST``: no fire time first, then the latest fire
    time, then the greatest run ID."""
    return (row.fire_at is None, row.fire_at or _NO_TIME, row.id)


_NO_TIME = datetime.min.replace(tzinfo=UTC)


def _older_than(cursor: RunCursor) -> ColumnElement[bool]:
    """Runs after ``cursor`` in ``NEWEST_FIRST`` order. ``fire_at <= t`` is what bounds
    the index scan; the rest drops the runs of that very fire time already shown."""
    if cursor.fire_at is None:
        return or_(runs.c.fire_at.is_not(None), runs.c.id < cursor.id)
    return and_(
        runs.c.fire_at <= cursor.fire_at,
        or_(runs.c.fire_at < cursor.fire_at, runs.c.id < cursor.id),
    )


def _filtered(
    query: Select[Any], when: ColumnElement[datetime], state: RunState | None, since: Since | None
) -> Select[Any]:
    """``query`` restricted to the runs in ``state`` whose time ``when`` is ``since``."""
    if state is not None:
        query = query.where(runs.c.state == state.value)
    if since is not None:
        query = query.where(when >= _moment(since))
    return query


def _schedule_history(
    name: str, state: RunState | None, since: Since | None, limit: int
) -> Select[Any]:
    """``history`` of schedule ``name``: the newest ``limit`` of its runs with a fire
    time, read along the history index in its order (ordering all by ``_run_time()``
    sorts every run of the schedule: 750 ms for one with 200,000), merged with the
    newest ``limit`` without one (none, but for runs written by hand)."""
    named = runs.c.schedule_name == name
    timed = _filtered(select(runs).where(named), runs.c.fire_at, state, since)
    untimed = _filtered(select(runs).where(named), runs.c.claimed_at, state, since)
    both = union_all(
        timed.where(runs.c.fire_at.is_not(None))
        .order_by(runs.c.fire_at.desc(), runs.c.id)
        .limit(limit),
        untimed.where(runs.c.fire_at.is_(None))
        .order_by(runs.c.claimed_at.desc(), runs.c.id)
        .limit(limit),
    ).subquery("history")
    when = func.coalesce(both.c.fire_at, both.c.claimed_at)
    return select(both).order_by(when.desc(), both.c.id).limit(limit)


def _moment(since: Since) -> Any:
    if isinstance(since, timedelta):
        return func.now() - since
    return since
