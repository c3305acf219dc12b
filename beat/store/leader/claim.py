"""What the leader writes, each statement fenced by its epoch: the leader row,
the claim, the outbox, the reaper, and what wakes the leader. Callers get
domain objects and domain errors (``beat.errors``), never rows or driver
exceptions; time is the database's ``now()``: one clock for all nodes.

The contract of the claim (``claim_due``), which the leader loop relies on:

- eligible rows are enabled schedules whose ``next_fire_at <= now()``, oldest
  first, at most ``batch``, skipping rows another transaction has locked;
- the claim holds a share lock on the leader row for its whole transaction and
  aborts with :class:`StaleEpoch` unless the row's epoch is the caller's, so a
  takeover (which needs the row exclusively) waits for claims in flight and
  every claim after it fails for the old leader;
- what to write is decided by :func:`beat.claim.planning.plan_claim`; in the same
  transaction it inserts one ``pending`` run per planned fire time (unique per
  schedule and fire time: a fire time is never claimed twice), records skipped
  fire times, and advances ``next_fire_at``;
- it returns only the runs it inserted, to be published after commit.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Double,
    Engine,
    Integer,
    Row,
    Text,
    and_,
    any_,
    bindparam,
    case,
    column,
    delete,
    func,
    literal,
    literal_column,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

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
from beat.errors import (
    StaleEpoch,
    StoreUnavailable,
    error_text,
)
from beat.models import (
    ACTIVE_STATES,
    PLAIN_RUN_INTERRUPTED,
    WAITING_STATES,
    DueSchedule,
    FirePlan,
    MisfirePolicy,
    OverlapPolicy,
    Quarantine,
    RunState,
    RunToPublish,
    SkipKind,
    UnpublishableRun,
)
from beat.publish.dispatch import ROUTING_OPTIONS
from beat.records import RedisHalf, Session, SessionlessRun
from beat.schedule.options import check_publish_options
from beat.schedule.payload import decoded_json, stored_payload
from beat.schedule.timing import Trigger, parse_zone
from beat.store.db import (
    NO_IDLE_TIMEOUTS,
    SERVER_INCARNATION,
    StoreConnection,
    create_store_engine,
    masked_url,
    psycopg_conninfo,
    unreachable,
)
from beat.store.pg_arrays import (
    array_param,
    bigint_array,
    integer_array,
    text_array,
    time_array,
    uuid_array,
)
from beat.store.rows import (
    SCHEDULE_TIMES,
    finite,
    infinite_times,
    new_run_values,
    preview,
    run_copy_columns,
    stored_times_problem,
    trigger_from_row,
)
from beat.store.runs import due_again
from beat.store.stats import RunStatsStore, SummaryReport
from beat.store.tables import (
    FINISHED_SQL,
    SCHEDULES_CHANNEL,
    TZ,
    beacons,
    leader,
    runs,
    schedules,
    unrecorded_consumers,
    workers,
)

logger = logging.getLogger(__name__)

#: Channel a leader notifies when it hands over cleanly, so standbys take over at once.
LEADER_RELEASED_CHANNEL = "beat_leader_released"
#: Attempts ended by their worker's death that a run may have before it is given up
#: (a job that kills the whole worker process every time must not loop for ever).
MAX_INTERRUPTIONS = 10
#: A run's message is sent at most this many times while no worker records it (its
#: publication, and the copies sent because the broker seemed to have lost it: by
#: lost-message recovery, ``requeue_missing``, or past the visibility timeout,
#: ``reclaim``); then the run ends ``lost``.
MAX_SENDS = 3
#: Which of some runs still have their message waiting in a queue of the broker, where
#: it can be read (``beat.leader.lost_messages.waiting_in_queues``).
InQueue = Callable[[Sequence[RunToPublish]], Collection[uuid.UUID]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """The outcome of one claim transaction."""

    runs: list[RunToPublish]
    #: Database time of the claim.
    now: datetime
    #: Schedules claimed; equal to the batch size when more may be due.
    schedules_claimed: int
    skipped: int
    #: Skip records written, by kind (misfire or overlap policy).
    skips: Counter[SkipKind] = field(default_factory=Counter)
    #: Runs cancelled by the overlap policy cancel_previous (to revoke).
    cancelled: list[uuid.UUID] = field(default_factory=list)
    #: Runs claimed ahead of their fire time (``not_before == fire_at``): the claiming
    #: leader publishes them at that time; another leader, from the outbox.
    armed: list[RunToPublish] = field(default_factory=list)
    #: ``time.monotonic()`` just after ``now`` was read: turns a database time into a
    #: local deadline without trusting this host's wall clock.
    clock: float = 0.0
    #: Runs left in the outbox until their jittered time.
    deferred: int = 0
    #: Schedules disabled because their window ended, with the reason.
    disabled: list[tuple[str, str]] = field(default_factory=list)
    #: Schedules quarantined because they could not be read or planned.
    quarantined: list[Quarantine] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class LostRun:
    id: uuid.UUID
    schedule_name: str | None
    error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Reclaim:
    """What one pass of the reaper did."""

    #: Runs put back in the outbox, to publish again under the same task ID.
    runs: list[RunToPublish]
    #: Runs whose attempts are exhausted.
    lost: list[LostRun]


@dataclass(frozen=True, kw_only=True, slots=True)
class Unconfirmed:
    """Runs no worker has taken although their message should have reached one."""

    runs: list[RunToPublish]
    #: Database time of the query.
    now: datetime
    #: When each run was published (database time; None if not recorded).
    published_at: dict[uuid.UUID, datetime | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnrecordedConsumer:
    """A consumer of ``queue`` that does not record runs, as the leader found it
    (``beat_unrecorded_consumers``); queue ``*``: no worker answered the control."""

    queue: str
    consumer: str
    first_seen_at: datetime
    seen_at: datetime
    #: The first check that no longer found it; None while it is found.
    gone_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderInfo:
    name: str
    epoch: int
    holder: str
    acquired_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class PruneReport:
    deleted: int
    #: Transactions that deleted at least one row.
    batches: int
    #: Finished runs older than this were deleted (database time).
    cutoff: datetime
    #: False when the time budget ran out before the last old run was deleted.
    caught_up: bool


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueBacklog:
    """Runs published to ``queue`` that no worker has taken for a while."""

    queue: str
    waiting: int
    oldest_published_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerPresence:
    """A worker (its Celery node name) that renewed its row of ``beat_workers`` lately."""

    name: str
    pid: int
    #: When its main process started.
    booted_at: datetime
    seen_at: datetime


#: The queue a run's message went to, from its task name and publish options.
QueueOf = Callable[[str, Mapping[str, Any]], str]


class LeaderStore(StoreConnection):
    """PostgreSQL access for the leader of cluster ``leader_name``: every write fenced."""

    def __init__(
        self, engine: Engine, *, leader_name: str = "habeat", setting: str = "habeat_database_url"
    ) -> None:
        super().__init__(engine, setting=setting)
        self.leader_name = leader_name

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        leader_name: str = "habeat",
        pool_size: int = 5,
        setting: str = "habeat_database_url",
    ) -> LeaderStore:
        """A store on ``url``; no connection is made until first use."""
        engine = create_store_engine(url, pool_size=pool_size)
        return cls(engine, leader_name=leader_name, setting=setting)

    # -- leadership ---------------------------------------------------------------

    def current_epoch(self) -> int:
        """The newest epoch recorded by any leader (0 before the first)."""
        with self._transaction() as conn:
            epoch = conn.execute(
                select(leader.c.epoch).where(leader.c.name == self.leader_name)
            ).scalar_one_or_none()
        return epoch or 0

    def take_leadership(
        self,
        epoch: int,
        holder: str,
        *,
        session: Session | None = None,
        lock_timeout: float = 2.0,
    ) -> datetime | None:
        """Record ``epoch`` as the newest, with the ``session`` its holder keeps for its
        term (``beat.lease.beacon``), and return PostgreSQL's clock as the statement that
        recorded it read it (the new leader's first reading of the database's time,
        before its first claim); None if an equal or newer epoch is recorded.

        Waits for claims in flight (they hold the row in share mode), at most
        ``lock_timeout`` seconds, so a stalled old leader cannot block a takeover
        for long: its idle transaction is aborted by PostgreSQL anyway.
        """
        values = {
            "epoch": epoch,
            "holder": holder,
            # The beacon's halves are in beat_beacons; these two columns are left empty
            # (a standby of the release before reads them, and finds nothing to evict).
            "session_pid": None,
            "session_started_at": None,
            "beacon": None if session is None else session.beacon,
        }
        statement = (
            pg_insert(leader)
            .values(name=self.leader_name, **values)
            .on_conflict_do_update(
                index_elements=[leader.c.name],
                set_={**values, "acquired_at": func.now()},
                where=leader.c.epoch < epoch,
            )
            # Read once the row is ours (not now(): the transaction may have waited).
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        try:
            with self._transaction() as conn:
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'"))
                row = conn.execute(statement).one_or_none()
                if row is None or row[0] != epoch:
                    return None
                taken_at: datetime = row[1]
                return taken_at
        except StoreUnavailable as exc:
            if isinstance(exc.__cause__, DBAPIError) and isinstance(
                exc.__cause__.orig, psycopg.errors.LockNotAvailable
            ):
                logger.warning(
                    "takeover waited %.1fs for a claim in flight; will retry", lock_timeout
                )
                return None
            raise

    def leader_without_session(self) -> tuple[str, RedisHalf] | None:
        """(holder, Redis half of its beacon) of the recorded leader if the database
        session of its beacon is proven gone (``beat.lease.beacon``); None while it is
        listed, when it was opened on another server, when none was recorded, or when
        there is no leader. Whether its process died is for its Redis connection to
        confirm."""
        query = (
            select(leader.c.holder, beacons.c.name, beacons.c.redis_server)
            .join(beacons, beacons.c.name == leader.c.beacon)
            .where(leader.c.name == self.leader_name, session_gone(beacons))
        )
        with self._transaction() as conn:
            row = conn.execute(query).one_or_none()
        if row is None:
            return None
        return row.holder, RedisHalf(name=row.name, server=row.redis_server)

    def runs_without_session(self, *, limit: int) -> list[SessionlessRun]:
        """Running runs whose worker process's database session is proven gone:
        candidates for a crash, for Redis to confirm; each with the beacon of its
        worker's main process if that session is proven gone too."""
        own = beacons.alias("own")
        main = beacons.alias("main")
        query = (
            select(
                runs.c.id,
                own.c.name,
                own.c.redis_server,
                case((session_gone(main), main.c.name)).label("worker"),
                main.c.redis_server.label("worker_server"),
            )
            .select_from(
                runs.join(own, own.c.name == runs.c.beacon)
                .outerjoin(workers, workers.c.name == runs.c.worker)
                .outerjoin(main, main.c.name == workers.c.beacon)
            )
            .where(runs.c.state == RunState.RUNNING.value, session_gone(own))
            .limit(limit)
        )
        with self._transaction() as conn:
            return [
                SessionlessRun(
                    id=row.id,
                    beacon=RedisHalf(name=row.name, server=row.redis_server),
                    worker_beacon=None
                    if row.worker is None
                    else RedisHalf(name=row.worker, server=row.worker_server),
                )
                for row in conn.execute(query)
            ]

    def leader_info(self) -> LeaderInfo | None:
        with self._transaction() as conn:
            row = conn.execute(
                select(leader).where(leader.c.name == self.leader_name)
            ).one_or_none()
        if row is None:
            return None
        return LeaderInfo(
            name=row.name, epoch=row.epoch, holder=row.holder, acquired_at=row.acquired_at
        )

    def notify_leader_released(self) -> None:
        with self._transaction() as conn:
            conn.execute(select(func.pg_notify(LEADER_RELEASED_CHANNEL, self.leader_name)))

    # -- claim and outbox ---------------------------------------------------------

    def claim_due(
        self,
        epoch: int,
        *,
        batch: int,
        plan: SchedulePlanner,
        idle_timeout: float = 10.0,
        ahead: float = 0.0,
    ) -> Claim:
        """Claim due schedules as leader ``epoch`` (see the module docstring), planned
        by :func:`beat.claim.planning.plan_claim` with ``plan`` for each schedule.

        With ``ahead`` > 0, schedules of the ``allow`` overlap policy due within
        ``ahead`` seconds are claimed too, planned as of their fire time, and returned
        as ``armed`` runs whose ``not_before`` is their fire time. (Overlap policies
        look at the runs active when a fire time comes: those schedules wait for it.)
        """
        with self._transaction() as conn:
            # The claim's own updates must not wake the leader through the NOTIFY trigger.
            now = self._fence(conn, epoch, idle_timeout, claiming=True)
            clock = time.monotonic()
            rows = conn.execute(_due_query(batch), {"ahead": ahead}).all()
            if not rows:
                return Claim(runs=[], now=now, clock=clock, schedules_claimed=0, skipped=0)
            due, unreadable = _due_schedules(rows)
            due = self._with_active_runs(conn, due)
            claim_plan = plan_claim(due, now, claim_horizon(now, ahead), plan)
            # A schedule that cannot be read or planned is set aside; the batch goes on.
            quarantined = [*unreadable, *claim_plan.quarantined]
            _quarantine(conn, quarantined)
            cancelled = self._cancel_active(conn, claim_plan.cancel_active_of)
            inserted = self._insert_runs(conn, epoch, claim_plan.new_runs)
            skipped = self._insert_skipped(conn, epoch, claim_plan.plans, now)
            self._advance(conn, claim_plan.advances)
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
            quarantined=quarantined,
        )

    @staticmethod
    def _with_active_runs(conn: Connection, due: list[DueSchedule]) -> list[DueSchedule]:
        """Add each schedule's waiting and running runs (where an overlap policy needs them)."""
        ids = [s.id for s in due if s.overlap_policy is not OverlapPolicy.ALLOW]
        if not ids:
            return due
        counts = {
            row.schedule_id: (row.waiting, row.running)
            for row in conn.execute(
                select(
                    runs.c.schedule_id,
                    func.count().filter(runs.c.state.in_(WAITING_STATES)).label("waiting"),
                    func.count().filter(runs.c.state == RunState.RUNNING.value).label("running"),
                )
                .where(runs.c.schedule_id.in_(ids), runs.c.state.in_(ACTIVE_STATES))
                .group_by(runs.c.schedule_id)
            )
        }
        return [
            replace(s, waiting=counts[s.id][0], running=counts[s.id][1]) if s.id in counts else s
            for s in due
        ]

    @staticmethod
    def _cancel_active(conn: Connection, ids: list[int]) -> list[uuid.UUID]:
        """Cancel the active runs of schedules ``ids`` (overlap policy cancel_previous)."""
        if not ids:
            return []
        return list(
            conn.scalars(
                update(runs)
                .where(runs.c.schedule_id.in_(ids), runs.c.state.in_(ACTIVE_STATES))
                .values(
                    state=RunState.CANCELLED.value,
                    finished_at=func.now(),
                    reason="overlap (cancel_previous): a newer run of the schedule started",
                    lease_owner=None,
                    lease_expires_at=None,
                )
                .returning(runs.c.id)
            )
        )

    def _fence(
        self, conn: Connection, epoch: int, idle_timeout: float, *, claiming: bool = False
    ) -> datetime:
        """Hold the leader row (shared) for this transaction, as leader ``epoch``; the
        database's time (the transaction's). With ``claiming``, the transaction's writes
        to schedules do not notify the leader (the trigger reads ``beat.claiming``).

        A leader paused inside the transaction (SIGSTOP, a VM pause) would keep the
        row and block every takeover: PostgreSQL ends the transaction once it has
        been idle for ``idle_timeout`` seconds. One statement does it all: a burst's
        claims follow each other, and each round trip is paid per batch."""
        settings = [
            func.set_config(
                "idle_in_transaction_session_timeout", f"{int(idle_timeout * 1000)}ms", True
            )
        ]
        if claiming:
            settings.append(func.set_config("beat.claiming", "on", True))
        row = conn.execute(
            select(leader.c.epoch, func.now(), *settings)
            .where(leader.c.name == self.leader_name)
            .with_for_update(read=True)
        ).one_or_none()
        current = None if row is None else row[0]
        if current != epoch:
            raise StaleEpoch(
                f"claim refused: this process leads with epoch {epoch}, the newest is {current}"
            )
        assert row is not None
        now: datetime = row[1]
        return now

    @staticmethod
    def _insert_runs(conn: Connection, epoch: int, fires: list[NewRun]) -> list[RunToPublish]:
        """Insert a ``pending`` run per planned fire time in one statement.

        Only the fire times travel as arrays; each run's payload is copied from its
        schedule row (locked by this claim) inside PostgreSQL.
        """
        if not fires:
            return []
        inserted = set(
            conn.scalars(
                _INSERT_RUNS,
                {
                    "ids": uuid_array(fire.id for fire in fires),
                    "schedule_ids": bigint_array(fire.schedule.id for fire in fires),
                    "fire_ats": time_array(fire.fire_at for fire in fires),
                    "not_befores": time_array(fire.not_before for fire in fires),
                    "epoch": epoch,
                },
            )
        )
        if len(inserted) < len(fires):
            logger.warning(
                "%d fire times were claimed before and were not claimed again",
                len(fires) - len(inserted),
            )
        return [fire.to_publish() for fire in fires if fire.id in inserted]

    @staticmethod
    def _insert_skipped(
        conn: Connection, epoch: int, plans: list[tuple[DueSchedule, FirePlan]], now: datetime
    ) -> int:
        rows = [
            new_run_values(
                schedule,
                fire_at=skip.fire_at,
                state=RunState.SKIPPED,
                reason=skip.reason,
                epoch=epoch,
                finished_at=now,
            )
            for schedule, plan in plans
            for skip in plan.skipped
        ]
        if rows:
            conn.execute(
                pg_insert(runs).on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at"),
                rows,
            )
            logger.warning(
                "recorded %d skipped fire times (misfire or overlap policy)",
                len(rows),
                extra={"skipped": len(rows)},
            )
        return len(rows)

    @staticmethod
    def _advance(conn: Connection, advances: list[Advance]) -> None:
        """Advance every claimed schedule in one statement (``UPDATE ... FROM unnest(...)``)."""
        conn.execute(
            _ADVANCE,
            {
                "ids": bigint_array(advance.schedule_id for advance in advances),
                "next_fire_ats": time_array(advance.next_fire_at for advance in advances),
                "last_fire_ats": time_array(advance.last_fire_at for advance in advances),
                "fired": integer_array(advance.fired for advance in advances),
                "reasons": text_array(advance.disable_reason for advance in advances),
            },
        )

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
        """The reaper, as leader ``epoch`` (fenced like a claim), in one transaction:

        - a ``running`` run whose lease expired (its worker died or was cut off),
          or whose worker process is known dead (``dead``: its beacon is gone,
          ``beat.lease.beacon``; ``interrupted`` if its whole worker died with it),
          goes back to the outbox (``pending``, attempt kept) to be published
          again under the same task ID, unless it has had ``max_attempts``
          attempts (Celery retries not counted): then it is ``lost``. An attempt
          whose worker process is known to have died (``beat_workers``: not seen
          since, or started again) is an interruption, not the run's fault: it
          does not count, up to ``MAX_INTERRUPTIONS``;
        - a ``queued`` or ``retrying`` run whose message a worker took (receipt
          lease, see ``beat.delivery.tracking``) but which that worker never started,
          the lease having expired, goes back to the outbox (a retry at its time,
          the times of the deliveries before it cleared);
        - a ``queued`` run no worker holds, published more than
          ``stale_queued_after`` seconds ago (twice the visibility timeout: its
          message is presumed gone from the broker) goes back to the outbox too,
          counted like a copy of lost-message recovery (``_sent_again_or_lost``):
          once its message was sent ``MAX_SENDS`` times it ends ``lost`` with the
          reason. A consumer that records nothing (``beat.leader.lost_messages``) runs
          every copy it takes, so the rule must be bounded: without the bound such
          a run would be executed once more every ``stale_queued_after``, for ever.
          ``in_queue`` (the broker's content, where it can be read: Redis) tells
          which of these runs still have their message waiting in a queue: those
          wait in a backlog, and are neither sent again nor counted. Where nothing
          can be read (RabbitMQ, a topic or fanout route, Redis unreachable) every
          such run counts: a run left waiting in a backlog of more than three
          times ``stale_queued_after`` (six times the visibility timeout, 6 hours by
          default) gets two copies behind it and then ends ``lost``, and its
          messages are refused when they come (a gap, never a second execution).
          That is the trade a production fleet wants: a backlog that deep is an
          outage already, and a consumer that records nothing must not run one
          run without end.
        """
        expired = (
            select(runs.c.id)
            .where(
                runs.c.state == RunState.RUNNING.value,
                or_(runs.c.lease_expires_at < func.now(), runs.c.id.in_(list(dead))),
            )
            .order_by(runs.c.lease_expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
            .cte("expired")
        )
        # A plain task is never started twice: once its worker is gone after it started,
        # the run is over. (Taken but not started, it is published again like any run.)
        interrupted_plain = and_(runs.c.plain, runs.c.started_at.is_not(None))
        # The heuristic on beat_workers reads a run whose lease expired; a run taken back
        # before that (its process is dead) was interrupted only if its whole worker died.
        lease_expired = runs.c.lease_expires_at < func.now()
        worker_died = or_(
            and_(lease_expired, _worker_died(lease_seconds)), runs.c.id.in_(list(interrupted))
        )
        interruptions = runs.c.interruptions + case((worker_died, 1), else_=0)
        exhausted = or_(
            interrupted_plain,
            runs.c.attempt - runs.c.retries - interruptions >= runs.c.max_attempts,
            interruptions > MAX_INTERRUPTIONS,
        )
        lost_error = case(
            (
                interrupted_plain,
                func.concat(PLAIN_RUN_INTERRUPTED, " (worker ", runs.c.worker, ")"),
            ),
            (
                interruptions > MAX_INTERRUPTIONS,
                func.concat(
                    "its worker died ",
                    interruptions,
                    " times while running it (last ",
                    func.coalesce(runs.c.worker, "?"),
                    "): given up",
                ),
            ),
            else_=func.concat(
                "lease expired on attempt ",
                runs.c.attempt,
                " of ",
                runs.c.max_attempts,
                " (worker ",
                func.coalesce(runs.c.worker, "?"),
                "): attempts exhausted",
            ),
        )
        # A plain run's retry is held by the worker that received it (``running``, not
        # started) until its countdown ends: sent again, it keeps its due time. A retry
        # whose time had come (its worker died running it) is due again at that time,
        # later than the delivery before it was published.
        due_later = and_(
            ~exhausted,
            or_(runs.c.retry_due_at > func.now(), due_again() > runs.c.published_at),
        )
        reap = (
            update(runs)
            .where(runs.c.id == expired.c.id)
            .values(
                state=case((exhausted, RunState.LOST.value), else_=RunState.PENDING.value),
                error=case((exhausted, lost_error), else_=runs.c.error),
                interruptions=interruptions,
                finished_at=case((exhausted, func.now()), else_=None),
                epoch=epoch,
                claimed_at=func.now(),
                lease_owner=None,
                lease_expires_at=None,
                # A run that ends here is not sent again: its not_before stays.
                not_before=case((exhausted, runs.c.not_before), else_=due_again()),
                # As below: a delivery due later keeps no time of the ones before it.
                published_at=case((due_later, None), else_=runs.c.published_at),
                received_at=case((due_later, None), else_=runs.c.received_at),
                started_at=case((due_later, None), else_=runs.c.started_at),
            )
            .returning(*runs.c, func.now().label("now"))
        )
        # A worker took the message but died before starting it (a reserved message, a
        # retry waiting for its countdown): kombu would restore it only after the
        # visibility timeout. Back to the outbox, at its retry time if that is later.
        held_by_dead = (
            update(runs)
            .where(
                runs.c.state.in_([RunState.QUEUED.value, RunState.RETRYING.value]),
                runs.c.lease_expires_at < func.now(),
            )
            .values(
                state=RunState.PENDING.value,
                epoch=epoch,
                claimed_at=func.now(),
                lease_owner=None,
                lease_expires_at=None,
                # A retry is not published before it is due (the outbox waits for it).
                not_before=due_again(),
                # The run waits for a new delivery, due at that later time: the times of
                # the deliveries before it (a publication and an attempt on time for the
                # fire time, the receipt of a retry's message held for its countdown) are
                # cleared, else the row pairs them with the retry's due time and reads as
                # sent early. They are written again by this delivery: published_at by
                # mark_published, or, if that is lost (PostgreSQL down just after the
                # send), by the worker that takes the message (coalesce), never before it.
                published_at=None,
                received_at=None,
                started_at=None,
            )
            .returning(*runs.c, func.now().label("now"))
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            rows = [*_due(conn.execute(reap))]
            rows += _send_stale_again(conn, epoch, stale_queued_after, limit, in_queue)
            rows += _due(conn.execute(held_by_dead))
        republish = [_run_from_row(row) for row in rows if row.state == RunState.PENDING.value]
        lost = [
            LostRun(id=row.id, schedule_name=row.schedule_name, error=row.error)
            for row in rows
            if row.state == RunState.LOST.value
        ]
        return Reclaim(runs=republish, lost=lost)

    def unconfirmed_runs(self, *, older_than: float, limit: int) -> Unconfirmed:
        """Runs whose message a worker should have taken by now but no worker has: ``queued``
        for more than ``older_than`` seconds, or ``retrying`` for that long past the time
        their retry was due. Their message may be lost (the caller asks the broker)."""
        overdue = func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than)
        query = (
            select(runs, func.now().label("now"))
            .where(
                or_(
                    and_(runs.c.state == RunState.QUEUED.value, runs.c.published_at < overdue),
                    and_(runs.c.state == RunState.RETRYING.value, runs.c.retry_due_at < overdue),
                ),
                # A worker holds it (receipt lease): if that worker dies, the reaper acts.
                runs.c.lease_owner.is_(None),
            )
            .order_by(runs.c.published_at)
            .limit(limit)
        )
        with self._transaction() as conn:
            rows = list(conn.execute(query))
            now = rows[0].now if rows else conn.execute(select(func.now())).scalar_one()
        return Unconfirmed(
            runs=[_run_from_row(row) for row in rows],
            now=now,
            published_at={row.id: row.published_at for row in rows},
        )

    def requeue_missing(
        self,
        epoch: int,
        run_ids: Sequence[uuid.UUID],
        *,
        max_sends: int = MAX_SENDS,
        idle_timeout: float = 10.0,
    ) -> Reclaim:
        """Put runs whose message the broker lost back in the outbox, as leader ``epoch``
        (fenced), unless a worker took them meanwhile: the runs to publish again. A run
        whose message was sent ``max_sends`` times already (its first publication and
        the copies sent by this recovery, ``recovery_sends``) ends ``lost`` instead: a
        consumer that records nothing may have taken every copy."""
        if not run_ids:
            return Reclaim(runs=[], lost=[])
        statement = (
            update(runs)
            .where(
                runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                runs.c.state.in_([RunState.QUEUED.value, RunState.RETRYING.value]),
            )
            .values(**_sent_again_or_lost(max_sends), epoch=epoch, claimed_at=func.now())
            .returning(*runs.c)
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            rows = list(conn.execute(statement, {"ids": list(run_ids)}))
        return Reclaim(
            runs=[_run_from_row(row) for row in rows if row.state == RunState.PENDING.value],
            lost=[
                LostRun(id=row.id, schedule_name=row.schedule_name, error=row.error)
                for row in rows
                if row.state == RunState.LOST.value
            ],
        )

    def record_consumers(
        self,
        epoch: int,
        found: Sequence[tuple[str, str]],
        *,
        forget_after: float,
        answered: bool = True,
        recording: Collection[str] = (),
        idle_timeout: float = 10.0,
    ) -> list[UnrecordedConsumer]:
        """Record what a check of the consumers found, as leader ``epoch`` (fenced):
        ``found`` (queue, consumer) pairs are seen now; a pair recorded before and not
        found is gone since now (unless nobody ``answered`` the check); a pair last seen
        more than ``forget_after`` seconds ago is deleted, and so is every pair of a
        consumer now known to record runs (``recording``: a worker that answered the
        control before its presence was written, as one just restarted, was taken for
        one that records nothing). Returns the pairs new or back since the last check
        (to say so once)."""
        table = unrecorded_consumers
        pairs = set(found)
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            conn.execute(
                delete(table).where(
                    or_(
                        table.c.seen_at
                        < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, forget_after),
                        table.c.consumer.in_(list(recording)),
                    )
                )
            )
            known = {
                (row.queue, row.consumer): row.gone_at is None
                for row in conn.execute(select(table.c.queue, table.c.consumer, table.c.gone_at))
            }
            # A check nobody answered tells nothing of the consumers it did not name.
            for queue, consumer in known.keys() - pairs if answered else ():
                conn.execute(
                    update(table)
                    .where(table.c.queue == queue, table.c.consumer == consumer)
                    .where(table.c.gone_at.is_(None))
                    .values(gone_at=func.now())
                )
            rows = [
                conn.execute(
                    pg_insert(table)
                    .values(queue=queue, consumer=consumer)
                    .on_conflict_do_update(
                        index_elements=[table.c.queue, table.c.consumer],
                        set_={"seen_at": func.now(), "gone_at": None},
                    )
                    .returning(*table.c)
                ).one()
                for queue, consumer in sorted(pairs)
            ]
        return [_consumer_from_row(row) for row in rows if not known.get((row.queue, row.consumer))]

    def unrecorded_consumers(self) -> list[UnrecordedConsumer]:
        """The consumers that do not record runs, as the leader last found them, by queue."""
        table = unrecorded_consumers
        query = select(table).order_by(table.c.queue, table.c.consumer)
        with self._transaction() as conn:
            return [_consumer_from_row(row) for row in conn.execute(query)]

    def expire_runs(
        self, epoch: int, run_ids: Sequence[uuid.UUID], *, idle_timeout: float = 10.0
    ) -> int:
        """End runs whose ``expires`` passed before any worker started them (fenced)."""
        if not run_ids:
            return 0
        statement = (
            update(runs)
            .where(
                runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
                runs.c.state.in_(
                    [RunState.PENDING.value, RunState.QUEUED.value, RunState.RETRYING.value]
                ),
            )
            .values(
                state=RunState.EXPIRED.value,
                reason="expired before a worker started it (the leader found no message for it)",
                finished_at=func.now(),
                epoch=epoch,
            )
        )
        with self._transaction() as conn:
            self._fence(conn, epoch, idle_timeout)
            return conn.execute(statement, {"ids": list(run_ids)}).rowcount

    def pending_runs(self, epoch: int, *, grace: float, limit: int) -> list[RunToPublish]:
        """The outbox: runs claimed but not published, by an earlier leader (any age)
        or by this one (older than ``grace`` seconds, i.e. its publish failed), and
        jittered runs whose time has come; none before its ``not_before``."""
        query = (
            select(runs)
            .where(runs.c.state == RunState.PENDING.value)
            .where(_released_now())
            .where(
                or_(
                    runs.c.epoch.is_distinct_from(epoch),
                    runs.c.claimed_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, grace),
                    # A jittered run whose time has come. (A run claimed ahead, whose
                    # not_before is its fire time, is this leader's to send from memory.)
                    _deferred(),
                )
            )
            .order_by(runs.c.claimed_at)
            .limit(limit)
        )
        with self._transaction() as conn:
            return [_run_from_row(row) for row in conn.execute(query)]

    def mark_published(self, run_ids: Sequence[uuid.UUID]) -> int:
        """``pending`` -> ``queued`` for the runs published, in one statement."""
        if not run_ids:
            return 0
        with self._transaction() as conn:
            return conn.execute(
                update(runs)
                .where(runs.c.id == any_(array_param("ids", UUID(as_uuid=True))))
                .where(runs.c.state == RunState.PENDING.value)
                .values(state=RunState.QUEUED.value, published_at=func.now()),
                {"ids": uuid_array(run_ids)},
            ).rowcount

    def fail_unpublishable(self, rejected: Sequence[UnpublishableRun]) -> list[Quarantine]:
        """Mark ``failed``, with their error, the runs whose message cannot be built, and
        quarantine their schedules (see ``_quarantine``); returns the quarantines."""
        quarantined: dict[int, Quarantine] = {}
        with self._transaction() as conn:
            for entry in rejected:
                row = conn.execute(
                    update(runs)
                    .where(runs.c.id == entry.run.id, runs.c.state == RunState.PENDING.value)
                    .values(
                        state=RunState.FAILED.value,
                        error=f"cannot be published: {entry.error}",
                        finished_at=func.now(),
                    )
                    .returning(runs.c.schedule_id)
                ).one_or_none()
                if row is None or row.schedule_id is None or row.schedule_id in quarantined:
                    continue
                quarantined[row.schedule_id] = Quarantine(
                    schedule_id=row.schedule_id,
                    name=entry.run.schedule_name or "?",
                    reason=f"run {entry.run.id} cannot be published: {entry.error}",
                )
            _quarantine(conn, list(quarantined.values()))
        return list(quarantined.values())

    def seconds_until_lease_expiry(self) -> float | None:
        """Seconds until the earliest lease of a running run expires (negative if it
        has), or None: the leader wakes then to reclaim the run of a dead worker."""
        query = select(func.extract("epoch", func.min(runs.c.lease_expires_at) - func.now())).where(
            runs.c.state == RunState.RUNNING.value
        )
        with self._transaction() as conn:
            seconds = conn.execute(query).scalar_one_or_none()
        return None if seconds is None else float(seconds)

    def seconds_until_next_fire(self, epoch: int | None = None) -> float | None:
        """Seconds until the earliest enabled fire time or run waiting for its
        ``not_before`` (negative if overdue), or None. Runs that leader ``epoch``
        claimed ahead (``not_before = fire_at``) are left out: it keeps them in memory."""
        next_fire = (
            select(func.min(schedules.c.next_fire_at))
            .where(schedules.c.enabled, schedules.c.next_fire_at.is_not(None))
            .scalar_subquery()
        )
        next_jittered = (
            select(func.min(runs.c.not_before))
            .where(
                runs.c.state == RunState.PENDING.value,
                runs.c.not_before.is_not(None),
                or_(_deferred(), runs.c.epoch.is_distinct_from(epoch)),
            )
            .scalar_subquery()
        )
        query = select(_seconds_until(func.least(next_fire, next_jittered)))
        with self._transaction() as conn:
            seconds = conn.execute(query).scalar_one_or_none()
        return None if seconds is None else float(seconds)

    def due_profile(self, horizon: float) -> list[DueSecond]:
        """How many schedules that may be claimed ahead (overlap policy ``allow``) are
        due within ``horizon`` seconds, by fire second (``beat.claim.window``), each at
        its earliest fire time; the overdue ones count in the first. One range of the
        due index."""
        until = _seconds_until(schedules.c.next_fire_at)
        second = func.greatest(0, func.floor(until)).label("second")
        query = (
            select(func.greatest(0, func.min(until)), func.count())
            .where(
                schedules.c.enabled,
                schedules.c.next_fire_at.is_not(None),
                schedules.c.next_fire_at <= func.now() + _seconds("horizon"),
                schedules.c.overlap_policy == OverlapPolicy.ALLOW.value,
            )
            .group_by(second)
            .order_by(second)
        )
        with self._transaction() as conn:
            rows = conn.execute(query, {"horizon": horizon}).all()
        return [DueSecond(seconds=float(row[0]), count=row[1]) for row in rows]

    # -- retention ----------------------------------------------------------------

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        on_batch: Callable[[int], None] | None = None,
        budget: float | None = None,
    ) -> PruneReport:
        """Delete finished runs whose ``finished_at`` (else ``claimed_at``) is older
        than ``older_than``, ``batch`` rows per transaction, so no lock is held long.

        The cutoff is fixed once, at the start. Rows locked by someone else are
        skipped (they are not finished business for long). ``on_batch`` gets the
        row count of every transaction that deleted something. ``budget`` bounds
        the seconds one call spends (the leader prunes on each maintenance pass):
        no batch starts after it is spent, but one always runs; the report says
        whether old runs are left.
        """
        if batch < 1:
            raise ValueError(f"batch={batch!r}: must be at least 1")
        with self._transaction() as conn:
            cutoff: datetime = conn.execute(select(func.now() - older_than)).scalar_one()
            # The summary of the minutes whose runs go (``beat.store.stats``) goes too.
            self._run_stats().delete_summary_before(cutoff, conn)
        deadline = None if budget is None else time.monotonic() + budget
        deleted = batches = 0
        while True:
            count = self._prune_batch(cutoff, batch)
            if count:
                deleted, batches = deleted + count, batches + 1
                if on_batch is not None:
                    on_batch(count)
            caught_up = count < batch
            if caught_up or (deadline is not None and time.monotonic() >= deadline):
                return PruneReport(
                    deleted=deleted, batches=batches, cutoff=cutoff, caught_up=caught_up
                )

    def summarise(
        self, *, until: datetime | None = None, budget: float | None = None
    ) -> SummaryReport:
        """Summarise the settled minutes of finished runs for the run statistics
        (:meth:`beat.store.stats.RunStatsStore.summarise`). Not fenced: the summary
        is derived from committed runs, and its own row lock keeps two processes
        from summarising a minute twice."""
        return self._run_stats().summarise(until=until, budget=budget)

    def _run_stats(self) -> RunStatsStore:
        return RunStatsStore(self.engine, setting=self.setting)

    def _prune_batch(self, cutoff: datetime, batch: int) -> int:
        age = func.coalesce(runs.c.finished_at, runs.c.claimed_at)
        doomed = (
            select(runs.c.id)
            # The predicate of the retention index, as literal SQL: a bound parameter
            # would keep a generic plan from using the index.
            .where(text(FINISHED_SQL), age < cutoff)
            .order_by(age)
            .limit(batch)
            .with_for_update(skip_locked=True)
        )
        with self._transaction() as conn:
            return conn.execute(delete(runs).where(runs.c.id.in_(doomed))).rowcount

    # -- what operators read about the cluster --------------------------------------

    def queued_backlog(self, *, older_than: timedelta, queue_of: QueueOf) -> list[QueueBacklog]:
        """Queues holding runs published more than ``older_than`` ago that no worker has
        received, the most stuck first. Runs are grouped by task and routing options in
        PostgreSQL (on the index of queued runs), and each group's queue is worked out
        once by ``queue_of``, as the publisher routed it."""
        waiting = (
            select(
                runs.c.task,
                runs.c.published_at,
                *(runs.c.options[key].astext.label(key) for key in ROUTING_OPTIONS),
            )
            # The index's predicate, as literal SQL: a bound parameter would keep a
            # generic plan from using it.
            .where(text("state = 'queued'"))
            .where(
                runs.c.published_at
                < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than.total_seconds()),
                runs.c.received_at.is_(None),
            )
            .subquery("waiting")
        )
        routing = [waiting.c[key] for key in ROUTING_OPTIONS]
        query = select(
            waiting.c.task,
            *routing,
            func.count().label("runs"),
            func.min(waiting.c.published_at).label("oldest"),
        ).group_by(waiting.c.task, *routing)
        with self._transaction() as conn:
            groups = list(conn.execute(query))
        by_queue: dict[str, QueueBacklog] = {}
        for row in groups:
            options = {key: row._mapping[key] for key in ROUTING_OPTIONS if row._mapping[key]}
            queue = queue_of(row.task, options)
            by_queue[queue] = _merged_backlog(by_queue.get(queue), queue, row.runs, row.oldest)
        return sorted(by_queue.values(), key=lambda b: (b.oldest_published_at, b.queue))

    def live_workers(self, *, within: timedelta) -> list[WorkerPresence]:
        """The workers that renewed their row less than ``within`` ago (a worker does it
        every third of its lease), by name."""
        query = (
            select(workers.c.name, workers.c.pid, workers.c.booted_at, workers.c.seen_at)
            .where(
                workers.c.seen_at
                >= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, within.total_seconds())
            )
            .order_by(workers.c.name)
        )
        with self._transaction() as conn:
            return [
                WorkerPresence(
                    name=row.name, pid=row.pid, booted_at=row.booted_at, seen_at=row.seen_at
                )
                for row in conn.execute(query)
            ]


