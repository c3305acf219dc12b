"""The worker side of the run table: the idempotency guard, leases and completion;
and the reads of the run history (``history``, ``run``, ``last_runs``, and for the
pages of a web UI ``run_page`` and ``recent_runs``).

Every transition is one conditional statement; the row count (or the row
returned) says who won, so two deliveries of one run can never both start it,
and a worker whose lease was taken over can never record a completion.

A run may be started when it is ``pending`` or ``queued`` (new), ``retrying``
by a delivery at least as new as the last retry, ``running`` under a lease
that has expired, or ``running`` by a delivery newer than the attempt that
holds it (Celery publishes a retry before the attempt that asked for it has
ended: a retry with a zero countdown may arrive first). Anything else is a
duplicate delivery: refused and counted.

Plain tasks (not on the idempotent base) are taken at receipt, in the
worker's main process (``receive_plain``): once taken, a plain run is never
started again, whoever delivers it. Its body starts only if the delivery that
took it still holds it (``start_plain``: the attempt its receipt numbered, under
that receipt's owner, not started): a delivery whose receipt lease expired and
whose run went to another worker does not run the body.

A run with ``expires`` is expired when PostgreSQL's ``now()`` has reached its
expiry instant (``fire_at`` + ``expires``, as beat put it in the message);
every statement that would take or start a run checks that in the same
statement, and a delivery that would have taken or started it ends it
``expired`` instead. No worker's clock is consulted.
"""

from __future__ import annotations

import base64
import binascii
import os
import threading
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Double,
    Integer,
    Row,
    Select,
    and_,
    any_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, TEXT, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.errors import InvalidSchedule
from beat.models import WAITING_STATES, RunState
from beat.records import Session
from beat.store.db import StoreConnection, create_store_engine
from beat.store.tables import runs, schedules, unrecorded_consumers, workers


@dataclass(frozen=True, kw_only=True, slots=True)
class Started:
    """The delivery holds the run's lease."""

    attempt: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """The delivery is a duplicate: the run is done, or another worker holds a live lease."""

    state: str
    lease_owner: str | None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """One row of the run history, as shown to an operator."""

    id: uuid.UUID
    #: The Celery task ID its messages carry (Flower's page of the task): the caller's
    #: when it chose one that is not a UUID, else the run ID.
    task_id: str
    schedule_name: str | None
    task: str
    state: RunState
    fire_at: datetime | None
    claimed_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    attempt: int
    max_attempts: int
    retries: int
    duplicate_deliveries: int
    duration_seconds: float | None
    epoch: int | None
    reason: str | None
    error: str | None
    args: list[Any]
    kwargs: dict[str, Any]

    @property
    def lateness(self) -> timedelta | None:
        """How long after its fire time the run was handed to the broker."""
        if self.published_at is None or self.fire_at is None:
            return None
        return self.published_at - self.fire_at


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

#: Namespace of the run IDs derived from task IDs that are not UUIDs (caller-chosen keys).
TASK_ID_NAMESPACE = uuid.UUID("6c1b1f0e-8a43-4c59-9a0e-686162656174")

#: The state reported for a refused delivery whose run has no row (see ``start``).
MISSING = "missing"
#: Why a plain run ends ``lost`` when its body never returned: Celery's trace was unwound
#: by a ``BaseException`` (a prefork pool process terminated with SIGTERM by a cancel or
#: a revoke, or the body raised ``SystemExit``).
PLAIN_RUN_TERMINATED = (
    "its body did not return (terminated by Celery while it ran): it may have had its"
    " effect; a plain task is not run again"
)
#: The same, when Celery says why: it cancels the requests it cannot acknowledge once
#: the worker lost its broker connection (``worker_cancel_long_running_tasks_on_connection_loss``).
CANCELLED_ON_CONNECTION_LOSS = (
    "cancelled by Celery when the worker lost its broker connection: it may have had its effect"
)

#: A plain run whose message came back from a consumer that records no runs.
TAKEN_UNRECORDED = (
    "its message came back from the broker after a consumer took it, and no worker"
    " recorded it, on a queue a consumer that records no runs takes from: that consumer"
    " may have run it; a plain task is not run again"
)


