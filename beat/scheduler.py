"""The Celery beat scheduler class: ``beat_scheduler = "beat.scheduler:HAScheduler"``
(or ``celery beat -S ha``).

This class adapts Celery's beat to the leader loop (``beat.leader.loop``): it
reads the settings, checks the code-defined schedules at start, syncs them
once connected, runs one pass of the loop per ``tick()`` behind an error
boundary, and hands the lease over on ``close()``. The clients (PostgreSQL,
Redis, the LISTEN connection) are built on first use, never in ``__init__``:
beat builds this class several times for its banner.

Nothing escapes ``tick()``: an error is logged with what to do and the loop
tries again shortly, so a standby survives Redis and PostgreSQL restarts.
Losing the lease stops claiming, never the process.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any, NoReturn

from celery.beat import Scheduler

from beat import metrics
from beat.config import BeatConfig
from beat.delivery.workflow_steps import install_step_recording
from beat.errors import ConfigError, StaleEpoch
from beat.leader.armed import ArmedRuns
from beat.leader.leadership import Leadership
from beat.leader.loop import LeaderLoop
from beat.leader.lost_messages import LostMessages
from beat.leader.overlapped_send import SHUTDOWN_WAIT
from beat.leader.reporting import MAX_BACKOFF, Reporter, TickErrors
from beat.lease.beacon import CrashDetection, SessionBeacon
from beat.lease.database_hold import DatabaseHold
from beat.lease.holder import LeaderLease
from beat.lease.presence import BeatPresence
from beat.lease.redis_url import redis_client
from beat.models import ChangeEntry
from beat.publish.confirms import confirm_publishes
from beat.publish.dispatch import CeleryPublisher
from beat.records import ChangeContext
from beat.schedule import code as code_schedules
from beat.schedule.define import first_fire_at
from beat.store.db import masked_url
from beat.store.leader import Claim, LeaderStore, ScheduleChangeListener
from beat.store.schedules import ScheduleStore

logger = logging.getLogger(__name__)

#: Beat's exit status when a code schedule is refused at start (a usage error, as click's).
CONFIG_ERROR_EXIT_STATUS = 2


def _refuse_to_start(exc: ConfigError) -> NoReturn:
    """Stop beat on a setting or code schedule it cannot run: one line naming the fix,
    exit status 2 (a usage error). Raised, the error would reach Celery's beat, which
    logs it with its traceback and lets it through to stderr, which beat logs one
    write at a time: a screen of one-character lines burying the message."""
    logger.critical("beat cannot start: %s", exc)
    raise SystemExit(CONFIG_ERROR_EXIT_STATUS) from None


class HAScheduler(Scheduler):  # type: ignore[misc]  # celery is untyped
    """A highly-available beat scheduler: schedules in PostgreSQL, one leader at a time."""

    #: Test hook: called after a claim commits and before its runs are published.
    after_claim_commit: Callable[[Claim], None] | None = None

    def __init__(self, app: Any, *args: Any, lazy: bool = False, **kwargs: Any) -> None:
        # Beat builds this class several times with lazy=True (for its banner):
        # nothing here may connect anywhere.
        try:
            self.config = BeatConfig.from_celery_conf(app.conf)
        except ConfigError as exc:
            _refuse_to_start(exc)
        self._store: LeaderStore | None = None
        self._schedule_store: ScheduleStore | None = None
        self._lease: LeaderLease | None = None
        self._listener: ScheduleChangeListener | None = None
        self._leadership: Leadership | None = None
        self._presence: BeatPresence | None = None
        self._crash_detection: CrashDetection | None = None
        self._loop: LeaderLoop | None = None
        self._started = False
        self._closed = False
        self._errors = TickErrors()
        self._report = Reporter()
        self._code: list[Any] = []
        self._metrics_started = False
        kwargs["max_interval"] = self.config.max_wait
        # Before any connection of the app's pool exists: its options are read then.
        confirm_publishes(app)
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- celery.beat.Scheduler interface -------------------------------------------

    def setup_schedule(self) -> None:
        """Validate code-defined schedules now, so a broken one stops beat at start:
        one line naming the entry and the fix, exit status 2 (a usage error)."""
        code_schedules.load_as_beat_does(self.app)
        try:
            self._code = code_schedules.collect(
                self.app,
                default_tz=self.config.default_timezone,
                defaults=self.config.schedule_defaults(),
            )
        except ConfigError as exc:
            _refuse_to_start(exc)
        for warning in code_schedules.task_warnings(self.app, self._code):
            logger.warning(warning)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass of the loop; returns 0 (it waited itself) or a back-off delay."""
        if self._closed:
            raise SystemExit()  # closed by a shutdown signal: no pass after it
        self._start_metrics()
        try:
            self._start()
            self.loop.run_once()
        except StaleEpoch as exc:
            # run_once waited a bounded time for the send in flight: did it end?
            self.leadership.step_down(str(exc), nothing_in_flight=not self.loop.sends.in_flight)
        except Exception as exc:  # an error here would kill beat: log, back off, retry
            if self._closed:
                # SIGTERM's handler closed this scheduler, then raised SystemExit into
                # the call this pass was making; a driver cleaning up that call (psycopg
                # restoring autocommit after an interrupted ping) can raise an error of
                # its own in its place. The process stops as it was asked to.
                raise SystemExit() from exc
            return self._errors.failed(exc)
        else:
            self._errors.succeeded()
        finally:
            self._report.leading(self.epoch)
        return 0.0

    def sync(self) -> None:
        """Nothing to persist: the state lives in PostgreSQL."""

    def close(self) -> None:
        """Hand over cleanly: release the lease and wake the standbys (SIGTERM/SIGINT)."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            # A batch being sent is let finish (one batch of a burst, unless the broker
            # stopped answering): what it sends is then not sent again from the outbox
            # by the next leader.
            self._loop.sends.finish_quietly(timeout=SHUTDOWN_WAIT)
            # Runs claimed ahead are not waited for: the next leader publishes them from
            # the outbox at their fire time, so a hand-over is not delayed by them.
            self._loop.armed.drop()
            # A batch of notifications being sent is let finish (bounded: a send left
            # unrecorded is sent again), not cut off by the pools' close.
            self._loop.notifier.finish(timeout=SHUTDOWN_WAIT)
        if self._leadership is not None:
            self._leadership.hand_over()
        if self._listener is not None:
            self._listener.close()
        super().close()

    @property
    def info(self) -> str:
        return (
            f"    . store -> {masked_url(self.config.database_url)}\n"
            f"    . leader lease -> {masked_url(self.config.redis_url)}"
            f" key {self.config.key_prefix}:leader:lock ttl {self.config.lock_ttl}s"
        )

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    @property
    def epoch(self) -> int | None:
        return None if self._leadership is None else self._leadership.epoch

    # -- start ---------------------------------------------------------------------

    def _start(self) -> None:
        """Connect, check the schema and sync code schedules, once (retried until it works)."""
        if self._started:
            return
        self.schedule_store.check_schema()
        # The audit log names the sync at start the scheduler's, on this machine.
        change = ChangeContext(
            actor="system:code-sync", entry=ChangeEntry.CODE, host=socket.gethostname()
        )
        synced = self.schedule_store.sync_code_schedules(self._code, first_fire_at, change=change)
        self._report.code_synced(synced)
        self._started = True

    def _start_metrics(self) -> None:
        """Open the metrics endpoint on the first tick (never in __init__), if configured."""
        if self._metrics_started:
            return
        self._metrics_started = True
        port = self.config.metrics_port
        if not port:
            return
        try:
            metrics.start_metrics_server(port, self.config.metrics_address)
        except OSError as exc:  # scheduling matters more than its metrics
            logger.error(
                "cannot serve metrics on %s:%d (%s): beat runs without its metrics endpoint;"
                " free the port or change habeat_metrics_port (HABEAT_METRICS_PORT)",
                self.config.metrics_address,
                port,
                exc,
            )

    def _after_claim_commit(self, claim: Claim) -> None:
        if self.after_claim_commit is not None:
            self.after_claim_commit(claim)

    # -- lazily built parts (never in __init__) --------------------------------------

    @property
    def loop(self) -> LeaderLoop:
        if self._loop is None:
            install_step_recording()  # the first steps of workflows, as beat sends them
            self._loop = LeaderLoop(
                config=self.config,
                store=self.store,
                leadership=self.leadership,
                publisher=CeleryPublisher(self.app),
                waiter=self.listener,
                lost_messages=LostMessages(self.app),
                armed=ArmedRuns(),
                reporter=self._report,
                after_claim_commit=self._after_claim_commit,
                crash_detection=self.crash_detection,
            )
        return self._loop

    @property
    def leadership(self) -> Leadership:
        if self._leadership is None:
            config = self.config
            longest_step = config.lock_ttl + config.max_wait + config.claim_ahead
            self._leadership = Leadership(
                self.lease,
                self.store,
                self._report,
                longest_step=longest_step,
                on_lost=self._drop_armed,
                crash_detection=self.crash_detection,
                presence=self.presence,
                hold=self._database_hold(longest_step) if config.lead_without_redis else None,
            )
        return self._leadership

    def _database_hold(self, longest_step: float) -> DatabaseHold:
        """The leader row's hold: longer than the lease by the leader's longest step, so
        a slow loop loses its Redis lease to the watchdog before its hold could lapse."""
        return DatabaseHold(
            self.store,
            holder=self.lease.holder,
            seconds=longest_step + self.config.lock_ttl,
            renew_interval=self.config.renew_interval,
        )

    @property
    def presence(self) -> BeatPresence:
        """This process's entry among the cluster's beat processes (``beat.lease.presence``)."""
        if self._presence is None:
            config = self.config
            # A client of its own, with short timeouts: an unreachable Redis delays the
            # leader's pass by at most this much, once per interval.
            client = redis_client(
                config.redis_url, config.redis_setting, socket_timeout=1, socket_connect_timeout=1
            )
            self._presence = BeatPresence(
                client,
                prefix=config.key_prefix,
                holder=self.lease.holder,
                # Two lease TTLs past its last refresh, plus the longest wait between two
                # passes (the leader's, a standby's, the back-off after a failed one).
                lifetime=2 * config.lock_ttl
                + max(config.max_wait, config.standby_poll, MAX_BACKOFF),
                interval=config.renew_interval,
            )
        return self._presence

    @property
    def crash_detection(self) -> CrashDetection:
        if self._crash_detection is None:
            config = self.config
            beacon = SessionBeacon(
                config.database_url,
                config.redis_url,
                database_setting=config.database_setting,
                redis_setting=config.redis_setting,
            )
            self._crash_detection = CrashDetection(beacon, self.store, self.lease)
        return self._crash_detection

    def _drop_armed(self) -> None:
        """Leadership ended: drop the runs claimed ahead (also from the renewer's thread)."""
        if self._loop is not None:
            self._loop.drop_armed()

    def _on_lease_lost(self, reason: str) -> None:
        self.leadership.lease_lost(reason)

    @property
    def store(self) -> LeaderStore:
        if self._store is None:
            self._store = LeaderStore.connect(
                self.config.database_url,
                leader_name=self.config.key_prefix,
                setting=self.config.database_setting,
            )
        return self._store

    @property
    def schedule_store(self) -> ScheduleStore:
        """The schedules table, on the leader store's engine (one pool per process)."""
        if self._schedule_store is None:
            self._schedule_store = ScheduleStore(
                self.store.engine, setting=self.config.database_setting
            )
        return self._schedule_store

    @property
    def lease(self) -> LeaderLease:
        if self._lease is None:
            client = redis_client(
                self.config.redis_url,
                self.config.redis_setting,
                socket_timeout=2,
                socket_connect_timeout=2,
                health_check_interval=10,
            )
            self._lease = LeaderLease(
                client,
                prefix=self.config.key_prefix,
                ttl=self.config.lock_ttl,
                renew_interval=self.config.renew_interval,
                on_lost=self._on_lease_lost,
                setting=self.config.redis_setting,
            )
        return self._lease

    @property
    def listener(self) -> ScheduleChangeListener:
        if self._listener is None:
            self._listener = ScheduleChangeListener(
                self.config.database_url, setting=self.config.database_setting
            )
        return self._listener
