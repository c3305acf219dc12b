"""The Python API for schedules: define, create, update, pause, resume, delete.

Everything a user passes is validated by :func:`define` before anything is
written, so a bad cron, an unknown zone, an unknown task or oversized
arguments leave the database untouched::

    from app import celery_app
    from beat import Schedules

    schedules = Schedules.for_app(celery_app)
    schedules.create("nightly-report", "tasks.demo.report", cron="30 2 * * *",
                     tz="Europe/Berlin", kwargs={"format": "pdf"})
    schedules.pause("nightly-report")
"""

from __future__ import annotations

import builtins
import contextlib
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from beat.config import BeatConfig, setting
from beat.errors import (
    ConfigError,
    HABeatError,
    InvalidSchedule,
    LeaseUnavailable,
    ScheduleNotFound,
    StoreUnavailable,
    UnknownTask,
)
from beat.lease.presence import BeatProcess as BeatProcess
from beat.lease.presence import leader_first, read_beats
from beat.lease.status import LeaseStatus, read_lease
from beat.models import Origin, RunState, Schedule, ScheduleDefinition
from beat.ops.health import ClusterStatus, Health, health_checks
from beat.publish.inventory import queue_of
from beat.schedule import timing
from beat.schedule.define import (
    MAX_TASK_NAME_LENGTH,
    arguments_problem,
    check_count,
    check_task_name,
    define,
    first_fire_at,
)
from beat.schedule.payload import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from beat.schedule.payload import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from beat.store.all_roles import Store
from beat.store.code_sync import SyncReport, next_fire_after_retiming
from beat.store.db import first_line
from beat.store.history import LastRun, RecentRuns, RunRecord, Since
from beat.store.history import RunPage as RunPage
from beat.store.leader import LeaderInfo, PruneReport, QueueOf
from beat.store.leader import QueueBacklog as QueueBacklog
from beat.store.leader import WorkerPresence as WorkerPresence
from beat.store.percentiles import Percentiles as Percentiles
from beat.store.rows import preview as preview
from beat.store.runs import RunStore
from beat.store.schedules import OverdueSchedule as OverdueSchedule
from beat.store.schedules import OverdueSchedules, QuarantinedSchedule
from beat.store.schedules import ScheduleFilter as ScheduleFilter
from beat.store.stats import MIN_BUCKET, RunStatsStore
from beat.store.stats import RunStats as RunStats
from beat.store.stats import StatsBucket as StatsBucket
from beat.store.stored_schedules import StoredSchedule as StoredSchedule
from beat.store.stored_schedules import UnreadableSchedule as UnreadableSchedule

#: Most runs one backfill creates: they are built, inserted and returned in one go
#: (86,401 runs of a one-second schedule took 363 MB in the CLI).
MAX_BACKFILL_RUNS = 10_000
#: Backfill starts this long after the retention horizon: a run claimed ahead (up to
#: habeat_claim_ahead, at most 30 s) counts its age from before its fire time.
BACKFILL_HORIZON_MARGIN = timedelta(minutes=1)
#: Fire times :meth:`Schedules.details` lists.
UPCOMING_FIRES = 5
#: Runs :meth:`Schedules.details` lists.
RECENT_RUNS = 10
#: Overdue schedules :meth:`Schedules.cluster_overview` lists (it counts them all).
OVERDUE_LIMIT = 50
#: A run published this long ago that no worker has received waits in a queue nobody
#: consumes (or whose workers are all busy): a free worker takes a message within
#: milliseconds, and a worker restarting is back within seconds.
STUCK_QUEUED_AFTER = timedelta(seconds=60)
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


