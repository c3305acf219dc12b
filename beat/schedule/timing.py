"""Schedule math: when does a trigger fire next? Pure functions, no I/O.

Three triggers:

* ``Cron``: a cron expression read in the local wall time of the schedule's zone,
  5 fields ``minute hour day month weekday`` or 6 with seconds first
  (``second minute hour day month weekday``, the Quartz/Spring order). When both
  day fields are restricted a day matching either one fires (Vixie cron), or,
  with ``both_days``, only a day matching both (how Celery's ``crontab`` reads
  them: ``beat_schedule`` entries keep that meaning).
* ``Every``: ``anchor + k * seconds`` for every integer ``k >= 0``: elapsed time,
  so daylight saving time never moves it.
* ``Once``: one instant.

Fields hold values, names (``jan``-``dec``, ``sun``-``sat``; ``7`` is Sunday too),
lists ``a,b``, ranges ``a-b`` (a range from a value to itself is that value;
one that runs past the field's end wraps around: ``fri-mon``), steps ``*/n``,
``a-b/n`` and ``a/n`` (from ``a`` to the field's end), ``L`` (last day of the
month), ``15W`` (the weekday nearest the 15th), ``1#2`` (the second Monday) and
``L5`` (the last Friday). croniter checks the syntax; which wall times match is
decided here, from plain sets of values, because croniter reads ``N-N`` as the
whole field and lets ``#`` and ``W`` turn the day fields' "either" into "both".

Daylight saving time (cron only). The matching wall times are naive; this module
maps each of them to real instants:

* A job whose hour field names specific hours (no ``*`` in it: ``30 2 * * *``,
  ``0 9-17 * * 1-5``, ``0 1-23/2 * * *``) runs once per matching wall time:

  - fall-back: a wall time that happens twice fires once, at its first occurrence;
  - spring-forward: a wall time skipped by the clock fires at the first instant
    after the gap, and several skipped wall times fire there only once.

* A job whose hour field contains ``*`` (``*``, ``*/2``) runs in every real hour:

  - fall-back: a wall time that happens twice fires at both occurrences, an
    hour (or however long the shift is) apart;
  - spring-forward: a wall time skipped by the clock does not exist: no run.

Transitions are found to the second, so shifts that are not one hour long or do
not happen at a full hour (Australia/Lord_Howe moves by 30 minutes) work too.

Every datetime this module returns is aware and in UTC, and each is strictly
later than the instant it was asked about, so iterating ``next_fire_after`` on
its own results never repeats a fire time nor goes back. Naive datetimes are
refused. Instants past the end of the calendar (year 9999) are "no fire time".
"""

from __future__ import annotations

import bisect
import calendar
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Final, assert_never
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from beat.errors import InvalidSchedule

__all__ = [
    "MIN_INTERVAL_SECONDS",
    "Cron",
    "Every",
    "Once",
    "Trigger",
    "every",
    "fire_times",
    "next_fire_after",
    "once",
    "parse_cron",
    "parse_zone",
]

MIN_INTERVAL_SECONDS: Final = 1.0

_ONE_MICROSECOND: Final = timedelta(microseconds=1)
_ONE_SECOND: Final = timedelta(seconds=1)
_ONE_MINUTE: Final = timedelta(minutes=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# The Gregorian calendar repeats itself every 400 years (146,097 days, a whole
# number of weeks): a day pattern that matches no date in 400 years never does.
_CALENDAR_CYCLE_MONTHS: Final = 400 * 12
_VALIDATION_START: Final = datetime(2000, 1, 1)

_CRON_USAGE: Final = "use 5 fields 'minute hour day month weekday' or 6 with seconds first"
_CRON_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# croniter's syntax for them: H, H/15, H(0-29), H(0-29)/10; R likewise.
_HASH_OR_RANDOM: Final = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE | re.ASCII)
_FIELD_NAMES: Final = ("minute", "hour", "day of month", "month", "day of week")
_FIELD_NAMES_WITH_SECONDS: Final = ("second", *_FIELD_NAMES)
_FIELD_VALUES: Final = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day of month": "1-31",
    "month": "1-12 or jan-dec",
    "day of week": "0-7 or sun-sat",
}


