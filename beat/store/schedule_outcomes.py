"""Which schedules are failing: those whose newest run (by fire time) failed or was
lost, found by looking up the newest run of a few candidates rather than of every
schedule that ever failed.

``beat_schedule_outcomes`` holds, per schedule name, the fire time and state of its
newest run among the finished runs that finished before
``beat_run_summary.outcomes_until``. The summariser of the run statistics
(:mod:`beat.store.stats`) brings it up to date in the transaction that moves the
summary, reading each finished run once, in the order of the retention index.

The candidates are the schedules whose newest recorded outcome failed or was lost,
and those with a run that failed or was lost and finished since ``outcomes_until``
(read live, through the retention index). Each candidate's newest run is then read
from the history index, which carries its state: that read decides, so a stale
outcome never makes a schedule failing. Every failing schedule is a candidate: its
newest run finished either since ``outcomes_until`` (a live candidate) or before it,
and then it is the newest run recorded, in its current state, because a run's state
changes to failed or lost, or away from them, only with a new ``finished_at`` (which
makes it live again). Like the summary, a run whose transaction committed more than
``beat.store.stats.SETTLE`` after it finished is never recorded.

Without outcomes yet (no summariser has run), every schedule with a failed or lost run
kept is a candidate (the partial failures index), as many as those.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    TEXT,
    Connection,
    Select,
    any_,
    bindparam,
    delete,
    func,
    select,
    text,
    true,
    union,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.models import RunState
from beat.store.rows import finished_age
from beat.store.tables import FAILED_SQL, FINISHED_SQL, run_summary, runs, schedule_outcomes


def advance_outcomes(
    conn: Connection, recorded_until: datetime | None, until: datetime, batch: timedelta
) -> None:
    """Record the outcomes of the runs that finished from ``recorded_until`` (from the
    minute of the oldest finished run, if None) towards ``until``, ``batch`` of time at
    most, and move ``outcomes_until`` as far. Called under the lock of
    ``beat_run_summary``, with the summary: the outcomes keep up with it, and catch up
    a batch a pass where a process of the release before summarised without them."""
    since = recorded_until
    if since is None:
        oldest = select(func.min(finished_age())).where(text(FINISHED_SQL)).scalar_subquery()
        since = conn.execute(select(func.date_trunc("minute", oldest))).scalar()
    if since is not None and since >= until:
        return
    end = until if since is None else min(until, since + batch)
    if since is not None:
        _record(conn, since, end)
    conn.execute(run_summary.update().values(outcomes_until=end))


def _record(conn: Connection, since: datetime, end: datetime) -> None:
    """Record the newest run of each schedule among those that finished from ``since``
    to ``end``, where it is newer than the one recorded."""
    age = finished_age()
    rank = func.row_number().over(partition_by=runs.c.schedule_name, order_by=runs.c.fire_at.desc())
    ranked = (
        select(runs.c.schedule_name, runs.c.fire_at, runs.c.state, rank.label("rank"))
        # The retention index's predicate, as literal SQL (see failing_names).
        .where(text(FINISHED_SQL), age >= since, age < end)
        .where(runs.c.schedule_name.is_not(None), runs.c.fire_at.is_not(None))
        .subquery("ranked")
    )
    newest = select(ranked.c.schedule_name, ranked.c.fire_at, ranked.c.state).where(
        ranked.c.rank == 1
    )
    upsert = pg_insert(schedule_outcomes).from_select(["schedule_name", "fire_at", "state"], newest)
    conn.execute(
        upsert.on_conflict_do_update(
            index_elements=[schedule_outcomes.c.schedule_name],
            set_={"fire_at": upsert.excluded.fire_at, "state": upsert.excluded.state},
            # The same run again (its state changed since) replaces itself.
            where=upsert.excluded.fire_at >= schedule_outcomes.c.fire_at,
        )
    )


def delete_runs_keeping_outcomes(conn: Connection, doomed: Select[Any]) -> int:
    """Delete the runs ``doomed`` selects (retention), and for each schedule whose
    recorded outcome was one of them, record its newest run left instead: an older run
    that finished later (a failure that outlived a newer success) may now be its newest,
    and would not be recorded again. How many runs were deleted."""
    deleted = (
        delete(runs).where(runs.c.id.in_(doomed)).returning(runs.c.schedule_name, runs.c.fire_at)
    )
    gone = deleted.cte("gone")
    found = conn.execute(
        select(
            select(func.count()).select_from(gone).scalar_subquery(),
            select(func.array_agg(schedule_outcomes.c.schedule_name))
            .join_from(
                gone,
                schedule_outcomes,
                (schedule_outcomes.c.schedule_name == gone.c.schedule_name)
                & (schedule_outcomes.c.fire_at == gone.c.fire_at),
            )
            .scalar_subquery(),
        )
    ).one()
    count, names = found
    if names:
        _record_newest_left(conn, names)
    return int(count)


def _record_newest_left(conn: Connection, names: list[str]) -> None:
    """Record each schedule's newest run left (a second statement: the deleting one
    still saw the deleted runs), whatever its state: the failing filter looks only at
    failed or lost outcomes, and the history index decides; none if none is left."""
    conn.execute(
        delete(schedule_outcomes).where(
            schedule_outcomes.c.schedule_name == any_(bindparam("names", names, type_=ARRAY(TEXT)))
        )
    )
    named = select(
        func.unnest(bindparam("names", names, type_=ARRAY(TEXT))).label("name")
    ).subquery("named")
    newest = (
        select(runs.c.fire_at, runs.c.state)
        .where(runs.c.schedule_name == named.c.name, runs.c.fire_at.is_not(None))
        .order_by(runs.c.fire_at.desc())
        .limit(1)
        .lateral("newest")
    )
    conn.execute(
        pg_insert(schedule_outcomes).from_select(
            ["schedule_name", "fire_at", "state"],
            select(named.c.name, newest.c.fire_at, newest.c.state).join_from(named, newest, true()),
        )
    )


def failing_names(conn: Connection) -> list[str]:
    """The names of the schedules whose newest run (by fire time) failed or was lost.

    The newest run is the first entry of the history index, as for
    :meth:`beat.store.history.RunHistory.last_runs`: breaking a tie of fire times by
    run ID would sort at every probe, for runs that cannot tie at a schedule's newest
    fire time short of a schedule removed, made again under its name and backfilled
    past its own runs."""
    since = conn.execute(select(run_summary.c.outcomes_until)).scalar()
    candidates = _candidates(since).subquery("candidates")
    newest = (
        select(runs.c.state)
        .where(runs.c.schedule_name == candidates.c.schedule_name)
        .order_by(runs.c.fire_at.desc())
        .limit(1)
        .lateral("newest")
    )
    failed = [RunState.FAILED.value, RunState.LOST.value]
    query = (
        select(candidates.c.schedule_name)
        .join_from(candidates, newest, true())
        .where(newest.c.state.in_(failed))
    )
    return list(conn.scalars(query))


def _candidates(since: datetime | None) -> Select[tuple[str]]:
    """The schedules whose newest run may have failed (see the module docstring)."""
    # The partial indexes' predicates as literal SQL: a bound parameter would keep a
    # generic plan from using them.
    failed_runs = select(runs.c.schedule_name).where(
        text(FAILED_SQL), runs.c.schedule_name.is_not(None)
    )
    if since is None:
        return failed_runs.distinct()
    recorded = select(schedule_outcomes.c.schedule_name).where(text(FAILED_SQL))
    # Failed runs are finished ones: the retention index finds those finished since.
    live = failed_runs.where(text(FINISHED_SQL), finished_age() >= since)
    return select(union(recorded, live).subquery().c.schedule_name)