class ScheduleChangeListener:
    """A dedicated autocommit connection that LISTENs for schedule changes and hand-overs.

    ``wait`` returns early when a schedule was changed outside a claim or a
    leader released its lease; the beat loop waits here instead of sleeping.
    """

    CHANNELS = (SCHEDULES_CHANNEL, LEADER_RELEASED_CHANNEL)

    def __init__(self, url: str, *, setting: str = "habeat_database_url") -> None:
        self._conninfo = psycopg_conninfo(url)
        self._masked = masked_url(url)
        self._setting = setting
        self._conn: psycopg.Connection[Any] | None = None

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a notification; True if one came."""
        conn = self._connection()
        try:
            woken = any(True for _ in conn.notifies(timeout=max(timeout, 0.0), stop_after=1))
            if woken:  # drain the rest, one wake-up is enough
                for _ in conn.notifies(timeout=0.0):
                    pass
            return woken
        except psycopg.Error as exc:
            self.close()
            raise StoreUnavailable(
                f"lost the LISTEN connection to PostgreSQL at {self._masked}: {exc}"
            ) from exc

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5)
            except psycopg.Error as exc:
                raise StoreUnavailable(unreachable(self._masked, exc, self._setting)) from exc
            # Waiting for notifications is idle: a server's idle_session_timeout would end it.
            self._conn.execute(NO_IDLE_TIMEOUTS)
            for channel in self.CHANNELS:
                self._conn.execute(f"LISTEN {channel}")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


# -- row mapping --------------------------------------------------------------------


def _merged_backlog(
    known: QueueBacklog | None, queue: str, waiting: int, oldest: datetime
) -> QueueBacklog:
    """``known`` (None: none yet) with a group of ``waiting`` runs more."""
    if known is None:
        return QueueBacklog(queue=queue, waiting=waiting, oldest_published_at=oldest)
    return QueueBacklog(
        queue=queue,
        waiting=known.waiting + waiting,
        oldest_published_at=min(known.oldest_published_at, oldest),
    )


def _due(rows: Iterable[Row[Any]]) -> list[Row[Any]]:
    """The rows put back in the outbox that are due now; the outbox sends the others
    when their ``not_before`` comes."""
    return [row for row in rows if row.not_before is None or row.not_before <= row.now]


def _send_stale_again(
    conn: Connection, epoch: int, older_than: float, limit: int, in_queue: InQueue | None
) -> list[Row[Any]]:
    """The reaper's visibility-timeout rule (``LeaderStore.reclaim``): the ``queued`` runs
    no worker holds, published more than ``older_than`` seconds ago, locked, back to the
    outbox or ``lost`` at the bound; those whose message ``in_queue`` finds waiting in
    a queue are left as they are. The rows are locked while the broker is read: a worker
    taking one of these messages meanwhile records its receipt after this decision."""
    stale = list(
        conn.execute(
            select(*runs.c)
            .where(
                runs.c.state == RunState.QUEUED.value,
                # A worker holds it (receipt lease): if that worker dies, held_by_dead acts.
                runs.c.lease_owner.is_(None),
                runs.c.published_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, older_than),
            )
            .order_by(runs.c.published_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
    waiting = set(in_queue([_run_from_row(row) for row in stale])) if stale and in_queue else set()
    copies = [row.id for row in stale if row.id not in waiting]
    if not copies:
        return []
    return list(
        conn.execute(
            update(runs)
            .where(runs.c.id == any_(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))))
            .values(**_sent_again_or_lost(MAX_SENDS), epoch=epoch, claimed_at=func.now())
            .returning(*runs.c),
            {"ids": copies},
        )
    )


def _sent_again_or_lost(max_sends: int) -> dict[str, Any]:
    """The values of a run whose message is presumed lost, no worker having recorded it:
    back to the outbox, or ``lost`` once its message was sent ``max_sends`` times (its
    publication and the copies sent since, counted in ``recovery_sends``)."""
    sent = 1 + runs.c.recovery_sends
    at_bound = sent >= max_sends
    given_up = func.concat(
        "its message was sent ",
        sent,
        " times and no worker recorded it: a consumer that does not record runs may have taken it",
    )
    return {
        "state": case((at_bound, RunState.LOST.value), else_=RunState.PENDING.value),
        "error": case((at_bound, given_up), else_=runs.c.error),
        "finished_at": case((at_bound, func.now()), else_=runs.c.finished_at),
        "recovery_sends": runs.c.recovery_sends + case((at_bound, 0), else_=1),
    }


def _consumer_from_row(row: Row[Any]) -> UnrecordedConsumer:
    return UnrecordedConsumer(
        queue=row.queue,
        consumer=row.consumer,
        first_seen_at=row.first_seen_at,
        seen_at=row.seen_at,
        gone_at=row.gone_at,
    )


def _worker_died(lease_seconds: float) -> Any:
    """Is the worker process that held a run whose lease expired known to be dead?

    Its worker renews ``beat_workers`` every third of the lease, from its main
    process: alive, it was seen less than a third of the lease before now, so
    after the run's lease expired, or just before. Dead, it was last seen about
    when the run's last heartbeat was, a whole lease before the expiry. Half a
    lease tells the two apart. A worker started again since the run started is
    another process: the one that ran it died (both instants by the database's
    clock: a worker records its start as PostgreSQL's time less its uptime,
    ``beat.delivery.tracking.WorkerHeartbeat``). A worker with no row (it does not
    import ``beat.delivery.tracking``) cannot be judged: the attempt counts."""
    half_lease = func.make_interval(0, 0, 0, 0, 0, 0, lease_seconds / 2)
    return (
        select(literal(1))
        .where(
            workers.c.name == runs.c.worker,
            or_(
                workers.c.seen_at < runs.c.lease_expires_at - half_lease,
                workers.c.booted_at > runs.c.started_at,
            ),
        )
        .exists()
    )


def session_gone(beacon: Any) -> ColumnElement[bool]:
    """SQL: the database session of a beacon (a row of ``beat_beacons``) is proven gone:
    it was opened on the server answering now (the same incarnation: not restarted,
    not failed over, no crash of a backend since) and that server no longer lists it
    (``beat.lease.beacon``). A pid listed again by a newer session reads as alive: the
    lease then decides."""
    listed = (
        select(literal(1))
        .select_from(text("pg_stat_activity"))
        .where(column("pid") == beacon.c.session_pid)
    )
    return and_(
        beacon.c.postgres_server == literal_column(f"({SERVER_INCARNATION})"), ~listed.exists()
    )


def _released_now() -> ColumnElement[bool]:
    """SQL of ``planning.release_of(run, now()) is Release.NOW``: no ``not_before``,
    or its time has come."""
    return or_(runs.c.not_before.is_(None), runs.c.not_before <= func.now())


def _deferred() -> ColumnElement[bool]:
    """SQL of a run held back by its jitter (``Release.DEFERRED`` until its time):
    ``not_before`` after its fire time. A run claimed ahead (``Release.ARMED``) has
    ``not_before`` equal to its fire time."""
    return runs.c.not_before > runs.c.fire_at


def _due_query(batch: int) -> Any:
    """Due schedules (and, with ``:ahead`` seconds, those due that soon whose overlap
    policy is ``allow``), oldest first, locked, skipping rows locked elsewhere. The
    columns are in the order ``_due_from_row`` unpacks them."""
    ahead = func.now() + _seconds("ahead")
    return (
        select(
            schedules.c.id,
            schedules.c.name,
            schedules.c.task,
            schedules.c.trigger_kind,
            schedules.c.cron,
            schedules.c.cron_both_days,
            schedules.c.every_seconds,
            finite(schedules.c.anchor_at),
            finite(schedules.c.run_at),
            schedules.c.timezone,
            # As text: a value Python's json cannot read fails its row, not the claim.
            schedules.c.args.cast(Text).label("args"),
            schedules.c.kwargs.cast(Text).label("kwargs"),
            schedules.c.options.cast(Text).label("options"),
            schedules.c.misfire_policy,
            schedules.c.max_attempts,
            finite(schedules.c.next_fire_at),
            schedules.c.overlap_policy,
            schedules.c.jitter_seconds,
            finite(schedules.c.end_at),
            schedules.c.max_runs,
            schedules.c.runs_count,
            # Infinite times are read as NULL above, and quarantine the row.
            infinite_times(*SCHEDULE_TIMES),
        )
        .where(
            schedules.c.enabled,
            schedules.c.next_fire_at <= ahead,
            or_(
                schedules.c.next_fire_at <= func.now(),
                schedules.c.overlap_policy == OverlapPolicy.ALLOW.value,
            ),
        )
        .order_by(schedules.c.next_fire_at)
        .limit(batch)
        .with_for_update(skip_locked=True)
    )


def _seconds_until(moment: Any) -> Any:
    """SQL: seconds from now until ``moment`` (negative if past). A row written with
    psql may hold ``-infinity`` or ``infinity``, which PostgreSQL cannot subtract from a
    time: told as infinite seconds (such a row is due, and its claim quarantines it)."""
    return func.extract("epoch", moment) - func.extract("epoch", func.now())


def _seconds(name: str) -> Any:
    """An interval of the bound parameter ``name`` seconds."""
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=Double))


def _unnest(name: str, **arrays: Any) -> Any:
    """``unnest(:a, :b, ...) AS name(a, b, ...)``: parallel arrays as a table, each
    one parameter whatever the batch's size (an array literal: ``beat.store.pg_arrays``)."""
    return (
        func.unnest(*(array_param(key, item) for key, item in arrays.items()))
        .table_valued(*(column(key, item) for key, item in arrays.items()))
        .render_derived(name=name)
    )