# ---------------------------------------------------------------------------
# Triggers
# ---------------------------------------------------------------------------


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
        compiled = _compile(_checked_text(self.expression), self.both_days)
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


def _require_aware(moment: datetime, name: str) -> datetime:
    """``moment`` in UTC; ValueError if it is naive."""
    if moment.utcoffset() is None:
        raise ValueError(
            f"{name}={moment.isoformat()!r} is naive: pass an aware datetime,"
            " e.g. with tzinfo=datetime.UTC"
        )
    return moment.astimezone(UTC)


# ---------------------------------------------------------------------------
# Cron expressions: parsing and validation
# ---------------------------------------------------------------------------

_MONTH_NAMES: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_WEEKDAY_NAMES: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}
_LAST_DAY_AS_RANGE_END: Final = {"l": 31}  # "15-L": the 15th to the last day
_NEAREST_WEEKDAY: Final = re.compile(r"^(?:(\d+)w|w(\d+))$", re.ASCII)
_LAST_WEEKDAY: Final = re.compile(r"^l(\d+)$", re.ASCII)
_MIDNIGHT: Final = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class _DayRule:
    """Which days of a month the two day fields select.

    A field written ``*`` (or ``?``) does not restrict; when both restrict, a
    day matching either one is selected (Vixie cron), whatever the values are
    written with (``1#2``, ``L``, ``15W`` included), unless ``both_days`` asks
    for a day matching both.
    """

    days_of_month: frozenset[int]
    last_day_of_month: bool  # L
    nearest_weekday_to: int | None  # 15W
    weekdays: frozenset[int]  # 0 = Sunday ... 6 = Saturday
    nth_weekdays: frozenset[tuple[int, int]]  # (weekday, n): 1#2 is (1, 2)
    last_weekdays: frozenset[int]  # L5 is 5
    month_restricts: bool
    week_restricts: bool
    both_days: bool

    def days_in(self, first_weekday: int, length: int) -> tuple[int, ...]:
        """The selected days of a month of ``length`` days whose 1st falls on
        ``first_weekday`` (Monday 0, as ``calendar.monthrange`` gives it)."""
        by_month = self._by_day_of_month(first_weekday, length)
        by_week = self._by_day_of_week(first_weekday, length)
        if self.month_restricts and self.week_restricts and not self.both_days:
            return tuple(sorted(by_month | by_week))
        return tuple(sorted(by_month & by_week))

    def _by_day_of_month(self, first_weekday: int, length: int) -> set[int]:
        days = {day for day in self.days_of_month if day <= length}
        if self.last_day_of_month:
            days.add(length)
        if self.nearest_weekday_to is not None:
            days.add(_nearest_weekday(self.nearest_weekday_to, first_weekday, length))
        return days

    def _by_day_of_week(self, first_weekday: int, length: int) -> set[int]:
        sunday_based_first = (first_weekday + 1) % 7
        days = {
            day
            for day in range(1, length + 1)
            if (sunday_based_first + day - 1) % 7 in self.weekdays
        }
        for weekday, nth in self.nth_weekdays:
            day = 1 + (weekday - sunday_based_first) % 7 + 7 * (nth - 1)
            if day <= length:
                days.add(day)
        last_weekday = (sunday_based_first + length - 1) % 7
        days.update(length - (last_weekday - weekday) % 7 for weekday in self.last_weekdays)
        return days


def _nearest_weekday(day: int, first_weekday: int, length: int) -> int:
    """The Monday-to-Friday day nearest ``day`` within its month (croniter's and
    Quartz's ``W``): a Saturday moves to Friday, a Sunday to Monday, unless that
    leaves the month. A day past the month's end is read as its last day."""
    day = min(day, length)
    weekday = (first_weekday + day - 1) % 7  # Monday 0
    if weekday == 5:  # Saturday
        return day - 1 if day > 1 else day + 2
    if weekday == 6:  # Sunday
        return day + 1 if day < length else day - 2
    return day


