"""What reads schedules and their runs, the reads part of
:class:`beat.ops.schedules.Schedules`: the schedules (one, all, a page of the list),
their next fire times, and their runs (history, pages, statistics)."""

from __future__ import annotations

import builtins
import uuid
from datetime import datetime, timedelta

from beat.errors import InvalidSchedule, ScheduleNotFound
from beat.models import Origin, RunState, Schedule
from beat.ops.read_models import ScheduleDetails, SchedulePage, ScheduleRow, ScheduleSummary
from beat.ops.schedules_base import SchedulesBase
from beat.records import RunRecord
from beat.schedule import timing
from beat.schedule.define import MAX_TASK_NAME_LENGTH, check_count
from beat.store.history import LastRun, RecentRuns, RunPage, Since
from beat.store.schedules import QuarantinedSchedule, ScheduleFilter
from beat.store.stats import MIN_BUCKET, RunStats
from beat.store.stored_schedules import StoredSchedule, UnreadableSchedule

#: Fire times :meth:`Schedules.details` lists.
UPCOMING_FIRES = 5
#: Runs :meth:`Schedules.details` lists.
RECENT_RUNS = 10
#: Latest runs whose lateness a row of :meth:`Schedules.page` carries.
SPARK_RUNS = 20
#: Most rows of one page (:meth:`Schedules.page`, :meth:`Schedules.run_page`).
MAX_PAGE_ROWS = 500
#: Longest window of :meth:`Schedules.run_stats` (it reads every run of the window).
MAX_STATS_WINDOW = timedelta(days=31)
#: Most buckets of :meth:`Schedules.run_stats`.
MAX_STATS_BUCKETS = 500
#: The filter that keeps every schedule.
EVERY_SCHEDULE = ScheduleFilter()


class ScheduleReads(SchedulesBase):
    """Read schedules and their runs; an unknown name raises, as a typo should."""

    def list(self) -> list[Schedule]:
        """The schedules whose rows can be read (:meth:`stored` lists every row)."""
        return [s for s in self.stored() if isinstance(s, Schedule)]

    def stored(self) -> builtins.list[StoredSchedule]:
        """Every schedule by name; one whose row cannot be read (written with psql) as
        an :class:`UnreadableSchedule`, with its problem."""
        return self.store.list_schedules()

    def details(
        self, name: str, *, upcoming: int = UPCOMING_FIRES, recent: int = RECENT_RUNS
    ) -> ScheduleDetails:
        """Schedule ``name``, its next ``upcoming`` fire times (see :func:`upcoming_fires`;
        none for a row that cannot be read) and its latest ``recent`` runs."""
        schedule = self.store.stored_schedule(name)
        return ScheduleDetails(
            schedule=schedule,
            upcoming=[]
            if isinstance(schedule, UnreadableSchedule)
            else upcoming_fires(schedule, self.store.now(), upcoming),
            # None asked (a page that reads its runs by pages of its own): no query.
            recent_runs=self._run_store.history(schedule_name=name, limit=recent) if recent else [],
        )

    # ``builtins.list`` in annotations from here on: ``list`` is a method of this class.
    def summaries(self) -> builtins.list[ScheduleSummary]:
        """Every schedule, by name, with its newest run."""
        found = self.stored()
        last = self.last_runs()
        return [ScheduleSummary(schedule=s, last_run=last.get(s.name)) for s in found]

    def page(
        self, filter: ScheduleFilter = EVERY_SCHEDULE, *, offset: int = 0, limit: int = 50
    ) -> SchedulePage:
        """The schedules matching ``filter`` by name, ``limit`` (at most
        ``MAX_PAGE_ROWS``) from ``offset``, each with its newest run and the lateness of
        its latest ``SPARK_RUNS`` runs, and how many match in all.

        The rows' runs are a few entries of the history index per row of the page. A
        filter reads the schedules table: a search scans it once, for the page's names
        and the count (at 100,000 schedules: 40 ms). ``failing`` looks up the newest
        run of the schedules with a failed or lost run kept (0.4 s when 53,000 of
        100,000 have one), not of every schedule.
        """
        _check_filter(filter)
        _check_paging(offset, limit)
        found, total = self.store.page_schedules(filter, offset=offset, limit=limit)
        recent = self._run_store.recent_runs([s.name for s in found], count=SPARK_RUNS)
        rows = [_schedule_row(schedule, recent[schedule.name]) for schedule in found]
        return SchedulePage(rows=rows, total=total, offset=offset, limit=limit)

    def quarantined(self) -> builtins.list[QuarantinedSchedule]:
        """The schedules the scheduler disabled because it could not plan or publish
        them, oldest quarantine first: they fire no more until resumed."""
        return self.store.quarantined()

    # -- runs ---------------------------------------------------------------------

    def runs(
        self,
        name: str | None = None,
        *,
        state: RunState | None = None,
        since: Since | None = None,
        limit: int = 20,
    ) -> builtins.list[RunRecord]:
        """Runs newest first (by fire time, else claim time): of schedule ``name``, also
        a removed one, or of all; only in ``state``, only ``since`` a time (or a
        distance back from the database's now); at most ``limit``.

        A name that is neither a schedule nor in the run history is a typo: raises
        :class:`ScheduleNotFound`, rather than returning an empty list that looks
        like no runs."""
        found = self._run_store.history(schedule_name=name, state=state, since=since, limit=limit)
        if not found and name is not None:
            self._check_known_name(name)
        return found

    def run_page(self, name: str, *, before: str | None = None, limit: int = 50) -> RunPage:
        """The runs of schedule ``name`` (also a removed one) newest first (by fire time,
        then run ID), ``limit`` of them (at most ``MAX_PAGE_ROWS``), older than the cursor
        ``before``: the ``next_before`` of the page before, None for the newest.

        Keyset paging: a deep page costs what the first does, and runs added meanwhile
        shift no page. Raises :class:`ScheduleNotFound` as :meth:`runs` does, and
        :class:`InvalidSchedule` for a cursor no page gave."""
        _check_paging(0, limit)
        found = self._run_store.run_page(name, before=before, limit=limit)
        if not found.runs:
            self._check_known_name(name)
        return found

    def run_stats(
        self, window: timedelta, *, schedule: str | None = None, buckets: int = 60
    ) -> RunStats:
        """The runs of the ``window`` (1 minute to ``MAX_STATS_WINDOW``) that ends at the
        database's now, of schedule ``schedule`` (also a removed one) or of all, in
        ``buckets`` equal buckets (at most ``MAX_STATS_BUCKETS``; fewer when a bucket
        would be shorter than a minute): counts by state and lateness percentiles.

        Of all schedules, it reads the leader's summary of finished runs by minute
        (placed at the minute they finished; lateness percentiles approximate, within
        9 %) plus the runs of the last minutes live; of one schedule, its runs, exact
        (see :mod:`beat.store.stats`). Raises :class:`ScheduleNotFound` as
        :meth:`runs` does."""
        _check_stats(window, buckets)
        stats = self._run_stats.stats(window, buckets=buckets, schedule=schedule)
        if schedule is not None and not any(stats.total_counts.values()):
            self._check_known_name(schedule)
        return stats

    def _check_known_name(self, name: str) -> None:
        try:
            self.store.stored_schedule(name)  # one whose row cannot be read has runs too
            return
        except ScheduleNotFound:
            if self._run_store.history(schedule_name=name, limit=1):
                return
        raise ScheduleNotFound(
            f"no schedule or run history named {name!r:.200}: `celery -A app schedules list`"
            " shows the schedules"
        )

    def run(self, run_id: uuid.UUID) -> RunRecord | None:
        """The run ``run_id`` (the Celery task ID of a scheduled run); None if unknown."""
        return self._run_store.run(run_id)

    def steps(self, run_id: uuid.UUID) -> builtins.list[RunRecord]:
        """The steps of workflow run ``run_id`` recorded so far, in the order of their
        paths (``beat.schedule.workflow``); empty for a run that is not a workflow."""
        return self._run_store.steps(run_id)

    def last_runs(self) -> dict[str, LastRun]:
        """The newest run (by fire time) of every schedule that has one, by name."""
        return self._run_store.last_runs()


