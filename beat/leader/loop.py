"""The leader loop: one pass of lead → maintenance → claim → publish → arm → wait.

Written against small protocols (the claim store, the leadership, the
publisher, the waiter, a monotonic clock), so every rule of the loop is
unit-tested on in-memory fakes (``tests/fakes.py``) and the same pass runs on
PostgreSQL, Redis and a Celery broker in production (``beat.scheduler``).

A pass, as the design reads:

1. **lead**: a standby tries to take the lease, then waits ``standby_poll``
   (woken early by a clean hand-over) and drops what it held in memory;
2. **maintenance** (every pass, once a second during a burst): publish the
   outbox (runs an earlier leader or a failed publish left, jittered runs
   whose time came), reclaim the runs of dead workers, send again the runs
   whose message the broker lost, prune history past its retention, summarise
   the runs finished (``beat.store.stats``);
3. **claim**: one transaction fenced by the epoch, planned by
   ``beat.claim.planning``; runs due now, and those due within the claim window
   (``claim_ahead``, wider before a burst: ``beat.claim.window``);
4. **publish** what is due now; **arm** what was claimed ahead, built in time
   and sent at its fire time if the lease is still ours then; revoke what was
   cancelled;
5. **wait** until something must be claimed (the next fire time less the
   window), an armed fire time's messages must be built, a worker's lease
   expires, or ``max_wait``, woken early by LISTEN/NOTIFY.

A full batch means a burst: the next claim follows at once.
"""

from __future__ import annotations

import contextlib
from functools import partial

from beat.errors import LeaseUnavailable, StoreUnavailable
from beat.leader.armed import no_lead
from beat.leader.claim_pacing import ClaimPacing
from beat.leader.loop_state import NO_CRASH_DETECTION
from beat.leader.maintenance import Maintenance
from beat.leader.overlapped_send import SHUTDOWN_WAIT
from beat.leader.reporting import CLAIM
from beat.metrics import forget_incidents
from beat.models import RunToPublish
from beat.records import DatabaseClock
from beat.store.leader import Claim

#: While it waits, the leader looks this often (seconds) for a run whose worker died,
#: to reclaim it at once (``beat.lease.beacon``).
CRASH_POLL_INTERVAL = 1.0
#: While a burst is claimed, send each batch as the next is claimed
#: (``beat.leader.overlapped_send``); False sends each batch before the next claim.
OVERLAP_SENDS = True


