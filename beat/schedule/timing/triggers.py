"""The triggers, validated when built: ``Cron`` (a cron expression read in the
local wall time of the schedule's zone), ``Every`` (``anchor + k * seconds``:
elapsed time, so daylight saving time never moves it) and ``Once`` (one instant);
the functions that build them, and the time zone a schedule names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from beat.errors import InvalidSchedule
from beat.schedule.timing.cron import compile_cron

MIN_INTERVAL_SECONDS: Final = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Cron:
    """A cron expression, validated and normalised (aliases expanded, single spaces).

    ``both_days``: when both day fields are restricted, a day must match both
    (Celery's ``crontab``), not either (cron). It is kept only where it changes
    something, so two Crons that fire alike compare equal.
    """

    expression: str
    both_days: bool = False

    def __post_init__(self) -> None:
        # Validating here as well as in parse_cron means that no invalid Cron can
        # exist, whichever way it was built (e.g. from a database row).
        if not isinstance(self.both_days, bool):
            raise InvalidSchedule(f"both_days must be True or False, got {self.both_days!r}")
        compiled = compile_cron(_checked_text(self.expression), self.both_days)
        object.__setattr__(self, "expression", compiled.expression)
        object.__setattr__(self, "both_days", compiled.both_days)

    def describe(self) -> str:
        """The expression as people read it, saying so when both day fields must match."""
        if self.both_days:
            return f"{self.expression} (day of month and day of week both match)"
        return self.expression


@dataclass(frozen=True, kw_only=True, slots=True)
class Every:
    """Fires at ``anchor + k * seconds`` for every integer ``k >= 0``."""

    seconds: float
    anchor: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "seconds", _checked_interval(self.seconds))
        object.__setattr__(self, "anchor", _checked_aware(self.anchor, "interval anchor"))


@dataclass(frozen=True, kw_only=True, slots=True)
class Once:
    """Fires once, at ``at``."""

    at: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "at", _checked_aware(self.at, "one-off time"))


Trigger = Cron | Every | Once


def parse_cron(expression: str) -> Cron:
    """Validate a cron expression; raise InvalidSchedule naming the problem and the fix."""
    return Cron(expression=expression)


def parse_zone(name: str) -> ZoneInfo:
    """The IANA time zone called ``name``; InvalidSchedule if there is none. (The claim
    reads every due row's zone: the error is made only when raised.)"""
    if not isinstance(name, str) or not name:
        raise _unknown_zone(name)
    if name == "localtime":
        # A file in the zone database that follows each machine's own setting:
        # nodes configured differently would disagree on when a job fires.
        raise _unknown_zone(name)
    try:
        return ZoneInfo(name)
    # ZoneInfo refuses paths with ValueError, missing keys with ZoneInfoNotFoundError,
    # and non-zone files in the database directory with ValueError or OSError.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise _unknown_zone(name) from exc


def _unknown_zone(name: object) -> InvalidSchedule:
    return InvalidSchedule(
        f"unknown time zone {name!r:.200}: use an IANA name such as 'Europe/Berlin' or 'UTC'"
    )


def every(seconds: float, *, anchor: datetime) -> Every:
    """An interval trigger; InvalidSchedule for a bad interval or a naive anchor."""
    return Every(seconds=seconds, anchor=anchor)


def once(at: datetime) -> Once:
    """A one-off trigger; InvalidSchedule for a naive time."""
    return Once(at=at)


def _checked_interval(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidSchedule(f"invalid interval {seconds!r}: use a number of seconds")
    if not math.isfinite(seconds) or seconds < MIN_INTERVAL_SECONDS:
        raise InvalidSchedule(
            f"invalid interval {seconds!r} seconds: use a finite number of seconds"
            f" >= {MIN_INTERVAL_SECONDS}"
        )
    try:
        timedelta(seconds=seconds)
    except OverflowError:
        raise InvalidSchedule(
            f"invalid interval {seconds!r} seconds: it is longer than a datetime can span;"
            " use a shorter interval"
        ) from None
    return float(seconds)


def _checked_aware(moment: object, what: str) -> datetime:
    if not isinstance(moment, datetime):
        raise InvalidSchedule(f"the {what} {moment!r} is not a datetime: pass an aware datetime")
    if moment.utcoffset() is None:
        raise InvalidSchedule(
            f"the {what} {moment.isoformat()!r} has no time zone:"
            " pass an aware datetime, e.g. with tzinfo=datetime.UTC"
        )
    return moment.astimezone(UTC)


def _checked_text(expression: object) -> str:
    if not isinstance(expression, str):
        raise InvalidSchedule(f"invalid cron expression {expression!r}: it is not a string")
    return expression