def _schedule_row(schedule: StoredSchedule, recent: RecentRuns) -> ScheduleRow:
    return ScheduleRow(schedule=schedule, last_run=recent.last_run, recent_lateness=recent.lateness)


def _check_filter(where: ScheduleFilter) -> None:
    """A filter of the schedule list whose fields have their types; a search is text
    that PostgreSQL can hold, no longer than a task name."""
    if not isinstance(where, ScheduleFilter):
        raise InvalidSchedule(
            f"filter must be a ScheduleFilter (beat.ops.schedules), got {type(where).__name__}:"
            " pass ScheduleFilter(search=..., paused=..., failing=..., origin=...)"
        )
    search = where.search
    if search is not None and (
        not isinstance(search, str) or len(search) > MAX_TASK_NAME_LENGTH or "\x00" in search
    ):
        raise InvalidSchedule(
            f"search must be text of at most {MAX_TASK_NAME_LENGTH} characters without NUL,"
            f" got {search!r:.80}: search for a part of a schedule or task name"
        )
    for label, value in (("paused", where.paused), ("failing", where.failing)):
        if value is not None and not isinstance(value, bool):
            raise InvalidSchedule(f"{label} must be true or false, got {value!r:.80}")
    if where.origin is not None and not isinstance(where.origin, Origin):
        choices = ", ".join(f"Origin.{origin.name}" for origin in Origin)
        raise InvalidSchedule(f"origin must be one of {choices} or None, got {where.origin!r:.80}")


def _check_paging(offset: int, limit: int) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidSchedule(
            f"offset must be a whole number from 0, got {offset!r:.80}: start from 0"
        )
    check_count(limit, "limit (rows per page)", maximum=MAX_PAGE_ROWS)


def _check_stats(window: timedelta, buckets: int) -> None:
    if not isinstance(window, timedelta) or not MIN_BUCKET <= window <= MAX_STATS_WINDOW:
        raise InvalidSchedule(
            f"the statistics window must be from 1 minute to {MAX_STATS_WINDOW.days} days,"
            f" got {window!r:.80}: give a timedelta in that range"
        )
    check_count(buckets, "buckets", maximum=MAX_STATS_BUCKETS)


def upcoming_fires(schedule: Schedule, now: datetime, count: int) -> list[datetime]:
    """The next ``count`` fire times: from the stored next fire time, or, for a paused
    schedule, those it would have if resumed ``now``."""
    definition = schedule.definition
    zone = timing.parse_zone(definition.timezone)
    following = schedule.next_fire_at
    if not definition.enabled and not isinstance(definition.trigger, timing.Once):
        following = timing.next_fire_after(definition.trigger, zone, now)
    found: list[datetime] = []
    while following is not None and len(found) < count:
        found.append(following)
        following = timing.next_fire_after(definition.trigger, zone, following)
    return found
