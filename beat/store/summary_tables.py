"""The tables of the run statistics' summary (``beat.store.stats``,
``beat.store.minute_summary``, ``beat.store.schedule_outcomes``): finished runs by
minute and by block of ten minutes, how far the summary has gone, and each schedule's
newest outcome."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Double,
    Index,
    Integer,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY

from beat.models import RunState
from beat.store.metadata import FAILED_SQL, TZ, in_values, metadata


def _summary_table(name: str, key: str, *more: Column[Any]) -> Table:
    """Finished runs summarised by ``key`` (a time) and state."""
    return Table(
        name,
        metadata,
        Column(key, TZ, primary_key=True),
        Column("state", Text, primary_key=True),
        Column("runs", BigInteger, nullable=False),
        #: Runs with a lateness (published, with a fire time).
        Column("published", BigInteger, nullable=False),
        #: Their lateness counted in the bins of ``beat.store.percentiles.LATENESS_BINS``;
        #: NULL when none was published.
        Column("lateness_bins", ARRAY(Integer)),
        Column("lateness_max", Double),
        Column("lateness_sum", Double),
        *more,
        CheckConstraint(in_values("state", RunState), name=f"ck_{name}_state"),
    )


#: The finished runs summarised minute by minute (``beat.store.stats``): one row per
#: minute and state, keyed as the retention index is, by the minute the run finished
#: (``coalesce(finished_at, claimed_at)``). The statistics of long windows read these
#: instead of every run.
run_minutes = _summary_table("beat_run_minutes", "minute")
#: The same by block of ten minutes from the epoch, kept by the triggers of migration
#: 0024 on ``beat_run_minutes``: a block holds the sum of its minutes unless
#: ``broken`` (minutes of it deleted or changed), and then its minutes are read.
run_blocks = _summary_table(
    "beat_run_blocks",
    "block",
    Column("broken", Boolean, nullable=False, server_default=false()),
)

#: How far the summary has gone: every minute before ``summarised_until`` is in
#: ``beat_run_minutes`` (one row, created by the first summariser).
run_summary = Table(
    "beat_run_summary",
    metadata,
    Column("id", Boolean, primary_key=True, server_default=text("true")),
    Column("summarised_until", TZ, nullable=False),
    #: How far ``beat_schedule_outcomes`` has gone (NULL: it holds nothing yet).
    Column("outcomes_until", TZ),
    CheckConstraint("id", name="ck_beat_run_summary_one_row"),
)

#: Each schedule's newest finished run (by fire time) among the runs that finished
#: before ``beat_run_summary.outcomes_until`` (``beat.store.schedule_outcomes``): where
#: the "failing" filter of the schedule list finds its candidates.
schedule_outcomes = Table(
    "beat_schedule_outcomes",
    metadata,
    Column("schedule_name", Text, primary_key=True),
    Column("fire_at", TZ, nullable=False),
    Column("state", Text, nullable=False),
    CheckConstraint(in_values("state", RunState), name="ck_beat_schedule_outcomes_state"),
)
# The schedules whose newest summarised run failed or was lost: a few in a cluster that
# works, read as one small index.
Index(
    "ix_beat_schedule_outcomes_failed",
    schedule_outcomes.c.schedule_name,
    postgresql_where=text(FAILED_SQL),
)