@dataclass(frozen=True, slots=True)
class _WallClockCron:
    """A validated cron expression as sets of values, and what the DST rules need."""

    expression: str
    seconds_first: bool
    every_real_hour: bool
    seconds: tuple[int, ...]  # sorted; (0,) without a seconds field
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    both_days: bool  # both day fields restrict, and a day must match both
    # Selected days by the shape of a month: (weekday of its 1st, its length).
    # There are only 28 shapes, so every month is a lookup.
    days_by_month_shape: Mapping[tuple[int, int], tuple[int, ...]]

    @property
    def resolution(self) -> timedelta:
        return _ONE_SECOND if self.seconds_first else _ONE_MINUTE

    def next_after(self, wall: datetime) -> datetime | None:
        """The first matching naive wall time strictly after ``wall``; None past year 9999."""
        try:
            start = self._floor(wall) + self.resolution
        except OverflowError:
            return None
        return self._first_match_from(start)

    def first_at_or_after(self, wall: datetime) -> datetime | None:
        """The first matching naive wall time at or after ``wall``."""
        floor = self._floor(wall)
        return self._first_match_from(floor) if floor == wall else self.next_after(floor)

    def _floor(self, wall: datetime) -> datetime:
        if self.seconds_first:
            return wall.replace(microsecond=0)
        return wall.replace(second=0, microsecond=0)

    def _first_match_from(self, start: datetime) -> datetime | None:
        """The first match at or after ``start`` (a whole second or minute), month by
        month; None if there is none within a calendar cycle or before year 10000."""
        year, month, day, clock = start.year, start.month, start.day, start.timetuple()[3:6]
        for _ in range(_CALENDAR_CYCLE_MONTHS + 12):
            if month in self.months:
                found = self._first_in_month(year, month, day, clock)
                if found is not None:
                    return found
            year, month, day, clock = year + month // 12, month % 12 + 1, 1, _MIDNIGHT
            if year > datetime.max.year:
                return None
        return None

    def _first_in_month(
        self, year: int, month: int, day: int, clock: tuple[int, ...]
    ) -> datetime | None:
        days = self.days_by_month_shape[calendar.monthrange(year, month)]
        for selected in days[bisect.bisect_left(days, day) :]:
            time_of_day = self._time_at_or_after(clock if selected == day else _MIDNIGHT)
            if time_of_day is not None:
                return datetime(year, month, selected, *time_of_day)
        return None

    def _time_at_or_after(self, clock: tuple[int, ...]) -> tuple[int, int, int] | None:
        """The first matching (hour, minute, second) at or after ``clock`` in a day."""
        hour, minute, second = clock
        hours, minutes, seconds = self.hours, self.minutes, self.seconds
        hour_index = bisect.bisect_left(hours, hour)
        if hour_index < len(hours) and hours[hour_index] == hour:
            minute_index = bisect.bisect_left(minutes, minute)
            if minute_index < len(minutes) and minutes[minute_index] == minute:
                second_index = bisect.bisect_left(seconds, second)
                if second_index < len(seconds):
                    return hour, minute, seconds[second_index]
                minute_index += 1
            if minute_index < len(minutes):
                return hour, minutes[minute_index], seconds[0]
            hour_index += 1
        if hour_index < len(hours):
            return hours[hour_index], minutes[0], seconds[0]
        return None


def _checked_text(expression: object) -> str:
    if not isinstance(expression, str):
        raise InvalidSchedule(f"invalid cron expression {expression!r}: it is not a string")
    return expression


@functools.lru_cache(maxsize=4096)
def _compile(expression: str, both_days: bool = False) -> _WallClockCron:
    """Validate ``expression`` once; the scheduler asks about the same few expressions."""
    fields = _fields_of(expression)
    _reject_hash_and_random(expression, fields)
    seconds_first = len(fields) == 6
    _check_each_field(expression, fields, seconds_first)
    cron = _wall_clock_cron(expression, fields, seconds_first, both_days)
    _check_it_fires(expression, cron)
    return cron