def _lease_until(seconds: float) -> Any:
    return func.now() + func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def _startable(retries: Any, expires: datetime | None = None) -> ColumnElement[bool]:
    """May a delivery carrying ``retries`` (Celery's retry count) start the run, before
    its ``expires`` (by the database's clock, in the statement that starts it)?

    A running run whose lease expired may be taken by another delivery (its worker is
    gone), unless it is a plain run whose body started: that one runs at most once,
    and only the reaper ends it (``lost``). Celery's next retry of it may, as ever."""
    body_started_plain = and_(runs.c.plain.is_(True), runs.c.started_at.is_not(None))
    startable = or_(
        runs.c.state.in_([RunState.PENDING.value, RunState.QUEUED.value]),
        and_(runs.c.state == RunState.RETRYING.value, retries >= runs.c.retries),
        and_(
            runs.c.state == RunState.RUNNING.value,
            or_(
                and_(runs.c.lease_expires_at < func.now(), ~body_started_plain),
                retries > runs.c.retries,
            ),
        ),
    )
    if expires is None:
        return startable
    return and_(startable, func.now() < expires)


def _expired_values(reason: str) -> dict[str, Any]:
    return {
        "state": RunState.EXPIRED.value,
        "reason": reason,
        "finished_at": func.now(),
        "lease_owner": None,
        "lease_expires_at": None,
    }


def expiry_reason(expires: datetime) -> str:
    return f"expired at {expires.isoformat()} before a worker started it"


def _expire_instead(
    conn: Connection, run_id: uuid.UUID, may_start: ColumnElement[bool], expires: datetime | None
) -> Refused | None:
    """The delivery that may start the run (``may_start``) found it past ``expires`` by
    the database's clock: end it ``expired``; None if it has not expired (or no such)."""
    if expires is None:
        return None
    ended = conn.execute(
        update(runs)
        .where(runs.c.id == run_id, may_start, func.now() >= expires)
        .values(**_expired_values(expiry_reason(expires)))
    ).rowcount
    return Refused(state=RunState.EXPIRED.value, lease_owner=None) if ended else None


def due_again() -> ColumnElement[datetime]:
    """When a run put back in the outbox may be sent again: not before its ``not_before``,
    nor, if it was a retry, before the retry is due (``retry_due_at``, by the database's
    clock, kept from the attempt that asked for it)."""
    return func.greatest(runs.c.not_before, runs.c.retry_due_at)


def run_id_for(task_id: str) -> uuid.UUID:
    """The run ID of a task ID: itself if it is a UUID, else a stable UUID derived from it."""
    try:
        return uuid.UUID(task_id)
    except ValueError:
        return uuid.uuid5(TASK_ID_NAMESPACE, task_id)


_stores: dict[tuple[int, str], RunStore] = {}
_stores_lock = threading.Lock()


def run_store_for(url: str) -> RunStore:
    """One store per process and database: a forked pool child makes its own engine."""
    key = (os.getpid(), url)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = RunStore.connect(url)
    return store