class Schedules:
    """Create and steer schedules in the store, read their runs, and tell the state of
    the cluster: the one entry point of code and of the CLI (a thin layer over this,
    as a web page would be). It returns domain objects and plain values, and raises
    domain errors (``beat.errors``)."""

    def __init__(
        self,
        store: Store,
        *,
        app: Any | None = None,
        default_tz: str = "UTC",
        defaults: Mapping[str, Any] | None = None,
        history_retention: timedelta | None = None,
        config: BeatConfig | None = None,
    ) -> None:
        self.store = store
        self.app = app
        self.default_tz = default_tz
        #: Fields a new schedule gets when the caller leaves them out (settings).
        self.defaults = dict(defaults or {})
        #: How long finished runs are kept (None: for ever); backfill stays within it.
        self.history_retention = history_retention
        #: The settings of the cluster: where its lease is (``cluster_status``, ``health``).
        self.config = config
        #: The run history, on the same connection pool.
        self._run_store = RunStore(store.engine, setting=store.setting)
        self._run_stats = RunStatsStore(store.engine, setting=store.setting)

    @classmethod
    def for_app(cls, app: Any) -> Schedules:
        """Schedules of a Celery app configured for this scheduler (``habeat_*`` keys)."""
        config = BeatConfig.from_celery_conf(app.conf)
        store = Store.connect(
            config.database_url, leader_name=config.key_prefix, setting=config.database_setting
        )
        return cls(
            store,
            app=app,
            default_tz=config.default_timezone,
            defaults=config.schedule_defaults(),
            history_retention=(
                timedelta(days=config.history_retention_days)
                if config.history_retention_days > 0
                else None
            ),
            config=config,
        )

    # -- the database -------------------------------------------------------------

    @property
    def database_url(self) -> str:
        """The schedule database's URL, password hidden."""
        return self.store.url

    def migrate(self) -> str:
        """Create the database if it is missing and upgrade the schema to the newest
        revision (safe to run any time, from several places); the revision."""
        return self.store.migrate()

    def check_schema(self) -> None:
        """SchemaOutdated unless the schema is the one this code expects."""
        self.store.check_schema()

    def close(self) -> None:
        """Close the connections to the database."""
        self.store.dispose()

    # -- schedules ----------------------------------------------------------------

    def create(
        self, name: str, task: str, *, allow_unregistered: bool = False, **fields: Any
    ) -> Schedule:
        """Validate and store a new schedule; see :func:`define` for the fields."""
        fields = {**self.defaults, **fields}
        fields.setdefault("default_tz", self.default_tz)
        # Bad input is refused before the task lookup; the past is the database's, below.
        checked = define(name, task, **(fields | {"allow_past": True}))
        if not allow_unregistered:
            self.check_task_registered(task)
            self.check_arguments(checked)

        def build(now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = define(name, task, now=now, **fields)
            return definition, first_fire_at(definition, now)

        return self.store.insert_schedule(build)

    def update(self, name: str, *, allow_unregistered: bool = False, **changes: Any) -> Schedule:
        """Change some fields of a schedule; a changed timing recomputes the next fire time."""
        if "task" in changes:
            check_task_name(changes["task"])  # before it is looked up
            if not allow_unregistered:
                self.check_task_registered(changes["task"])
        check_call = not allow_unregistered and bool({"task", "args", "kwargs"} & set(changes))
        if check_call:
            self._import_tasks()

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = _redefine(current.definition, changes, now)
            if check_call:
                self.check_arguments(definition)
            timing_changed = (definition.trigger, definition.timezone) != (
                current.definition.trigger,
                current.definition.timezone,
            )
            if not timing_changed:
                return definition, current.next_fire_at
            recomputed = first_fire_at(definition, now)
            if isinstance(definition.trigger, timing.Every):
                # A new interval counts from the change (or its start_at), as a new
                # schedule's does: nothing of the old timing is due under it.
                return definition, recomputed
            return definition, next_fire_after_retiming(
                current.next_fire_at, recomputed, definition, now
            )

        return self.store.replace_schedule(name, build)

    def pause(self, name: str) -> Schedule:
        """Stop firing; fire times while paused are not made up on resume."""
        return self.store.replace_schedule(
            name,
            lambda current, _now: (
                replace(current.definition, enabled=False),
                current.next_fire_at,
            ),
        )

    def resume(self, name: str) -> Schedule:
        """Fire again from the next fire time after now."""

        def build(current: Schedule, now: datetime) -> tuple[ScheduleDefinition, datetime | None]:
            definition = replace(current.definition, enabled=True)
            if current.definition.enabled:
                return definition, current.next_fire_at
            return definition, _resumed_next_fire(current, now)

        return self.store.replace_schedule(name, build)

    def delete(self, name: str) -> None:
        """Delete a schedule made at runtime; one defined in code is refused (the next
        sync would bring it back)."""
        self.store.delete_schedule(name)

    def get(self, name: str) -> Schedule:
        return self.store.get_schedule(name)

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
        filter reads the schedules table: a search scans it, for the count and for the
        page (at 100,000 schedules: 40 to 80 ms in all). ``failing`` looks up the newest
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

    def sync_code(self, definitions: Sequence[tuple[ScheduleDefinition, str]]) -> SyncReport:
        """Make the schedules defined in code (``beat.schedule.code.collect``: each
        with the hash of its definition) those of the database, as beat does when it
        starts: see :meth:`beat.store.code_sync.CodeSync.sync_code_schedules`."""
        return self.store.sync_code_schedules(definitions, first_fire_at)

    def _import_tasks(self) -> None:
        if self.app is not None:
            self.app.loader.import_default_modules()

    def check_task_registered(self, task: str) -> None:
        if self.app is None:
            return
        self._import_tasks()
        if task not in self.app.tasks:
            raise UnknownTask(
                f"task {task!r:.200} is not registered with the Celery app '{self.app.main}':"
                " check the name, or allow it explicitly (--allow-unregistered)"
                " if only the workers import it"
            )

    def check_arguments(self, definition: ScheduleDefinition) -> None:
        """Refuse args and kwargs that the task, if this app knows it, cannot be called
        with: every run would fail the same way."""
        registered = None if self.app is None else self.app.tasks.get(definition.task)
        problem = arguments_problem(registered, definition)
        if problem is not None:
            raise InvalidSchedule(
                f"{problem}: give matching --args/--kwargs, or --allow-unregistered if the"
                " workers run another version of the task"
            )

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

    def last_runs(self) -> dict[str, LastRun]:
        """The newest run (by fire time) of every schedule that has one, by name."""
        return self._run_store.last_runs()

    def backfill(
        self, name: str, *, start: datetime, end: datetime, limit: int = 100
    ) -> Sequence[RunRecord]:
        """Create the runs of schedule ``name`` for its fire times in ``start`` .. ``end``
        (oldest first, at most ``limit``, itself at most ``MAX_BACKFILL_RUNS``: like the
        misfire policy fire_all). Fire times that already have a run are left alone.
        Returns the runs created.

        The window must have passed (``end`` not after the database's now: fire times
        to come run on schedule) and lie within the history retention (older runs may
        be deleted, so which fire times ran is no longer known)."""
        if start.utcoffset() is None or end.utcoffset() is None or end < start:
            raise InvalidSchedule("backfill needs aware start and end times, end not before start")
        check_count(limit, "backfill limit", maximum=MAX_BACKFILL_RUNS)
        schedule = self.get(name)

        def fire_times(now: datetime) -> list[datetime]:
            self._check_backfill_window(start, end, now)
            return _fire_times_between(schedule, start, end, limit)

        return self.store.backfill(name, fire_times)

    def _check_backfill_window(self, start: datetime, end: datetime, now: datetime) -> None:
        if end > now:
            raise InvalidSchedule(
                f"backfill end (--to) {end.isoformat()} is after the database's now"
                f" {now.isoformat()}: end the window at now or earlier"
                " (fire times to come run on schedule)"
            )
        if self.history_retention is None:
            return
        horizon = now - self.history_retention + BACKFILL_HORIZON_MARGIN
        if start < horizon:
            raise InvalidSchedule(
                f"backfill start (--from) {start.isoformat()} is before {horizon.isoformat()}:"
                f" the runs of older fire times may have been deleted (history retention"
                f" {self.history_retention.total_seconds() / 86400:g} days), so which ran is"
                " unknown; start the window later, or keep more history"
                " (habeat_history_retention_days) before it is needed"
            )

    def prune(self, older_than: timedelta, *, batch: int = 1000) -> PruneReport:
        """Delete finished runs older than ``older_than``, ``batch`` rows per transaction."""
        return self.store.prune(older_than, batch=batch)

    def trigger(self, name: str) -> str:
        """Run schedule ``name`` once, now, besides its timing (paused or not); the run ID.

        The run is queued in PostgreSQL and the leader publishes it at its next tick
        (woken at once), with the run ID as the Celery task ID. ``next_fire_at`` is
        not touched. Raises :class:`ScheduleNotFound` for an unknown name.
        """
        return str(self.trigger_run(name).id)

    def trigger_run(self, name: str, *, run_id: uuid.UUID | None = None) -> RunRecord:
        """:meth:`trigger`, returning the run as queued rather than its ID. With
        ``run_id`` it is idempotent: the same ID again returns the run already queued
        (a form posted twice runs once)."""
        return self.store.trigger(name, run_id=run_id)

    # -- the cluster --------------------------------------------------------------

    def cluster_status(self) -> ClusterStatus:
        """Who leads: the leader row (PostgreSQL) and the lease (Redis), with the
        database's now. StoreUnavailable or LeaseUnavailable if one does not answer."""
        info = self.store.leader_info()
        now = self.store.now()
        return ClusterStatus(leader=info, lease=self._read_lease(), now=now)

    def health(self) -> Health:
        """The checks of :func:`beat.ops.health.health_checks`; never raises for a service
        that does not answer (its check fails)."""
        grace = default_overdue_grace(self._setting("lock_ttl"))
        return health_checks(self.store, self._read_lease, overdue_grace=grace)

    def _read_lease(self) -> LeaseStatus:
        config = self._redis_config()
        return read_lease(config.redis_url, prefix=config.key_prefix, setting=config.redis_setting)

    def _redis_config(self) -> BeatConfig:
        if self.config is None:
            raise ConfigError(
                "the lease's Redis is not known to this Schedules: make it with"
                " Schedules.for_app(app), or pass config=BeatConfig(...)"
            )
        return self.config

    # -- the cluster page ---------------------------------------------------------

    def cluster_overview(
        self,
        *,
        overdue_grace: timedelta | None = None,
        overdue_limit: int = OVERDUE_LIMIT,
        stuck_after: timedelta = STUCK_QUEUED_AFTER,
    ) -> ClusterOverview:
        """Who leads, the beat processes and workers that are up, the schedules nobody
        claims and the queues no worker takes from (see :class:`ClusterOverview`).

        Each part is read on its own: one whose server does not answer is left empty
        and named in ``problems``; this never raises for a server that is down.
        ``overdue_grace`` defaults to :func:`default_overdue_grace` of the lease TTL."""
        parts = _Parts()
        leader_row = parts.read("postgres", "leader row", self._leader_row)
        lease = parts.read("redis", "lease", self._read_lease)
        beats = parts.read("redis", "beat processes", self._read_beats) or []
        workers = parts.read("postgres", "workers", self._live_workers) or []
        if (grace := overdue_grace) is None:
            grace = default_overdue_grace(self._setting("lock_ttl"))
        overdue = parts.read(
            "postgres",
            "overdue schedules",
            lambda: self.store.overdue(grace=grace, limit=overdue_limit),
        ) or OverdueSchedules(schedules=[], total=0)
        stuck = parts.read(
            "postgres",
            "stuck queues",
            lambda: self.store.queued_backlog(
                older_than=stuck_after, queue_of=_queue_resolver(self.app)
            ),
        )
        status = None
        if leader_row is not None and lease is not None:
            status = ClusterStatus(leader=leader_row[0], lease=lease, now=leader_row[1])
        return ClusterOverview(
            status=status,
            beats=leader_first(beats, None if lease is None else lease.holder),
            workers=workers,
            overdue=overdue.schedules,
            overdue_total=overdue.total,
            stuck_queues=stuck or [],
            problems=parts.problems,
        )

    def _leader_row(self) -> tuple[LeaderInfo | None, datetime]:
        """The leader row and the database's now, as :meth:`cluster_status` reads them."""
        return self.store.leader_info(), self.store.now()

    def _read_beats(self) -> builtins.list[BeatProcess]:
        config = self._redis_config()
        return read_beats(config.redis_url, prefix=config.key_prefix, setting=config.redis_setting)

    def _live_workers(self) -> builtins.list[WorkerPresence]:
        """Workers seen within their lease (they renew their row every third of it)."""
        lease = timedelta(seconds=self._setting("lease_timeout"))
        return self.store.live_workers(within=lease)

    def _setting(self, name: str) -> Any:
        """The cluster's setting ``name``, or its default when the settings are not known."""
        return setting(name).default if self.config is None else getattr(self.config, name)


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


def _fire_times_between(
    schedule: Schedule, start: datetime, end: datetime, limit: int
) -> list[datetime]:
    """The fire times of ``schedule`` in ``start`` .. ``end``; refused beyond ``limit``."""
    trigger = schedule.definition.trigger
    zone = timing.parse_zone(schedule.definition.timezone)
    first = timing.next_fire_after(trigger, zone, start - timedelta(microseconds=1))
    if first is None or first > end:
        return []
    times = [first, *timing.fire_times(trigger, zone, after=first, until=end, limit=limit)]
    if len(times) > limit:
        raise InvalidSchedule(
            f"{start.isoformat()} .. {end.isoformat()} holds more than {limit} fire times"
            f" of {schedule.definition.name}: backfill a shorter window"
        )
    return times


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


def _redefine(
    current: ScheduleDefinition, changes: Mapping[str, Any], now: datetime
) -> ScheduleDefinition:
    """The definition with ``changes`` applied, validated as a whole by :func:`define`
    (relative times count from the database's ``now``)."""
    fields: dict[str, Any] = {
        "args": current.args,
        "kwargs": current.kwargs,
        "options": current.options,
        "enabled": current.enabled,
        "misfire_policy": current.misfire_policy,
        "max_attempts": current.max_attempts,
        "origin": current.origin,
        "overlap_policy": current.overlap_policy,
        "jitter": current.jitter_seconds,
        "end_at": current.end_at,
        "max_runs": current.max_runs,
    }
    timing_keys = {"cron", "every", "at", "in_seconds", "start_at"}
    if not timing_keys & set(changes):
        fields |= _trigger_fields(current)
    elif _window_start_stays(current, changes, now):
        fields["start_at"] = current.start_at
    fields |= dict(changes)
    if "at" not in changes:
        fields["allow_past"] = True  # a one-off's own time is not checked again
    task = fields.pop("task", current.task)
    # The zone stays unless changed; only a zone given anew is checked against the timing.
    return define(current.name, task, default_tz=current.timezone, now=now, **fields)


def _window_start_stays(
    current: ScheduleDefinition, changes: Mapping[str, Any], now: datetime
) -> bool:
    """Whether a new timing keeps the window's start_at: always when it is not given
    anew, except for an interval once the window has started (start_at is also where
    an interval counts from, and a changed one counts from the change)."""
    if "start_at" in changes or current.start_at is None:
        return False
    return "every" not in changes or current.start_at > now


def _trigger_fields(current: ScheduleDefinition) -> dict[str, Any]:
    trigger = current.trigger
    if isinstance(trigger, timing.Cron):
        # The trigger itself, so a change of anything else keeps its day rule.
        return {"cron": trigger, "start_at": current.start_at}
    if isinstance(trigger, timing.Every):
        return {"every": trigger.seconds, "start_at": trigger.anchor}
    return {"at": trigger.at}


def _resumed_next_fire(current: Schedule, now: datetime) -> datetime | None:
    if current.next_fire_at is None:
        return None  # a finished one-off stays finished
    trigger = current.definition.trigger
    if isinstance(trigger, timing.Once):
        return current.next_fire_at  # a paused one-off still fires once
    return timing.next_fire_after(trigger, timing.parse_zone(current.definition.timezone), now)


# -- the cluster page -------------------------------------------------------------------

#: The queue of a message routed nowhere else, when no app says otherwise (Celery's
#: ``task_default_queue``).
DEFAULT_QUEUE = "celery"


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


def default_overdue_grace(lock_ttl: float) -> timedelta:
    """How late a fire time may be before its schedule counts as overdue: twice the
    lease TTL, plus 5 s. A leader claims a fire time when it comes (it is woken for
    it); a failover leaves one unclaimed for up to a lease TTL (a dead leader's lease
    running out, when its crash is not seen at once) plus a standby's poll and first
    claim. The second TTL and the 5 s (the default max_wait) leave room for that, and
    for a burst claimed batch after batch, so only a cluster that claims nothing
    shows schedules here."""
    return timedelta(seconds=2 * lock_ttl + 5)


PartT = TypeVar("PartT")


class _Parts:
    """Reads the parts of an overview one by one. One that fails reads as None and adds
    a line to ``problems``; once a server is found down (or not configured), its other
    parts are not tried: each would wait out the connection timeout again."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self._down: dict[str, str] = {}

    def read(self, server: str, part: str, action: Callable[[], PartT]) -> PartT | None:
        if server in self._down:
            self.problems.append(f"{server}: {part}: not read ({self._down[server]} failed)")
            return None
        try:
            return action()
        except (HABeatError, SQLAlchemyError) as exc:
            if isinstance(exc, StoreUnavailable | LeaseUnavailable | ConfigError):
                self._down[server] = f"reading the {part}"
            self.problems.append(f"{server}: {part}: {first_line(exc)}")
            return None


def _queue_resolver(app: Any | None) -> QueueOf:
    """The queue of a run as ``app`` routes it (``beat.publish.inventory.queue_of``).
    Without an app, or when its route cannot be worked out (a topic or fanout exchange,
    a queue the app does not declare), the queue its options name, else its exchange,
    else the default queue."""
    default = DEFAULT_QUEUE if app is None else str(app.conf.task_default_queue)

    def resolve(task: str, options: Mapping[str, Any]) -> str:
        if app is not None:
            # A router of the app may raise anything: the run still counts, by its options.
            with contextlib.suppress(Exception):
                found = queue_of(app, task, options)
                if found is not None:
                    return found
        if options.get("queue"):
            return str(options["queue"])
        return f"exchange {options['exchange']}" if options.get("exchange") else default

    return resolve