def _wall_clock_cron(
    expression: str, fields: list[str], seconds_first: bool, both_days: bool
) -> _WallClockCron:
    """The sets of values of fields croniter accepted."""
    lowered = [field.lower() for field in fields]
    second = lowered[0] if seconds_first else "0"
    minute, hour, day_of_month, month, day_of_week = lowered[-5:]
    try:
        day_rule = _day_rule(day_of_month, day_of_week, both_days)
        return _WallClockCron(
            expression=" ".join(fields),
            seconds_first=seconds_first,
            every_real_hour="*" in hour,
            seconds=_sorted_values(second, 0, 59),
            minutes=_sorted_values(minute, 0, 59),
            hours=_sorted_values(hour, 0, 23),
            months=frozenset(_field_values(month, 1, 12, _MONTH_NAMES)),
            both_days=day_rule.both_days,
            days_by_month_shape={
                (first_weekday, length): day_rule.days_in(first_weekday, length)
                for first_weekday in range(7)
                for length in (28, 29, 30, 31)
            },
        )
    except (ValueError, KeyError):
        # croniter accepted a spelling this module does not read: refuse it rather
        # than guess what it means.
        raise _cron_error(expression, "a field is not understood") from None


def _fields_of(expression: str) -> list[str]:
    if not expression.isascii():
        raise _cron_error(expression, "it contains non-ASCII characters")
    text = expression.strip()
    if not text:
        raise _cron_error(expression, "it is empty")
    if text.startswith("@"):
        alias = _CRON_ALIASES.get(text.lower())
        if alias is None:
            known = ", ".join(_CRON_ALIASES)
            raise _cron_error(expression, f"unknown alias (known: {known})")
        text = alias
    fields = text.split()
    if len(fields) == 7:
        raise _cron_error(expression, "it has 7 fields, and a year field is not supported")
    if len(fields) not in (5, 6):
        raise _cron_error(expression, f"it has {len(fields)} fields")
    return fields


def _reject_hash_and_random(expression: str, fields: list[str]) -> None:
    # croniter's H (hash) and R (random) values depend on an id or on chance:
    # fire times must be the same on every node and after every restart.
    for field in fields:
        for value in field.split(","):
            if _HASH_OR_RANDOM.match(value):
                raise _cron_error(
                    expression,
                    f"{value!r} is a hash or random value, which makes fire times unpredictable",
                    fix="name the values instead, e.g. '17 * * * *'",
                )


def _check_each_field(expression: str, fields: list[str], seconds_first: bool) -> None:
    """Find the field croniter refuses, so the message can name it."""
    names = _FIELD_NAMES_WITH_SECONDS if seconds_first else _FIELD_NAMES
    for index, (name, value) in enumerate(zip(names, fields, strict=True)):
        alone = ["*"] * len(fields)
        alone[index] = value
        reason = _croniter_refusal(" ".join(alone), seconds_first)
        if reason is not None:
            problem = "out of range" if "out of" in reason else "not understood"
            raise _cron_error(
                expression,
                f"{name} {value!r} {problem} (values {_FIELD_VALUES[name]},"
                " lists a,b, ranges a-b, steps */n)",
            )
    reason = _croniter_refusal(" ".join(fields), seconds_first)
    if reason is not None:
        raise _cron_error(expression, reason)


def _croniter_refusal(expression: str, seconds_first: bool) -> str | None:
    try:
        croniter.expand(expression, second_at_beginning=seconds_first)
    except CroniterError as exc:
        return str(exc).splitlines()[-1] or type(exc).__name__
    return None


def _check_it_fires(expression: str, cron: _WallClockCron) -> None:
    if cron.first_at_or_after(_VALIDATION_START) is None:
        raise _cron_error(
            expression,
            "it never fires (no date matches its day and month fields)",
            fix="check those fields",
        )


def _cron_error(expression: str, problem: str, *, fix: str = _CRON_USAGE) -> InvalidSchedule:
    return InvalidSchedule(f"invalid cron expression {expression!r}: {problem}; {fix}")


def _sorted_values(field: str, low: int, high: int) -> tuple[int, ...]:
    return tuple(sorted(_field_values(field, low, high, {})))


def _field_values(field: str, low: int, high: int, names: Mapping[str, int]) -> set[int]:
    values: set[int] = set()
    for element in field.split(","):
        values |= _element_values(element, low, high, names)
    return values


