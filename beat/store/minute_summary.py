"""The summary of finished runs by minute (``beat_run_minutes``), written: one
transaction of the leader's summariser moves ``beat_run_summary.summarised_until`` over
the settled minutes, each minute's runs counted by state and binned by lateness as the
plots read them (see :mod:`beat.store.stats`)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, insert, select, text, update

from beat.store.percentiles import LATENESS_BINS, lateness_bin
from beat.store.rows import finished_age, lateness_seconds
from beat.store.schedule_outcomes import advance_outcomes
from beat.store.tables import FINISHED_SQL, run_minutes, run_summary, runs

#: How long after the end of a minute it is summarised. A run's ``finished_at`` is
#: the ``now()`` of the transaction that finished it, its start: the run becomes
#: visible when that transaction commits, a little later. Those transactions are one
#: statement (a worker's outcome) or the leader's claim and reaper transactions,
#: which the idle timeout of the claim bounds to seconds; two minutes leave a wide
#: margin. A run committed later than that is never summarised (nor counted live).
SETTLE = timedelta(minutes=2)


def summarise_batch(
    conn: Connection, until: datetime | None, batch: timedelta
) -> tuple[datetime, bool, int, int, int] | None:
    """One transaction of :meth:`beat.store.stats.RunStatsStore.summarise`: None if
    another process holds the summary, else ``(summarised_until, caught_up, runs,
    rows, moved)``."""
    settled = func.date_trunc("minute", func.now() - SETTLE)
    found = conn.execute(
        select(
            run_summary.c.summarised_until, run_summary.c.outcomes_until, settled.label("settled")
        ).with_for_update(skip_locked=True)
    ).first()
    if found is None:
        return None
    start: datetime = found.summarised_until
    limit: datetime = found.settled
    if until is not None:
        limit = min(limit, until.replace(second=0, microsecond=0))
    if start >= limit:
        advance_outcomes(conn, found.outcomes_until, start, batch)
        return start, True, 0, 0, 0
    # Skip the minutes without a finished run (a fresh start, a quiet night) at once.
    age = finished_age()
    following = conn.execute(
        select(func.date_trunc("minute", func.min(age))).where(text(FINISHED_SQL), age >= start)
    ).scalar()
    first = limit if following is None else min(max(start, following), limit)
    end = min(first + batch, limit)
    summarised_runs, rows = 0, 0
    if first < end:
        summarised_runs, rows = summarise_minutes(conn, first, end)
    conn.execute(update(run_summary).values(summarised_until=end))
    advance_outcomes(conn, found.outcomes_until, end, batch)
    return end, end >= limit, summarised_runs, rows, 1


def summarise_minutes(conn: Connection, first: datetime, end: datetime) -> tuple[int, int]:
    """Insert the summary of the finished runs of ``first`` .. ``end`` (minutes)."""
    age = finished_age()
    lateness = lateness_seconds()
    grouped = conn.execute(
        select(
            func.date_trunc("minute", age).label("minute"),
            runs.c.state,
            lateness_bin(lateness).label("bin"),
            func.count().label("runs"),
            func.max(lateness).label("slowest"),
            func.sum(lateness).label("total"),
        )
        # The retention index, in its order (its predicate as literal SQL).
        .where(text(FINISHED_SQL), age >= first, age < end)
        .group_by(text("1, 2, 3"))
    ).all()
    minutes: dict[tuple[datetime, str], dict[str, Any]] = {}
    for row in grouped:
        entry = minutes.setdefault(
            (row.minute, row.state),
            {
                "minute": row.minute,
                "state": row.state,
                "runs": 0,
                "published": 0,
                "lateness_bins": None,
                "lateness_max": None,
                "lateness_sum": None,
            },
        )
        entry["runs"] += row.runs
        if row.bin is None:
            continue
        if entry["lateness_bins"] is None:
            entry |= {"lateness_bins": [0] * LATENESS_BINS, "lateness_max": row.slowest}
            entry["lateness_sum"] = 0.0
        entry["published"] += row.runs
        entry["lateness_bins"][row.bin] += row.runs
        entry["lateness_max"] = max(entry["lateness_max"], row.slowest)
        entry["lateness_sum"] += row.total
    if minutes:
        conn.execute(insert(run_minutes), list(minutes.values()))
    return sum(entry["runs"] for entry in minutes.values()), len(minutes)
