"""Frozen value objects passed between the store, the policies and the scheduler.

Datetimes are always aware (UTC from the store); constructors reject naive ones.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from beat.schedule.timing import Trigger

#: Why a plain run that a worker took ends ``lost`` when that worker dies.
PLAIN_RUN_INTERRUPTED = (
    "its worker stopped while it ran; a plain task is not sent again once a worker took it"
    " (it may have had its effect): use the idempotent base to have it run again"
)


class TriggerKind(enum.StrEnum):
    CRON = "cron"
    EVERY = "every"
    ONCE = "once"


class Origin(enum.StrEnum):
    """Where a schedule was defined: code is synced at beat start; api rows are never synced."""

    CODE = "code"
    API = "api"


class ChangeAction(enum.StrEnum):
    """What a change to a schedule did (``beat_schedule_changes.action``)."""

    CREATE = "create"
    UPDATE = "update"
    PAUSE = "pause"
    RESUME = "resume"
    DELETE = "delete"
    #: An earlier version's fields made the schedule's again.
    RESTORE = "restore"
    #: The scheduler disabled it: it could not be planned or published.
    QUARANTINE = "quarantine"
    #: Its last fire time passed: a one-off fired, its window or ``max_runs`` ended.
    END = "end"
    #: A run made besides its timing (the schedule itself is unchanged).
    TRIGGER = "trigger"
    BACKFILL = "backfill"


class ChangeEntry(enum.StrEnum):
    """Where a change to a schedule came from."""

    CLI = "cli"
    PYTHON = "python"
    UI = "ui"
    API = "api"
    #: The schedules defined in code, synced at beat start.
    CODE = "code"
    IMPORT = "import"
    #: The scheduler itself: a quarantine, a pause after failures, an end.
    SYSTEM = "system"
    #: Written around the scheduler (psql): the actor is the database user.
    SQL = "sql"


class Role(enum.StrEnum):
    """What a user of the UI or a token of the API may do; each includes the one before."""

    #: Read everything.
    VIEWER = "viewer"
    #: And pause, resume, trigger and backfill.
    OPERATOR = "operator"
    #: And create, edit, restore and delete.
    ADMIN = "admin"

    def allows(self, needed: Role) -> bool:
        order = list(Role)
        return order.index(self) >= order.index(needed)


class MisfirePolicy(enum.StrEnum):
    """What happens to fire times missed for longer than the misfire grace (no leader ran)."""

    FIRE_ONCE = "fire_once"
    FIRE_ALL = "fire_all"
    SKIP = "skip"


class OverlapPolicy(enum.StrEnum):
    """What happens to a fire time while the schedule's previous run is still queued or running."""

    ALLOW = "allow"
    SKIP = "skip"
    QUEUE_ONE = "queue_one"
    CANCEL_PREVIOUS = "cancel_previous"


class RunState(enum.StrEnum):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    LOST = "lost"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"
    #: Its ``expires`` passed before a worker started it: it never runs late.
    EXPIRED = "expired"


#: States a run never leaves: retention deletes only these.
FINISHED_STATES = (
    RunState.SUCCEEDED,
    RunState.FAILED,
    RunState.LOST,
    RunState.SKIPPED,
    RunState.CANCELLED,
    RunState.EXPIRED,
)

#: States of a run not yet started: pending (outbox), queued (sent), retrying.
WAITING_STATES = (RunState.PENDING, RunState.QUEUED, RunState.RETRYING)
#: States of a run that has not finished: what overlap policies look at.
ACTIVE_STATES = (*WAITING_STATES, RunState.RUNNING)