#: New runs of a claim: only ids and fire times are sent, the payload is copied
#: from the (locked) schedule rows.
_FIRES = _unnest(
    "fires",
    ids=UUID(as_uuid=True),
    schedule_ids=BigInteger,
    fire_ats=TZ,
    not_befores=TZ,
)


_NEW_RUN = run_copy_columns(
    id=_FIRES.c.ids,
    fire_at=_FIRES.c.fire_ats,
    state=literal(RunState.PENDING.value),
    epoch=bindparam("epoch", type_=BigInteger),
    attempt=literal(0),
    not_before=_FIRES.c.not_befores,
)
_INSERT_RUNS = (
    pg_insert(runs)
    .from_select(
        list(_NEW_RUN),
        select(*_NEW_RUN.values()).join_from(
            _FIRES, schedules, schedules.c.id == _FIRES.c.schedule_ids
        ),
    )
    .on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at")
    .returning(runs.c.id)
)

_ADVANCED = _unnest(
    "advanced",
    ids=BigInteger,
    next_fire_ats=TZ,
    last_fire_ats=TZ,
    fired=Integer,
    reasons=Text,
)
#: Advances every schedule of a claim; a reason (its window ended) disables it.
_ADVANCE = (
    update(schedules)
    .where(schedules.c.id == _ADVANCED.c.ids)
    .values(
        next_fire_at=_ADVANCED.c.next_fire_ats,
        last_fire_at=_ADVANCED.c.last_fire_ats,
        runs_count=schedules.c.runs_count + _ADVANCED.c.fired,
        enabled=and_(schedules.c.enabled, _ADVANCED.c.reasons.is_(None)),
        disabled_reason=func.coalesce(_ADVANCED.c.reasons, schedules.c.disabled_reason),
    )
)


