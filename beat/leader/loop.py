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

import time
import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Protocol

from beat.claim.planning import PlanningRules, SchedulePlanner
from beat.claim.window import (
    FIRST_BUILD_PACE,
    FIRST_CLAIM_PACE,
    DueSecond,
    Pace,
    claim_window,
    lead_time,
    seconds_until_claim,
)
from beat.config import BeatConfig
from beat.errors import HABeatError, StaleEpoch
from beat.leader.armed import ArmedRuns, no_lead
from beat.leader.lost_messages import Recovery
from beat.leader.overlapped_send import SHUTDOWN_WAIT, OverlappedSend
from beat.leader.reporting import CLAIM, OUTBOX, RECLAIM, Reporter
from beat.lease.beacon import WorkerDeaths
from beat.models import Quarantine, RunToPublish, UnpublishableRun
from beat.publish.dispatch import WAIT_STEP, PublishResult
from beat.records import DatabaseClock
from beat.store.leader import Claim, InQueue, PruneReport, Reclaim
from beat.store.stats import SummaryReport

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
#: The leader wakes this long after a worker's lease expires (seconds), so the reaper
#: sees it expired.
LEASE_EXPIRY_MARGIN = 0.05
#: While it waits, the leader looks this often (seconds) for a run whose worker died,
#: to reclaim it at once (``beat.lease.beacon``).
CRASH_POLL_INTERVAL = 1.0
#: While a burst is claimed batch after batch, the outbox and the reaper run this often (s).
BURST_MAINTENANCE_INTERVAL = 1.0
#: While a burst is claimed, send each batch as the next is claimed
#: (``beat.leader.overlapped_send``); False sends each batch before the next claim.
OVERLAP_SENDS = True


class ClaimStore(Protocol):
    """What the loop reads and writes as leader (``beat.store.leader.LeaderStore``)."""

    def claim_due(
        self,
        epoch: int,
        *,
        batch: int,
        plan: SchedulePlanner,
        idle_timeout: float = ...,
        ahead: float = ...,
    ) -> Claim: ...
    def pending_runs(self, epoch: int, *, grace: float, limit: int) -> list[RunToPublish]: ...
    def mark_published(self, run_ids: Sequence[uuid.UUID]) -> int: ...
    def fail_unpublishable(self, rejected: Sequence[UnpublishableRun]) -> list[Quarantine]: ...
    def reclaim(
        self,
        epoch: int,
        *,
        stale_queued_after: float,
        limit: int,
        idle_timeout: float = ...,
        lease_seconds: float = ...,
        dead: Sequence[uuid.UUID] = ...,
        interrupted: Sequence[uuid.UUID] = ...,
        in_queue: InQueue | None = ...,
    ) -> Reclaim: ...
    def seconds_until_next_fire(self, epoch: int | None = ...) -> float | None: ...
    def due_profile(self, horizon: float) -> list[DueSecond]: ...
    def seconds_until_lease_expiry(self) -> float | None: ...
    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = ...,
        on_batch: Callable[[int], None] | None = ...,
        budget: float | None = ...,
    ) -> PruneReport: ...
    def summarise(
        self, *, until: datetime | None = ..., budget: float | None = ...
    ) -> SummaryReport: ...


class Leader(Protocol):
    """This process's leadership (``beat.leader.leadership.Leadership``)."""

    @property
    def epoch(self) -> int | None: ...
    @property
    def database(self) -> DatabaseClock | None:
        """PostgreSQL's clock as the takeover of this term read it."""

    def lead(self) -> int | None: ...
    def made_progress(self) -> None: ...
    def confirm_for_send(self) -> None: ...


class Publisher(Protocol):
    """Sends runs to the broker with the run ID as task ID (``beat.publish.dispatch``);
    ``database`` is the database's clock, which times the messages' expiry."""

    def publish(
        self, runs: Sequence[RunToPublish], *, database: DatabaseClock | None = ...
    ) -> PublishResult: ...
    def publish_at(
        self,
        runs: Sequence[RunToPublish],
        deadline: float,
        *,
        database: DatabaseClock | None = ...,
        before_send: Callable[[], None] | None = ...,
        while_waiting: Callable[[], float] | None = ...,
    ) -> PublishResult: ...
    def revoke(self, run_ids: Sequence[uuid.UUID]) -> None: ...


class Waiter(Protocol):
    """Sleeps up to ``timeout`` seconds; returns early when woken (LISTEN/NOTIFY)."""

    def wait(self, timeout: float) -> bool: ...


class MessageRecovery(Protocol):
    """Finds runs whose message the broker lost (``beat.leader.lost_messages.LostMessages``)."""

    def due(self) -> bool: ...
    def forget(self) -> None: ...
    def look(self, store: Any, epoch: int, *, limit: int, idle_timeout: float) -> Recovery: ...
    def waiting_in_queues(self, runs: Sequence[RunToPublish]) -> Collection[uuid.UUID]: ...


