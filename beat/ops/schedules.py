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

:class:`Schedules` is composed of parts by concern, each on the state declared in
:mod:`beat.ops.schedules_base`: :mod:`beat.ops.schedule_commands` (what changes
schedules and runs), :mod:`beat.ops.schedule_reads` (what reads them) and
:mod:`beat.ops.cluster` (who leads, health, the cluster overview) and
:mod:`beat.ops.importing` (moving in from another scheduler) and
:mod:`beat.ops.channels` (where incidents are notified) and :mod:`beat.ops.audit`
(who changed what, and restores) and :mod:`beat.ops.api_access` (the API's tokens);
the values they
return are in :mod:`beat.ops.read_models`. This module keeps the constructor and the
database, and re-exports the names callers import from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from beat.config import BeatConfig
from beat.lease.presence import BeatProcess as BeatProcess
from beat.models import ChangeEntry
from beat.ops.api_access import ApiAccess
from beat.ops.audit import ScheduleAudit
from beat.ops.channels import ChannelCommands
from beat.ops.cluster import DEFAULT_QUEUE as DEFAULT_QUEUE
from beat.ops.cluster import OVERDUE_LIMIT as OVERDUE_LIMIT
from beat.ops.cluster import STUCK_QUEUED_AFTER as STUCK_QUEUED_AFTER
from beat.ops.cluster import ClusterReads
from beat.ops.cluster import default_overdue_grace as default_overdue_grace
from beat.ops.importing import ScheduleImports
from beat.ops.read_models import ClusterOverview as ClusterOverview
from beat.ops.read_models import ScheduleDetails as ScheduleDetails
from beat.ops.read_models import SchedulePage as SchedulePage
from beat.ops.read_models import ScheduleRow as ScheduleRow
from beat.ops.read_models import ScheduleSummary as ScheduleSummary
from beat.ops.read_models import problem_of as problem_of
from beat.ops.schedule_commands import BACKFILL_HORIZON_MARGIN as BACKFILL_HORIZON_MARGIN
from beat.ops.schedule_commands import MAX_BACKFILL_RUNS as MAX_BACKFILL_RUNS
from beat.ops.schedule_commands import ScheduleCommands
from beat.ops.schedule_reads import EVERY_SCHEDULE as EVERY_SCHEDULE
from beat.ops.schedule_reads import MAX_PAGE_ROWS as MAX_PAGE_ROWS
from beat.ops.schedule_reads import MAX_STATS_BUCKETS as MAX_STATS_BUCKETS
from beat.ops.schedule_reads import MAX_STATS_WINDOW as MAX_STATS_WINDOW
from beat.ops.schedule_reads import RECENT_RUNS as RECENT_RUNS
from beat.ops.schedule_reads import SPARK_RUNS as SPARK_RUNS
from beat.ops.schedule_reads import UPCOMING_FIRES as UPCOMING_FIRES
from beat.ops.schedule_reads import ScheduleReads
from beat.ops.schedule_reads import upcoming_fires as upcoming_fires
from beat.ops.schedules_base import this_machine
from beat.schedule.payload import MAX_JSON_DEPTH as MAX_JSON_DEPTH
from beat.schedule.payload import MAX_PAYLOAD_BYTES as MAX_PAYLOAD_BYTES
from beat.store.all_roles import Store
from beat.store.history import RunPage as RunPage
from beat.store.leader import QueueBacklog as QueueBacklog
from beat.store.leader import WorkerPresence as WorkerPresence
from beat.store.percentiles import Percentiles as Percentiles
from beat.store.rows import preview as preview
from beat.store.runs import RunStore
from beat.store.schedules import OverdueSchedule as OverdueSchedule
from beat.store.schedules import ScheduleFilter as ScheduleFilter
from beat.store.stats import RunStats as RunStats
from beat.store.stats import RunStatsStore
from beat.store.stats import StatsBucket as StatsBucket
from beat.store.stored_schedules import StoredSchedule as StoredSchedule
from beat.store.stored_schedules import UnreadableSchedule as UnreadableSchedule


class Schedules(
    ScheduleAudit,
    ScheduleCommands,
    ScheduleReads,
    ClusterReads,
    ScheduleImports,
    ChannelCommands,
    ApiAccess,
):
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
        self.change = this_machine(ChangeEntry.PYTHON)
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
