"""The Celery beat scheduler class: ``beat_scheduler = "beat.scheduler:HAScheduler"``
(or ``celery beat -S ha``).

Every process runs the same loop; ``tick()`` reads like the design:

1. am I leader? (Redis lease; a standby tries to take it and waits);
2. publish what an earlier leader left in the outbox;
3. claim a batch of due schedules in one PostgreSQL transaction fenced by the epoch
   (and those due within ``claim_ahead`` seconds, armed for their fire time);
4. publish each run with its run ID as task ID, then mark them published; armed
   runs are built ahead and sent at their fire time;
5. wait until the next fire time (less ``claim_ahead``), woken early by LISTEN/NOTIFY.

Nothing escapes ``tick()``: an error is logged with what to do and the loop
tries again shortly, so a standby survives Redis and PostgreSQL restarts.
Losing the lease stops claiming, never the process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import redis
from celery.beat import Scheduler

from beat import code_schedules, metrics
from beat.api import first_fire_at
from beat.config import BeatConfig
from beat.db import masked_url
from beat.dispatch import publish_at, publish_runs
from beat.errors import ConfigError, HABeatError, LeaseUnavailable, StaleEpoch
from beat.leader import DRIFT_MARGIN, LeaderLease
from beat.leader_store import Claim, ScheduleChangeListener
from beat.lost_messages import LostMessages
from beat.models import Quarantine, RunToPublish, UnpublishableRun
from beat.planning import PlanningRules
from beat.store import Store

logger = logging.getLogger(__name__)

#: Longest pause between attempts while PostgreSQL or Redis is unreachable.
MAX_BACKOFF = 5.0
#: The leader deletes run history past its retention on its maintenance passes: batches
#: of RETENTION_BATCH rows for up to RETENTION_BUDGET seconds a pass, again at the next
#: pass (about a second later) while old runs are left, else after RETENTION_INTERVAL.
RETENTION_INTERVAL = 60.0
RETENTION_BATCH = 1000
RETENTION_BUDGET = 0.25
#: The leader wakes this long after a worker's lease expires (seconds), so the reaper
#: sees it expired.
LEASE_EXPIRY_MARGIN = 0.05
#: While a burst is claimed batch after batch, the outbox and the reaper run this often (s).
BURST_MAINTENANCE_INTERVAL = 1.0
#: A failure that repeats is logged again at most this often (seconds).
REPEAT_LOG_INTERVAL = 30.0
#: Beat's exit status when a code schedule is refused at start (a usage error, as click's).
CONFIG_ERROR_EXIT_STATUS = 2


class _ErrorReporter:
    """Logs the first error of a streak at ERROR, repeats rarely, and says when it is over."""

    def __init__(self) -> None:
        self._streak = 0
        self._last_message = ""
        self._last_logged = 0.0

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how long to wait before the next attempt."""
        self._streak += 1
        message = str(exc) or repr(exc)
        now = time.monotonic()
        if message != self._last_message or now - self._last_logged > REPEAT_LOG_INTERVAL:
            known = isinstance(exc, HABeatError)
            logger.error(
                "beat tick failed (attempt %d): %s; retrying",
                self._streak,
                message,
                exc_info=not known,
                extra={"attempt": self._streak},
            )
            self._last_message, self._last_logged = message, now
        return min(MAX_BACKOFF, 0.25 * float(2 ** min(self._streak, 5)))

    def succeeded(self) -> None:
        if self._streak:
            logger.warning("beat recovered after %d failed attempts", self._streak)
        self._streak, self._last_message = 0, ""


