"""What every table definition shares: the metadata the tables are defined on, the
time type, the states' predicates and the version table's name."""

from __future__ import annotations

import enum

from sqlalchemy import DateTime, MetaData

from beat.models import FINISHED_STATES

metadata = MetaData()

#: Alembic's own version table, named so that it cannot clash with the host application's.
VERSION_TABLE = "beat_alembic_version"

#: Channel notified whenever a schedule changes outside a claim (wakes the leader at once).
SCHEDULES_CHANNEL = "beat_schedules_changed"


#: SQL that holds for a finished run (the predicate of the retention index).
FINISHED_SQL = f"state IN ({', '.join(repr(state.value) for state in FINISHED_STATES)})"
#: SQL that holds for a run not finished (the predicate of the index of active runs).
ACTIVE_SQL = "state IN ('pending', 'queued', 'running', 'retrying')"
#: SQL that holds for a run that failed or was lost (the predicate of the failures index).
FAILED_SQL = "state IN ('failed', 'lost')"


def in_values(column: str, values: type[enum.StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(v.value) for v in values)})"


TZ = DateTime(timezone=True)