class LeaderLoop(Maintenance, ClaimPacing):
    """One process's loop (see the module docstring); ``run_once`` is one pass."""

    def run_once(self) -> None:
        """One pass; a fenced write refused raises StaleEpoch (the caller steps down).

        While a burst is claimed, a batch's runs are sent on a thread of their own
        (``beat.leader.overlapped_send``) as the next batch is claimed; whatever else the loop
        does (armed runs, maintenance, waiting, standing by) waits for that send."""
        try:
            self._run_once()
        except BaseException:
            # Bounded: SIGTERM's SystemExit comes through here too, and a send stuck on
            # a broker that stopped answering must not keep the process from exiting
            # (a send left running is still waited for before the next one).
            self.sends.finish_quietly(timeout=SHUTDOWN_WAIT)
            raise

    def _run_once(self) -> None:
        self._watch_stall()  # before leading: an outage of every leader is told first
        try:
            epoch = self.leadership.lead()
        except LeaseUnavailable:
            # No process can lead while the lease's Redis is down: send what the stall
            # look opened (in PostgreSQL, which answers), as a standby would.
            self._send_notifications_left()
            raise
        if epoch is None:
            self.stand_by()
            return
        if self.database is None:  # no claim yet in this term: the takeover's reading
            self.database = self.leadership.database
        if self._carried:
            carried, self._carried = self._carried, []
            self._publish(carried, source=CLAIM)
        # Armed runs whose time came while claiming go first, before the outbox sees them.
        if self.armed.any_due(self.clock()):
            self.sends.finish()
            self._publish_armed(until=self.clock())
        if self._maintenance_due():
            self.sends.finish()  # the outbox would see the runs being sent as pending
            self._maintain(epoch)
        self._listen()
        claim = self._claim(epoch)
        self.leadership.made_progress()  # a fenced claim committed: this leader works
        if self.after_claim_commit is not None:
            self.after_claim_commit(claim)
        self.armed.arm(claim)  # first: if the broker fails the publish below, these keep their time
        self._in_burst = claim.schedules_claimed >= self.config.claim_batch
        # More are due: claim again at once, sending these meanwhile. Building the armed
        # runs waits until the burst is claimed (the window allowed for both), unless
        # their time has come.
        if self._in_burst and OVERLAP_SENDS and not self.armed.any_due(self.clock()):
            self._revoke(claim.cancelled)
            self._finish_send_before(claim.runs)
            if claim.runs:
                self.sends.start(partial(self._publish, claim.runs, source=CLAIM))
            return
        self.sends.finish()
        self._publish(claim.runs, source=CLAIM)
        self._revoke(claim.cancelled)
        if self._in_burst and not self.armed.any_due(self.clock()):
            return
        # Armed runs whose messages must be built before the next claim are built now
        # and sent at their time; later ones wait for a later pass, so that what is due
        # meanwhile (schedules of the other overlap policies, triggers) is claimed on
        # time too.
        next_claim = self.clock() + self.until_next_claim(claimed_any=claim.schedules_claimed > 0)
        self._publish_armed(until=next_claim)
        self.leadership.made_progress()
        self._wait_watching(min(next_claim, self.armed.next_start(self.build_lead)) - self.clock())
        self.leadership.made_progress()

    def stand_by(self) -> None:
        """Not leading: hold nothing in memory, wait for the next attempt."""
        self.sends.finish_quietly()
        self._carried = []  # the next leader publishes them from its outbox, at once
        self.database = None  # a term of its own reads the database's clock afresh
        self.drop_armed()
        self.lost_messages.forget()
        self.series_gauges.forget()
        forget_incidents()
        self._in_burst = False
        self._send_notifications_left()
        self._wait(self.config.standby_poll)

    def _finish_send_before(self, runs: list[RunToPublish]) -> None:
        """Wait for the send in flight before this batch's. If it failed (the broker,
        the lease), this batch, claimed meanwhile, is sent first thing in the next
        pass (after the back-off), as it would have been claimed and sent then
        without the overlap, rather than after the outbox's grace."""
        try:
            self.sends.finish()
        except BaseException:
            self._carried = runs
            raise

    def drop_armed(self) -> None:
        """Forget the runs claimed ahead (this process stops leading): whoever leads
        next publishes them from the outbox at their fire time."""
        self.report.armed_dropped(self.armed.drop())

    # -- claim and armed runs --------------------------------------------------------------

    def _claim(self, epoch: int) -> Claim:
        """One claim transaction, reported with its duration; its pace is measured."""
        ahead = self._window()
        started = self.clock()
        claim = self.store.claim_due(
            epoch,
            batch=self.config.claim_batch,
            plan=self.rules.plan_schedule,
            idle_timeout=self.config.claim_idle_timeout,
            ahead=ahead,
        )
        duration = self.clock() - started
        self.database = DatabaseClock(now=claim.now, clock=claim.clock)
        self.claim_pace.observe(len(claim.runs) + len(claim.armed) + claim.deferred, duration)
        self.report.claimed(claim, duration)
        return claim

    def _publish_armed(self, *, until: float) -> None:
        """Publish armed runs whose messages must be built before ``until`` (their
        deadline less the time to build them), a fire time at a time, each built ahead
        and sent when its time comes if the lease is still ours then; while a burst is
        claimed, only those whose time has come (the rest of the burst first).
        Runs the broker fails to take are kept and sent again on the next pass (at once
        if their time has come), not left to the outbox's grace of ``outbox_grace``."""
        lead = no_lead if self._in_burst else self.build_lead
        for fire_at, deadline, runs in self.armed.take_until(until, lead):
            self._send_armed(fire_at, deadline, runs, while_waiting=self._while_building)

    def _while_building(self) -> float:
        """Called while a fire time's messages are built and wait for it: sends the
        armed runs whose time comes meanwhile (a small fire time just before a large
        one whose messages are being built), and tells the watchdog that this is work.
        Seconds until the next armed fire time."""
        self.leadership.made_progress()
        for fire_at, deadline, runs in self.armed.take_until(self.clock()):
            self._send_armed(fire_at, deadline, runs, while_waiting=self._waiting_only)
        return self.armed.next_deadline() - self.clock()

    def _listen(self) -> None:
        """LISTEN before the claim reads what is due: a trigger or an edit committed after
        that read wakes the wait instead of waiting out max_wait. Best effort: a server
        that takes no new connection must not stop the claims on the pool's (the wait
        reports the error, after this pass's runs are sent)."""
        with contextlib.suppress(StoreUnavailable):
            self.waiter.listen()

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self.waiter.wait(seconds)

    def _wait_watching(self, seconds: float) -> None:
        """Wait as the leader: woken by a change, or cut short as soon as a worker
        running a run is seen dead (looked for every ``CRASH_POLL_INTERVAL``), so
        its run is reclaimed at once."""
        if self.crashes is NO_CRASH_DETECTION:
            self._wait(seconds)
            return
        deadline = self.clock() + seconds
        while (left := deadline - self.clock()) > 0:
            if self.waiter.wait(min(left, CRASH_POLL_INTERVAL)):
                return
            if self.crashes.dead_runs(limit=1).runs:
                return
