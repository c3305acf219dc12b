"""The maintenance of a pass of the leader loop: publish the outbox (runs an
earlier leader or a failed publish left, jittered runs whose time came), reclaim
the runs of dead workers, send again the runs whose message the broker lost,
prune history past its retention, summarise the runs finished
(``beat.store.stats``), watch for schedules failing in a row (``beat.monitors``) and send
the notifications of their incidents, serve each schedule's series for Prometheus;
every pass, once a second during a burst."""

from __future__ import annotations

from datetime import timedelta

from beat.errors import StaleEpoch
from beat.leader.publishing import Publishing
from beat.leader.reporting import OUTBOX, RECLAIM
from beat.notify.senders import SEND_TIMEOUT
from beat.store.leader.stall import stall_after

#: The leader deletes run history past its retention on its maintenance passes: batches
#: of RETENTION_BATCH rows for up to RETENTION_BUDGET seconds a pass, again at the next
#: pass (about a second later) while old runs are left, else after RETENTION_INTERVAL.
RETENTION_INTERVAL = 60.0
RETENTION_BATCH = 1000
RETENTION_BUDGET = 0.25
#: The leader summarises the runs finished (``beat.store.stats``) on its maintenance
#: passes the same way: for up to SUMMARY_BUDGET seconds a pass, again at the next pass
#: while minutes are left (a first catch-up), else after SUMMARY_INTERVAL.
SUMMARY_INTERVAL = 60.0
SUMMARY_BUDGET = 0.25
#: The leader reads each schedule's series for Prometheus this often (seconds), on a
#: thread of its own: a statement over the history index, a few pages per schedule.
SCHEDULE_SERIES_INTERVAL = 30.0
#: The failing monitor (``beat.store.leader.monitors``) looks at the runs finished since
#: its last pass this often (seconds), in the maintenance pass, unless an armed run is
#: due sooner than MONITOR_HEADROOM: then at the pass after it.
MONITOR_INTERVAL = 5.0
MONITOR_HEADROOM = 0.5
#: After a failed pass (its transaction refused), the next is tried this much later.
MONITOR_RETRY = 30.0
#: The leader looks at the notification outbox this often (seconds), and sends up to
#: NOTIFY_BATCH at a time on the notifier's thread, each held for NOTIFY_LEASE.
NOTIFY_INTERVAL = 1.0
NOTIFY_BATCH = 10
NOTIFY_LEASE = timedelta(seconds=NOTIFY_BATCH * SEND_TIMEOUT + 30)
#: Every process, leader or not, looks for a stall of the whole cluster this often
#: (``beat.store.leader.stall``), first thing in its first pass.
STALL_CHECK_INTERVAL = 15.0
#: A process that does not lead sends the notifications the leader left this long past
#: their time (none leads, or its sends fail), this often.
STANDBY_SEND_AFTER = timedelta(seconds=30)
STANDBY_NOTIFY_INTERVAL = 5.0
#: While a burst is claimed batch after batch, the outbox and the reaper run this often (s).
BURST_MAINTENANCE_INTERVAL = 1.0