class RunStore(StoreConnection):
    """Run transitions made by workers (see the module docstring), and the run history."""

    @classmethod
    def connect(cls, url: str, *, pool_size: int = 5) -> RunStore:
        return cls(create_store_engine(url, pool_size=pool_size))

    # -- run history --------------------------------------------------------------

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

    def _changed_one(self, statement: Any) -> bool:
        """Run one conditional statement on one run; True if it changed the run."""
        with self._transaction() as conn:
            return bool(conn.execute(statement).rowcount == 1)

    def start(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        task: str,
        args: list[Any],
        kwargs: dict[str, Any],
        options: dict[str, Any],
        retries: int,
        max_attempts: int,
        may_create: bool = True,
        task_id: str | None = None,
        expires: datetime | None = None,
        session: Session | None = None,
    ) -> Started | Refused:
        """Take the run's lease if this delivery may run it (one statement), else record a refusal.

        ``session`` is the beacon this worker process keeps (``beat.lease.beacon``):
        once both its halves are proven gone, the leader reclaims the run at once.

        A run that does not exist yet (a task sent with ``delay()``) is created,
        with its payload, so the reaper can publish it again, unless
        ``may_create`` is false: a delivery of a run that beat claimed whose row is
        gone (pruned by retention) is refused, since it ran long ago.
        ``task_id`` is kept when the caller's task ID is not the run ID.
        """
        lease = {
            "state": RunState.RUNNING.value,
            "lease_owner": owner,
            "lease_expires_at": _lease_until(lease_seconds),
            "started_at": func.now(),
            "worker": worker,
            "session_pid": None,  # the beacon's session is in beat_beacons
            "beacon": None if session is None else session.beacon,
        }
        if not may_create:
            return self._take(run_id, retries, lease, expires)
        insert = pg_insert(runs).values(
            id=run_id,
            task_id=task_id,
            task=task,
            args=args,
            kwargs=kwargs,
            options=options,
            attempt=1,
            retries=retries,
            max_attempts=max_attempts,
            published_at=func.now(),
            **lease,
        )
        statement = insert.on_conflict_do_update(
            index_elements=[runs.c.id],
            set_=lease
            | {
                "attempt": runs.c.attempt + 1,
                "retries": func.greatest(runs.c.retries, insert.excluded.retries),
                "published_at": func.coalesce(runs.c.published_at, func.now()),
                "finished_at": None,
                "error": None,
            },
            where=_startable(insert.excluded.retries, expires),
        ).returning(runs.c.attempt)
        with self._transaction() as conn:
            attempt = conn.execute(statement).scalar_one_or_none()
            if attempt is not None:
                return Started(attempt=attempt)
            return _refuse(conn, run_id)

    def receive_plain(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        worker: str,
        lease_seconds: float,
        retries: int,
        expires: datetime | None = None,
        retry_due_at: datetime | None = None,
        retry_due_in: float | None = None,
    ) -> Started | Refused:
        """A worker took the message of a plain run: hold it (under ``owner``'s lease,
        renewed by ``heartbeat_received``) if it may start, else refuse the delivery;
        past ``expires`` by the database's clock, the run ends ``expired`` (refused).

        The message of a retry waits here for its countdown, until ``retry_due_at`` (the
        instant by the database's clock the retrying worker put in the message) or,
        without it, ``retry_due_in`` seconds (measured on this worker's clock from the
        ETA): the run keeps that due time, so that if this worker dies, the retry is
        not sent again before it. (The retry may arrive before the attempt that asked
        for it has recorded its outcome, and then only the receipt knows the due
        time.)"""
        values: dict[str, Any] = {
            "state": RunState.RUNNING.value,
            "plain": True,
            "received_at": func.now(),
            "started_at": None,
            "worker": worker,
            "lease_owner": owner,
            "lease_expires_at": _lease_until(lease_seconds),
        }
        if retry_due_at is not None:
            values["retry_due_at"] = func.greatest(runs.c.retry_due_at, retry_due_at)
        elif retry_due_in is not None:
            values["retry_due_at"] = func.greatest(
                runs.c.retry_due_at, _lease_until(max(0.0, retry_due_in))
            )
        return self._take(run_id, retries, values, expires)

    def _take(
        self,
        run_id: uuid.UUID,
        retries: int,
        values: dict[str, Any],
        expires: datetime | None = None,
    ) -> Started | Refused:
        """Start the stored run if a delivery carrying ``retries`` may (one statement)."""
        statement = (
            update(runs)
            .where(runs.c.id == run_id, _startable(literal_int(retries), expires))
            .values(
                **values,
                attempt=runs.c.attempt + 1,
                retries=func.greatest(runs.c.retries, retries),
                published_at=func.coalesce(runs.c.published_at, func.now()),
                finished_at=None,
                error=None,
            )
            .returning(runs.c.attempt)
        )
        with self._transaction() as conn:
            attempt = conn.execute(statement).scalar_one_or_none()
            if attempt is not None:
                return Started(attempt=attempt)
            expired = _expire_instead(conn, run_id, _startable(literal_int(retries)), expires)
            return expired or _refuse(conn, run_id)

    def note_received(
        self, run_id: uuid.UUID, *, owner: str, worker: str, lease_seconds: float
    ) -> bool:
        """A worker took the message of a run it has not started (the idempotent base
        starts it later, in the pool): hold it under ``owner``'s receipt lease, so that
        if the worker dies before starting it the leader publishes it again at once
        instead of waiting for the broker's visibility timeout."""
        return self._changed_one(
            update(runs)
            .where(
                runs.c.id == run_id,
                runs.c.state.in_(WAITING_STATES),
            )
            .values(
                received_at=func.now(),
                worker=worker,
                lease_owner=owner,
                lease_expires_at=_lease_until(lease_seconds),
            )
        )

    def worker_seen(
        self, name: str, *, pid: int, booted_at: datetime, session: Session | None = None
    ) -> None:
        """The worker ``name`` (its process ``pid``, started at ``booted_at`` by the
        database's clock, keeping the beacon ``session``) is alive."""
        statement = pg_insert(workers).values(
            name=name,
            pid=pid,
            booted_at=booted_at,
            seen_at=func.now(),
            session_pid=None,  # the beacon's session is in beat_beacons
            beacon=None if session is None else session.beacon,
        )
        with self._transaction() as conn:
            conn.execute(
                statement.on_conflict_do_update(
                    index_elements=[workers.c.name],
                    set_={
                        "pid": statement.excluded.pid,
                        "booted_at": statement.excluded.booted_at,
                        "seen_at": func.now(),
                        "session_pid": statement.excluded.session_pid,
                        "beacon": statement.excluded.beacon,
                    },
                )
            )

    def heartbeat_received(
        self, owner: str, run_ids: Collection[uuid.UUID], *, lease_seconds: float
    ) -> int:
        """Extend ``owner``'s receipt leases on the runs it still has in hand (plain runs
        running, others not started yet)."""
        if not run_ids:
            return 0
        with self._transaction() as conn:
            return conn.execute(
                update(runs)
                .where(
                    runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                    runs.c.lease_owner == owner,
                )
                .values(lease_expires_at=_lease_until(lease_seconds)),
                {"ids": list(run_ids)},
            ).rowcount

    def start_plain(
        self, run_id: uuid.UUID, *, owner: str, attempt: int, expires: datetime | None = None
    ) -> Started | Refused:
        """The plain run's body starts now, if the delivery whose receipt numbered it
        ``attempt`` under ``owner`` still holds it (no other delivery took it since) and
        it has not expired by the database's clock (one statement); else the body must
        not run: past ``expires``, the run ends ``expired``. Each receipt numbers its
        own attempt, so only one start can pass; trying it again after a commit whose
        reply was lost passes again (the start time kept)."""
        held = and_(
            runs.c.id == run_id,
            runs.c.plain,
            runs.c.state == RunState.RUNNING.value,
            runs.c.attempt == attempt,
            runs.c.lease_owner == owner,
        )
        statement = (
            update(runs).where(held).values(started_at=func.coalesce(runs.c.started_at, func.now()))
        )
        if expires is not None:
            statement = statement.where(func.now() < expires)
        with self._transaction() as conn:
            if conn.execute(statement.returning(runs.c.attempt)).scalar_one_or_none() is not None:
                return Started(attempt=attempt)
            not_started = and_(held, runs.c.started_at.is_(None))
            return _expire_instead(conn, run_id, not_started, expires) or _refuse(conn, run_id)

    def finish_plain(
        self,
        run_id: uuid.UUID,
        *,
        state: RunState,
        error: str | None = None,
        attempt_retries: int,
        retry_in: float | None = None,
    ) -> bool:
        """Record the outcome of the plain run's attempt that Celery numbered
        ``attempt_retries`` (its ``request.retries``), unless a later attempt (the retry
        it asked for, received before this one ended) holds the run now."""
        retries = attempt_retries + 1 if state is RunState.RETRYING else None
        values = _outcome(state, error=error, retries=retries, retry_in=retry_in)
        # An outcome the body reached replaces a ``lost`` written while it ran (the
        # reaper's, a cancel's); a ``lost`` itself replaces nothing but ``running``.
        ended = [RunState.RUNNING.value]
        if state is not RunState.LOST:
            ended.append(RunState.LOST.value)
        return self._changed_one(
            update(runs)
            .where(*_plain_attempt(run_id, attempt_retries), runs.c.state.in_(ended))
            .values(**values)
        )

    def cancel_plain(self, run_id: uuid.UUID, *, attempt_retries: int) -> bool:
        """Celery cancelled the attempt ``attempt_retries`` of a plain run on a lost broker
        connection, terminating its body: the run ends ``lost`` with
        ``CANCELLED_ON_CONNECTION_LOSS`` if its body started (it may have had its effect;
        it is never run again), also over the ``PLAIN_RUN_TERMINATED`` its pool process
        may have recorded first. A body that had returned recorded its outcome, which
        stays; one that never started is left to its receipt lease (sent again)."""
        return self._changed_one(
            update(runs)
            .where(
                *_plain_attempt(run_id, attempt_retries),
                runs.c.started_at.is_not(None),
                or_(
                    runs.c.state == RunState.RUNNING.value,
                    and_(
                        runs.c.state == RunState.LOST.value,
                        runs.c.error == PLAIN_RUN_TERMINATED,
                    ),
                ),
            )
            .values(
                **_outcome(
                    RunState.LOST, error=CANCELLED_ON_CONNECTION_LOSS, retries=None, retry_in=None
                )
            )
        )

    def end_taken_unrecorded(self, run_id: uuid.UUID, *, queue: str) -> bool:
        """A delivery of a plain run that the broker hands out again (kombu restored it
        after a consumer took it without acknowledging it): if no worker ever recorded
        the run and a consumer that records no runs takes from ``queue``
        (``beat_unrecorded_consumers``), that consumer may have run it, and nothing can
        prove it did not. The run ends ``lost`` with the reason; True if it did (the
        delivery must not run). Otherwise the consumer that took it was a worker that
        records runs and died before it could (or handed it back): it may run."""
        taken_unrecorded = (
            select(literal(1))
            .select_from(unrecorded_consumers)
            .where(unrecorded_consumers.c.queue == queue)
            .exists()
        )
        return self._changed_one(
            update(runs)
            .where(
                runs.c.id == run_id,
                runs.c.state.in_(WAITING_STATES),
                runs.c.received_at.is_(None),
                runs.c.lease_owner.is_(None),
                taken_unrecorded,
            )
            .values(
                state=RunState.LOST.value,
                error=TAKEN_UNRECORDED,
                finished_at=func.now(),
            )
        )

    def expire_if_past(self, run_id: uuid.UUID, expires: datetime) -> bool:
        """End the run ``expired`` if ``expires`` has passed by the database's clock
        and no worker started it; True if it did (the delivery must not run)."""
        return self._changed_one(
            update(runs)
            .where(
                runs.c.id == run_id,
                runs.c.state.in_(WAITING_STATES),
                func.now() >= expires,
            )
            .values(**_expired_values(expiry_reason(expires)))
        )

    def end_discarded(
        self, run_id: uuid.UUID, *, expires: datetime, owner: str, attempt: int | None = None
    ) -> str | None:
        """Celery discarded a delivery of the run because its ``expires`` passed by the
        worker's clock, before any task code ran. The database's clock decides (one
        statement): expired by it, the run ends ``expired``; not expired, the worker's
        clock was wrong and the run goes back to the outbox (``pending``) to be sent
        again, not before a retry is due. Either only if no other delivery holds it: it
        is waiting (unleased, or under ``owner``'s receipt lease, or one that expired),
        or it is the plain run this delivery took at receipt (``attempt`` under
        ``owner``) and never started. Returns the run's new state, or None."""
        expired = func.now() >= expires
        free = or_(
            runs.c.lease_owner.is_(None),
            runs.c.lease_owner == owner,
            runs.c.lease_expires_at < func.now(),
        )
        discarded = and_(runs.c.state.in_(WAITING_STATES), free)
        if attempt is not None:
            held = and_(
                runs.c.plain,
                runs.c.state == RunState.RUNNING.value,
                runs.c.attempt == attempt,
                runs.c.lease_owner == owner,
                runs.c.started_at.is_(None),
            )
            discarded = or_(discarded, held)
        back = RunState.PENDING.value
        statement = (
            update(runs)
            .where(runs.c.id == run_id, discarded)
            .values(
                state=case((expired, RunState.EXPIRED.value), else_=back),
                reason=case((expired, expiry_reason(expires)), else_=runs.c.reason),
                finished_at=case((expired, func.now()), else_=None),
                lease_owner=None,
                lease_expires_at=None,
                not_before=case((expired, runs.c.not_before), else_=due_again()),
                # Sent again: no time of the deliveries before it stays (as the reaper).
                published_at=case((expired, runs.c.published_at), else_=None),
                received_at=case((expired, runs.c.received_at), else_=None),
                started_at=case((expired, runs.c.started_at), else_=None),
            )
            .returning(runs.c.state)
        )
        with self._transaction() as conn:
            state: str | None = conn.execute(statement).scalar_one_or_none()
            return state

    def database_now(self) -> datetime:
        """PostgreSQL's clock, read as late in the round trip as the server can."""
        with self._transaction() as conn:
            now: datetime = conn.execute(select(func.clock_timestamp())).scalar_one()
            return now

    def heartbeat(self, run_id: uuid.UUID, *, owner: str, lease_seconds: float) -> bool:
        """Extend the lease; False if it is no longer ours (taken over, or the run moved on)."""
        return self._changed_one(
            update(runs)
            .where(_held_by(run_id, owner))
            .values(lease_expires_at=_lease_until(lease_seconds))
        )

    def finish(
        self,
        run_id: uuid.UUID,
        *,
        owner: str,
        state: RunState,
        error: str | None = None,
        retries: int | None = None,
        retry_in: float | None = None,
        conn: Connection | None = None,
    ) -> bool:
        """Record the outcome of the attempt if we still hold the lease; True if recorded.

        Pass ``conn`` to record it inside the task's own transaction, so its
        side effects commit together with the completion (or not at all).
        A retry is due ``retry_in`` seconds from now (``retry_due_at``): past it, the
        leader looks for its message.
        """
        values = _outcome(state, error=error, retries=retries, retry_in=retry_in)
        statement = update(runs).where(_held_by(run_id, owner)).values(**values)
        if conn is not None:
            return conn.execute(statement).rowcount == 1
        with self._transaction() as own:
            return own.execute(statement).rowcount == 1


