"""In-memory fakes of what the leader loop talks to, for tests that need no server.

- :class:`ManualClock`: monotonic seconds and the database's time, moved together
  by the test, in small steps, calling the tickers registered on it at each step
  (a lease's renewer is one: it renews at its own cadence as time passes);
- :class:`FakeLeaseServer` (the Redis key) and :class:`FakeLease`
  (``beat.leader.leadership.Lease``) with the semantics of ``beat.lease.holder``;
- :class:`FakeClaimStore` (``beat.leader.loop.ClaimStore`` and
  ``beat.leader.leadership.LeaderRow``): the leader's tables in memory. It decides
  nothing itself: a claim is planned by ``beat.claim.planning`` exactly as
  ``LeaderStore.claim_due`` plans it, and the rest follows the SQL of
  ``beat.store.leader`` statement by statement;
- :class:`RecordingPublisher`, :class:`FakeWaiter`, :class:`NoMessageRecovery`;
- :class:`World`: processes wired like ``beat.scheduler.HAScheduler`` wires the
  real parts, sharing one store, one lease server and one clock, run in the
  order of their wake-up times (a discrete-event simulation: while one process
  sleeps before sending runs claimed ahead, the others go on).

Nothing here connects anywhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import math
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any
from unittest import mock
from zoneinfo import ZoneInfo

from beat.claim import planning
from beat.claim.planning import (
    Advance,
    NewRun,
    Release,
    SchedulePlanner,
    claim_horizon,
    plan_claim,
    release_of,
)
from beat.claim.window import DueSecond
from beat.config import BeatConfig
from beat.errors import LeaseUnavailable, StaleEpoch, StoreUnavailable
from beat.leader.armed import ArmedRuns
from beat.leader.leadership import Leadership
from beat.leader.loop import LeaderLoop
from beat.leader.lost_messages import Recovery
from beat.leader.notifier import Notifier
from beat.leader.reporting import Reporter, TickErrors
from beat.leader.schedule_series import ScheduleSeriesGauges
from beat.lease.database_hold import DatabaseHold
from beat.lease.holder import DRIFT_MARGIN
from beat.models import (
    ACTIVE_STATES,
    FINISHED_STATES,
    ChannelKind,
    DueSchedule,
    FirePlan,
    IncidentKind,
    MisfirePolicy,
    OverlapPolicy,
    Quarantine,
    RunState,
    RunToPublish,
    UnpublishableRun,
)
from beat.monitors.failing import OpenIncident, Outcome, Thresholds, decide
from beat.notify.senders import SendFailed
from beat.publish.dispatch import BUILD_STEP, PublishResult
from beat.records import DatabaseClock, Session
from beat.schedule.timing import Every, Once, Trigger
from beat.store.leader import Claim, InQueue, LostRun, MonitorReport, PruneReport, Reclaim
from beat.store.leader.notifications import PendingNotification
from beat.store.leader.run_monitors import RunMonitorReport
from beat.store.leader.stall import STALL_AFTER, StallReport
from beat.store.schedule_series import FAILURES as SERIES_FAILURES
from beat.store.schedule_series import STREAK_LIMIT, ScheduleSeries
from beat.store.stats import SETTLE, SummaryReport

#: The database's time when a manual clock starts.
START = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

#: Called at every step of the clock; returns the monotonic time it next wants to be
#: called at (the clock lands a step exactly there), or None (any step will do).
Ticker = Callable[[], float | None]


def beat_config(**settings: Any) -> BeatConfig:
    """Settings for a loop on fakes: URLs that connect nowhere, ``settings`` on top."""
    config = BeatConfig(
        database_url="postgresql+psycopg://nobody@127.0.0.1:1/unused",
        redis_url="redis://127.0.0.1:1/0",
        **settings,
    )
    config.validate()
    return config


@contextlib.contextmanager
def deterministic_run_ids(seed: int = 0) -> Iterator[None]:
    """New runs get their IDs from a seeded generator: a run's jitter depends on its
    ID, so a simulation with jittered schedules then runs the same way every time."""
    generator = random.Random(seed)

    def uuid4() -> uuid.UUID:
        return uuid.UUID(int=generator.getrandbits(128), version=4)

    with mock.patch.object(planning, "uuid", SimpleNamespace(uuid4=uuid4, UUID=uuid.UUID)):
        yield


# -- the clock ----------------------------------------------------------------------------


class ManualClock:
    """A monotonic clock (call it) and the database's clock (``now()``) that move
    together, only when told to: whole microseconds, so the two never drift."""

    def __init__(
        self, *, start: datetime = START, monotonic: float = 1000.0, max_step: float = 0.1
    ) -> None:
        self._start = start
        self._base = monotonic
        self._elapsed = 0  # microseconds
        self._max_step = max(1, round(max_step * 1_000_000))
        self._tickers: list[Ticker] = []
        self._wakes: list[float | None] = []
        self._advancing = False

    def __call__(self) -> float:
        return self._base + self._elapsed / 1_000_000

    def now(self) -> datetime:
        """The database's time."""
        return self._start + timedelta(microseconds=self._elapsed)

    def monotonic_at(self, moment: datetime) -> float:
        """The monotonic time at which the database's clock shows ``moment``."""
        return self._base + ((moment - self._start) // _MICROSECOND) / 1_000_000

    def add_ticker(self, ticker: Ticker) -> None:
        self._tickers.append(ticker)
        self._wakes.append(None)

    def advance(self, seconds: float, *, until: Callable[[], bool] | None = None) -> None:
        """Let ``seconds`` pass, in steps; stop early once ``until()`` holds."""
        self._run_to(self._elapsed + max(0, round(seconds * 1_000_000)), until)

    def advance_to(self, monotonic: float, *, until: Callable[[], bool] | None = None) -> None:
        """Let time pass until this clock reads ``monotonic`` or later (no-op if it does)."""
        self._run_to(self._ticks_at(monotonic), until)

    def _ticks_at(self, monotonic: float) -> int:
        """The first microsecond count at which the clock reads ``monotonic`` or later."""
        ticks = math.ceil((monotonic - self._base) * 1_000_000)
        while self._base + ticks / 1_000_000 < monotonic:
            ticks += 1
        while self._base + (ticks - 1) / 1_000_000 >= monotonic:
            ticks -= 1
        return ticks

    def _run_to(self, target: int, until: Callable[[], bool] | None) -> None:
        if self._advancing:
            raise RuntimeError("a ticker may not move the clock")
        self._advancing = True
        try:
            while self._elapsed < target:
                step = min(target - self._elapsed, self._max_step)
                for wake in self._wakes:
                    if wake is not None:
                        ahead = self._ticks_at(wake) - self._elapsed
                        if ahead > 0:
                            step = min(step, ahead)
                self._elapsed += step
                for index, ticker in enumerate(list(self._tickers)):
                    self._wakes[index] = ticker()
                if until is not None and until():
                    return
        finally:
            self._advancing = False


# -- the lease ------------------------------------------------------------------------------


class FakeLeaseServer:
    """The Redis side of the lease: the lock key (holder and expiry, ``PX`` semantics)
    and the epoch counter, with the scripts of ``beat.lease.holder`` as methods."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._holder: str | None = None
        self._expires_at = 0.0
        self.epoch = 0
        #: False: every call raises LeaseUnavailable (Redis down or cut off).
        self.reachable = True
        #: (clock, holder, epoch) of every acquisition.
        self.acquisitions: list[tuple[float, str, int]] = []

    @property
    def holder(self) -> str | None:
        """Who holds the key now (None once it expired)."""
        self._expire()
        return self._holder

    def acquire(self, token: str, ttl: float, floor: int) -> int | None:
        """``_ACQUIRE``: free, expired or our own leftover key: take it, with a new epoch."""
        self._call()
        if self._holder is not None and self._holder != token:
            return None
        self._holder, self._expires_at = token, self.clock() + _ms(ttl)
        epoch = self._next_epoch(floor)
        self.acquisitions.append((self.clock(), token, epoch))
        return epoch

    def bump(self, token: str, floor: int) -> int | None:
        """``_BUMP``: a new epoch above ``floor`` while ``token`` holds the key."""
        self._call()
        return self._next_epoch(floor) if self._holder == token else None

    def renew(self, token: str, ttl: float) -> bool:
        """``_RENEW``: compare-and-pexpire."""
        self._call()
        if self._holder != token:
            return False
        self._expires_at = self.clock() + _ms(ttl)
        return True

    def time_left(self, token: str) -> float | None:
        """``_TIME_LEFT``: the key's PTTL in seconds if ``token`` holds it, else None."""
        self._call()
        if self._holder != token:
            return None
        return math.floor((self._expires_at - self.clock()) * 1000) / 1000

    def release(self, token: str) -> bool:
        """``_RELEASE``: compare-and-delete."""
        self._call()
        if self._holder != token:
            return False
        self._holder = None
        return True

    def restart_empty(self) -> None:
        """Redis restarted without persistence: the key and the epoch counter are gone."""
        self._holder, self.epoch = None, 0

    def _call(self) -> None:
        if not self.reachable:
            raise LeaseUnavailable("Redis (fake) is unreachable")
        self._expire()

    def _expire(self) -> None:
        if self._holder is not None and self.clock() >= self._expires_at:
            self._holder = None

    def _next_epoch(self, floor: int) -> int:
        self.epoch = max(self.epoch + 1, floor + 1)
        return self.epoch


def _ms(seconds: float) -> float:
    """A TTL as Redis takes it: whole milliseconds."""
    return int(seconds * 1000) / 1000


@dataclass(kw_only=True)
class _Renewer:
    term: int
    healthy: Callable[[], bool] | None
    next_at: float


class FakeLease:
    """``beat.leader.leadership.Lease`` over a :class:`FakeLeaseServer`, as
    ``beat.lease.holder.LeaderLease`` does it: this process leads until ``ttl`` less the
    drift margin after the last renewal it *sent*; the renewer runs every ttl/3 as the
    clock moves, while
    ``healthy()`` says so, and calls ``on_lost`` when it finds the lease gone."""

    def __init__(
        self,
        server: FakeLeaseServer,
        *,
        ttl: float,
        holder: str,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self._server = server
        self._clock = server.clock
        self.ttl = ttl
        self.holder = holder
        self.on_lost = on_lost
        self._valid_until = 0.0
        self._term = 0
        self._renewer: _Renewer | None = None
        #: Test controls: the renewer is frozen (paused) or gone (crashed); a killed
        #: lease belongs to a dead process: every call raises ProcessCrashed; a lease
        #: cut off cannot reach Redis (every call raises LeaseUnavailable).
        self.cut_off = False
        self.paused = False
        self.crashed = False
        self.killed = False
        #: Clock times of the renewals sent.
        self.renewals: list[float] = []
        self._clock.add_ticker(self._tick)

    # -- beat.leader.leadership.Lease ---------------------------------------------------------

    def is_held(self) -> bool:
        return self._clock() < self._valid_until

    def try_acquire(self, epoch_floor: int) -> int | None:
        self._alive()
        sent_at = self._clock()
        epoch = self._server.acquire(self.holder, self.ttl, epoch_floor)
        if epoch is None:
            return None
        self._term += 1
        self._valid_until = sent_at + self.ttl * (1 - DRIFT_MARGIN)
        return epoch

    def bump_epoch(self, epoch_floor: int) -> int | None:
        self._alive()
        return self._server.bump(self.holder, epoch_floor)

    def time_left(self) -> float | None:
        self._alive()
        left = self._server.time_left(self.holder)
        if left is None:
            self._drop("another process holds the lease, or it expired")
        return left

    def release(self) -> bool:
        self._alive()
        self._valid_until = 0.0
        self._term += 1
        self._renewer = None
        return self._server.release(self.holder)

    def start_renewing(self, healthy: Callable[[], bool] | None = None) -> object:
        self._alive()
        self._renewer = _Renewer(
            term=self._term, healthy=healthy, next_at=self._clock() + self.ttl / 3
        )
        return self._renewer

    # -- what the real lease does besides ----------------------------------------------

    def renew(self) -> bool:
        sent_at = self._clock()
        self.renewals.append(sent_at)
        if self.cut_off:
            raise LeaseUnavailable(f"Redis (fake) is unreachable from {self.holder}")
        if not self._server.renew(self.holder, self.ttl):
            self._drop("another process holds the lease")
            return False
        if self._valid_until > 0:
            self._valid_until = sent_at + self.ttl * (1 - DRIFT_MARGIN)
        return True

    @property
    def renewing(self) -> bool:
        return self._renewer is not None and not self.crashed

    # -- test controls -------------------------------------------------------------------

    def pause(self) -> None:
        """Freeze the renewer (the process is stopped: SIGSTOP, a VM pause)."""
        self.paused = True

    def resume(self) -> None:
        self.paused = False

    def crash(self) -> None:
        """The renewer dies: no more renewals; the key stays until it expires."""
        self.crashed = True

    def kill(self) -> None:
        """The whole process died: the renewer stops and nothing more reaches Redis."""
        self.crashed = self.killed = True

    def _alive(self) -> None:
        if self.killed:
            raise ProcessCrashed(self.holder)
        if self.cut_off:
            raise LeaseUnavailable(f"Redis (fake) is unreachable from {self.holder}")

    def _tick(self) -> float | None:
        """One wake-up of ``LeaderLease._renew_loop``."""
        renewer = self._renewer
        if renewer is None or self.paused or self.crashed:
            return None
        if self._clock() < renewer.next_at:
            return renewer.next_at
        if self._term != renewer.term or self._valid_until == 0.0:
            self._renewer = None
            return None
        if renewer.healthy is not None and not renewer.healthy():
            self._renewer = None
            self._drop("this process cannot do a leader's work (see its tick errors)")
            with contextlib.suppress(LeaseUnavailable):  # else the TTL frees it
                if not self.cut_off:
                    self._server.release(self.holder)
            return None
        try:
            if not self.renew():
                self._renewer = None
                return None
        except LeaseUnavailable:
            if not self.is_held():
                self._renewer = None
                self._drop("the lease expired while Redis was unreachable")
                return None
        renewer.next_at = self._clock() + self.ttl / 3
        return renewer.next_at

    def _drop(self, reason: str) -> None:
        was_held = self._valid_until > 0.0
        self._valid_until = 0.0
        self._term += 1
        if was_held and self.on_lost is not None:
            self.on_lost(reason)


# -- the store ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class FakeSchedule:
    """A row of ``beat_schedules``: what a claim reads and writes."""

    id: int
    name: str
    task: str
    trigger: Trigger
    next_fire_at: datetime | None
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    max_attempts: int = 3
    overlap_policy: OverlapPolicy = OverlapPolicy.ALLOW
    jitter_seconds: float = 0.0
    end_at: datetime | None = None
    max_runs: int | None = None
    runs_count: int = 0
    last_fire_at: datetime | None = None
    enabled: bool = True
    disabled_reason: str | None = None
    quarantined_at: datetime | None = None
    alert_after_failures: int | None = None
    pause_after_failures: int | None = None


@dataclass(kw_only=True)
class FakeIncident:
    """A row of ``beat_incidents`` (the failing kind)."""

    id: int
    schedule_id: int
    failures: int
    paused_after_fire_at: datetime | None = None
    resolution: str | None = None


@dataclass(kw_only=True)
class FakeRun:
    """A row of ``beat_runs``."""

    id: uuid.UUID
    schedule_id: int | None
    schedule_name: str | None
    task: str
    fire_at: datetime | None
    state: RunState
    epoch: int | None
    claimed_at: datetime
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    not_before: datetime | None = None
    attempt: int = 0
    retries: int = 0
    max_attempts: int = 3
    published_at: datetime | None = None
    finished_at: datetime | None = None
    lease_expires_at: datetime | None = None
    worker: str | None = None
    reason: str | None = None
    error: str | None = None
    task_id: str | None = None

    def to_publish(self) -> RunToPublish:
        return RunToPublish(
            id=self.id,
            task=self.task,
            args=self.args,
            kwargs=self.kwargs,
            options=self.options,
            schedule_name=self.schedule_name,
            fire_at=self.fire_at,
            attempt=self.attempt,
            not_before=self.not_before,
            task_id=self.task_id,
            retries=self.retries,
        )


@dataclass(kw_only=True)
class LeaderRowState:
    epoch: int
    holder: str
    acquired_at: datetime
    #: ``beat_leader.held_until``, ``held_epoch`` and ``held_on_database``.
    held_until: datetime | None = None
    held_epoch: int | None = None
    held_on_database: bool = False

    def held_now(self, now: datetime) -> bool:
        """Held by the term of this epoch, now."""
        return (
            self.held_epoch == self.epoch and self.held_until is not None and self.held_until >= now
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class StoreCall:
    method: str
    clock: float
    caller: str | None = None


class FakeClaimStore:
    """``LeaderStore`` in memory: the claim is planned by ``beat.claim.planning.plan_claim``
    and written as ``claim_due`` writes it; every other method follows its SQL.

    A call is one transaction: it waits ``latency`` seconds (through ``sleep``, so
    other processes of a :class:`World` go on meanwhile), then runs at once: a
    takeover cannot slip into a claim, as the leader row's share lock ensures."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        leader_name: str = "habeat",
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.clock = clock
        self.leader_name = leader_name
        #: Lets time pass until the given monotonic time (a World runs others meanwhile).
        self.sleep: Callable[[float], None] = sleep or clock.advance_to
        self.schedules: dict[int, FakeSchedule] = {}
        self.runs: dict[uuid.UUID, FakeRun] = {}
        self._fired: dict[tuple[int, datetime], uuid.UUID] = {}  # uq_beat_runs_schedule_fire_at
        self._ids = itertools.count(1)
        self.leader: LeaderRowState | None = None
        #: Seconds every call takes before it runs.
        self.latency = 0.0
        #: Seconds a claim takes per schedule it claims, besides ``latency``.
        self.latency_per_schedule = 0.0
        #: True: every call raises StoreUnavailable (PostgreSQL is down).
        self.unreachable = False
        #: Processes that cannot reach PostgreSQL (their calls raise StoreUnavailable).
        self.cut_off: set[str] = set()
        #: Who is calling (a World names the process in its pass).
        self.caller: Callable[[], str | None] = lambda: None
        self._hangs: dict[str | None, float] = {}
        self.calls: list[StoreCall] = []
        self._released: list[Callable[[], None]] = []
        #: The summary of finished runs: runs by (finish minute, state), and how far.
        self.run_minutes: Counter[tuple[datetime, RunState]] = Counter()
        self.summarised_until: datetime | None = None
        #: The failing monitor's incidents, open and resolved.
        self.incidents: list[FakeIncident] = []
        #: The cluster's stall incident is open.
        self.stalled = False
        #: The notification outbox: what tests put there, and what became of each.
        self.outbox: list[PendingNotification] = []
        self.notifications_sent: list[int] = []
        self.notifications_failed: list[tuple[int, str]] = []
        #: The task IDs the next pass of the run monitors ends (runs past their
        #: max_runtime whose schedule revokes them), as the SQL would find them.
        self.overrunning: list[str] = []

    # -- test controls ---------------------------------------------------------------------

    def hang_next_call(self, seconds: float, *, of: str | None = None) -> None:
        """The next call (of process ``of``) hangs ``seconds`` (a connection gone
        silent), then fails."""
        self._hangs[of] = seconds

    def on_leader_released(self, listener: Callable[[], None]) -> None:
        """``listener`` is called on every ``notify_leader_released`` (LISTEN)."""
        self._released.append(listener)

    def count(self, method: str, *, of: str | None = None) -> int:
        return len(self.call_times(method, of=of))

    def call_times(self, method: str, *, of: str | None = None) -> list[float]:
        return [
            call.clock
            for call in self.calls
            if call.method == method and (of is None or call.caller == of)
        ]

    def add_schedule(
        self,
        name: str,
        *,
        every: float | None = None,
        first: datetime | None = None,
        in_seconds: float = 0.0,
        overlap: OverlapPolicy | str = OverlapPolicy.ALLOW,
        misfire: MisfirePolicy | str = MisfirePolicy.FIRE_ONCE,
        jitter: float = 0.0,
        task: str = "tasks.demo.add",
        args: list[Any] | None = None,
        options: dict[str, Any] | None = None,
        max_runs: int | None = None,
        end_at: datetime | None = None,
    ) -> FakeSchedule:
        """A schedule firing every ``every`` seconds from ``first`` (default: now plus
        ``in_seconds``), or once at that time when ``every`` is None."""
        if any(schedule.name == name for schedule in self.schedules.values()):
            raise ValueError(f"a schedule named {name!r} exists already")
        start = first if first is not None else self.clock.now() + timedelta(seconds=in_seconds)
        trigger: Trigger = Every(seconds=every, anchor=start) if every else Once(at=start)
        schedule = FakeSchedule(
            id=next(self._ids),
            name=name,
            task=task,
            trigger=trigger,
            next_fire_at=start.astimezone(UTC),
            args=list(args or []),
            options=dict(options or {}),
            misfire_policy=MisfirePolicy(misfire),
            overlap_policy=OverlapPolicy(overlap),
            jitter_seconds=jitter,
            max_runs=max_runs,
            end_at=end_at,
        )
        self.schedules[schedule.id] = schedule
        return schedule

    def retime(self, name: str, *, in_seconds: float) -> None:
        """Move the schedule's timing: it fires next (and from then on) at now plus
        ``in_seconds``, as an edit outside the API would."""
        schedule = self.schedule(name)
        first = self.clock.now() + timedelta(seconds=in_seconds)
        trigger = schedule.trigger
        schedule.trigger = (
            Every(seconds=trigger.seconds, anchor=first)
            if isinstance(trigger, Every)
            else Once(at=first)
        )
        schedule.next_fire_at = first

    def schedule(self, name: str) -> FakeSchedule:
        (found,) = [s for s in self.schedules.values() if s.name == name]
        return found

    def runs_of(self, name: str | None = None) -> list[FakeRun]:
        """Runs (of schedule ``name``), by fire time."""
        found = [run for run in self.runs.values() if name is None or run.schedule_name == name]
        return sorted(found, key=lambda run: (run.schedule_name or "", run.fire_at or START))

    def start_run(self, run_id: uuid.UUID, *, worker: str, lease_seconds: float) -> None:
        """A worker starts the run (an attempt) and holds its lease."""
        run = self.runs[run_id]
        run.state, run.attempt, run.worker = RunState.RUNNING, run.attempt + 1, worker
        run.lease_expires_at = self.clock.now() + timedelta(seconds=lease_seconds)

    def finish_run(self, run_id: uuid.UUID, state: RunState = RunState.SUCCEEDED) -> None:
        run = self.runs[run_id]
        run.state, run.finished_at, run.lease_expires_at = state, self.clock.now(), None

    # -- beat.leader.leadership.LeaderRow ---------------------------------------------------------

    def current_epoch(self) -> int:
        self._enter("current_epoch")
        return self.leader.epoch if self.leader is not None else 0

    def take_leadership(
        self,
        epoch: int,
        holder: str,
        *,
        session: Session | None = None,
        hold: float | None = None,
        ask_within: float = 1.0,
        lock_timeout: float = 2.0,
    ) -> datetime | None:
        """As ``LeaderStore.take_leadership``; the session is not kept: in memory no
        process dies, so crash detection has nothing to judge."""
        self._enter("take_leadership")
        row, now = self.leader, self.clock.now()
        on_row = row is not None and row.held_on_database and row.held_now(now)
        if row is not None and on_row and row.holder != holder:
            # Another holder leads on the row alone: asked to end (``ask_to_end``).
            assert row.held_until is not None
            row.held_until = min(row.held_until, now + timedelta(seconds=ask_within))
            return None
        if row is not None and row.epoch >= epoch:
            return None
        self.leader = LeaderRowState(epoch=epoch, holder=holder, acquired_at=now)
        self._hold_row(epoch, hold, on_database=False)
        return now

    # -- beat.lease.database_hold.HoldRow ---------------------------------------------------

    def renew_hold(
        self, epoch: int, holder: str, hold: float, *, on_database: bool, margin: float = 0.0
    ) -> bool:
        self._enter("renew_hold")
        row, now = self.leader, self.clock.now()
        if not self._term_is(epoch, holder) or row is None:
            return False
        if on_database and not (
            row.held_epoch == epoch
            and row.held_until is not None
            and row.held_until > now + timedelta(seconds=margin)
        ):
            return False
        self._hold_row(epoch, hold, on_database=on_database)
        return True

    def take_ended_hold(self, holder: str, hold: float) -> tuple[int, datetime] | None:
        self._enter("take_ended_hold")
        row, now = self.leader, self.clock.now()
        if row is None or row.held_epoch != row.epoch or row.held_until is None:
            return None
        if row.held_until >= now:
            return None
        self.leader = LeaderRowState(epoch=row.epoch + 1, holder=holder, acquired_at=now)
        self._hold_row(row.epoch + 1, hold, on_database=True)
        return self.leader.epoch, now

    def carry_hold_on(self, epoch: int, holder: str, hold: float) -> tuple[int, datetime] | None:
        self._enter("carry_hold_on")
        row, now = self.leader, self.clock.now()
        if not self._term_is(epoch, holder) or row is None or not row.held_now(now):
            return None
        self.leader = LeaderRowState(epoch=epoch + 1, holder=holder, acquired_at=now)
        self._hold_row(epoch + 1, hold, on_database=True)
        return epoch + 1, now

    def hold_left(self, epoch: int, holder: str) -> float | None:
        self._enter("hold_left")
        row = self.leader
        if not self._term_is(epoch, holder) or row is None or row.held_epoch != epoch:
            return None
        assert row.held_until is not None
        return (row.held_until - self.clock.now()).total_seconds()

    def end_hold(self, epoch: int, holder: str) -> None:
        self._enter("end_hold")
        row = self.leader
        if self._term_is(epoch, holder) and row is not None and row.held_epoch == epoch:
            row.held_until = self.clock.now()

    def _hold_row(self, epoch: int, hold: float | None, *, on_database: bool) -> None:
        assert self.leader is not None
        if hold is None:
            self.leader.held_until, self.leader.held_epoch = None, None
            self.leader.held_on_database = False
            return
        self.leader.held_until = self.clock.now() + timedelta(seconds=hold)
        self.leader.held_epoch, self.leader.held_on_database = epoch, on_database

    def _term_is(self, epoch: int, holder: str) -> bool:
        return self.leader is not None and (self.leader.epoch, self.leader.holder) == (
            epoch,
            holder,
        )

    def notify_leader_released(self) -> None:
        self._enter("notify_leader_released")
        for listener in list(self._released):
            listener()

    # -- beat.leader.loop.ClaimStore -------------------------------------------------------

    def claim_due(
        self,
        epoch: int,
        *,
        batch: int,
        plan: SchedulePlanner,
        idle_timeout: float = 10.0,
        ahead: float = 0.0,
    ) -> Claim:
        self._enter("claim_due")
        self._fence(epoch)
        now, clock = self.clock.now(), self.clock()
        horizon = claim_horizon(now, ahead)
        rows = sorted(
            (
                s
                for s in self.schedules.values()
                if s.enabled
                and s.next_fire_at is not None
                and s.next_fire_at <= horizon
                and (s.next_fire_at <= now or s.overlap_policy is OverlapPolicy.ALLOW)
            ),
            key=lambda s: (s.next_fire_at or now, s.id),
        )[:batch]
        if not rows:
            return Claim(runs=[], now=now, clock=clock, schedules_claimed=0, skipped=0)
        if self.latency_per_schedule:  # the rows are locked: the claim is all at ``now``
            self.sleep(self.clock() + self.latency_per_schedule * len(rows))
        claim_plan = plan_claim([self._due(s) for s in rows], now, horizon, plan)
        self._quarantine(claim_plan.quarantined)
        cancelled = self._cancel_active(claim_plan.cancel_active_of)
        inserted = self._insert_runs(epoch, claim_plan.new_runs)
        skipped = self._insert_skipped(epoch, claim_plan.plans)
        self._advance(claim_plan.advances)
        released: dict[Release, list[RunToPublish]] = {release: [] for release in Release}
        for run in inserted:
            released[release_of(run, now)].append(run)
        return Claim(
            runs=released[Release.NOW],
            armed=released[Release.ARMED],
            now=now,
            clock=clock,
            schedules_claimed=len(rows),
            skipped=skipped,
            skips=claim_plan.skip_counts,
            cancelled=cancelled,
            deferred=len(released[Release.DEFERRED]),
            disabled=claim_plan.disabled,
            quarantined=claim_plan.quarantined,
        )

    def pending_runs(self, epoch: int, *, grace: float, limit: int) -> list[RunToPublish]:
        self._enter("pending_runs")
        now = self.clock.now()
        old = now - timedelta(seconds=grace)
        found = [
            run
            for run in self.runs.values()
            if run.state is RunState.PENDING
            and (run.not_before is None or run.not_before <= now)
            and (run.epoch != epoch or run.claimed_at < old or _jittered(run))
        ]
        found.sort(key=lambda run: run.claimed_at)
        return [run.to_publish() for run in found[:limit]]

    def mark_published(self, run_ids: Sequence[uuid.UUID]) -> int:
        if not run_ids:
            return 0
        self._enter("mark_published")
        marked = 0
        for run_id in set(run_ids):
            run = self.runs.get(run_id)
            if run is not None and run.state is RunState.PENDING:
                run.state, run.published_at = RunState.QUEUED, self.clock.now()
                marked += 1
        return marked

    def fail_unpublishable(self, rejected: Sequence[UnpublishableRun]) -> list[Quarantine]:
        self._enter("fail_unpublishable")
        quarantined: dict[int, Quarantine] = {}
        for entry in rejected:
            run = self.runs.get(entry.run.id)
            if run is None or run.state is not RunState.PENDING:
                continue
            run.state, run.finished_at = RunState.FAILED, self.clock.now()
            run.error = f"cannot be published: {entry.error}"
            if run.schedule_id is None or run.schedule_id in quarantined:
                continue
            quarantined[run.schedule_id] = Quarantine(
                schedule_id=run.schedule_id,
                name=entry.run.schedule_name or "?",
                reason=f"run {entry.run.id} cannot be published: {entry.error}",
            )
        self._quarantine(list(quarantined.values()))
        return list(quarantined.values())

    def links_left_unsent(
        self, epoch: int, *, older_than: float, limit: int, idle_timeout: float = 10.0
    ) -> list[RunToPublish]:
        """No workflow steps here: nothing is ever left unsent."""
        self._fence(epoch)
        return []

    def reclaim(
        self,
        epoch: int,
        *,
        stale_queued_after: float,
        limit: int,
        idle_timeout: float = 10.0,
        lease_seconds: float = 30.0,
        dead: Sequence[uuid.UUID] = (),
        interrupted: Sequence[uuid.UUID] = (),
        in_queue: InQueue | None = None,
    ) -> Reclaim:
        """The reaper as ``LeaderStore.reclaim``, without what this store does not hold:
        no workers table (an attempt whose worker died counts), no plain runs, no retries,
        no bound on the copies of a stale run (nothing is left queued that long here)."""
        self._enter("reclaim")
        self._fence(epoch)
        now = self.clock.now()
        touched: list[FakeRun] = []
        expired = sorted(
            (
                run
                for run in self.runs.values()
                if run.state is RunState.RUNNING
                and (
                    run.id in dead
                    or (run.lease_expires_at is not None and run.lease_expires_at < now)
                )
            ),
            key=lambda run: run.lease_expires_at or now,
        )[:limit]
        for run in expired:
            if run.attempt - run.retries >= run.max_attempts:
                run.state, run.finished_at = RunState.LOST, now
                run.error = (
                    f"lease expired on attempt {run.attempt} of {run.max_attempts}"
                    f" (worker {run.worker or '?'}): attempts exhausted"
                )
            else:
                run.state = RunState.PENDING
            run.epoch, run.claimed_at, run.lease_expires_at = epoch, now, None
            touched.append(run)
        stale_before = now - timedelta(seconds=stale_queued_after)
        for run in self.runs.values():
            if (
                run.state is RunState.QUEUED
                and run.published_at is not None
                and run.published_at < stale_before
            ):
                run.state, run.epoch, run.claimed_at = RunState.PENDING, epoch, now
                touched.append(run)
        for run in self.runs.values():
            if (
                run.state in (RunState.QUEUED, RunState.RETRYING)
                and run.lease_expires_at is not None
                and run.lease_expires_at < now
            ):
                run.state, run.epoch, run.claimed_at = RunState.PENDING, epoch, now
                run.lease_expires_at = run.published_at = None
                if run.not_before is None or run.not_before <= now:
                    touched.append(run)
        return Reclaim(
            runs=[run.to_publish() for run in touched if run.state is RunState.PENDING],
            lost=[
                LostRun(id=run.id, schedule_name=run.schedule_name, error=run.error or "")
                for run in touched
                if run.state is RunState.LOST
            ],
        )

    def seconds_until_next_fire(self, epoch: int | None = None) -> float | None:
        self._enter("seconds_until_next_fire")
        times = [
            s.next_fire_at
            for s in self.schedules.values()
            if s.enabled and s.next_fire_at is not None
        ]
        times += [
            run.not_before
            for run in self.runs.values()
            if run.state is RunState.PENDING
            and run.not_before is not None
            and (_jittered(run) or run.epoch != epoch)
        ]
        return (min(times) - self.clock.now()).total_seconds() if times else None

    def due_profile(self, horizon: float) -> list[DueSecond]:
        self._enter("due_profile")
        now = self.clock.now()
        by_second: dict[int, list[float]] = {}
        for s in self.schedules.values():
            if (
                s.enabled
                and s.next_fire_at is not None
                and s.overlap_policy is OverlapPolicy.ALLOW
                and s.next_fire_at <= now + timedelta(seconds=horizon)
            ):
                until = max(0.0, (s.next_fire_at - now).total_seconds())
                by_second.setdefault(math.floor(until), []).append(until)
        return [
            DueSecond(seconds=min(times), count=len(times))
            for _, times in sorted(by_second.items())
        ]

    def seconds_until_lease_expiry(self) -> float | None:
        self._enter("seconds_until_lease_expiry")
        expiries = [
            run.lease_expires_at
            for run in self.runs.values()
            if run.state is RunState.RUNNING and run.lease_expires_at is not None
        ]
        return (min(expiries) - self.clock.now()).total_seconds() if expiries else None

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        on_batch: Callable[[int], None] | None = None,
        budget: float | None = None,
    ) -> PruneReport:
        if batch < 1:
            raise ValueError(f"batch={batch!r}: must be at least 1")
        self._enter("prune")
        cutoff = self.clock.now() - older_than
        deadline = None if budget is None else self.clock() + budget
        deleted = batches = 0
        while True:
            doomed = sorted(
                (
                    run
                    for run in self.runs.values()
                    if run.state in FINISHED_STATES and _age(run) < cutoff
                ),
                key=_age,
            )[:batch]
            for run in doomed:
                self._delete(run)
            if doomed:
                deleted, batches = deleted + len(doomed), batches + 1
                if on_batch is not None:
                    on_batch(len(doomed))
            caught_up = len(doomed) < batch
            if caught_up or (deadline is not None and self.clock() >= deadline):
                return PruneReport(
                    deleted=deleted,
                    batches=batches,
                    cutoff=cutoff,
                    caught_up=caught_up,
                    # No test of the loop counts on the retention of incidents.
                    incidents=0,
                    notifications=0,
                )

    def schedule_series(self, *, limit: int) -> list[ScheduleSeries] | None:
        """Each schedule's failures in a row and newest success, by fire time."""
        self._enter("schedule_series")
        if len(self.schedules) > limit:
            return None
        found = []
        for name in sorted(schedule.name for schedule in self.schedules.values()):
            mine = sorted(
                (
                    run
                    for run in self.runs.values()
                    if run.schedule_name == name and run.fire_at is not None
                ),
                key=lambda run: run.fire_at or datetime.min,
                reverse=True,
            )
            counted = [
                run.state for run in mine if run.state in (*SERIES_FAILURES, RunState.SUCCEEDED)
            ]
            streak = next(
                (index for index, state in enumerate(counted) if state == RunState.SUCCEEDED),
                len(counted),
            )
            success = next((run.fire_at for run in mine if run.state == RunState.SUCCEEDED), None)
            found.append(
                ScheduleSeries(
                    name=name, consecutive_failures=min(streak, STREAK_LIMIT), last_success=success
                )
            )
        return found

    def watch_failures(
        self, epoch: int, *, alert_after: int, pause_after: int, idle_timeout: float
    ) -> MonitorReport:
        """Every schedule looked at (no progress kept), decided by ``beat.monitors``."""
        self._enter("watch_failures")
        self._fence(epoch)
        report = MonitorReport(looked_at=len(self.schedules))
        for schedule in self.schedules.values():
            self._watch(schedule, alert_after, pause_after, report)
        open_count = sum(incident.resolution is None for incident in self.incidents)
        report.open[IncidentKind.FAILING] = open_count
        return report

    def watch_runs(self, epoch: int, *, idle_timeout: float) -> RunMonitorReport:
        """The runs in ``overrunning`` end (revoked) in the pass that finds them."""
        self._enter("watch_runs")
        self._fence(epoch)
        revoked, self.overrunning = self.overrunning, []
        return RunMonitorReport(revoke=revoked)

    def take_notifications(
        self,
        epoch: int | None,
        *,
        limit: int,
        lease: timedelta,
        idle_timeout: float,
        overdue_by: timedelta = timedelta(0),
    ) -> list[PendingNotification]:
        """The first ``limit`` of the outbox, taken out of it (the lease is not kept).
        Without the latency of a call: the real one runs on the notifier's thread, and
        costs the loop nothing."""
        self.calls.append(
            StoreCall(method="take_notifications", clock=self.clock(), caller=self.caller())
        )
        if self.unreachable:
            raise StoreUnavailable("PostgreSQL (fake) is unreachable")
        if epoch is not None:
            self._fence(epoch)
        taken, self.outbox = self.outbox[:limit], self.outbox[limit:]
        return taken

    def watch_stall(self, *, stall_after: timedelta = STALL_AFTER) -> StallReport:
        """Counted as the SQL counts; the incident kept as a flag."""
        self._enter("watch_stall")
        before = self.clock.now() - stall_after
        overdue = [
            schedule
            for schedule in self.schedules.values()
            if schedule.enabled
            and schedule.next_fire_at is not None
            and schedule.next_fire_at < before
        ]
        if overdue:
            opened, self.stalled = not self.stalled, True
            return StallReport(overdue=len(overdue), opened=opened, detail=f"{len(overdue)} wait")
        resolved, self.stalled = self.stalled, False
        return StallReport(overdue=0, resolved=resolved)

    def notification_sent(self, notification_id: int) -> None:
        self._enter("notification_sent")
        self.notifications_sent.append(notification_id)

    def notification_failed(self, notification_id: int, error: str, *, epoch: int | None) -> bool:
        self._enter("notification_failed")
        self.notifications_failed.append((notification_id, error))
        return False

    def _watch(
        self, schedule: FakeSchedule, alert_after: int, pause_after: int, report: MonitorReport
    ) -> None:
        counted = sorted(
            (
                run
                for run in self.runs.values()
                if run.schedule_id == schedule.id
                and run.fire_at is not None
                and run.state in (*SERIES_FAILURES, RunState.SUCCEEDED)
            ),
            key=lambda run: run.fire_at or datetime.min,
            reverse=True,
        )
        outcomes = [
            Outcome(
                fire_at=run.fire_at or datetime.min,
                failed=run.state != RunState.SUCCEEDED,
                error=run.error or run.reason,
            )
            for run in counted
        ]
        incident = next(
            (
                found
                for found in self.incidents
                if found.schedule_id == schedule.id and found.resolution is None
            ),
            None,
        )
        thresholds = Thresholds(
            alert_after=_own_or(schedule.alert_after_failures, alert_after),
            pause_after=_own_or(schedule.pause_after_failures, pause_after),
        )
        decision = decide(
            outcomes,
            thresholds,
            enabled=schedule.enabled,
            incident=None
            if incident is None
            else OpenIncident(
                id=incident.id,
                failures=incident.failures,
                paused_after_fire_at=incident.paused_after_fire_at,
            ),
        )
        if decision.resolve is not None and incident is not None:
            incident.resolution = decision.resolve
            report.resolved.append((schedule.name, decision.resolve))
            return
        if decision.failures is None:
            return
        if decision.open:
            incident = FakeIncident(
                id=len(self.incidents) + 1, schedule_id=schedule.id, failures=decision.failures
            )
            self.incidents.append(incident)
            report.opened.append((schedule.name, decision.failures))
        assert incident is not None
        incident.failures = decision.failures
        if decision.pause_after_fire_at is not None and schedule.enabled:
            schedule.enabled = False
            schedule.disabled_reason = f"paused after {decision.failures} failures in a row"
            incident.paused_after_fire_at = decision.pause_after_fire_at
            report.paused.append((schedule.name, decision.failures))
            report.cancelled.extend(self._cancel_unreleased(schedule.id))

    def _cancel_unreleased(self, schedule_id: int) -> list[uuid.UUID]:
        """``beat.store.unreleased_runs.cancel_unreleased``: its runs claimed ahead."""
        now = self.clock.now()
        cancelled = []
        for run in self.runs.values():
            if (
                run.schedule_id == schedule_id
                and run.state is RunState.PENDING
                and run.not_before is not None
                and run.not_before > now
                and run.published_at is None
                and run.retries == 0
            ):
                run.state, run.finished_at = RunState.CANCELLED, now
                cancelled.append(run.id)
        return cancelled

    def summarise(
        self, *, until: datetime | None = None, budget: float | None = None
    ) -> SummaryReport:
        """The whole backlog at once (no budget): runs counted by minute and state."""
        self._enter("summarise")
        limit = (self.clock.now() - SETTLE).replace(second=0, microsecond=0)
        if until is not None:
            limit = min(limit, until.replace(second=0, microsecond=0))
        finished = [run for run in self.runs.values() if run.state in FINISHED_STATES]
        start = self.summarised_until
        if start is None:
            start = min((_age(run) for run in finished), default=limit)
            start = start.replace(second=0, microsecond=0)
        summarised = [run for run in finished if start <= _age(run) < limit]
        for run in summarised:
            self.run_minutes[_age(run).replace(second=0, microsecond=0), run.state] += 1
        self.summarised_until = max(start, limit)
        return SummaryReport(
            runs=len(summarised),
            rows=0,
            batches=1,
            summarised_until=self.summarised_until,
            caught_up=True,
        )

    # -- the claim's statements ---------------------------------------------------------------

    def _enter(self, method: str) -> None:
        caller = self.caller()
        self.calls.append(StoreCall(method=method, clock=self.clock(), caller=caller))
        hang = self._hangs.pop(caller, None) or self._hangs.pop(None, None)
        if hang:
            self.sleep(self.clock() + hang)
            raise StoreUnavailable(f"PostgreSQL (fake) did not answer for {hang}s")
        if self.unreachable or caller in self.cut_off:
            raise StoreUnavailable("PostgreSQL (fake) is unreachable")
        if self.latency:
            self.sleep(self.clock() + self.latency)

    def _fence(self, epoch: int) -> None:
        current = None if self.leader is None else self.leader.epoch
        if current != epoch:
            raise StaleEpoch(
                f"claim refused: this process leads with epoch {epoch}, the newest is {current}"
            )

    def _due(self, schedule: FakeSchedule) -> DueSchedule:
        assert schedule.next_fire_at is not None
        waiting = running = 0
        if schedule.overlap_policy is not OverlapPolicy.ALLOW:
            states = Counter(
                run.state for run in self.runs.values() if run.schedule_id == schedule.id
            )
            waiting = states[RunState.PENDING] + states[RunState.QUEUED]
            waiting += states[RunState.RETRYING]
            running = states[RunState.RUNNING]
        return DueSchedule(
            id=schedule.id,
            name=schedule.name,
            task=schedule.task,
            trigger=schedule.trigger,
            zone=schedule.zone,
            args=list(schedule.args),
            kwargs=dict(schedule.kwargs),
            options=dict(schedule.options),
            misfire_policy=schedule.misfire_policy,
            max_attempts=schedule.max_attempts,
            next_fire_at=schedule.next_fire_at,
            overlap_policy=schedule.overlap_policy,
            jitter_seconds=schedule.jitter_seconds,
            end_at=schedule.end_at,
            max_runs=schedule.max_runs,
            runs_count=schedule.runs_count,
            waiting=waiting,
            running=running,
        )

    def _quarantine(self, quarantined: Sequence[Quarantine]) -> None:
        now = self.clock.now()
        for entry in quarantined:
            schedule = self.schedules[entry.schedule_id]
            if schedule.quarantined_at is None:
                schedule.quarantined_at, schedule.disabled_reason = now, entry.reason
            schedule.enabled = False
            for run in self.runs.values():
                if run.schedule_id == entry.schedule_id and run.state is RunState.PENDING:
                    run.state, run.finished_at = RunState.FAILED, now
                    run.error = f"not published: its schedule was quarantined ({entry.reason})"

    def _cancel_active(self, schedule_ids: list[int]) -> list[uuid.UUID]:
        cancelled: list[uuid.UUID] = []
        for run in self.runs.values():
            if run.schedule_id in schedule_ids and run.state.value in ACTIVE_STATES:
                run.state, run.finished_at = RunState.CANCELLED, self.clock.now()
                run.reason = "overlap (cancel_previous): a newer run of the schedule started"
                run.lease_expires_at = None
                cancelled.append(run.id)
        return cancelled

    def _insert_runs(self, epoch: int, fires: list[NewRun]) -> list[RunToPublish]:
        inserted: list[RunToPublish] = []
        for fire in fires:
            if (fire.schedule.id, fire.fire_at) in self._fired:
                continue  # ON CONFLICT DO NOTHING: a fire time is claimed once
            run = fire.to_publish()
            self._insert(
                FakeRun(
                    id=run.id,
                    schedule_id=fire.schedule.id,
                    schedule_name=run.schedule_name,
                    task=run.task,
                    args=run.args,
                    kwargs=run.kwargs,
                    options=run.options,
                    fire_at=fire.fire_at,
                    not_before=fire.not_before,
                    state=RunState.PENDING,
                    epoch=epoch,
                    claimed_at=self.clock.now(),
                    max_attempts=fire.schedule.max_attempts,
                )
            )
            inserted.append(run)
        return inserted

    def _insert_skipped(self, epoch: int, plans: list[tuple[DueSchedule, FirePlan]]) -> int:
        now, count = self.clock.now(), 0
        for schedule, plan in plans:
            for skip in plan.skipped:
                count += 1
                if (schedule.id, skip.fire_at) in self._fired:
                    continue
                self._insert(
                    FakeRun(
                        id=uuid.uuid4(),
                        schedule_id=schedule.id,
                        schedule_name=schedule.name,
                        task=schedule.task,
                        fire_at=skip.fire_at,
                        state=RunState.SKIPPED,
                        reason=skip.reason,
                        epoch=epoch,
                        claimed_at=now,
                        finished_at=now,
                    )
                )
        return count

    def _advance(self, advances: list[Advance]) -> None:
        for advance in advances:
            schedule = self.schedules[advance.schedule_id]
            schedule.next_fire_at = advance.next_fire_at
            schedule.last_fire_at = advance.last_fire_at
            schedule.runs_count += advance.fired
            schedule.enabled = schedule.enabled and advance.disable_reason is None
            schedule.disabled_reason = advance.disable_reason or schedule.disabled_reason

    def _insert(self, run: FakeRun) -> None:
        self.runs[run.id] = run
        if run.schedule_id is not None and run.fire_at is not None:
            self._fired[(run.schedule_id, run.fire_at)] = run.id

    def _delete(self, run: FakeRun) -> None:
        del self.runs[run.id]
        if run.schedule_id is not None and run.fire_at is not None:
            self._fired.pop((run.schedule_id, run.fire_at), None)


def _jittered(run: FakeRun) -> bool:
    """``not_before > fire_at`` (NULL, hence false, when either is missing)."""
    return run.not_before is not None and run.fire_at is not None and run.not_before > run.fire_at


def _own_or(own: int | None, default: int) -> int:
    return default if own is None else own


def _age(run: FakeRun) -> datetime:
    return run.finished_at or run.claimed_at


# -- publisher, waiter, lost messages ----------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Sent:
    """One run handed to the (fake) broker."""

    run: RunToPublish
    #: The monotonic clock and the database's time at the send.
    clock: float
    at: datetime
    sender: str
    #: The deadline ``publish_at`` was given; None for ``publish``.
    deadline: float | None = None


class RecordingPublisher:
    """``beat.leader.loop.Publisher`` that records what it sends. ``publish_at`` lets
    time pass until the deadline (the real one sleeps), calls ``before_send``, then
    sends; a failing send returns the error in the result, as the real one does."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        sender: str = "beat",
        sent: list[Sent] | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.clock = clock
        self.sender = sender
        self.sent: list[Sent] = [] if sent is None else sent
        self.sleep: Callable[[float], None] = sleep or clock.advance_to
        self.revoked: list[uuid.UUID] = []
        self.terminated: list[str] = []
        #: Schedules whose messages cannot be built (their runs are ``rejected``).
        self.unpublishable: set[str] = set()
        #: Called with the runs about to be recorded as sent.
        self.on_send: Callable[[Sequence[RunToPublish]], None] | None = None
        self.failed_sends = 0
        self._failures = 0
        #: Seconds ``publish_at`` takes to build each message (in ``BUILD_STEP`` chunks).
        self.build_seconds_per_run = 0.0
        #: The database's clock each publish was given, in order.
        self.databases: list[DatabaseClock | None] = []

    def fail_next(self, sends: int = 1) -> None:
        """The next ``sends`` sends fail (the broker is down): nothing of them is sent."""
        self._failures += sends

    def publish(
        self, runs: Sequence[RunToPublish], *, database: DatabaseClock | None = None
    ) -> PublishResult:
        self.databases.append(database)
        return self._send(runs, deadline=None)

    def publish_at(
        self,
        runs: Sequence[RunToPublish],
        deadline: float,
        *,
        database: DatabaseClock | None = None,
        before_send: Callable[[], None] | None = None,
        while_waiting: Callable[[], float] | None = None,
    ) -> PublishResult:
        self.databases.append(database)
        if not runs:
            return PublishResult(published=[])
        started = self.clock()
        for first in range(0, len(runs), BUILD_STEP):
            chunk = len(runs[first : first + BUILD_STEP])
            self.sleep(self.clock() + self.build_seconds_per_run * chunk)
            if while_waiting is not None and chunk == BUILD_STEP:
                while_waiting()
        built_in = self.clock() - started
        while deadline > self.clock():
            step = 1.0 if while_waiting is None else max(0.0, while_waiting())
            self.sleep(self.clock() + max(0.0, min(deadline - self.clock(), 1.0, step)))
        if before_send is not None:
            before_send()
        return dataclasses.replace(self._send(runs, deadline=deadline), built_in=built_in)

    def revoke(self, run_ids: Sequence[uuid.UUID]) -> None:
        self.revoked.extend(run_ids)

    def terminate(self, task_ids: Sequence[str]) -> None:
        self.terminated.extend(task_ids)

    def sends_of(self, run_id: uuid.UUID) -> list[Sent]:
        return [sent for sent in self.sent if sent.run.id == run_id]

    def _send(self, runs: Sequence[RunToPublish], *, deadline: float | None) -> PublishResult:
        rejected = [
            UnpublishableRun(run=run, error="TypeError: options.headers must be a JSON object")
            for run in runs
            if run.schedule_name in self.unpublishable
        ]
        refused = {entry.run.id for entry in rejected}
        good = [run for run in runs if run.id not in refused]
        if self._failures:
            self._failures -= 1
            self.failed_sends += 1
            error = ConnectionError("the broker (fake) refused the connection")
            return PublishResult(published=[], error=error, rejected=rejected)
        if self.on_send is not None:
            self.on_send(good)
        clock, at = self.clock(), self.clock.now()
        for run in good:
            self.sent.append(
                Sent(run=run, clock=clock, at=at, sender=self.sender, deadline=deadline)
            )
        return PublishResult(published=[run.id for run in good], rejected=rejected)


class FakeWaiter:
    """``beat.leader.loop.Waiter``: waits on the manual clock, woken by ``wake()``
    (a NOTIFY). With ``sleeps=False`` it only notes when the wait ends (``wake_at``),
    for a :class:`World` to run the process again then."""

    def __init__(self, clock: ManualClock, *, sleeps: bool = True) -> None:
        self.clock = clock
        self.sleeps = sleeps
        self.waits: list[float] = []
        self.wake_at = clock()
        self.wakeups = 0
        self.listening = False
        self._woken = False

    def listen(self) -> None:
        self.listening = True

    def wait(self, timeout: float) -> bool:
        self.listen()  # as the real one, which LISTENs on first use
        self.waits.append(timeout)
        if self._woken:  # a notification came while not waiting: return at once
            self._woken = False
            self.wake_at = self.clock()
            return True
        if not self.sleeps:
            self.wake_at = self.clock() + timeout
            return False
        self.clock.advance(timeout, until=lambda: self._woken)
        woken, self._woken = self._woken, False
        self.wake_at = self.clock()
        return woken

    def wake(self) -> None:
        self.wakeups += 1
        if not self.listening:
            return  # PostgreSQL tells only the sessions that LISTEN already
        if not self.sleeps and self.wake_at > self.clock():
            self.wake_at = self.clock()  # waiting: the wait ends now
            return
        self._woken = True


class NoMessageRecovery:
    """``beat.leader.loop.MessageRecovery`` on a broker that loses nothing."""

    def due(self) -> bool:
        return False

    def forget(self) -> None:
        pass

    def look(self, store: Any, epoch: int, *, limit: int, idle_timeout: float) -> Recovery:
        return Recovery()

    def waiting_in_queues(self, runs: Sequence[RunToPublish]) -> set[uuid.UUID]:
        return set()


# -- processes ------------------------------------------------------------------------------


class DeferredSends:
    """``beat.leader.overlapped_send.OverlappedSend`` at its latest, and on the loop's thread:
    a burst's batch is sent only when the loop waits for it (before anything else it
    does but the next claim), so a test sees what the next claim or a fault meanwhile
    does to it."""

    def __init__(self) -> None:
        self._send: Callable[[], None] | None = None
        #: Sends handed over (started) so far.
        self.started = 0

    @property
    def in_flight(self) -> bool:
        return self._send is not None

    def start(self, send: Callable[[], None]) -> None:
        self.finish()
        self._send = send
        self.started += 1

    def finish(self) -> None:
        send, self._send = self._send, None
        if send is not None:
            send()

    def finish_quietly(self, timeout: float | None = None) -> None:
        with contextlib.suppress(Exception):
            self.finish()


class ProcessCrashed(BaseException):
    """Unwinds the pass of a process that died meanwhile (nothing of it runs on)."""


class ProcessStopped(BaseException):
    """Unwinds the pass of a process told to shut down (SIGTERM: beat raises SystemExit)."""


class Process:
    """One beat process of a :class:`World`: the real ``LeaderLoop`` and ``Leadership``
    on the world's fakes, wired as ``beat.scheduler.HAScheduler`` wires them."""

    def __init__(self, world: World, name: str, *, index: int, start_at: float) -> None:
        self.world = world
        self.name = name
        self.index = index
        config, clock = world.config, world.clock
        self.clock = clock
        self.reporter = Reporter()
        self.lease = FakeLease(
            world.lease_server, ttl=config.lock_ttl, holder=name, on_lost=self._on_lease_lost
        )
        self.armed = ArmedRuns()
        self.waiter = FakeWaiter(clock, sleeps=False)
        self.waiter.wake_at = start_at
        self.publisher = RecordingPublisher(
            clock, sender=name, sent=world.sent, sleep=world.sleep_until
        )
        self.publisher.on_send = self._sending
        longest_step = config.lock_ttl + config.max_wait + config.claim_ahead
        #: The leader row's hold, as ``HAScheduler`` makes it (``habeat_lead_without_redis``).
        self.hold = (
            DatabaseHold(
                world.store,
                holder=name,
                seconds=longest_step + config.lock_ttl,
                renew_interval=config.renew_interval,
                clock=clock,
            )
            if config.lead_without_redis
            else None
        )
        self.leadership = Leadership(
            self.lease,
            world.store,
            self.reporter,
            longest_step=longest_step,
            on_lost=self._drop_armed,
            clock=clock,
            hold=self.hold,
        )
        self.loop = LeaderLoop(
            config=config,
            store=world.store,
            leadership=self.leadership,
            publisher=self.publisher,
            waiter=self.waiter,
            lost_messages=NoMessageRecovery(),
            # Read at once, in the pass: a thread would read outside the simulated time.
            series_gauges=ScheduleSeriesGauges(start=lambda read: read()),
            notifier=Notifier(send=world.send_notification, start=lambda work: work(), clock=clock),
            armed=self.armed,
            reporter=self.reporter,
            clock=clock,
            after_claim_commit=self._after_claim_commit,
            sends=DeferredSends(),
        )
        world.store.on_leader_released(self.waiter.wake)
        #: Test hook: called with each claim after it commits, before its runs are sent.
        self.after_claim: Callable[[Claim], None] | None = None
        self.claims: list[Claim] = []
        self.errors: list[Exception] = []
        self.passes = 0
        self.start_at = start_at
        self.backoff_until = -math.inf
        self.paused_until = -math.inf
        self.crashed = self.closed = self.stopping = False
        self._tick_errors = TickErrors()

    def __repr__(self) -> str:
        return f"<Process {self.name}>"

    @property
    def epoch(self) -> int | None:
        return self.leadership.epoch

    @property
    def term(self) -> int | None:
        """The epoch of the term the loop works in (None between terms); unlike
        ``epoch``, it stays until the loop notices that the lease is gone."""
        return self.leadership._epoch

    @property
    def leads(self) -> bool:
        return self.leadership.epoch is not None

    @property
    def runnable(self) -> bool:
        return not (self.crashed or self.closed)

    @property
    def next_run(self) -> float:
        """When this process runs its next pass: its wait is over (or it was woken),
        and so are a back-off after an error and a pause."""
        return max(self.start_at, self.waiter.wake_at, self.backoff_until, self.paused_until)

    def tick(self) -> float:
        """``HAScheduler.tick``: one pass; a back-off delay after an error, else 0."""
        try:
            self.loop.run_once()
        except StaleEpoch as exc:
            self.leadership.step_down(str(exc), nothing_in_flight=not self.loop.sends.in_flight)
        except Exception as exc:  # as the real tick: log, back off, retry
            self.errors.append(exc)
            return self._tick_errors.failed(exc)
        else:
            self._tick_errors.succeeded()
        finally:
            self.reporter.leading(self.leadership.epoch)
        return 0.0

    def run_pass(self) -> None:
        """One tick, then Celery beat's sleep of the back-off (if any)."""
        self.world.running.append(self)
        self.waiter.wake_at = self.clock()
        backoff = 0.0
        try:
            backoff = self.tick()
        except ProcessCrashed:
            return
        except ProcessStopped:
            pass
        finally:
            self.world.running.remove(self)
            self.passes += 1
        if self.stopping and not self.closed:
            self.close()
        self.backoff_until = self.clock() + backoff

    # -- faults ---------------------------------------------------------------------------

    def crash(self) -> None:
        """The process dies at once (SIGKILL): its lease stays until it expires."""
        self.crashed = True
        self.lease.kill()

    def pause(self, seconds: float) -> None:
        """Stop the whole process (loop and renewer) for ``seconds`` (SIGSTOP, a VM pause)."""
        self.paused_until = max(self.paused_until, self.clock() + seconds)
        self.lease.pause()
        self.world.at(self.paused_until, self._resume)

    def hand_over(self) -> None:
        """A clean shutdown (SIGTERM): ``HAScheduler.close``, once the pass in flight ends."""
        if self in self.world.running:
            self.stopping = True
        elif self.runnable:
            self.close()

    def close(self) -> None:
        """``HAScheduler.close``: end the send in flight, drop the runs claimed ahead,
        release, wake the standbys."""
        self.closed = True
        self.loop.sends.finish_quietly()
        self.armed.drop()
        self.leadership.hand_over()

    def _resume(self) -> None:
        if self.clock() >= self.paused_until:
            self.lease.resume()

    # -- wiring ---------------------------------------------------------------------------

    def _on_lease_lost(self, reason: str) -> None:
        self.leadership.lease_lost(reason)

    def _drop_armed(self) -> None:
        self.loop.drop_armed()

    def _after_claim_commit(self, claim: Claim) -> None:
        self.claims.append(claim)
        if self.after_claim is not None:
            self.after_claim(claim)

    def _sending(self, runs: Sequence[RunToPublish]) -> None:
        self.world.check_send(self, runs)


class World:
    """Beat processes sharing one store, one lease server and one clock, run in the
    order of their wake-up times; timed events (``at``) go first at equal times.

    ``double_leaders`` notes when two processes lead at once (checked at every step
    of the clock), ``violations`` when a process sends runs in a term that a newer
    epoch superseded."""

    def __init__(self, config: BeatConfig | None = None, *, max_step: float = 0.1) -> None:
        self.config = config or beat_config()
        self.clock = ManualClock(max_step=max_step)
        self.store = FakeClaimStore(
            self.clock, leader_name=self.config.key_prefix, sleep=self.sleep_until
        )
        self.store.caller = self._caller
        self.lease_server = FakeLeaseServer(self.clock)
        self.sent: list[Sent] = []
        self.processes: list[Process] = []
        #: Runs sent by a process whose term a newer epoch superseded.
        self.violations: list[str] = []
        #: Moments when two processes believed they led (only Redis losing the key can
        #: cause it: the epoch then fences the old leader), a term on the row that was
        #: asked to end aside (``_ended_on_the_row``).
        self.double_leaders: list[str] = []
        #: Processes in the middle of a pass (sleeping until a deadline), innermost last.
        self.running: list[Process] = []
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self.clock.add_ticker(self._check_leaders)
        #: Notifications the channels took: (kind, target, notification ID).
        self.notified: list[tuple[ChannelKind, str, int]] = []
        #: Targets whose sends fail.
        self.unreachable_channels: set[str] = set()

    def send_notification(
        self, kind: ChannelKind, target: str, notification_id: int, payload: dict[str, Any]
    ) -> None:
        """``beat.notify.senders.send`` on the fake channels."""
        if target in self.unreachable_channels:
            raise SendFailed(f"{kind.value}: the receiver at {target} does not answer")
        self.notified.append((kind, target, notification_id))

    def start(self, name: str | None = None, *, delay: float = 0.0) -> Process:
        """A new process (a standby until it takes the lease), running after ``delay``."""
        index = len(self.processes)
        process = Process(self, name or f"p{index}", index=index, start_at=self.clock() + delay)
        self.processes.append(process)
        return process

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._sequence), action))

    def after(self, seconds: float, action: Callable[[], None]) -> None:
        self.at(self.clock() + seconds, action)

    @property
    def leaders(self) -> list[Process]:
        return [process for process in self.processes if process.leads]

    def run_for(self, seconds: float) -> None:
        self.run_until(self.clock() + seconds)

    def run_until(self, until: float) -> None:
        """Run events and processes in time order until the clock reads ``until``."""
        stalled, last = 0, self.clock()
        while True:
            waiting = [p for p in self.processes if p.runnable and p not in self.running]
            process = min(waiting, key=lambda p: (p.next_run, p.index), default=None)
            event_at = self._events[0][0] if self._events else math.inf
            process_at = process.next_run if process is not None else math.inf
            if min(event_at, process_at) > until:
                self.clock.advance_to(until)
                return
            if event_at <= process_at:
                _, _, action = heapq.heappop(self._events)
                self.clock.advance_to(event_at)
                action()
            else:
                assert process is not None
                self.clock.advance_to(process_at)
                process.run_pass()
                self._check_leaders()
            if self.clock() > last:
                stalled, last = 0, self.clock()
            else:
                stalled += 1
                if stalled > 10_000:
                    raise RuntimeError(f"no time passes: {stalled} passes at {last}")

    def sleep_until(self, monotonic: float) -> None:
        """A process sleeps (in a store call, or before sending runs claimed ahead): the
        others run meanwhile; a process paused, crashed or stopped then does so here."""
        process = self.running[-1] if self.running else None
        if process is None:
            self.clock.advance_to(monotonic)
            return
        if monotonic > self.clock():
            self.run_until(monotonic)
        while process.paused_until > self.clock() and not process.crashed:
            self.run_until(process.paused_until)
        if process.crashed:
            raise ProcessCrashed(process.name)
        if process.stopping:
            raise ProcessStopped(process.name)

    def _caller(self) -> str | None:
        return self.running[-1].name if self.running else None

    def check_send(self, process: Process, runs: Sequence[RunToPublish]) -> None:
        """A process sends a run only while it waits to be published, and only in a
        term no newer one has superseded. (Its lease may have run out locally since
        the pass began: nobody else can hold it until the key expires in Redis, a
        tenth of the TTL later.)"""
        epoch = process.term
        newest = None if self.store.leader is None else self.store.leader.epoch
        if runs and (epoch is None or epoch != newest):
            self.violations.append(
                f"{self.clock():.3f}: {process.name} sent {len(runs)} runs in term"
                f" {epoch}, the newest is {newest}"
            )
        for run in runs:
            row = self.store.runs.get(run.id)
            if row is not None and row.state is not RunState.PENDING:
                self.violations.append(
                    f"{self.clock():.3f}: {process.name} sent run {run.id} of"
                    f" {run.schedule_name} at {run.fire_at} again: it is {row.state}"
                )

    def _check_leaders(self) -> float | None:
        leaders = [process for process in self.leaders if not self._ended_on_the_row(process)]
        if len(leaders) > 1:
            self.double_leaders.append(f"{self.clock():.3f}: {leaders} lead at once")
        return None

    def _ended_on_the_row(self, process: Process) -> bool:
        """A term on the row whose hold was asked to end (shortened inside its margin)
        or superseded: until its next pass it believes it leads, but the store refuses
        its claims (the epoch) and its sends (``hold_left`` under its margin)."""
        row, hold = self.store.leader, process.hold
        if not process.leadership.on_database or hold is None:
            return False
        if row is None or row.epoch != process.term or row.held_until is None:
            return True
        return (row.held_until - self.clock.now()).total_seconds() < hold.margin

    # -- what was sent ----------------------------------------------------------------------

    def sends_of(self, run_id: uuid.UUID) -> list[Sent]:
        return [sent for sent in self.sent if sent.run.id == run_id]

    def send_counts(self) -> Counter[uuid.UUID]:
        return Counter(sent.run.id for sent in self.sent)
