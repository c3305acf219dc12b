"""What the leader loop tells people and Prometheus: one method per event.

The loop and the leadership call these at each event and go on; the metric
updates and the log lines (readable for people, with machine-readable fields
in ``extra``) live here, out of the control flow.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from beat import metrics
from beat.errors import HABeatError, error_text
from beat.leader.lost_messages import Recovery
from beat.leader.monitor_reporting import MonitorReporting
from beat.models import Quarantine, RunToPublish, UnpublishableRun
from beat.store.code_sync import SyncReport
from beat.store.leader import Claim, PruneReport, Reclaim
from beat.store.stats import SummaryReport

logger = logging.getLogger("beat.scheduler")

#: Longest pause between attempts while PostgreSQL or Redis is unreachable (seconds).
MAX_BACKOFF = 5.0
#: A failure that repeats is logged again at most this often (seconds).
REPEAT_LOG_INTERVAL = 30.0
#: A fire time with this many runs claimed ahead is logged as they are built.
BUILD_LOG_THRESHOLD = 1000

#: Where published runs came from: a claim, the outbox, or a repair (reaper, lost messages).
CLAIM, OUTBOX, RECLAIM = "claim", "outbox", "reclaim"


class TickErrors:
    """Logs the first error of a streak at ERROR, repeats rarely, and says when it is over."""

    def __init__(self) -> None:
        self._streak = 0
        self._last_message = ""
        self._last_logged = 0.0

    def failed(self, exc: BaseException) -> float:
        """Record a failure; return how long to wait before the next attempt."""
        metrics.TICK_ERRORS.inc()
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


class RedisOutage:
    """Tells that the lease's Redis does not answer at most once every
    ``REPEAT_LOG_INTERVAL``, however often it comes and goes (every process asks it at
    every poll), and that it answers again after an outage it told of."""

    def __init__(self, reporter: Reporter, clock: Callable[[], float]) -> None:
        self._report = reporter
        self._clock = clock
        self._down_since: float | None = None
        self._logged_at: float | None = None
        self._told = False  # this outage was logged: its end is said too

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        again = self._down_since is not None
        if self._down_since is None:
            self._down_since = now
        if self._logged_at is not None and now - self._logged_at < REPEAT_LOG_INTERVAL:
            return
        self._report.redis_unreachable(exc, again=again)
        self._logged_at, self._told = now, True

    def answered(self) -> None:
        if self._down_since is not None and self._told:
            self._report.redis_answers_again(self._clock() - self._down_since)
        self._down_since, self._told = None, False


class Reporter(MonitorReporting):
    """Metrics and log lines of the leader loop and the leadership."""

    # -- leadership -----------------------------------------------------------------

    def leading(self, epoch: int | None) -> None:
        """The current state, set after every tick (and at once when the lease is lost)."""
        metrics.LEADER.set(0 if epoch is None else 1)
        metrics.LEADER_EPOCH.set(epoch or 0)
        if epoch is None:
            metrics.LEADING_ON_DATABASE.set(0)

    def acquired(self, epoch: int, holder: str) -> None:
        metrics.LEADERSHIP_CHANGES.labels(change=metrics.ACQUIRED).inc()
        self.leading(epoch)
        metrics.LEADING_ON_DATABASE.set(0)
        logger.warning(
            "this process now leads (epoch %d, holder %s)",
            epoch,
            holder,
            extra={"epoch": epoch, "holder": holder},
        )

    def acquired_on_database(self, epoch: int, holder: str) -> None:
        """A term on the leader row's hold alone: the lease's Redis is unreachable."""
        metrics.LEADERSHIP_CHANGES.labels(change=metrics.ACQUIRED).inc()
        self.leading(epoch)
        metrics.LEADING_ON_DATABASE.set(1)
        logger.warning(
            "this process now leads on the leader row in PostgreSQL (epoch %d, holder %s):"
            " the lease's Redis is unreachable; the lease goes back to Redis when it answers",
            epoch,
            holder,
            extra={"epoch": epoch, "holder": holder},
        )

    def lost(self) -> None:
        """Leadership ended without a clean release (its reason was logged where seen)."""
        metrics.LEADERSHIP_CHANGES.labels(change=metrics.LOST).inc()

    def lease_lost(self, reason: str) -> None:
        logger.warning("lost the leader lease: %s; claiming stops", reason)
        self.leading(None)

    def stepping_down(self, reason: str) -> None:
        logger.warning("stepping down as leader: %s", reason)

    def released(self, epoch: int, released: bool) -> None:
        logger.warning("released the leader lease (epoch %s)", epoch)
        metrics.LEADERSHIP_CHANGES.labels(
            change=metrics.RELEASED if released else metrics.LOST
        ).inc()
        self.leading(None)

    def redis_unreachable(self, exc: BaseException, *, again: bool) -> None:
        """The lease's Redis does not answer (logged at the first failure of a streak,
        ``again`` every ``REPEAT_LOG_INTERVAL`` while it lasts)."""
        logger.error(
            "%s%s; a beat leads on the leader row in PostgreSQL once its hold ends"
            " (habeat_lead_without_redis)",
            "still: " if again else "",
            exc,
        )

    def redis_answers_again(self, after: float) -> None:
        logger.warning("the lease's Redis answers again (unreachable for %.1fs)", after)

    def release_failed(self, exc: BaseException) -> None:
        logger.warning("could not release the leader lease cleanly: %s", exc)

    # -- start ----------------------------------------------------------------------

    def code_synced(self, report: SyncReport) -> None:
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

    # -- claim ----------------------------------------------------------------------

    def claimed(self, claim: Claim, duration: float) -> None:
        metrics.CLAIM_DURATION.observe(duration)
        if claim.schedules_claimed:
            metrics.CLAIMS.inc()
        metrics.RUNS_CLAIMED.inc(len(claim.runs) + len(claim.armed) + claim.deferred)
        for kind, count in claim.skips.items():
            metrics.RUNS_SKIPPED.labels(reason=kind.value).inc(count)
        metrics.RUNS_CANCELLED.inc(len(claim.cancelled))
        if claim.schedules_claimed:
            self._log_claim(claim, duration)

    def _log_claim(self, claim: Claim, duration: float) -> None:
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
        self.quarantined(claim.quarantined)
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

    def quarantined(self, quarantined: Sequence[Quarantine]) -> None:
        for entry in quarantined:
            logger.error(
                "schedule %s is quarantined: %s; fix it, then `celery -A app schedules resume %s`",
                entry.name,
                entry.reason,
                entry.name,
                extra={"schedule": entry.name},
            )

    def armed_dropped(self, count: int) -> None:
        if count:
            logger.warning(
                "dropped %d runs claimed ahead: the next leader publishes them from the outbox",
                count,
                extra={"runs": count},
            )

    # -- publish --------------------------------------------------------------------

    def published(
        self,
        runs: Sequence[RunToPublish],
        published: Sequence[Any],
        source: str,
        database_now: datetime | None = None,
    ) -> None:
        """Runs were published when the database's clock showed ``database_now``: their
        lateness counts by it (a host's wall clock may be off by minutes), and is not
        measured without it."""
        metrics.RUNS_PUBLISHED.inc(len(published))
        done = set(published)
        for run in runs:
            if run.id not in done:
                continue
            if source == OUTBOX and run.not_before is None:
                metrics.OUTBOX_REPUBLISHED.inc()  # a jittered run's time came: not a repair
            if source != RECLAIM and run.fire_at is not None and database_now is not None:
                due = max(run.fire_at, run.not_before or run.fire_at)
                metrics.RUN_LATENESS.observe(max(0.0, (database_now - due).total_seconds()))

    def built_ahead(self, runs: int, seconds: float, margin: float) -> None:
        """The messages of ``runs`` armed runs were built in ``seconds``, ``margin``
        seconds before their fire time (negative: after it, so they went out late).
        Logged for a burst: how much room the claim window left."""
        if runs >= BUILD_LOG_THRESHOLD:
            logger.info(
                "built %d messages in %.3fs, %.3fs before their fire time",
                runs,
                seconds,
                margin,
                extra={"built": runs, "build_seconds": seconds, "margin_seconds": margin},
            )

    def publish_failed(self) -> None:
        metrics.PUBLISH_ERRORS.inc()

    def rejected(self, rejected: Sequence[UnpublishableRun]) -> None:
        for entry in rejected:
            logger.error(
                "run %s of schedule %s cannot be published: %s; it is marked failed",
                entry.run.id,
                entry.run.schedule_name,
                entry.error,
                extra={"run_id": str(entry.run.id), "schedule": entry.run.schedule_name},
            )

    def revoke_failed(self, count: int, exc: BaseException) -> None:
        logger.warning("could not broadcast the revocation of %d runs: %s", count, exc)

    # -- maintenance ----------------------------------------------------------------

    def reclaimed(self, reclaim: Reclaim, *, dead: frozenset[uuid.UUID] = frozenset()) -> None:
        """What the reaper did; ``dead``: the runs whose worker process crash detection
        found gone (the others' leases expired)."""
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
                "publishing run %s of schedule %s again (attempt %d): %s",
                run.id,
                run.schedule_name,
                run.attempt + 1,
                "its worker process is gone" if run.id in dead else "its worker's lease expired",
                extra={"run_id": str(run.id), "schedule": run.schedule_name},
            )

    def recovered(self, recovery: Recovery) -> None:
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

    def summarised(self, report: SummaryReport) -> None:
        if report.runs and not report.caught_up:
            logger.info(
                "summarised %d finished runs up to %s; more at the next pass",
                report.runs,
                "?" if report.summarised_until is None else report.summarised_until.isoformat(),
                extra={"summarised": report.runs},
            )

    def summary_failed(self, exc: BaseException) -> None:
        logger.warning(
            "could not summarise the finished runs (the plots of all schedules read them"
            " live meanwhile): %s; trying again in a minute",
            error_text(exc),
        )

    def pruned(self, report: PruneReport, days: float) -> None:
        if report.deleted or report.incidents or report.notifications or report.changes:
            logger.info(
                "deleted %d runs finished, %d incidents resolved, %d notifications sent"
                " or given up and %d changes of the audit log made before %s (history"
                " retention %g days)%s",
                report.deleted,
                report.incidents,
                report.notifications,
                report.changes,
                report.cutoff.isoformat(),
                days,
                "" if report.caught_up else "; more at the next pass",
                extra={
                    "deleted": report.deleted,
                    "incidents": report.incidents,
                    "notifications": report.notifications,
                    "changes": report.changes,
                },
            )
