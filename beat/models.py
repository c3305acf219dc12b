"""Frozen value objects passed between the store, the policies and the scheduler.

Datetimes are always aware (UTC from the store); constructors reject naive ones.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from beat.tables import MisfirePolicy, Origin
from beat.timing import Trigger


def require_aware(value: datetime | None, what: str) -> None:
    if value is not None and value.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got naive {value.isoformat()}")


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleDefinition:
    """What a user defines: validated by ``beat.api.define`` before anything is written."""

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


@dataclass(frozen=True, kw_only=True, slots=True)
class Schedule:
    """A stored schedule, as listed and shown."""

    id: int
    definition: ScheduleDefinition
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    created_at: datetime
    updated_at: datetime

    def __post_init__(self) -> None:
        require_aware(self.next_fire_at, "next_fire_at")
        require_aware(self.last_fire_at, "last_fire_at")

    @property
    def name(self) -> str:
        return self.definition.name


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

    def __post_init__(self) -> None:
        require_aware(self.next_fire_at, "next_fire_at")


@dataclass(frozen=True, kw_only=True, slots=True)
class SkippedFire:
    fire_at: datetime
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class FirePlan:
    """What one claim does with one due schedule."""

    #: Fire times that get a run, oldest first.
    fire: tuple[datetime, ...]
    #: Fire times recorded as ``skipped`` (misfire policy), oldest first.
    skipped: tuple[SkippedFire, ...]
    #: The schedule's next fire time after this claim; None when it never fires again.
    next_fire_at: datetime | None


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

    def __post_init__(self) -> None:
        require_aware(self.fire_at, "fire_at")
