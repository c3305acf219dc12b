"""The read models of the Python API: what :class:`beat.ops.schedules.Schedules`
returns to the CLI and the UI beyond the store's own records: a schedule with its fire
times and runs, a row and a page of the schedule list, and the cluster overview."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from beat.lease.presence import BeatProcess
from beat.ops.health import ClusterStatus
from beat.records import RunRecord
from beat.store.history import LastRun
from beat.store.leader import QueueBacklog, WorkerPresence
from beat.store.schedules import OverdueSchedule
from beat.store.stored_schedules import StoredSchedule, UnreadableSchedule


def problem_of(schedule: StoredSchedule) -> str | None:
    """Why a stored schedule cannot be read (shown in place of its fire times); None
    for one that can."""
    return schedule.problem if isinstance(schedule, UnreadableSchedule) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleDetails:
    """A schedule with its next fire times and its latest runs (newest first); one
    whose row cannot be read has no fire times, and its problem."""

    schedule: StoredSchedule
    upcoming: list[datetime]
    recent_runs: list[RunRecord]

    @property
    def problem(self) -> str | None:
        return problem_of(self.schedule)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleSummary:
    """A schedule and its newest run (None before its first)."""

    schedule: StoredSchedule
    last_run: LastRun | None

    @property
    def problem(self) -> str | None:
        return problem_of(self.schedule)


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleRow:
    """A row of the schedule list: a schedule, its newest run and its recent lateness."""

    schedule: StoredSchedule
    #: The newest run (by fire time); None before the first.
    last_run: LastRun | None
    #: Lateness in seconds (published_at - fire_at) of the newest ``SPARK_RUNS`` runs,
    #: oldest first; None for a run not (yet) published.
    recent_lateness: list[float | None]

    @property
    def problem(self) -> str | None:
        return problem_of(self.schedule)


@dataclass(frozen=True, kw_only=True, slots=True)
class SchedulePage:
    """One page of the schedule list, by name."""

    rows: list[ScheduleRow]
    #: Schedules matching the filter, on every page.
    total: int
    offset: int
    limit: int


@dataclass(frozen=True, kw_only=True, slots=True)
class ClusterOverview:
    """What the cluster page shows (:meth:`Schedules.cluster_overview`); a part that
    could not be read is empty (``status`` None) and has a line in ``problems``."""

    #: Who leads, as :meth:`Schedules.cluster_status` tells it (needs both servers).
    status: ClusterStatus | None
    #: The live beat processes, the lease's holder first, then by start.
    beats: list[BeatProcess]
    #: The workers seen within their lease, by name.
    workers: list[WorkerPresence]
    #: Enabled schedules due long ago and unclaimed, oldest first (at most a limit).
    overdue: list[OverdueSchedule]
    #: All the overdue schedules, also those beyond the limit.
    overdue_total: int
    #: Queues with runs that no worker received for a while, the most stuck first.
    stuck_queues: list[QueueBacklog]
    #: One line per part that could not be read: ``server: part: why``.
    problems: list[str]