def _due_from_row(row: Row[Any], triggers: dict[tuple[Any, ...], Trigger]) -> DueSchedule:
    """A due row as a schedule. A burst's rows mostly share their trigger (one cron for
    thousands of schedules): ``triggers`` keeps the one built for each trigger's
    columns, for the rows of one claim."""
    (
        schedule_id,
        name,
        task,
        *trigger_columns,
        timezone,
        args,
        kwargs,
        options,
        misfire_policy,
        max_attempts,
        next_fire_at,
        overlap_policy,
        jitter_seconds,
        end_at,
        max_runs,
        runs_count,
        infinite,
    ) = cast(tuple[Any, ...], row)
    stored_times_problem(infinite)
    key = tuple(trigger_columns)
    trigger = triggers.get(key)
    if trigger is None:
        trigger = triggers[key] = trigger_from_row(row)
    # A row written with psql may carry what the API refuses (args of 10 MB, options a
    # schedule may not have): it is quarantined.
    args, kwargs = stored_payload(args, kwargs)
    return DueSchedule(
        id=schedule_id,
        name=name,
        task=task,
        trigger=trigger,
        zone=parse_zone(timezone),
        args=args,
        kwargs=kwargs,
        options={} if options == "{}" else check_publish_options(decoded_json(options, "options")),
        misfire_policy=_MISFIRE_POLICIES.get(misfire_policy) or MisfirePolicy(misfire_policy),
        max_attempts=max_attempts,
        next_fire_at=next_fire_at,
        overlap_policy=_OVERLAP_POLICIES.get(overlap_policy) or OverlapPolicy(overlap_policy),
        jitter_seconds=jitter_seconds,
        end_at=end_at,
        max_runs=max_runs,
        runs_count=runs_count,
    )


