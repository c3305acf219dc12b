"""What tells the state of the cluster, the cluster part of
:class:`beat.ops.schedules.Schedules`: who leads, the health checks, and the cluster
page's overview (beat processes, workers, overdue schedules, stuck queues), each part
read on its own so that a server that is down leaves the others readable."""

from __future__ import annotations

import builtins
import contextlib
from collections.abc import Callable, Collection, Mapping
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import SQLAlchemyError

from beat.config import BeatConfig, setting
from beat.errors import ConfigError, HABeatError, LeaseUnavailable, StoreUnavailable
from beat.lease.presence import BeatProcess, leader_first, read_beats
from beat.lease.status import LeaseStatus, read_lease
from beat.models import Incident, IncidentKind
from beat.ops.health import ClusterStatus, Health, health_checks
from beat.ops.read_models import ClusterOverview
from beat.ops.schedules_base import SchedulesBase
from beat.publish.inventory import queue_of
from beat.store.db import first_line
from beat.store.leader import IncidentList, LeaderInfo, QueueOf, WorkerPresence
from beat.store.schedules import OverdueSchedules

#: Overdue schedules :meth:`Schedules.cluster_overview` lists (it counts them all).
OVERDUE_LIMIT = 50
#: A run published this long ago that no worker has received waits in a queue nobody
#: consumes (or whose workers are all busy): a free worker takes a message within
#: milliseconds, and a worker restarting is back within seconds.
STUCK_QUEUED_AFTER = timedelta(seconds=60)

#: The queue of a message routed nowhere else, when no app says otherwise (Celery's
#: ``task_default_queue``).
DEFAULT_QUEUE = "celery"


class ClusterReads(SchedulesBase):
    """Who leads, whether the cluster is healthy, and what its page shows."""

    def cluster_status(self) -> ClusterStatus:
        """Who leads: the leader row (PostgreSQL) and the lease (Redis), with the
        database's now. StoreUnavailable or LeaseUnavailable if one does not answer."""
        info = self.store.leader_info()
        now = self.store.now()
        return ClusterStatus(leader=info, lease=self._read_lease(), now=now)

    def health(self, *, fail_on: Collection[IncidentKind] = ()) -> Health:
        """The checks of :func:`beat.ops.health.health_checks`; never raises for a service
        that does not answer (its check fails)."""
        grace = default_overdue_grace(self._setting("lock_ttl"))
        return health_checks(self.store, self._read_lease, overdue_grace=grace, fail_on=fail_on)

    def incidents(
        self, *, include_resolved: bool = False, limit: int = 100, schedule: str | None = None
    ) -> builtins.list[Incident]:
        """The open incidents (all with ``include_resolved``), newest first; ``schedule``:
        only those of the schedule of that name (not the cluster's)."""
        return self.store.incidents(
            include_resolved=include_resolved, limit=limit, schedule=schedule
        )

    def incident_list(self, *, include_resolved: bool = False, limit: int = 100) -> IncidentList:
        """:meth:`incidents`, telling which have a schedule whose page can be linked."""
        return self.store.incident_list(include_resolved=include_resolved, limit=limit)

    def open_incident_count(self) -> int:
        """How many incidents are open."""
        return self.store.open_incident_count()

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