def _element_values(element: str, low: int, high: int, names: Mapping[str, int]) -> set[int]:
    """The values of ``*``, ``a``, ``a-b``, each with or without ``/step``.

    ``a/step`` runs from ``a`` to the field's end. A range from a value to itself
    is that value, step or not. A range whose end comes before its start wraps
    around the field: minutes ``50-10``, months ``nov-feb``.
    """
    body, slash, step_text = element.partition("/")
    step = int(step_text) if slash else 1
    if body in ("*", "?"):
        first, last = low, high
    elif "-" in body:
        start, _, end = body.partition("-")
        first, last = _value(start, names), _value(end, names)
    else:
        first = _value(body, names)
        last = high if slash else first
    if first == last:
        return {first}
    if first > last:
        size = high - low + 1
        return {
            low + (first - low + offset) % size
            for offset in range(0, (last - first) % size + 1, step)
        }
    return set(range(first, last + 1, step))


def _value(text: str, names: Mapping[str, int]) -> int:
    return names[text] if text in names else int(text)


def _day_rule(day_of_month: str, day_of_week: str, both_days: bool) -> _DayRule:
    days_of_month, last_day_of_month, nearest_weekday_to = _read_day_of_month(day_of_month)
    weekdays, nth_weekdays, last_weekdays = _read_day_of_week(day_of_week)
    month_restricts = day_of_month not in ("*", "?")
    week_restricts = day_of_week not in ("*", "?")
    # With a day field unrestricted, "both" and "either" select the same days:
    # say "both" only where it means something.
    both_days = both_days and month_restricts and week_restricts
    return _DayRule(
        days_of_month=frozenset(days_of_month if month_restricts else range(1, 32)),
        last_day_of_month=last_day_of_month,
        nearest_weekday_to=nearest_weekday_to,
        weekdays=frozenset(weekdays if week_restricts else range(7)),
        nth_weekdays=frozenset(nth_weekdays),
        last_weekdays=frozenset(last_weekdays),
        month_restricts=month_restricts,
        week_restricts=week_restricts,
        both_days=both_days,
    )


def _read_day_of_month(field: str) -> tuple[set[int], bool, int | None]:
    """Plain days, whether ``L`` is there, and the day of a ``15W``."""
    days: set[int] = set()
    last_day = False
    nearest_weekday_to = None
    for element in field.split(","):
        nearest = _NEAREST_WEEKDAY.match(element)
        if element == "l":
            last_day = True
        elif nearest:
            nearest_weekday_to = int(nearest.group(1) or nearest.group(2))
        else:
            days |= _element_values(element, 1, 31, _LAST_DAY_AS_RANGE_END)
    return days, last_day, nearest_weekday_to


def _read_day_of_week(field: str) -> tuple[set[int], set[tuple[int, int]], set[int]]:
    """Plain weekdays, ``1#2`` as (1, 2), and the weekdays of ``L5``; Sunday is 0.

    7 is Sunday too: ranges are read before folding it, so ``5-7`` is Friday to Sunday.
    """
    weekdays: set[int] = set()
    nth_weekdays: set[tuple[int, int]] = set()
    last_weekdays: set[int] = set()
    for element in field.split(","):
        last = _LAST_WEEKDAY.match(element)
        if last:
            last_weekdays.add(int(last.group(1)) % 7)
        elif "#" in element:
            which, _, nth = element.partition("#")
            named = _element_values(which, 0, 6, _WEEKDAY_NAMES)
            nth_weekdays |= {(weekday % 7, int(nth)) for weekday in named}
        else:
            named = _element_values(element, 0, 6, _WEEKDAY_NAMES)
            weekdays |= {weekday % 7 for weekday in named}
    return weekdays, nth_weekdays, last_weekdays


# ---------------------------------------------------------------------------
# Wall clock <-> real instants
# ---------------------------------------------------------------------------


class _WallKind(Enum):
    REGULAR = "regular"  # happens exactly once
    REPEATED = "repeated"  # happens twice: the clock went back over it
    SKIPPED = "skipped"  # never happens: the clock jumped over it


@dataclass(frozen=True, slots=True)
class _Shift:
    """One change of UTC offset, seen from the wall clock."""

    instant: datetime  # when the offset changed (UTC)
    start: datetime  # first wall time repeated or skipped (naive)
    end: datetime  # first wall time after the repeated or skipped ones (naive)


