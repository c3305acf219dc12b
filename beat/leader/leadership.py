"""Who leads: the Redis lease, the epoch recorded in the leader row, and the
health watchdog that lets the lease go when this process cannot do the work.

- **Take**: a standby takes the lease when it is free (``beat.lease.holder``) and
  gets a new epoch; it leads once PostgreSQL's leader row records that epoch
  (if the row already holds a newer one, Redis lost its counter: the epoch is
  raised above it once). Every write of the leader is fenced by that row. The
  statement that records the epoch also reads PostgreSQL's clock: until its
  first claim, the new leader times what it sends (the outbox and the reaper's
  runs it inherits) by that reading (``database``), never by its host's clock.
- **Keep**: the lease is renewed from a thread of its own while the watchdog
  says the loop makes progress; a loop that fails or hangs for longer than its
  longest step lets the lease go, so a standby that can reach PostgreSQL leads.
- **Crash**: the leader keeps a beacon for its term (a database session and a
  Redis connection) and records it; a standby that finds both proven gone (the
  process died) evicts the dead holder's lease and leads at once
  (``beat.lease.beacon``). Each pass, the leader opens again a half it lost (a
  server restarted, a timeout closed it): it steps down only when it lost its
  database session and cannot open another.
- **Lose**: whoever notices first (the renewer, a fenced write refused with
  ``StaleEpoch``, the check before sending runs claimed ahead) ends this term;
  the loop's ``on_lost`` drops what only this leader holds in memory.
- **Redis down**: with a hold on the leader row (``beat.lease.database_hold``), a
  process that cannot reach the lease's Redis takes the row once its hold ended and
  leads on it alone, fenced by the same epoch; Redis answering again ends that term.
- **Presence**: every pass, leading or not, also refreshes this process's entry
  among the cluster's beat processes (``beat.lease.presence``), for people to
  read; a clean shutdown removes it. It never bears on who leads.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from beat.errors import HABeatError, LeaseUnavailable, StaleEpoch
from beat.leader.reporting import RedisOutage, Reporter
from beat.lease.database_hold import DatabaseHold
from beat.lease.holder import DRIFT_MARGIN
from beat.records import DatabaseClock, Session


class Lease(Protocol):
    """The Redis lease (``beat.lease.holder.LeaderLease``), as leadership uses it."""

    holder: str
    ttl: float

    def is_held(self) -> bool: ...
    def try_acquire(self, epoch_floor: int) -> int | None: ...
    def bump_epoch(self, epoch_floor: int) -> int | None: ...
    def time_left(self) -> float | None: ...
    def release(self) -> bool: ...
    def start_renewing(self, healthy: Callable[[], bool] | None = None) -> object: ...


class LeaderRow(Protocol):
    """The leader row in PostgreSQL (``beat.store.leader.LeaderStore``)."""

    def current_epoch(self) -> int: ...
    def take_leadership(
        self,
        epoch: int,
        holder: str,
        *,
        session: Session | None = ...,
        hold: float | None = ...,
        ask_within: float = ...,
    ) -> datetime | None: ...
    def notify_leader_released(self) -> None: ...


class CrashDetector(Protocol):
    """A leader's beacon and a standby's check for a crashed leader (``beat.lease.beacon``)."""

    def open_beacon(self) -> Session | None: ...
    def keep_beacon(self) -> bool: ...
    def close_beacon(self) -> None: ...
    def evict_dead_leader(self) -> bool: ...


class _NoCrashDetection:
    """Standbys wait for the lease's TTL; the leader records no session."""

    def open_beacon(self) -> Session | None:
        return None

    def keep_beacon(self) -> bool:
        return True

    def close_beacon(self) -> None:
        pass

    def evict_dead_leader(self) -> bool:
        return False


class Presence(Protocol):
    """This process's entry among the cluster's beat processes (``beat.lease.presence``):
    never raises, and says nothing about who leads."""

    def refresh(self) -> None: ...
    def leave(self) -> None: ...


class _NoPresence:
    def refresh(self) -> None:
        pass

    def leave(self) -> None:
        pass