#: The policies by their stored value (a look-up, cheaper than the enum's call; a value
#: not listed goes through the call, whose error names it).
_MISFIRE_POLICIES = {policy.value: policy for policy in MisfirePolicy}
_OVERLAP_POLICIES = {policy.value: policy for policy in OverlapPolicy}


def _run_from_row(row: Row[Any]) -> RunToPublish:
    return RunToPublish(
        id=row.id,
        task=row.task,
        args=row.args,
        kwargs=row.kwargs,
        options=row.options,
        schedule_name=row.schedule_name,
        fire_at=row.fire_at,
        attempt=row.attempt,
        not_before=row.not_before,
        task_id=row.task_id,
        retries=row.retries,
    )


def _due_schedules(rows: Sequence[Row[Any]]) -> tuple[list[DueSchedule], list[Quarantine]]:
    """The due rows as schedules, and those whose stored definition cannot be read
    (e.g. a zone or cron written with psql): each alone is quarantined."""
    due: list[DueSchedule] = []
    unreadable: list[Quarantine] = []
    triggers: dict[tuple[Any, ...], Trigger] = {}
    for row in rows:
        try:
            due.append(_due_from_row(row, triggers))
        except Exception as exc:  # bad data in one row must not stop every claim
            reason = preview(f"its stored definition cannot be read: {error_text(exc)}")
            unreadable.append(Quarantine(schedule_id=row.id, name=row.name, reason=reason))
    return due, unreadable


def _quarantine(conn: Connection, quarantined: Sequence[Quarantine]) -> None:
    """Disable each schedule with its reason and fail its runs waiting in the outbox
    (they would fail the same way). A schedule quarantined already keeps its first
    reason and time: that is the cause to fix."""
    first_time = schedules.c.quarantined_at.is_(None)
    for entry in quarantined:
        conn.execute(
            update(schedules)
            .where(schedules.c.id == entry.schedule_id)
            .values(
                enabled=False,
                quarantined_at=func.coalesce(schedules.c.quarantined_at, func.now()),
                disabled_reason=case(
                    (first_time, literal(entry.reason)), else_=schedules.c.disabled_reason
                ),
                updated_at=func.now(),
            )
        )
        conn.execute(
            update(runs)
            .where(runs.c.schedule_id == entry.schedule_id, runs.c.state == RunState.PENDING.value)
            .values(
                state=RunState.FAILED.value,
                error=f"not published: its schedule was quarantined ({entry.reason})",
                finished_at=func.now(),
            )
        )