def _wall_kind(wall: datetime, zone: ZoneInfo) -> _WallKind:
    # PEP 495: fold=0 reads a wall time with the offset in force before a change,
    # fold=1 with the offset after it; they differ only around a change.
    before = wall.replace(tzinfo=zone, fold=0).utcoffset()
    after = wall.replace(tzinfo=zone, fold=1).utcoffset()
    assert before is not None
    assert after is not None
    if before == after:
        return _WallKind.REGULAR
    # The clock goes back when the offset shrinks, forward when it grows.
    return _WallKind.REPEATED if before > after else _WallKind.SKIPPED


def _instant(wall: datetime, zone: ZoneInfo, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def _shift_around(wall: datetime, zone: ZoneInfo) -> _Shift:
    """The offset change that repeats or skips ``wall``, found to the second.

    Read with the old offset and with the new one, ``wall`` gives two instants
    with the change between them: the earlier one still has the old offset, the
    later one the new. Halving that bracket finds the change without assuming it
    happens at a full hour or moves the clock by one hour. Zone transitions are
    whole seconds.
    """
    old_offset = wall.replace(tzinfo=zone, fold=0).utcoffset()
    new_offset = wall.replace(tzinfo=zone, fold=1).utcoffset()
    assert old_offset is not None
    assert new_offset is not None
    low, high = sorted(
        _utc_seconds(wall.replace(tzinfo=zone, fold=fold)) for fold in (0, 1)
    )  # invariant: low has the old offset, high the new one
    while high - low > 1:
        middle = (low + high) // 2
        if _offset_at(middle, zone) == old_offset:
            low = middle
        else:
            high = middle
    instant = _EPOCH + timedelta(seconds=high)
    naive = instant.replace(tzinfo=None)
    return _Shift(
        instant=instant,
        start=naive + min(old_offset, new_offset),
        end=naive + max(old_offset, new_offset),
    )


def _utc_seconds(moment: datetime) -> int:
    return (moment - _EPOCH) // _ONE_SECOND


def _offset_at(utc_seconds: int, zone: ZoneInfo) -> timedelta | None:
    return (_EPOCH + timedelta(seconds=utc_seconds)).astimezone(zone).utcoffset()


# ---------------------------------------------------------------------------
# Next fire time
# ---------------------------------------------------------------------------


def next_fire_after(trigger: Trigger, zone: ZoneInfo, after: datetime) -> datetime | None:
    """The first fire time strictly after ``after``, in UTC; None if there is none.

    ``zone`` is the schedule's time zone: it matters for Cron only.
    ValueError if ``after`` is naive.
    """
    after = _require_aware(after, "after")
    if isinstance(trigger, Every):
        return _every_fire(trigger, _first_every_index_after(trigger, after))
    if isinstance(trigger, Once):
        return trigger.at if trigger.at > after else None
    if isinstance(trigger, Cron):
        return _next_cron_fire(_compile(trigger.expression, trigger.both_days), zone, after)
    assert_never(trigger)


def fire_times(
    trigger: Trigger, zone: ZoneInfo, *, after: datetime, until: datetime, limit: int
) -> list[datetime]:
    """Fire times ``t`` with ``after < t <= until``, oldest first: the ``limit`` oldest."""
    after = _require_aware(after, "after")
    until = _require_aware(until, "until")
    if limit < 0:
        raise ValueError(f"limit={limit!r} is negative: pass 0 or more")
    if until <= after or limit == 0:
        return []
    if isinstance(trigger, Every):
        return _every_fires_between(trigger, after, until, limit)
    fires: list[datetime] = []
    following = next_fire_after(trigger, zone, after)
    while following is not None and following <= until:
        fires.append(following)
        if len(fires) == limit:
            break
        following = next_fire_after(trigger, zone, following)
    return fires


# Every: integer microseconds, so a million periods later there is no float drift.


def _period_microseconds(trigger: Every) -> int:
    return round(trigger.seconds * 1_000_000)


def _first_every_index_after(trigger: Every, after: datetime) -> int:
    elapsed = (after - trigger.anchor) // _ONE_MICROSECOND
    if elapsed < 0:
        return 0
    return elapsed // _period_microseconds(trigger) + 1


def _every_fire(trigger: Every, index: int) -> datetime | None:
    try:
        return trigger.anchor + timedelta(microseconds=index * _period_microseconds(trigger))
    except OverflowError:
        return None  # past year 9999


def _every_fires_between(
    trigger: Every, after: datetime, until: datetime, limit: int
) -> list[datetime]:
    if until < trigger.anchor:
        return []
    period = _period_microseconds(trigger)
    first = _first_every_index_after(trigger, after)
    last = (until - trigger.anchor) // _ONE_MICROSECOND // period
    count = max(0, min(limit, last - first + 1))
    return [
        trigger.anchor + timedelta(microseconds=(first + step) * period) for step in range(count)
    ]


# Cron: iterate wall times with croniter, then map them to instants by the DST rules.


def _next_cron_fire(cron: _WallClockCron, zone: ZoneInfo, after: datetime) -> datetime | None:
    try:
        # Converting from UTC sets fold=1 exactly when ``after`` is the second
        # occurrence of a repeated wall time.
        local = after.astimezone(zone)
        if cron.every_real_hour:
            return _next_fire_in_every_real_hour(cron, zone, local)
        return _next_fire_once_per_wall_time(cron, zone, local)
    except OverflowError:
        return None  # the local time is past year 9999


def _next_fire_once_per_wall_time(
    cron: _WallClockCron, zone: ZoneInfo, local: datetime
) -> datetime | None:
    """Specific hours: a repeated wall time fires at its first occurrence, a skipped
    one at the end of the gap.

    That rule maps later wall times to later (or, inside one gap, equal) instants,
    so the answer is the first matching wall time after ``local``'s own.
    """
    wall = local.replace(tzinfo=None)
    if local.fold == 1:
        # Except in the second pass over a repeated period: the first occurrences of
        # its remaining wall times are already past, so resume after the period.
        following = cron.first_at_or_after(_shift_around(wall, zone).end)
    else:
        following = cron.next_after(wall)
    if following is None:
        return None
    if _wall_kind(following, zone) is _WallKind.SKIPPED:
        return _shift_around(following, zone).instant
    return _instant(following, zone, fold=0)


def _next_fire_in_every_real_hour(
    cron: _WallClockCron, zone: ZoneInfo, local: datetime
) -> datetime | None:
    """Every hour: each occurrence of a matching wall time fires, skipped ones never.

    First occurrences (fold=0) come in wall-time order, and so do second ones
    (fold=1), but the second occurrences of a repeated period come after the first
    occurrences of all of it: New York, 3 Nov 2024, runs 01:00, 01:15, ... 01:45 EDT
    then 01:00, ... 01:45 EST. So the answer is the earlier of two candidates.
    """
    after = local.astimezone(UTC)
    wall = local.replace(tzinfo=None)
    candidates: list[datetime] = []
    if local.fold == 0 and _wall_kind(wall, zone) is _WallKind.REPEATED:
        # In the first pass over a repeated period: the second pass is still ahead,
        # including the wall times before ``wall``.
        shift = _shift_around(wall, zone)
        repeated = cron.first_at_or_after(shift.start)
        if repeated is not None and repeated < shift.end:
            candidates.append(_instant(repeated, zone, fold=1))
    later = _first_real_instant_from(cron, zone, cron.next_after(wall), after)
    if later is not None:
        candidates.append(later)
    return min(candidates, default=None)


def _first_real_instant_from(
    cron: _WallClockCron, zone: ZoneInfo, wall: datetime | None, after: datetime
) -> datetime | None:
    """The earliest instant later than ``after`` at which the clock shows ``wall``
    or, failing that, one of the matching wall times after it."""
    while wall is not None:
        kind = _wall_kind(wall, zone)
        if kind is _WallKind.SKIPPED:
            # Jump over the gap rather than stepping through each of its matches
            # (a per-second job has 3,600 of them in a one-hour gap).
            wall = cron.first_at_or_after(_shift_around(wall, zone).end)
            continue
        for fold in (0, 1) if kind is _WallKind.REPEATED else (0,):
            instant = _instant(wall, zone, fold)
            if instant > after:
                return instant
        wall = cron.next_after(wall)
    return None