class _Takeover:
    """Records the epoch of a Redis term just taken in the leader row, with its hold."""

    def __init__(
        self,
        lease: Lease,
        row: LeaderRow,
        hold: DatabaseHold | None,
        clock: Callable[[], float],
    ) -> None:
        self._lease, self._row, self._hold, self._clock = lease, row, hold, clock
        #: PostgreSQL's clock as the statement that recorded the last epoch read it.
        self.database: DatabaseClock | None = None

    def record(self, epoch: int, session: Session | None) -> int | None:
        """Record our epoch (and the session we keep for the term) in PostgreSQL; if a
        newer epoch is there (Redis lost its counter), raise ours above it once."""
        holder = self._lease.holder
        if self._took(epoch, holder, session):
            return epoch
        bumped = self._lease.bump_epoch(self._row.current_epoch())
        if bumped is not None and self._took(bumped, holder, session):
            return bumped
        return None

    def _took(self, epoch: int, holder: str, session: Session | None) -> bool:
        """Record ``epoch``; if it was, keep the database's clock the statement read."""
        sent_at = self._clock()
        hold = None if self._hold is None else self._hold.seconds
        # A process without the fallback asks a term on the row to end as quickly as
        # one with it: inside half the margin of a hold as long as its own lease.
        if self._hold is None:
            ask_within = self._lease.ttl * DRIFT_MARGIN / 2
        else:
            ask_within = self._hold.ask_within
        taken_at = self._row.take_leadership(
            epoch, holder, session=session, hold=hold, ask_within=ask_within
        )
        if taken_at is None:
            return False
        self.database = DatabaseClock(now=taken_at, clock=self._clock())
        if self._hold is not None:
            self._hold.started(epoch, sent_at)
        return True