def _log_quarantines(quarantined: list[Quarantine]) -> None:
    for entry in quarantined:
        logger.error(
            "schedule %s is quarantined: %s; fix it, then `celery -A app schedules resume %s`",
            entry.name,
            entry.reason,
            entry.name,
            extra={"schedule": entry.name},
        )


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
        self._store: Store | None = None
        self._lease: LeaderLease | None = None
        self._listener: ScheduleChangeListener | None = None
        self._epoch: int | None = None
        self._started = False
        self._closed = False
        self._errors = _ErrorReporter()
        self._code: list[Any] = []
        self._metrics_started = False
        self._next_retention = 0.0  # time.monotonic() of the next history prune
        self._rules = PlanningRules(
            misfire_grace=self.config.misfire_grace, max_catchup=self.config.max_catchup
        )
        #: The last claim was a full batch: more are due (see _maintenance_due).
        self._in_burst = False
        self._next_maintenance = 0.0
        #: time.monotonic() when the leader's loop last made progress (see _healthy).
        self._progress = time.monotonic()
        #: Runs claimed ahead, by fire time: (monotonic deadline, runs), published at it.
        self._armed: dict[datetime, tuple[float, list[RunToPublish]]] = {}
        self._lost_messages = LostMessages(app)
        kwargs["max_interval"] = self.config.max_wait
        super().__init__(app, *args, lazy=lazy, **kwargs)

    # -- celery.beat.Scheduler interface -------------------------------------------

    def setup_schedule(self) -> None:
        """Validate code-defined schedules now, so a broken one stops beat at start:
        one line naming the entry and the fix, exit status 2 (a usage error)."""
        self.app.loader.import_default_modules()
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
        self._start_metrics()
        try:
            self._tick()
        except StaleEpoch as exc:
            self._step_down(str(exc))
        except Exception as exc:  # an error here would kill beat: log, back off, retry
            metrics.TICK_ERRORS.inc()
            return self._errors.failed(exc)
        else:
            self._errors.succeeded()
        finally:
            self._report_leadership()
        return 0.0

    def sync(self) -> None:
        """Nothing to persist: the state lives in PostgreSQL."""

    def close(self) -> None:
        """Hand over cleanly: release the lease and wake the standbys (SIGTERM/SIGINT)."""
        if self._closed:
            return
        self._closed = True
        # Runs claimed ahead are not waited for: the next leader publishes them from
        # the outbox at their fire time, so a hand-over is not delayed by them.
        self._armed.clear()
        if self._lease is not None and self._epoch is not None:
            released = False
            try:
                released = self._lease.release()
                if released and self._store is not None:
                    self._store.notify_leader_released()
                logger.warning("released the leader lease (epoch %s)", self._epoch)
            except Exception as exc:  # shutting down: the TTL frees the lease anyway
                logger.warning("could not release the leader lease cleanly: %s", exc)
            metrics.LEADERSHIP_CHANGES.labels(
                change=metrics.RELEASED if released else metrics.LOST
            ).inc()
            metrics.LEADER.set(0)
            metrics.LEADER_EPOCH.set(0)
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
        return self._epoch is not None and self._lease is not None and self._lease.is_held()

    @property
    def epoch(self) -> int | None:
        return self._epoch if self.is_leader else None

    # -- the loop ------------------------------------------------------------------

    def _tick(self) -> None:
        self._start()
        epoch = self._lead()
        if epoch is None:
            self._drop_armed()
            self._lost_messages.forget()
            self._in_burst = False
            self._wait(self.config.standby_poll)
            return
        # Armed runs whose time came while claiming go first, before the outbox sees them.
        self._publish_armed(until=time.monotonic())
        if self._maintenance_due():
            self._publish(
                self.store.pending_runs(
                    epoch, grace=self.config.outbox_grace, limit=self.config.claim_batch
                ),
                source="outbox",
            )
            self._reclaim(epoch)
            self._recover_lost_messages(epoch)
            self._enforce_retention()
        claim, duration = self._claim(epoch)
        self._progress = time.monotonic()  # a fenced claim committed: this leader works
        if claim.schedules_claimed:
            self._report_claim(claim, duration)
        if self.after_claim_commit is not None:
            self.after_claim_commit(claim)
        self._arm(claim)  # first: if the broker fails the publish below, these keep their time
        self._publish(claim.runs, source="claim")
        self._revoke(claim.cancelled)
        self._in_burst = claim.schedules_claimed >= self.config.claim_batch
        if self._in_burst and not self._armed_due():
            return  # more are due: claim again at once
        # Armed runs due before the next claim are sent now, each at its time; later
        # ones wait for a later tick, so that what is due meanwhile (schedules of the
        # other overlap policies, triggers) is claimed on time too.
        next_claim = time.monotonic() + self._until_next_claim(
            claimed_any=claim.schedules_claimed > 0
        )
        self._publish_armed(until=next_claim)
        self._progress = time.monotonic()
        self._wait(min(next_claim, self._next_armed_deadline()) - time.monotonic())
        self._progress = time.monotonic()

    def _maintenance_due(self) -> bool:
        """Outbox, reaper and retention run every tick, but only once a second while a
        burst is claimed batch after batch: each is a query, and the outbox's would
        walk the runs just claimed ahead."""
        now = time.monotonic()
        if self._in_burst and now < self._next_maintenance:
            return False
        self._next_maintenance = now + BURST_MAINTENANCE_INTERVAL
        return True

    def _arm(self, claim: Claim) -> None:
        """Keep the runs claimed ahead for their fire time, a deadline on this host's
        monotonic clock measured from the database's ``now`` (never early)."""
        for run in claim.armed:
            if run.fire_at is None:  # armed runs have one; this narrows the type
                continue
            deadline = claim.clock + (run.fire_at - claim.now).total_seconds()
            self._keep_armed(run.fire_at, deadline, [run])

    def _keep_armed(self, fire_at: datetime, deadline: float, runs: list[RunToPublish]) -> None:
        earlier, kept = self._armed.get(fire_at, (deadline, []))
        kept.extend(runs)
        self._armed[fire_at] = (max(earlier, deadline), kept)

    def _drop_armed(self) -> None:
        """Forget the runs claimed ahead, when this process stops leading: whoever leads
        next publishes them from the outbox at their fire time (another epoch's runs
        have no grace). Also called from the lease renewer's thread: the dict is
        swapped, never changed under the loop's feet."""
        armed, self._armed = self._armed, {}
        dropped = sum(len(runs) for _, runs in list(armed.values()))
        if dropped:
            logger.warning(
                "dropped %d runs claimed ahead: the next leader publishes them from the outbox",
                dropped,
                extra={"runs": dropped},
            )

    def _next_armed_deadline(self) -> float:
        return min((deadline for deadline, _ in self._armed.values()), default=float("inf"))

    def _armed_due(self) -> bool:
        return any(deadline <= time.monotonic() for deadline, _ in self._armed.values())

    def _publish_armed(self, *, until: float) -> None:
        """Publish armed runs whose deadline is before ``until``, a fire time at a time,
        each built ahead and sent when its time comes if the lease is still ours then.
        Runs the broker fails to take are kept and sent again on the next tick (at once
        if their time has come), not left to the outbox's grace of ``outbox_grace``."""
        armed = self._armed  # _drop_armed may swap in another dict meanwhile
        for fire_at in sorted(armed):
            deadline, runs = armed[fire_at]
            if deadline > until:
                return
            del armed[fire_at]
            try:
                self._publish(runs, source="claim", deadline=deadline)
            except Exception as exc:
                # Kept for the next tick if the broker failed, or for _step_down to count
                # and drop if the lease is lost; not if PostgreSQL failed after the send.
                if isinstance(exc, StaleEpoch) or not isinstance(exc, HABeatError):
                    self._keep_armed(fire_at, deadline, runs)
                raise

    def _confirm_lease(self) -> None:
        """Raise StaleEpoch unless Redis confirms that this process holds the lease with
        enough of it left to send: asked at the fire time, just before runs claimed
        ahead are sent. A leader paused past its lease sends nothing then (the next
        leader publishes the runs from its outbox) and steps down.

        Checking, then sending, is not atomic: a process paused between the two for
        longer than the lease had left still sends, a second message for a run the next
        leader published (the worker's guard runs it once). The window is bounded: it is
        one round trip long (as long as building the messages takes, on a transport that
        cannot batch), the pause must outlast the tenth of the TTL the check requires,
        and another process can take the lease only once it has expired in Redis, then
        it records its epoch and reads its outbox before it sends."""
        try:
            left = self.lease.time_left()
        except LeaseUnavailable as exc:
            raise StaleEpoch(
                f"cannot confirm the leader lease before sending runs claimed ahead: {exc}"
            ) from exc
        if left is None:
            raise StaleEpoch(
                "another process holds the leader lease, or it expired"
                " (checked before sending runs claimed ahead)"
            )
        if left < self.config.lock_ttl * DRIFT_MARGIN:
            raise StaleEpoch(
                f"the leader lease expires in {left:.3f}s, too soon to send runs claimed ahead"
            )

    def _until_next_claim(self, *, claimed_any: bool) -> float:
        """Seconds to wait: until the next fire time less ``claim_ahead``, or until a
        worker's lease expires (its run is reclaimed at once), or max_wait.

        Something due within ``claim_ahead`` that the last claim did not take (``allow``
        schedules are taken ahead; other overlap policies wait for their fire time,
        jittered runs for theirs) is waited for until its own time."""
        wait = self.config.max_wait
        until_next = self.store.seconds_until_next_fire(self._epoch)
        if until_next is not None:
            ahead = self.config.claim_ahead
            if until_next > ahead or claimed_any:
                wait = min(wait, until_next - ahead)  # <= 0: claim again at once
            else:
                wait = min(wait, until_next)
        until_expiry = self.store.seconds_until_lease_expiry()
        if until_expiry is not None:
            # The reaper compares with now(): wake just after the expiry, not before it.
            wait = min(wait, until_expiry + LEASE_EXPIRY_MARGIN)
        return wait

    def _start(self) -> None:
        """Connect, check the schema and sync code schedules, once (retried until it works)."""
        if self._started:
            return
        self.store.check_schema()
        report = self.store.sync_code_schedules(self._code, first_fire_at)
        for name in report.conflicts:
            logger.warning(
                "code schedule '%s' not synced: a schedule created at runtime has that name", name
            )
        for name in report.removed:
            logger.warning("removed code schedule '%s': it is no longer defined in code", name)
        logger.info(
            "synced code schedules: %d created, %d updated, %d unchanged, %d removed",
            len(report.created),
            len(report.updated),
            len(report.unchanged),
            len(report.removed),
        )
        self._started = True

    def _lead(self) -> int | None:
        """This process's epoch if it leads (taking the lease if it is free), else None."""
        lease = self.lease
        if self._epoch is not None:
            if lease.is_held():
                return self._epoch
            self._epoch = None  # the renewer already said why
            self._drop_armed()
            metrics.LEADERSHIP_CHANGES.labels(change=metrics.LOST).inc()
        epoch = lease.try_acquire(self.store.current_epoch())
        if epoch is None:
            return None
        try:
            epoch = self._record_epoch(epoch)
        except BaseException:
            lease.release()
            raise
        if epoch is None:
            lease.release()
            return None
        self._epoch = epoch
        self._progress = time.monotonic()
        lease.start_renewing(healthy=self._healthy)
        metrics.LEADERSHIP_CHANGES.labels(change=metrics.ACQUIRED).inc()
        self._report_leadership()
        logger.warning(
            "this process now leads (epoch %d, holder %s)",
            epoch,
            lease.holder,
            extra={"epoch": epoch, "holder": lease.holder},
        )
        return epoch

    def _record_epoch(self, epoch: int) -> int | None:
        """Record our epoch in PostgreSQL; if a newer one is there (Redis lost its
        counter), raise ours above it once."""
        if self.store.take_leadership(epoch, self.lease.holder):
            return epoch
        bumped = self.lease.bump_epoch(self.store.current_epoch())
        if bumped is not None and self.store.take_leadership(bumped, self.lease.holder):
            return bumped
        return None

    def _healthy(self) -> bool:
        """False once the leader's loop has made no progress for a lock TTL beyond its
        longest wait: its ticks fail (PostgreSQL unreachable from here) or hang (a
        connection gone silent). The renewer then lets the lease go, so a standby that
        reaches PostgreSQL leads; this process cannot take it back while it cannot
        read PostgreSQL's epoch."""
        config = self.config
        longest_step = config.lock_ttl + config.max_wait + config.claim_ahead
        return time.monotonic() - self._progress < longest_step

    def _step_down(self, reason: str) -> None:
        logger.warning("stepping down as leader: %s", reason)
        if self._epoch is not None:
            metrics.LEADERSHIP_CHANGES.labels(change=metrics.LOST).inc()
        self._epoch = None
        self._drop_armed()
        if self._lease is not None:
            try:
                self._lease.release()
            except HABeatError as exc:
                logger.warning("could not release the lease: %s", exc)

    def _on_lease_lost(self, reason: str) -> None:
        logger.warning("lost the leader lease: %s; claiming stops", reason)
        metrics.LEADER.set(0)  # at once: the next tick counts the change
        metrics.LEADER_EPOCH.set(0)
        self._drop_armed()

    def _report_leadership(self) -> None:
        epoch = self.epoch
        metrics.LEADER.set(0 if epoch is None else 1)
        metrics.LEADER_EPOCH.set(epoch or 0)

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

    def _claim(self, epoch: int) -> tuple[Claim, float]:
        """One claim transaction, counted; returns the claim and its duration in seconds."""
        started = time.monotonic()
        claim = self.store.claim_due(
            epoch,
            batch=self.config.claim_batch,
            plan=self._rules.plan_schedule,
            idle_timeout=self.config.claim_idle_timeout,
            ahead=self.config.claim_ahead,
        )
        duration = time.monotonic() - started
        metrics.CLAIM_DURATION.observe(duration)
        if claim.schedules_claimed:
            metrics.CLAIMS.inc()
        metrics.RUNS_CLAIMED.inc(len(claim.runs) + len(claim.armed) + claim.deferred)
        for kind, count in claim.skips.items():
            metrics.RUNS_SKIPPED.labels(reason=kind.value).inc(count)
        metrics.RUNS_CANCELLED.inc(len(claim.cancelled))
        return claim, duration

    def _reclaim(self, epoch: int) -> None:
        """Publish again the runs of dead workers; mark lost those out of attempts."""
        reclaim = self.store.reclaim(
            epoch,
            stale_queued_after=2 * self.config.visibility_timeout,
            limit=self.config.claim_batch,
            idle_timeout=self.config.claim_idle_timeout,
            lease_seconds=self.config.lease_timeout,
        )
        metrics.LEASES_RECLAIMED.inc(len(reclaim.runs))
        metrics.RUNS_LOST.inc(len(reclaim.lost))
        for lost in reclaim.lost:
            logger.error(
                "run %s of schedule %s is lost: %s",
                lost.id,
                lost.schedule_name,
                lost.error,
                extra={"run_id": str(lost.id), "schedule": lost.schedule_name},
            )
        for run in reclaim.runs:
            logger.warning(
                "publishing run %s of schedule %s again (attempt %d): its worker's lease expired",
                run.id,
                run.schedule_name,
                run.attempt + 1,
                extra={"run_id": str(run.id), "schedule": run.schedule_name},
            )
        self._publish(reclaim.runs, source="reclaim")

    def _recover_lost_messages(self, epoch: int) -> None:
        """Publish again the runs whose message the broker lost; end those that expired."""
        if not self._lost_messages.due():
            return
        recovery = self._lost_messages.look(
            self.store,
            epoch,
            limit=self.config.claim_batch,
            idle_timeout=self.config.claim_idle_timeout,
        )
        metrics.RUNS_EXPIRED.inc(recovery.expired)
        metrics.MESSAGES_LOST.inc(len(recovery.republish))
        if recovery.expired:
            logger.warning(
                "%d runs expired before any worker took them",
                recovery.expired,
                extra={"expired": recovery.expired},
            )
        for run in recovery.republish:
            logger.warning(
                "publishing run %s of schedule %s again: the broker no longer holds its message",
                run.id,
                run.schedule_name,
                extra={"run_id": str(run.id), "schedule": run.schedule_name},
            )
        self._publish(recovery.republish, source="reclaim")

    def _enforce_retention(self) -> None:
        """Delete run history past its retention, as fast as the leader produces it:
        batch after batch within a small time budget, and at the next maintenance
        pass again while a backlog is left; once caught up, a minute later."""
        days = self.config.history_retention_days
        if days <= 0 or time.monotonic() < self._next_retention:
            return
        # Armed runs wait while this pass deletes: stop before the next one is due.
        budget = min(RETENTION_BUDGET, self._next_armed_deadline() - time.monotonic())
        report = self.store.prune(
            timedelta(days=days), batch=RETENTION_BATCH, budget=max(budget, 0.0)
        )
        if report.caught_up:
            self._next_retention = time.monotonic() + RETENTION_INTERVAL
        if report.deleted:
            logger.info(
                "deleted %d runs finished before %s (history retention %g days)%s",
                report.deleted,
                report.cutoff.isoformat(),
                days,
                "" if report.caught_up else "; more at the next pass",
                extra={"deleted": report.deleted},
            )

    def _publish(
        self, runs: list[RunToPublish], *, source: str, deadline: float | None = None
    ) -> None:
        """Publish ``runs`` (from the ``claim``, the ``outbox`` or the ``reclaim``er),
        at once or, built ahead, at ``deadline`` (``time.monotonic()``)."""
        if not runs:
            return
        if deadline is None:
            result = publish_runs(self.app, runs)
        else:
            result = publish_at(self.app, runs, deadline, before_send=self._confirm_lease)
        self.store.mark_published(result.published)
        self._count_published(runs, result.published, source)
        if result.rejected:
            self._reject(result.rejected)
        if result.error is not None:
            metrics.PUBLISH_ERRORS.inc()
            raise result.error

    def _reject(self, rejected: list[UnpublishableRun]) -> None:
        """Fail the runs whose message cannot be built and quarantine their schedules,
        so that one bad schedule does not stop the others."""
        for entry in rejected:
            logger.error(
                "run %s of schedule %s cannot be published: %s; it is marked failed",
                entry.run.id,
                entry.run.schedule_name,
                entry.error,
                extra={"run_id": str(entry.run.id), "schedule": entry.run.schedule_name},
            )
        _log_quarantines(self.store.fail_unpublishable(rejected))

    @staticmethod
    def _count_published(runs: list[RunToPublish], published: list[Any], source: str) -> None:
        metrics.RUNS_PUBLISHED.inc(len(published))
        done = set(published)
        now = datetime.now(UTC)
        for run in runs:
            if run.id not in done:
                continue
            if source == "outbox" and run.not_before is None:
                metrics.OUTBOX_REPUBLISHED.inc()  # a jittered run's time came: not a repair
            if source != "reclaim" and run.fire_at is not None:
                due = max(run.fire_at, run.not_before or run.fire_at)
                metrics.RUN_LATENESS.observe(max(0.0, (now - due).total_seconds()))

    def _revoke(self, run_ids: list[Any]) -> None:
        """Tell workers to drop cancelled runs still in the queue (best effort: the run
        table already refuses them, and a running one loses its lease)."""
        if not run_ids:
            return
        try:
            self.app.control.revoke([str(run_id) for run_id in run_ids])
        except Exception as exc:  # the broadcast is an optimisation only
            logger.warning("could not broadcast the revocation of %d runs: %s", len(run_ids), exc)

    def _report_claim(self, claim: Claim, duration: float) -> None:
        lateness = max(
            ((claim.now - run.fire_at).total_seconds() for run in claim.runs if run.fire_at),
            default=0.0,
        )
        logger.info(
            "claimed %d runs from %d schedules in %.3fs"
            " (%d ahead of their fire time, max lateness %.3fs, %d skipped)",
            len(claim.runs) + len(claim.armed),
            claim.schedules_claimed,
            duration,
            len(claim.armed),
            lateness,
            claim.skipped,
            extra={
                "runs": len(claim.runs),
                "schedules": claim.schedules_claimed,
                "lateness_max": lateness,
                "claim_seconds": duration,
            },
        )
        for name, reason in claim.disabled:
            logger.warning(
                "schedule %s disabled itself: %s", name, reason, extra={"schedule": name}
            )
        _log_quarantines(claim.quarantined)
        if claim.cancelled:
            logger.warning(
                "cancelled %d active runs (overlap policy cancel_previous)", len(claim.cancelled)
            )
        if not logger.isEnabledFor(logging.DEBUG):
            return  # a large claim would build thousands of records for nothing
        for run in claim.runs:
            logger.debug(
                "claimed run %s of schedule %s for %s",
                run.id,
                run.schedule_name,
                run.fire_at,
                extra={"run_id": str(run.id), "schedule": run.schedule_name},
            )

    def _wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        self.listener.wait(seconds)

    # -- lazily built resources (never in __init__) ----------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = Store.connect(
                self.config.database_url,
                leader_name=self.config.key_prefix,
                setting=self.config.database_setting,
            )
        return self._store

    @property
    def lease(self) -> LeaderLease:
        if self._lease is None:
            client = redis.Redis.from_url(
                self.config.redis_url,
                socket_timeout=2,
                socket_connect_timeout=2,
                health_check_interval=10,
            )
            self._lease = LeaderLease(
                client,
                prefix=self.config.key_prefix,
                ttl=self.config.lock_ttl,
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