def _plain_attempt(run_id: uuid.UUID, attempt_retries: int) -> tuple[Any, ...]:
    """The plain run's attempt that Celery numbered ``attempt_retries``."""
    return (runs.c.id == run_id, runs.c.plain, runs.c.retries == attempt_retries)


def _outcome(
    state: RunState,
    *,
    error: str | None,
    retries: int | None,
    retry_in: float | None,
) -> dict[str, Any]:
    values: dict[str, Any] = {
        "state": state.value,
        "error": error,
        "lease_owner": None,
        "lease_expires_at": None,
        "duration_seconds": func.extract("epoch", func.now() - runs.c.started_at),
    }
    if state is RunState.RETRYING:
        values["retry_due_at"] = _lease_until(max(0.0, retry_in or 0.0))
        # The retry is a message of its own: the copies lost-message recovery sent of
        # the one before it do not count against it (``LeaderStore.requeue_missing``).
        values["recovery_sends"] = 0
    else:
        values["finished_at"] = func.now()
    if retries is not None:
        values["retries"] = retries
    return values


def _refuse(conn: Connection, run_id: uuid.UUID) -> Refused:
    """Count a refused delivery on its run; a run with no row is reported ``missing``."""
    row = conn.execute(
        update(runs)
        .where(runs.c.id == run_id)
        .values(duplicate_deliveries=runs.c.duplicate_deliveries + 1)
        .returning(runs.c.state, runs.c.lease_owner)
    ).one_or_none()
    if row is None:
        return Refused(state=MISSING, lease_owner=None)
    return Refused(state=row.state, lease_owner=row.lease_owner)