class Maintenance(Publishing):
    """The maintenance pass: outbox, reaper, lost messages, retention, statistics."""

    def _maintenance_due(self) -> bool:
        """Outbox, reaper and retention run every pass, but only once a second while a
        burst is claimed batch after batch: each is a query, and the outbox's would
        walk the runs just claimed ahead."""
        now = self.clock()
        if self._in_burst and now < self._next_maintenance:
            return False
        self._next_maintenance = now + BURST_MAINTENANCE_INTERVAL
        return True

    def _maintain(self, epoch: int) -> None:
        config = self.config
        outbox = self.store.pending_runs(epoch, grace=config.outbox_grace, limit=config.claim_batch)
        # A run this leader holds armed is sent from memory at its fire time, however
        # long ago it was claimed (claim_ahead may exceed outbox_grace): not from here.
        armed = self.armed.run_ids() if outbox else set()
        self._publish([run for run in outbox if run.id not in armed], source=OUTBOX)
        self._reclaim(epoch)
        self._recover_lost_messages(epoch)
        self._enforce_retention()
        self._summarise()
        self._watch_schedules(epoch)
        self._send_notifications(epoch)
        self._export_schedule_series()

    def _reclaim(self, epoch: int) -> None:
        """Publish again the runs of dead workers; mark lost those out of attempts."""
        limit = self.config.claim_batch
        deaths = self.crashes.dead_runs(limit=limit)
        reclaim = self.store.reclaim(
            epoch,
            dead=deaths.runs,
            interrupted=deaths.interrupted,
            stale_queued_after=2 * self.config.visibility_timeout,
            limit=limit,
            idle_timeout=self.config.claim_idle_timeout,
            lease_seconds=self.config.lease_timeout,
            in_queue=self.lost_messages.waiting_in_queues,
        )
        self.report.reclaimed(reclaim, dead=frozenset(deaths.runs))
        self._publish(reclaim.runs, source=RECLAIM)
        # A workflow step whose message was lost before its worker sent what follows it.
        left = self.store.links_left_unsent(
            epoch,
            older_than=2 * self.config.lease_timeout,
            limit=limit,
            idle_timeout=self.config.claim_idle_timeout,
        )
        self._publish(left, source=RECLAIM)

    def _recover_lost_messages(self, epoch: int) -> None:
        """Publish again the runs whose message the broker lost; end those that expired."""
        if not self.lost_messages.due():
            return
        recovery = self.lost_messages.look(
            self.store,
            epoch,
            limit=self.config.claim_batch,
            idle_timeout=self.config.claim_idle_timeout,
        )
        self.report.recovered(recovery)
        self._publish(recovery.republish, source=RECLAIM)

    def _enforce_retention(self) -> None:
        """Delete run history past its retention, as fast as the leader produces it:
        batch after batch within a small time budget, and at the next maintenance
        pass again while a backlog is left; once caught up, a minute later."""
        days = self.config.history_retention_days
        if days <= 0 or self.clock() < self._next_retention:
            return
        # Armed runs wait while this pass deletes: stop before the next one is due.
        budget = min(RETENTION_BUDGET, self.armed.next_deadline() - self.clock())
        report = self.store.prune(
            timedelta(days=days), batch=RETENTION_BATCH, budget=max(budget, 0.0)
        )
        if report.caught_up:
            self._next_retention = self.clock() + RETENTION_INTERVAL
        self.report.pruned(report, days)

    def _summarise(self) -> None:
        """Summarise the minutes of finished runs that have settled (for the run
        statistics): within a small time budget, again at the next maintenance pass
        while minutes are left, else a minute later."""
        if self.clock() < self._next_summary:
            return
        budget = min(SUMMARY_BUDGET, self.armed.next_deadline() - self.clock())
        try:
            report = self.store.summarise(budget=max(budget, 0.0))
        except Exception as exc:
            # Statistics for people to read: whatever breaks them must not stop the
            # claims. Tried again a minute later; PostgreSQL down fails the claim anyway.
            self._next_summary = self.clock() + SUMMARY_INTERVAL
            self.report.summary_failed(exc)
            return
        if report.caught_up:
            self._next_summary = self.clock() + SUMMARY_INTERVAL
        self.report.summarised(report)

    def _watch_schedules(self, epoch: int) -> None:
        """The monitors (``beat.monitors``), every ``MONITOR_INTERVAL``, when no armed run
        is about to be due: the failing monitor, then the run monitors."""
        now = self.clock()
        if now < self._next_monitor or self.armed.next_deadline() - now < MONITOR_HEADROOM:
            return
        self._next_monitor = now + MONITOR_INTERVAL
        # Each on its own: one that fails (tried again MONITOR_RETRY later) does not
        # hold back the other's incidents, nor a revoke.
        self._watch_failures(epoch)
        self._watch_runs(epoch)

    def _watch_failures(self, epoch: int) -> None:
        """Open, update and resolve the incidents of schedules failing in a row, and pause
        those past their ``pause_after_failures`` (``beat.monitors.failing``)."""
        config = self.config
        try:
            report = self.store.watch_failures(
                epoch,
                alert_after=config.alert_after_failures,
                pause_after=config.pause_after_failures,
                idle_timeout=config.claim_idle_timeout,
            )
        except StaleEpoch:
            raise
        except Exception as exc:
            # Incidents are for people: whatever breaks them must not stop the claims.
            self._next_monitor = self.clock() + MONITOR_RETRY
            self.report.monitor_failed(exc)
            return
        if report.cancelled:
            # Cancelled in the database with the pause; not sent from memory either.
            self.armed.discard(set(report.cancelled))
        self.report.watched(report)

    def _watch_runs(self, epoch: int) -> None:
        """Open, update and resolve the run monitors' incidents (``beat.monitors.timing``:
        overran, late, missed), and terminate the runs the pass revoked, once it committed
        (they ended ``failed`` in it: no second execution whatever the broadcast does)."""
        try:
            report = self.store.watch_runs(epoch, idle_timeout=self.config.claim_idle_timeout)
        except StaleEpoch:
            raise
        except Exception as exc:
            self._next_monitor = self.clock() + MONITOR_RETRY
            self.report.monitor_failed(exc)
            return
        self.report.runs_watched(report)
        if report.revoke:
            try:
                self.publisher.terminate(report.revoke)
            except Exception as exc:  # the runs ended failed: they run to their own end
                self.report.revoke_failed(len(report.revoke), exc)

    def _send_notifications(self, epoch: int) -> None:
        """Send the due notifications of incidents (``beat.leader.notifier``), on the
        notifier's thread: taken as leader ``epoch``, so a deposed leader takes none."""
        if self.clock() < self._next_notify:
            return
        self._next_notify = self.clock() + NOTIFY_INTERVAL
        store, idle_timeout = self.store, self.config.claim_idle_timeout
        self.notifier.send_due(
            lambda: store.take_notifications(
                epoch, limit=NOTIFY_BATCH, lease=NOTIFY_LEASE, idle_timeout=idle_timeout
            ),
            store,
            epoch=epoch,
        )

    def _watch_stall(self) -> None:
        """Open or resolve the stall incident of the whole cluster, every
        ``STALL_CHECK_INTERVAL``, whether this process leads or not: an outage of every
        leader is told by the first process that looks."""
        if self.clock() < self._next_stall_check:
            return
        self._next_stall_check = self.clock() + STALL_CHECK_INTERVAL
        try:
            report = self.store.watch_stall(stall_after=stall_after(self.config.lock_ttl))
        except Exception as exc:
            # A finding for people: what breaks it must not stop this process leading.
            self.report.stall_check_failed(exc)
            return
        self.report.stall_watched(report)

    def _send_notifications_left(self) -> None:
        """While this process does not lead, send the notifications the leader left
        (``STANDBY_SEND_AFTER`` past their time): a stall is told with no leader."""
        if self.clock() < self._next_notify:
            return
        self._next_notify = self.clock() + STANDBY_NOTIFY_INTERVAL
        store, idle_timeout = self.store, self.config.claim_idle_timeout
        self.notifier.send_due(
            lambda: store.take_notifications(
                None,
                limit=NOTIFY_BATCH,
                lease=NOTIFY_LEASE,
                idle_timeout=idle_timeout,
                overdue_by=STANDBY_SEND_AFTER,
            ),
            store,
            epoch=None,
        )

    def _export_schedule_series(self) -> None:
        """Serve each schedule's failures in a row and last success (``beat.metrics``)
        while the cluster holds at most ``habeat_metrics_schedule_limit`` schedules, read
        again every ``SCHEDULE_SERIES_INTERVAL`` on a thread of its own; past the limit,
        none, and the capped gauge says so. Only while metrics are served: nobody reads
        them otherwise."""
        limit = self.config.metrics_schedule_limit
        if not self.config.metrics_port or not limit:
            return
        if self.clock() < self._next_schedule_series:
            return
        self._next_schedule_series = self.clock() + SCHEDULE_SERIES_INTERVAL
        store = self.store
        self.series_gauges.read(lambda: store.schedule_series(limit=limit), limit)