def require_aware(value: datetime | None, what: str) -> None:
    if value is not None and value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleDefinition:
    """What a user defines: validated by ``beat.schedule.define.define`` before anything is
    written."""

    name: str
    task: str
    trigger: Trigger
    timezone: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    enabled: bool = True
    misfire_policy: MisfirePolicy = MisfirePolicy.FIRE_ONCE
    max_attempts: int = 3
    origin: Origin = Origin.API
    overlap_policy: OverlapPolicy = OverlapPolicy.ALLOW
    #: Each run is published a stable random delay of up to this many seconds after its fire time.
    jitter_seconds: float = 0.0
    #: The window: no fire time before start_at or after end_at, at most max_runs runs.
    start_at: datetime | None = None
    end_at: datetime | None = None
    max_runs: int | None = None
    #: The failing monitor (``beat.monitors``): an incident opens once this many of its
    #: runs in a row failed, and the schedule pauses itself after ``pause_after_failures``
    #: in a row. None: the cluster's default (``habeat_alert_after_failures``,
    #: ``habeat_pause_after_failures``); 0: never.
    alert_after_failures: int | None = None
    pause_after_failures: int | None = None
    #: The outcomes its failing monitor counts as failures (some of ``failed``, ``lost``,
    #: ``expired``; the others are passed over, as skipped runs are); None: all three.
    failure_states: tuple[str, ...] | None = None
    #: The run monitors (``beat.monitors.timing``), in seconds; None: none. A run still
    #: running ``max_runtime_seconds`` after it started has overran (it is revoked, its
    #: pool process terminated, if ``revoke_after_max_runtime``); a run that started
    #: ``late_after_seconds`` after its fire time is late; a fire time not sent within
    #: ``missed_after_seconds`` of it was missed.
    max_runtime_seconds: float | None = None
    revoke_after_max_runtime: bool = False
    late_after_seconds: float | None = None
    missed_after_seconds: float | None = None
    #: The notification channels its incidents are told to (``beat.notify``); None:
    #: every channel. One no longer there is passed over; none left, every channel.
    channels: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        require_aware(self.start_at, "start_at")
        require_aware(self.end_at, "end_at")


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A stored schedule, as listed and shown."""

    id: int
    definition: ScheduleDefinition
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime
    runs_count: int = 0
    disabled_reason: str | None = None
    #: When the scheduler disabled it because it could not be planned or published
    #: (``disabled_reason`` says why); cleared when it is enabled again.
    quarantined_at: datetime | None = None
    #: The scheduler ``schedules import`` read it from, and its identity there.
    source: str | None = None
    source_id: str | None = None
    #: What it is for, in people's words (carried over by an import).
    description: str | None = None
    #: Raised by each change of its fields (``beat_schedule_changes``), never by a claim.
    version: int = 1

    def __post_init__(self) -> None:
        require_aware(self.next_fire_at, "next_fire_at")
        require_aware(self.last_fire_at, "last_fire_at")

    @property
    def name(self) -> str:
        return self.definition.name

    @property
    def tag(self) -> str:
        """This version of this schedule (an HTTP ETag): its row's ID and its version,
        so a schedule removed and made again under the name never matches an old tag."""
        return version_tag(self.id, self.version)


def version_tag(schedule_id: int, version: int) -> str:
    return f"{schedule_id}.{version}"


@dataclass(frozen=True, kw_only=True, slots=True)
class DueSchedule:
    """A schedule locked by a claim transaction: just what planning and publishing need."""

    id: int
    name: str
    task: str
    trigger: Trigger
    zone: ZoneInfo
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    misfire_policy: MisfirePolicy
    max_attempts: int
    next_fire_at: datetime
    overlap_policy: OverlapPolicy = OverlapPolicy.ALLOW
    jitter_seconds: float = 0.0
    end_at: datetime | None = None
    max_runs: int | None = None
    runs_count: int = 0
    #: The schedule's runs not yet started (pending, queued, retrying) and running, at claim time.
    waiting: int = 0
    running: int = 0

    def __post_init__(self) -> None:
        require_aware(self.next_fire_at, "next_fire_at")
        require_aware(self.end_at, "end_at")


class IncidentKind(enum.StrEnum):
    """What went wrong with a schedule, as an incident records it (``beat.monitors``)."""

    #: Its runs failed (``failed``, ``lost`` or ``expired``) so many times in a row.
    FAILING = "failing"
    #: The whole cluster: fire times left unclaimed for six lease TTLs
    #: (``beat.store.leader.stall``): no beat process leads, or the leader cannot claim.
    STALL = "stall"
    #: A run still running past its schedule's ``max_runtime``.
    OVERRAN = "overran"
    #: Its newest run started more than ``late_after`` after its fire time.
    LATE = "late"
    #: A fire time not sent within ``missed_after`` of it.
    MISSED = "missed"


class ChannelKind(enum.StrEnum):
    """Where a notification goes (``beat.notify``)."""

    #: A JSON document POSTed to a URL.
    WEBHOOK = "webhook"
    #: A message POSTed to a Slack incoming webhook.
    SLACK = "slack"
    #: An email through an SMTP server.
    EMAIL = "email"


class NotificationEvent(enum.StrEnum):
    """What happened to an incident, as notified."""

    OPENED = "opened"
    PAUSED = "paused"
    RESOLVED = "resolved"


@dataclass(frozen=True, kw_only=True, slots=True)
class Channel:
    name: str
    kind: ChannelKind
    target: str
    #: How its sends go, as listed (``list_channels``): notifications not sent yet, of
    #: which failing (tried and failed, to be tried again), given up (within the history
    #: retention), the newest error of a failing one, the last one sent.
    pending: int = 0
    failing: int = 0
    given_up: int = 0
    last_error: str | None = None
    last_sent_at: datetime | None = None

    @property
    def state(self) -> str:
        """``failing`` while a send of it fails, ``gave up`` if one was given up, else ``ok``."""
        if self.failing:
            return "failing"
        return "gave up" if self.given_up else "ok"


@dataclass(frozen=True, kw_only=True, slots=True)
class Incident:
    """One incident of a schedule: opened and resolved by the leader."""

    id: int
    schedule_name: str
    kind: IncidentKind
    opened_at: datetime
    #: The failures in a row when it opened, and the newest it has counted.
    failures: int
    #: The fire time of the first failure of the streak that opened it.
    first_failure_at: datetime | None
    #: The newest failure's error, for people (one line).
    last_error: str | None
    #: When the scheduler paused the schedule because of it (its pause note says why).
    paused_at: datetime | None = None
    resolved_at: datetime | None = None
    #: Why it closed: the run that succeeded, the schedule removed, its monitor off.
    resolution: str | None = None

    @property
    def open(self) -> bool:
        return self.resolved_at is None


class SkipKind(enum.Enum):
    """Why a fire time did not run, as counted (``habeat_runs_skipped_total{reason}``)."""

    #: No leader claimed it within the misfire grace (the misfire policy decided).
    MISFIRE = "misfire"
    #: A run of the schedule was active, or a newer fire time won (the overlap policy).
    OVERLAP = "overlap"


@dataclass(frozen=True, kw_only=True, slots=True)
class SkippedFire:
    fire_at: datetime
    #: The skip record's text, for people.
    reason: str
    kind: SkipKind = SkipKind.MISFIRE


@dataclass(frozen=True, kw_only=True, slots=True)
class FirePlan:
    """What one claim does with one due schedule."""

    #: Fire times that get a run, oldest first.
    fire: tuple[datetime, ...]
    #: Fire times recorded as ``skipped`` (misfire policy), oldest first.
    skipped: tuple[SkippedFire, ...]
    #: The schedule's next fire time after this claim; None when it never fires again.
    next_fire_at: datetime | None
    #: Set when the schedule's window is over: it is disabled, and this says why.
    disable_reason: str | None = None
    #: Cancel the schedule's active runs before these fire (overlap policy cancel_previous).
    cancel_active: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class RunToPublish:
    """A claimed run, published to the broker with ``task_id = id``."""

    id: uuid.UUID
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]
    schedule_name: str | None
    fire_at: datetime | None
    attempt: int
    #: Not published before this (jitter); None: at once.
    not_before: datetime | None = None
    #: The caller's task ID when it is not the run ID (``id`` is derived from it).
    task_id: str | None = None
    #: Celery retries so far: a run published again keeps its retry count.
    retries: int = 0

    def __post_init__(self) -> None:
        require_aware(self.fire_at, "fire_at")

    @property
    def celery_task_id(self) -> str:
        """The task ID its messages carry: the caller's, or the run ID."""
        return self.task_id or str(self.id)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnpublishableRun:
    """A run whose message cannot be built from its own options or payload: publishing
    it again would fail the same way."""

    run: RunToPublish
    error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Quarantine:
    """A schedule the scheduler disables because it cannot be planned or published."""

    schedule_id: int
    name: str
    reason: str