def lateness_seconds() -> ColumnElement[float]:
    """How late a run was handed to the broker, in seconds (``published_at - fire_at``);
    NULL for a run not published or without a fire time. ``date_part`` gives a float
    at once (``extract`` gives a numeric, a third slower over a million runs)."""
    return func.date_part("epoch", runs.c.published_at - runs.c.fire_at, type_=Double)


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


def record_from_row(row: Row[Any]) -> RunRecord:
    """A run of the history from its ``beat_runs`` row."""
    return RunRecord(
        id=row.id,
        task_id=row.task_id or str(row.id),
        schedule_name=row.schedule_name,
        task=row.task,
        state=RunState(row.state),
        fire_at=row.fire_at,
        claimed_at=row.claimed_at,
        published_at=row.published_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        worker=row.worker,
        attempt=row.attempt,
        max_attempts=row.max_attempts,
        retries=row.retries,
        duplicate_deliveries=row.duplicate_deliveries,
        duration_seconds=row.duration_seconds,
        epoch=row.epoch,
        reason=row.reason,
        error=row.error,
        args=list(row.args),
        kwargs=dict(row.kwargs),
    )


def literal_int(value: int) -> Any:
    """A bound integer, comparable with a column in SQL."""
    return bindparam(None, value, type_=Integer, unique=True)


def _held_by(run_id: uuid.UUID, owner: str) -> Any:
    return and_(
        runs.c.id == run_id,
        runs.c.state == RunState.RUNNING.value,
        runs.c.lease_owner == owner,
    )