class Leadership:
    """This process's term as leader, if any (see the module docstring)."""

    def __init__(
        self,
        lease: Lease,
        leader_row: LeaderRow,
        reporter: Reporter,
        *,
        longest_step: float,
        on_lost: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        crash_detection: CrashDetector | None = None,
        presence: Presence | None = None,
        hold: DatabaseHold | None = None,
    ) -> None:
        self._lease = lease
        self._row = leader_row
        self._report = reporter
        #: The loop is unhealthy once it has made no progress for this long (seconds).
        self._longest_step = longest_step
        self._on_lost = on_lost
        self._clock = clock
        self._crash = crash_detection or _NoCrashDetection()
        self._presence = presence or _NoPresence()
        #: The leader row's hold (None: no process leads without the Redis lease).
        self._hold = hold
        self._epoch: int | None = None
        #: This term leads on the row's hold alone (the lease's Redis was unreachable).
        self.on_database = False
        self._redis_asked = 0.0  # clock() when a term on the row last asked Redis
        self._redis_outage = RedisOutage(reporter, clock)
        self._takeover = _Takeover(lease, leader_row, hold, clock)
        self._progress = clock()
        #: PostgreSQL's clock as the takeover of this term read it (None before one).
        self.database: DatabaseClock | None = None

    @property
    def epoch(self) -> int | None:
        """This process's epoch while it leads, else None."""
        return self._epoch if self._epoch is not None and self._term_valid() else None

    def _term_valid(self) -> bool:
        """By this process's clock: the halves this term leads with are its own."""
        held = self._hold is None or self._hold.is_held()
        return held if self.on_database else held and self._lease.is_held()

    @property
    def holder(self) -> str:
        return self._lease.holder

    def lead(self) -> int | None:
        """This process's epoch if it leads (taking the lease if it is free), else None."""
        # Every pass of a leader or a standby comes here first: the one place to say
        # this process is up (throttled, and harmless if it fails).
        self._presence.refresh()
        if self._epoch is not None and self.on_database:
            return self._lead_on_database()
        if self._epoch is not None:
            if not self._crash.keep_beacon():
                self.step_down(
                    "this process lost the database session it leads with and cannot open"
                    " another: standbys may take over"
                )
                return None
            if self._lease.is_held():
                return self._epoch if self._keep_hold() else None
            return self._after_the_lease_lapsed()  # the renewer already said why
        try:
            epoch = self._try_acquire()
        except LeaseUnavailable as exc:
            if self._hold is None:
                raise
            self._redis_outage.failed(exc)
            return self._take_the_row()
        self._redis_outage.answered()
        return None if epoch is None else self._start_term(epoch)

    def _start_term(self, epoch: int) -> int | None:
        """Lead with the Redis lease just taken, once PostgreSQL records its epoch (the
        term on the row this process may lead goes on if it cannot be recorded)."""
        try:
            recorded = self._takeover.record(epoch, self._crash.open_beacon())
        except BaseException:
            self._crash.close_beacon()
            self._lease.release()
            raise
        if recorded is None:
            self._crash.close_beacon()
            self._lease.release()
            return self.epoch if self.on_database else None
        self.database = self._takeover.database
        if self._epoch is not None:  # a term on the row, superseded by this one
            self._report.lease_lost("Redis answers again: the lease goes back to it")
            self.on_database = False
            self._on_lost()
            self._report.lost()
        self._epoch = recorded
        self.made_progress()
        self._lease.start_renewing(healthy=self.healthy)
        self._report.acquired(recorded, self._lease.holder)
        return recorded

    def _after_the_lease_lapsed(self) -> int | None:
        """A Redis term whose lease lapsed: if Redis is unreachable and the row is still
        held by this term, lead on the row alone with the next epoch (no gap); if Redis
        answers, take the lease again (a new term) or stand by."""
        try:
            epoch = self._try_acquire()
        except LeaseUnavailable as exc:
            if self._hold is None:
                self._end_term()
                raise
            self._redis_outage.failed(exc)
            # Only a loop that works carries on: one whose passes fail lets the row go.
            ended, held = self._epoch, self._hold.is_held() and self.healthy()
            self._end_term()
            assert ended is not None
            taken = self._hold.carry_on(ended) if held else None
            return self._take_the_row() if taken is None else self._begin_row_term(*taken)
        self._redis_outage.answered()
        self._end_term()
        return None if epoch is None else self._start_term(epoch)

    def _try_acquire(self) -> int | None:
        """Take the lease if it is free, or if its holder crashed (``beat.lease.beacon``)."""
        epoch = self._lease.try_acquire(self._row.current_epoch())
        if epoch is None and self._crash.evict_dead_leader():
            epoch = self._lease.try_acquire(self._row.current_epoch())
        return epoch

    def _keep_hold(self) -> bool:
        """A Redis term keeps the row's hold too; once it lapsed or the row has a newer
        epoch, this term is over: it steps down (the Redis lease given back)."""
        if self._hold is None or self._hold.keep():
            return True
        self.step_down(
            "the leader row's hold lapsed or has a newer epoch (PostgreSQL unreachable"
            " for too long, or another process leads)"
        )
        return False

    def _end_term(self) -> None:
        """This term is over (why was said where it was seen): drop what it held."""
        self._epoch = None
        if self.on_database:
            self.on_database = False
        else:
            self._crash.close_beacon()
        if self._hold is not None:
            self._hold.end()
        self._on_lost()
        self._report.lost()

    # -- leading on the row while Redis is unreachable ---------------------------------

    def _take_the_row(self) -> int | None:
        """The lease's Redis is unreachable: lead on the leader row's hold if it ended
        (its last leader stopped renewing it: crashed, paused, or cut off too)."""
        assert self._hold is not None
        taken = self._hold.take_over()
        return None if taken is None else self._begin_row_term(*taken)

    def _begin_row_term(self, epoch: int, taken_at: datetime) -> int:
        self.database = DatabaseClock(now=taken_at, clock=self._clock())
        self._epoch, self.on_database = epoch, True
        self._redis_asked = self._clock()
        self.made_progress()
        self._report.acquired_on_database(epoch, self._lease.holder)
        return epoch

    def _lead_on_database(self) -> int | None:
        """A pass of a term on the row: keep the hold; once a lease TTL passed since
        Redis was last asked, ask it again (taking the lease): once this process takes
        it, the lease goes back to Redis with the next epoch. While another process
        holds the Redis lease, it cannot record a newer epoch (this term holds the row
        on the database): this term goes on."""
        assert self._hold is not None
        if not self.healthy():
            self.step_down("this process cannot do a leader's work (see its tick errors)")
            return None
        if not self._hold.keep():
            self._report.lease_lost("the leader row's hold lapsed or has a newer epoch")
            self._end_term()
            return None
        if self._clock() - self._redis_asked < self._lease.ttl:
            return self._epoch
        self._redis_asked = self._clock()
        try:
            epoch = self._lease.try_acquire(self._row.current_epoch())
        except LeaseUnavailable as exc:
            self._redis_outage.failed(exc)
            return self._epoch
        self._redis_outage.answered()
        return self._epoch if epoch is None else self._start_term(epoch)

    def made_progress(self) -> None:
        """The loop did a leader's work (a fenced claim committed, a wait ended); the
        row's hold is renewed as work goes on (a renewal interval apart), not only at
        the start of a pass, which a burst built ahead may make long."""
        self._progress = self._clock()
        if self._hold is not None and self._epoch is not None:
            self._hold.keep()

    def healthy(self) -> bool:
        """False once the loop has made no progress for its longest step: its ticks
        fail (PostgreSQL unreachable from here) or hang (a connection gone silent).
        The renewer then lets the lease go, so a standby that reaches PostgreSQL
        leads; this process cannot take it back while it cannot read the epoch."""
        return self._clock() - self._progress < self._longest_step

    def confirm_for_send(self) -> None:
        """Raise StaleEpoch unless Redis confirms that this process holds the lease with
        enough of it left to send: asked just before every send (of runs claimed ahead,
        at their fire time). A leader paused past its lease sends nothing then (the
        next leader publishes the runs from its outbox) and steps down.

        Checking, then sending, is not atomic: a process paused between the two for
        longer than the lease had left still sends, a second message for a run the next
        leader published (the worker's guard runs it once). The window is bounded: it is
        one round trip long (as long as building the messages takes, on a transport that
        cannot batch), the pause must outlast the tenth of the TTL the check requires,
        and another process can take the lease only once it has expired in Redis, then
        it records its epoch and reads its outbox before it sends.

        A term on the leader row's hold asks PostgreSQL the same of the hold; a Redis
        term needs its hold too, by its own clock (no round trip)."""
        if self.on_database:
            assert self._hold is not None
            self._hold.confirm_for_send()
            return
        if self._hold is not None and not self._hold.is_held():
            raise StaleEpoch("the leader row's hold lapsed (checked before sending runs)")
        try:
            left = self._lease.time_left()
        except LeaseUnavailable as exc:
            raise StaleEpoch(f"cannot confirm the leader lease before sending runs: {exc}") from exc
        if left is None:
            raise StaleEpoch(
                "another process holds the leader lease, or it expired"
                " (checked before sending runs)"
            )
        if left < self._lease.ttl * DRIFT_MARGIN:
            raise StaleEpoch(f"the leader lease expires in {left:.3f}s, too soon to send runs")

    def step_down(self, reason: str, *, nothing_in_flight: bool = False) -> None:
        """End this term at once (a fenced write was refused): give the lease back. The
        row's hold is ended in PostgreSQL too, so that a process cut off from Redis
        leads at once, only when the caller knows that no send of this term is in
        flight (``nothing_in_flight``); else the hold runs out after it."""
        self._report.stepping_down(reason)
        if self._epoch is not None:
            self._report.lost()
        self._epoch = None
        self._on_lost()
        if self._hold is not None and nothing_in_flight:
            self._hold.release()
        elif self._hold is not None:
            self._hold.end()
        if self.on_database:
            self.on_database = False  # no Redis lease nor beacon to give back
            return
        try:
            self._lease.release()
        except HABeatError as exc:
            self._report.release_failed(exc)
        self._crash.close_beacon()

    def lease_lost(self, reason: str) -> None:
        """Called by the lease's renewer thread when the lease is gone."""
        self._report.lease_lost(reason)
        self._on_lost()

    def hand_over(self) -> None:
        """Release the lease and wake the standbys (a clean shutdown); leave the list
        of the cluster's beat processes, leader or standby."""
        epoch, self._epoch = self._epoch, None
        if epoch is not None:
            self._release_term(epoch)  # first: a standby waits for it, nobody for the list
        self._presence.leave()

    def _release_term(self, epoch: int) -> None:
        released = False
        on_database, self.on_database = self.on_database, False
        try:
            if self._hold is not None:
                self._hold.release()  # a standby cut off from Redis too takes over at once
                released = on_database
            if not on_database:
                released = self._lease.release()
            if released:
                self._row.notify_leader_released()
        except Exception as exc:  # shutting down: the TTL frees the lease anyway
            self._report.release_failed(exc)
        self._crash.close_beacon()  # after the release: standbys take over from it
        self._report.released(epoch, released)
