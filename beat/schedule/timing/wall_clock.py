"""Matching wall times: a cron expression as plain sets of values, and the first
naive wall time at or after a given one that they match, month by month."""

from __future__ import annotations

import bisect
import calendar
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

_ONE_SECOND: Final = timedelta(seconds=1)
_ONE_MINUTE: Final = timedelta(minutes=1)
# The Gregorian calendar repeats itself every 400 years (146,097 days, a whole
# number of weeks): a day pattern that matches no date in 400 years never does.
_CALENDAR_CYCLE_MONTHS: Final = 400 * 12
_MIDNIGHT: Final = (0, 0, 0)


@dataclass(frozen=True, slots=True)
class DayRule:
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
class WallClockCron:
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
