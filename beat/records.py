"""The records that cross layers: what the stores hand the leader's loop, the
crash detection, the publisher and the operators' API, written here once so that
none of them imports another for a type. Values only: no I/O."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from beat.models import ChangeAction, ChangeEntry, RunState


@dataclass(frozen=True, slots=True)
class DatabaseClock:
    """PostgreSQL's ``now()`` placed on this host's monotonic clock: ``now`` as a query
    read it, and ``time.monotonic()`` just after. From then on the database's time is
    that reading plus the monotonic seconds since, whatever this host's wall clock says
    (set wrong, stepped by NTP). The leader takes one with every claim
    (``Claim.now``, ``Claim.clock``): a run claimed ahead is sent when the monotonic
    clock reaches its fire time, and a message's time to live is its expiry less the
    database's time at the send (``beat.publish.dispatch``)."""

    now: datetime
    clock: float

    def monotonic_at(self, moment: datetime) -> float:
        """The monotonic time at which the database's clock shows ``moment``."""
        return self.clock + (moment - self.now).total_seconds()

    def now_at(self, monotonic: float) -> datetime:
        """The database's time when the monotonic clock shows ``monotonic``."""
        return self.now + timedelta(seconds=monotonic - self.clock)


@dataclass(frozen=True, kw_only=True, slots=True)
class Session:
    """A process's beacon as last recorded: its name (what runs, the worker's presence
    and the leader row record) and its halves (as ``beat_beacons`` holds them)."""

    beacon: str
    pid: int
    started_at: datetime
    #: The PostgreSQL server's identity when the session was opened.
    postgres_server: str
    #: The Redis server's ``run_id`` when the connection was opened.
    redis_server: str


@dataclass(frozen=True, kw_only=True, slots=True)
class RedisHalf:
    """A beacon's Redis connection as recorded (``beat.lease.beacon``)."""

    #: The connection's name (the beacon's).
    name: str
    #: The ``run_id`` of the Redis server it was opened on.
    server: str


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionlessRun:
    """A running run whose worker process's database session is proven gone."""

    id: uuid.UUID
    #: The beacon of the process running it.
    beacon: RedisHalf
    #: The beacon of its worker's main process, if that session is proven gone too.
    worker_beacon: RedisHalf | None


@dataclass(frozen=True, kw_only=True, slots=True)
class RunRecord:
    """One row of the run history, as shown to an operator."""

    id: uuid.UUID
    #: The Celery task ID its messages carry (Flower's page of the task): the caller's
    #: when it chose one that is not a UUID, else the run ID.
    task_id: str
    schedule_name: str | None
    task: str
    state: RunState
    fire_at: datetime | None
    claimed_at: datetime
    published_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    attempt: int
    max_attempts: int
    retries: int
    duplicate_deliveries: int
    duration_seconds: float | None
    epoch: int | None
    reason: str | None
    error: str | None
    args: list[Any]
    kwargs: dict[str, Any]
    #: A step of a workflow run: that run, and the step's path in its canvas.
    workflow_run_id: uuid.UUID | None = None
    step: str | None = None

    @property
    def lateness(self) -> timedelta | None:
        """How long after its fire time the run was handed to the broker."""
        if self.published_at is None or self.fire_at is None:
            return None
        return self.published_at - self.fire_at


@dataclass(frozen=True, kw_only=True, slots=True)
class ChangeContext:
    """Who changes schedules, and from where: what the audit log records with each
    change (``beat.store.schedule_changes``)."""

    #: A user name, ``token:<name>`` or ``system:<reason>``.
    actor: str
    entry: ChangeEntry
    #: The machine the change is made on; the client's address over HTTP.
    host: str | None = None
    address: str | None = None
    #: Why, in the actor's words (a pause's note).
    note: str | None = None
    #: What the change is called when the trigger would name it otherwise (a restore).
    action: ChangeAction | None = None

    def document(self) -> dict[str, str]:
        """The fields the triggers read, without those left unset."""
        fields = {
            "actor": self.actor,
            "entry": self.entry.value,
            "host": self.host,
            "address": self.address,
            "note": self.note,
            "action": None if self.action is None else self.action.value,
        }
        # A lone surrogate (a user name not in UTF-8) would make PostgreSQL refuse the
        # JSON, and with it the change: it is written as "?" instead.
        return {
            key: value.encode("utf-8", "replace").decode("utf-8")
            for key, value in fields.items()
            if value is not None
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleChange:
    """One row of the audit log: a change to a schedule."""

    id: int
    schedule_name: str
    #: The schedule's version after the change (a delete's: the version deleted).
    version: int
    changed_at: datetime
    action: ChangeAction
    actor: str
    entry: ChangeEntry
    host: str | None
    address: str | None
    note: str | None
    #: The schedule's recorded fields before and after (None before a create, after
    #: a delete, and for an end, a trigger or a backfill: the note says what happened).
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @property
    def differences(self) -> dict[str, tuple[Any, Any]]:
        """Each field the change made different: (before, after)."""
        before, after = self.before or {}, self.after or {}
        return {
            field: (before.get(field), after.get(field))
            for field in sorted(before.keys() | after.keys())
            if before.get(field) != after.get(field)
        }