class RunCrashes(Protocol):
    """Running runs whose worker process is dead (``beat.lease.beacon.CrashDetection``)."""

    def dead_runs(self, *, limit: int) -> WorkerDeaths: ...


class Sends(Protocol):
    """Where a burst's batch is sent while the next is claimed
    (``beat.leader.overlapped_send.OverlappedSend``): one send in flight at most."""

    def start(self, send: Callable[[], None]) -> None: ...
    def finish(self) -> None: ...
    def finish_quietly(self, timeout: float | None = ...) -> None: ...


class _NoCrashes:
    def dead_runs(self, *, limit: int) -> WorkerDeaths:
        return WorkerDeaths()


NO_CRASH_DETECTION = _NoCrashes()


class LeaderLoop:
    """One process's loop (see the module docstring); ``run_once`` is one pass."""

    def __init__(
        self,
        *,
        config: BeatConfig,
        store: ClaimStore,
        leadership: Leader,
        publisher: Publisher,
        waiter: Waiter,
        lost_messages: MessageRecovery,
        armed: ArmedRuns,
        reporter: Reporter,
        clock: Callable[[], float] = time.monotonic,
        after_claim_commit: Callable[[Claim], None] | None = None,
        crash_detection: RunCrashes | None = None,
        sends: Sends | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.leadership = leadership
        self.publisher = publisher
        self.waiter = waiter
        self.lost_messages = lost_messages
        self.armed = armed
        self.report = reporter
        self.clock = clock
        #: Test hook: called after a claim commits and before its runs are published.
        self.after_claim_commit = after_claim_commit
        #: Runs of dead workers, reclaimed without waiting for their lease.
        self.crashes: RunCrashes = crash_detection or NO_CRASH_DETECTION
        self.rules = PlanningRules(
            misfire_grace=config.misfire_grace, max_catchup=config.max_catchup
        )
        #: The last claim was a full batch: more are due (see _maintenance_due).
        self._in_burst = False
        #: Seconds a run takes this leader to claim, and to build (``beat.claim.window``).
        self.claim_pace = Pace(FIRST_CLAIM_PACE)
        self.build_pace = Pace(FIRST_BUILD_PACE)
        #: clock() up to which the burst being claimed is claimed ahead, and when to
        #: look again at what is due (once a second while a burst is claimed).
        self._claim_until = 0.0
        self._replan_at = 0.0
        self._next_maintenance = 0.0
        self._next_retention = 0.0  # clock() of the next history prune
        self._next_summary = 0.0  # clock() of the next summary of finished runs
        #: The send of a burst's batch, in flight while the next batch is claimed.
        self.sends: Sends = sends or OverlappedSend()
        #: A burst's batch claimed while the send before it failed: sent next pass.
        self._carried: list[RunToPublish] = []
        #: The database's clock as the last claim read it (before this term's first
        #: claim, as the takeover did): messages' expiry and lateness count on it.
        self.database: DatabaseClock | None = None

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
        epoch = self.leadership.lead()
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
        self._in_burst = False
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

    def until_next_claim(self, *, claimed_any: bool) -> float:
        """Seconds to wait: until the next fire time less ``claim_ahead``, or until a
        burst must start being claimed (``beat.claim.window``), or until a worker's
        lease expires (its run is reclaimed at once), or max_wait.

        Something due within ``claim_ahead`` that the last claim did not take (``allow``
        schedules are taken ahead; other overlap policies wait for their fire time,
        jittered runs for theirs) is waited for until its own time."""
        wait = self.config.max_wait
        until_next = self.store.seconds_until_next_fire(self.leadership.epoch)
        if until_next is not None:
            ahead = self.config.claim_ahead
            if until_next > ahead or claimed_any:
                wait = min(wait, until_next - ahead)  # <= 0: claim again at once
            else:
                wait = min(wait, until_next)
        if self._adapts and self._armed_room() > 0:
            profile = self.store.due_profile(self.config.claim_ahead_max)
            start = seconds_until_claim(
                profile, base=self.config.claim_ahead, per_run=self._run_pace()
            )
            # Not at once again after a claim that took nothing (rows locked elsewhere).
            if start is not None and (start > 0 or claimed_any):
                wait = min(wait, max(start, 0.0))
        until_expiry = self.store.seconds_until_lease_expiry()
        if until_expiry is not None:
            # The reaper compares with now(): wake just after the expiry, not before it.
            wait = min(wait, until_expiry + LEASE_EXPIRY_MARGIN)
        return wait

    # -- maintenance ------------------------------------------------------------------

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
        self.report.reclaimed(reclaim)
        self._publish(reclaim.runs, source=RECLAIM)

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

    # -- claim window ---------------------------------------------------------------

    @property
    def _adapts(self) -> bool:
        """Whether the claim window widens before a burst (``beat.claim.window``)."""
        return self.config.claim_ahead_max > self.config.claim_ahead

    def _armed_room(self) -> int:
        """How many more runs may be held armed (``max_armed``)."""
        return self.config.max_armed - len(self.armed)

    def _run_pace(self) -> float:
        """Seconds a run takes this leader to claim and build, as measured so far."""
        return self.claim_pace.per_run + self.build_pace.per_run

    def build_lead(self, runs: int) -> float:
        """Seconds to allow for building the messages of ``runs`` armed runs."""
        return lead_time(runs, self.build_pace.per_run)

    def _window(self) -> float:
        """Seconds ahead to claim: ``claim_ahead``, or as far as a coming burst needs
        (``beat.claim.window``); ``claim_ahead`` once ``max_armed`` runs are held.
        While a burst is claimed batch after batch the window keeps its far end, and
        is looked at again once a second (the pace measured meanwhile may widen it)."""
        base = self.config.claim_ahead
        room = self._armed_room()
        if not self._adapts or room <= 0:
            return base
        now = self.clock()
        kept = self._claim_until - now if self._in_burst else 0.0
        if self._in_burst and now < self._replan_at:
            return max(base, kept)
        profile = self.store.due_profile(self.config.claim_ahead_max)
        window = claim_window(profile, base=base, per_run=self._run_pace(), room=room)
        window = max(window, kept)
        self._claim_until = now + window
        self._replan_at = now + BURST_MAINTENANCE_INTERVAL
        return window

    # -- claim and publish --------------------------------------------------------------

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

    def _waiting_only(self) -> float:
        self.leadership.made_progress()
        return WAIT_STEP

    def _send_armed(
        self,
        fire_at: datetime,
        deadline: float,
        runs: list[RunToPublish],
        *,
        while_waiting: Callable[[], float],
    ) -> None:
        """Send one fire time's armed runs at ``deadline``, built ahead."""
        try:
            self._publish(runs, source=CLAIM, deadline=deadline, while_waiting=while_waiting)
        except Exception as exc:
            # Kept for the next pass if the broker failed, or for the step-down to
            # drop if the lease is lost; not if PostgreSQL failed after the send.
            if isinstance(exc, StaleEpoch) or not isinstance(exc, HABeatError):
                self.armed.keep(fire_at, deadline, runs)
            raise

    def _publish(
        self,
        runs: list[RunToPublish],
        *,
        source: str,
        deadline: float | None = None,
        while_waiting: Callable[[], float] | None = None,
    ) -> None:
        """Publish ``runs`` (from the ``claim``, the ``outbox`` or the ``reclaim``er),
        at once or, built ahead, at ``deadline`` (``clock()``)."""
        if not runs:
            return
        if deadline is None:
            # Confirmed first, as for armed runs: a leader paused since its claim or its
            # outbox read, past its lease, sends nothing (the next leader does).
            self.leadership.confirm_for_send()
            result = self.publisher.publish(runs, database=self.database)
        else:
            started = self.clock()
            result = self.publisher.publish_at(
                runs,
                deadline,
                database=self.database,
                before_send=self.leadership.confirm_for_send,
                while_waiting=while_waiting or self._waiting_only,
            )
            self.build_pace.observe(len(runs), result.built_in)
            margin = deadline - started - result.built_in
            self.report.built_ahead(len(runs), result.built_in, margin)
        self.store.mark_published(result.published)
        self.report.published(runs, result.published, source, self._database_now())
        if result.rejected:
            self._reject(result.rejected)
        if result.error is not None:
            self.report.publish_failed()
            raise result.error

    def _database_now(self) -> datetime | None:
        """The database's time now, by the last reading of it; None without one."""
        return None if self.database is None else self.database.now_at(self.clock())

    def _reject(self, rejected: list[UnpublishableRun]) -> None:
        """Fail the runs whose message cannot be built and quarantine their schedules,
        so that one bad schedule does not stop the others."""
        self.report.rejected(rejected)
        self.report.quarantined(self.store.fail_unpublishable(rejected))

    def _revoke(self, run_ids: list[uuid.UUID]) -> None:
        """Tell workers to drop cancelled runs still in the queue (best effort: the run
        table already refuses them, and a running one loses its lease)."""
        if not run_ids:
            return
        try:
            self.publisher.revoke(run_ids)
        except Exception as exc:  # the broadcast is an optimisation only
            self.report.revoke_failed(len(run_ids), exc)

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
