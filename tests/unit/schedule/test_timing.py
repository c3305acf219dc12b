"""Schedule math: intervals, one-offs, cron in local time, and the DST rules."""

from __future__ import annotations

import calendar
import functools
import itertools
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import beat.schedule.timing as timing
from beat.errors import InvalidSchedule
from beat.schedule.timing import (
    MIN_INTERVAL_SECONDS,
    Cron,
    Every,
    Once,
    Trigger,
    every,
    fire_times,
    next_fire_after,
    once,
    parse_cron,
    parse_zone,
)

NEW_YORK = ZoneInfo("America/New_York")
BERLIN = ZoneInfo("Europe/Berlin")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")
UTC_ZONE = ZoneInfo("UTC")

#: Raise it for a long run of this module's and test_crontab's property tests, e.g.
#: HABEAT_PROPERTY_EXAMPLES=20000 with --timeout=0 (pytest-timeout stops a test at 300 s).
PROPERTY_SETTINGS = settings(
    max_examples=int(os.environ.get("HABEAT_PROPERTY_EXAMPLES", "200")),
    deadline=None,
    database=None,  # write nothing into the working tree
    suppress_health_check=[HealthCheck.too_slow],
)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def hours(start: datetime, count: int, minute: int = 0) -> list[datetime]:
    """``count`` instants one hour apart from ``start`` + ``minute`` minutes."""
    first = start + timedelta(minutes=minute)
    return [first + timedelta(hours=step) for step in range(count)]


def local_day(zone: ZoneInfo, year: int, month: int, day: int) -> tuple[datetime, datetime]:
    """The instants just before local midnight of that day and at the next local midnight."""
    midnight = datetime(year, month, day, tzinfo=zone)
    start = midnight.astimezone(UTC) - timedelta(microseconds=1)
    end = (midnight + timedelta(days=1)).astimezone(UTC) - timedelta(microseconds=1)
    return start, end


def fires_on(trigger: Trigger, zone: ZoneInfo, year: int, month: int, day: int) -> list[datetime]:
    start, end = local_day(zone, year, month, day)
    return fire_times(trigger, zone, after=start, until=end, limit=10_000)


def iterate(trigger: Trigger, zone: ZoneInfo, start: datetime, count: int) -> list[datetime]:
    fires: list[datetime] = []
    current = start
    for _ in range(count):
        following = next_fire_after(trigger, zone, current)
        assert following is not None
        fires.append(following)
        current = following
    return fires


def walls(instants: list[datetime], zone: ZoneInfo) -> list[str]:
    return [instant.astimezone(zone).strftime("%H:%M%z") for instant in instants]


# ---------------------------------------------------------------------------
# Every
# ---------------------------------------------------------------------------


class TestEvery:
    anchor = utc(2024, 1, 1, 12, 0, 0)

    def test_first_fire_is_the_anchor_when_asked_before_it(self) -> None:
        trigger = every(60, anchor=self.anchor)
        assert next_fire_after(trigger, NEW_YORK, utc(2023, 12, 1)) == self.anchor

    def test_fires_strictly_after(self) -> None:
        trigger = every(60, anchor=self.anchor)
        assert next_fire_after(trigger, NEW_YORK, self.anchor) == utc(2024, 1, 1, 12, 1)
        assert next_fire_after(trigger, NEW_YORK, utc(2024, 1, 1, 12, 0, 59)) == utc(
            2024, 1, 1, 12, 1
        )
        assert next_fire_after(trigger, NEW_YORK, utc(2024, 1, 1, 12, 1)) == utc(2024, 1, 1, 12, 2)

    def test_anchor_in_the_past_keeps_its_phase(self) -> None:
        trigger = every(90, anchor=utc(2020, 1, 1, 0, 0, 45))
        following = next_fire_after(trigger, NEW_YORK, utc(2024, 6, 1))
        assert following is not None
        assert (following - trigger.anchor) % timedelta(seconds=90) == timedelta(0)
        assert timedelta(0) < following - utc(2024, 6, 1) <= timedelta(seconds=90)

    def test_is_exact_to_the_microsecond_after_ten_million_periods(self) -> None:
        trigger = every(1.000001, anchor=self.anchor)
        periods = 10**7
        exact = self.anchor + timedelta(microseconds=periods * 1_000_001)
        assert next_fire_after(trigger, UTC_ZONE, exact - timedelta(microseconds=1)) == exact
        assert next_fire_after(trigger, UTC_ZONE, exact) == exact + timedelta(
            microseconds=1_000_001
        )

    def test_fractional_seconds_do_not_drift(self) -> None:
        trigger = every(2.5, anchor=self.anchor)
        far = self.anchor + timedelta(seconds=2.5 * 12_345_678)
        assert next_fire_after(trigger, UTC_ZONE, far - timedelta(microseconds=1)) == far

    def test_ignores_daylight_saving_time(self) -> None:
        anchor = datetime(2024, 11, 3, 0, 0, tzinfo=NEW_YORK)
        trigger = every(3600, anchor=anchor)
        fires = iterate(trigger, NEW_YORK, anchor - timedelta(seconds=1), 4)
        assert fires == hours(utc(2024, 11, 3, 4), 4)
        assert walls(fires, NEW_YORK) == ["00:00-0400", "01:00-0400", "01:00-0500", "02:00-0500"]

    def test_returns_utc(self) -> None:
        trigger = every(60, anchor=datetime(2024, 1, 1, 12, tzinfo=BERLIN))
        following = next_fire_after(trigger, NEW_YORK, utc(2024, 1, 2))
        assert following is not None
        assert following.tzinfo is UTC
        assert trigger.anchor == utc(2024, 1, 1, 11)

    def test_fire_times_are_computed_not_iterated(self) -> None:
        trigger = every(1, anchor=self.anchor)
        fires = fire_times(trigger, NEW_YORK, after=self.anchor, until=utc(2100, 1, 1), limit=3)
        assert fires == [self.anchor + timedelta(seconds=step) for step in (1, 2, 3)]

    def test_fire_times_include_until_and_exclude_after(self) -> None:
        trigger = every(60, anchor=self.anchor)
        fires = fire_times(
            trigger,
            NEW_YORK,
            after=self.anchor,
            until=self.anchor + timedelta(minutes=3),
            limit=100,
        )
        assert fires == [self.anchor + timedelta(minutes=step) for step in (1, 2, 3)]

    def test_fire_times_before_the_anchor(self) -> None:
        trigger = every(60, anchor=self.anchor)
        assert (
            fire_times(
                trigger,
                NEW_YORK,
                after=self.anchor - timedelta(hours=2),
                until=self.anchor - timedelta(hours=1),
                limit=100,
            )
            == []
        )
        assert fire_times(
            trigger,
            NEW_YORK,
            after=self.anchor - timedelta(hours=2),
            until=self.anchor + timedelta(seconds=60),
            limit=100,
        ) == [self.anchor, self.anchor + timedelta(seconds=60)]

    def test_minimum_interval_is_accepted(self) -> None:
        assert every(MIN_INTERVAL_SECONDS, anchor=self.anchor).seconds == 1.0
        assert isinstance(every(5, anchor=self.anchor).seconds, float)

    @pytest.mark.parametrize("seconds", [0, 0.5, -1, float("nan"), float("inf"), True, "60", 1e300])
    def test_invalid_intervals_are_refused(self, seconds: object) -> None:
        with pytest.raises(InvalidSchedule, match="invalid interval") as raised:
            every(seconds, anchor=self.anchor)  # type: ignore[arg-type]
        assert repr(seconds) in str(raised.value)

    def test_naive_anchor_is_refused(self) -> None:
        with pytest.raises(InvalidSchedule, match=r"2024-01-01T12:00:00.*no time zone"):
            every(60, anchor=datetime(2024, 1, 1, 12))

    def test_direct_construction_validates_too(self) -> None:
        with pytest.raises(InvalidSchedule):
            Every(seconds=0.1, anchor=self.anchor)


# ---------------------------------------------------------------------------
# Once
# ---------------------------------------------------------------------------


class TestOnce:
    at = utc(2024, 5, 1, 9, 30)

    def test_before_at_and_after(self) -> None:
        trigger = once(self.at)
        assert next_fire_after(trigger, NEW_YORK, self.at - timedelta(microseconds=1)) == self.at
        assert next_fire_after(trigger, NEW_YORK, self.at) is None
        assert next_fire_after(trigger, NEW_YORK, self.at + timedelta(days=1)) is None

    def test_any_time_zone_in_and_utc_out(self) -> None:
        trigger = once(datetime(2024, 5, 1, 11, 30, tzinfo=BERLIN))
        assert trigger.at == self.at
        following = next_fire_after(trigger, NEW_YORK, utc(2024, 1, 1))
        assert following == self.at
        assert following is not None
        assert following.tzinfo is UTC

    def test_fire_times(self) -> None:
        trigger = once(self.at)
        window = {"after": utc(2024, 1, 1), "until": utc(2025, 1, 1)}
        assert fire_times(trigger, NEW_YORK, **window, limit=5) == [self.at]
        assert fire_times(trigger, NEW_YORK, after=self.at, until=utc(2025, 1, 1), limit=5) == []
        assert fire_times(trigger, NEW_YORK, after=utc(2024, 1, 1), until=self.at, limit=5) == [
            self.at
        ]

    def test_naive_time_is_refused(self) -> None:
        with pytest.raises(InvalidSchedule, match="2024-05-01T09:30:00"):
            once(datetime(2024, 5, 1, 9, 30))
        with pytest.raises(InvalidSchedule):
            Once(at=datetime(2024, 5, 1, 9, 30))


# ---------------------------------------------------------------------------
# Cron without DST
# ---------------------------------------------------------------------------


class TestCron:
    def test_five_fields_every_five_minutes(self) -> None:
        fires = iterate(parse_cron("*/5 * * * *"), UTC_ZONE, utc(2024, 6, 1, 12, 3, 59), 3)
        assert fires == [utc(2024, 6, 1, 12, 5), utc(2024, 6, 1, 12, 10), utc(2024, 6, 1, 12, 15)]

    def test_strictly_after_a_fire_time(self) -> None:
        trigger = parse_cron("0 * * * *")
        assert next_fire_after(trigger, UTC_ZONE, utc(2024, 6, 1, 12)) == utc(2024, 6, 1, 13)

    def test_microseconds_in_after(self) -> None:
        trigger = parse_cron("0 13 * * *")
        just_before = utc(2024, 6, 1, 12, 59, 59) + timedelta(microseconds=999_999)
        assert next_fire_after(trigger, UTC_ZONE, just_before) == utc(2024, 6, 1, 13)
        seconds = parse_cron("0 0 13 * * *")
        assert next_fire_after(seconds, UTC_ZONE, just_before) == utc(2024, 6, 1, 13)

    def test_six_fields_have_seconds_first(self) -> None:
        fires = iterate(parse_cron("*/10 * * * * *"), UTC_ZONE, utc(2024, 6, 1, 12, 0, 3), 4)
        assert fires == [utc(2024, 6, 1, 12, 0, second) for second in (10, 20, 30, 40)]

    def test_six_fields_daily(self) -> None:
        trigger = parse_cron("0 30 2 * * *")
        assert next_fire_after(trigger, UTC_ZONE, utc(2024, 6, 1, 3)) == utc(2024, 6, 2, 2, 30)
        assert next_fire_after(trigger, UTC_ZONE, utc(2024, 6, 2, 2, 29, 59)) == utc(
            2024, 6, 2, 2, 30
        )

    def test_fields_are_read_in_local_time(self) -> None:
        trigger = parse_cron("0 9 * * 1-5")  # 09:00 on weekdays in Berlin (CEST in June)
        fires = iterate(trigger, BERLIN, utc(2024, 6, 7, 8), 2)  # a Friday, 10:00 local
        assert fires == [utc(2024, 6, 10, 7), utc(2024, 6, 11, 7)]

    def test_day_of_month_or_day_of_week(self) -> None:
        trigger = parse_cron("0 0 13 * 5")  # the 13th, and every Friday (Vixie cron)
        fires = iterate(trigger, UTC_ZONE, utc(2024, 9, 1), 4)
        assert fires == [utc(2024, 9, 6), utc(2024, 9, 13), utc(2024, 9, 20), utc(2024, 9, 27)]

    def test_leap_day(self) -> None:
        fires = iterate(parse_cron("0 0 29 2 *"), UTC_ZONE, utc(2024, 3, 1), 2)
        assert fires == [utc(2028, 2, 29), utc(2032, 2, 29)]

    def test_fire_times_limit_keeps_the_oldest(self) -> None:
        trigger = parse_cron("0 * * * *")
        fires = fire_times(trigger, UTC_ZONE, after=utc(2024, 1, 1), until=utc(2025, 1, 1), limit=3)
        assert fires == [utc(2024, 1, 1, 1), utc(2024, 1, 1, 2), utc(2024, 1, 1, 3)]

    def test_fire_times_empty_windows(self) -> None:
        trigger = parse_cron("* * * * *")
        start = utc(2024, 1, 1)
        assert fire_times(trigger, UTC_ZONE, after=start, until=start, limit=5) == []
        assert fire_times(trigger, UTC_ZONE, after=start, until=start - timedelta(1), limit=5) == []
        assert fire_times(trigger, UTC_ZONE, after=start, until=utc(2025, 1, 1), limit=0) == []

    def test_fire_times_calls_next_fire_after_at_most_limit_plus_one_times(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls = 0
        original = timing.next_fire_after

        def counting(trigger: Trigger, zone: ZoneInfo, after: datetime) -> datetime | None:
            nonlocal calls
            calls += 1
            return original(trigger, zone, after)

        monkeypatch.setattr(timing, "next_fire_after", counting)
        fires = timing.fire_times(
            parse_cron("* * * * * *"),
            UTC_ZONE,
            after=utc(2024, 1, 1),
            until=utc(2024, 1, 2),
            limit=5,
        )
        assert len(fires) == 5
        assert calls <= 6
        calls = 0
        fires = timing.fire_times(
            parse_cron("0 0 * * *"), UTC_ZONE, after=utc(2024, 1, 1), until=utc(2024, 1, 3), limit=5
        )
        assert len(fires) == 2
        assert calls <= 6

    def test_end_of_the_calendar_is_no_fire_time(self) -> None:
        end = datetime(9999, 12, 31, 12, tzinfo=UTC)
        assert next_fire_after(parse_cron("0 0 1 1 *"), UTC_ZONE, end) is None
        assert next_fire_after(parse_cron("0 0 1 1 *"), ZoneInfo("Pacific/Kiritimati"), end) is None
        assert next_fire_after(every(86_400 * 365, anchor=utc(2000, 1, 1)), UTC_ZONE, end) is None

    @pytest.mark.parametrize(
        ("written", "normalised"),
        [
            ("  0   *  * * * ", "0 * * * *"),
            ("@hourly", "0 * * * *"),
            ("@DAILY", "0 0 * * *"),
            ("@midnight", "0 0 * * *"),
            ("@weekly", "0 0 * * 0"),
            ("@monthly", "0 0 1 * *"),
            ("@yearly", "0 0 1 1 *"),
            ("@annually", "0 0 1 1 *"),
            ("0\t30 2 * * *", "0 30 2 * * *"),
            ("0 9 * * MON-FRI", "0 9 * * MON-FRI"),
        ],
    )
    def test_normalisation(self, written: str, normalised: str) -> None:
        assert parse_cron(written).expression == normalised
        assert Cron(expression=written) == parse_cron(normalised)

    def test_weekday_and_month_names(self) -> None:
        trigger = parse_cron("0 12 * mar thu")
        assert next_fire_after(trigger, UTC_ZONE, utc(2024, 1, 1)) == utc(2024, 3, 7, 12)


class TestCronErrors:
    @pytest.mark.parametrize(
        ("expression", "problem"),
        [
            ("", "it is empty"),
            ("   ", "it is empty"),
            ("* * * *", "it has 4 fields"),
            ("* * * * * * *", "it has 7 fields"),
            ("61 * * * *", "minute '61' out of range"),
            ("* 24 * * *", "hour '24' out of range"),
            ("0 0 32 * *", "day of month '32' out of range"),
            ("0 0 * 13 *", "month '13' out of range"),
            ("0 0 * * 8", "day of week '8' out of range"),
            ("60 * * * * *", "second '60' out of range"),
            ("5-70 * * * *", "minute '5-70' out of range"),
            ("x * * * *", "minute 'x' not understood"),
            ("*/0 * * * *", "minute '*/0' not understood"),
            ("* 1-2-3 * * *", "hour '1-2-3' not understood"),
            ("0 ? * * *", "hour '?' not understood"),
            ("hello world foo bar baz", "not understood"),
            ("H * * * *", "hash or random"),
            ("0 H(0-5) * * *", "hash or random"),
            ("r * * * *", "hash or random"),
            ("0 0 * * * H", "hash or random"),
            ("@reboot", "unknown alias"),
            ("0 0 30 2 *", "never fires"),
            ("0 0 31 4,6 *", "never fires"),
            ("0\u00a00 * * *", "non-ASCII"),
        ],
    )
    def test_bad_expressions(self, expression: str, problem: str) -> None:
        with pytest.raises(InvalidSchedule) as raised:
            parse_cron(expression)
        message = str(raised.value)
        assert repr(expression) in message
        assert problem in message
        assert "\n" not in message

    def test_message_says_how_to_fix(self) -> None:
        with pytest.raises(InvalidSchedule, match="use 5 fields 'minute hour day month weekday'"):
            parse_cron("61 * * * *")

    def test_direct_construction_validates_too(self) -> None:
        with pytest.raises(InvalidSchedule, match="'61 \\* \\* \\* \\*'"):
            Cron(expression="61 * * * *")

    def test_not_a_string(self) -> None:
        with pytest.raises(InvalidSchedule, match="not a string"):
            parse_cron(None)  # type: ignore[arg-type]


class TestOneValueRanges:
    """A range from a value to itself is that value (croniter reads it as the whole
    field), and the day fields' "either" holds for every way of writing them."""

    def test_one_hour_range_fires_only_in_that_hour(self) -> None:
        """A range of one hour fires only in that hour. Finding 17 of issue 15."""
        fires = fires_on(parse_cron("* 11-11 * * *"), UTC_ZONE, 2024, 6, 3)
        assert fires == [utc(2024, 6, 3, 11, minute) for minute in range(60)]

    def test_one_weekday_range_fires_on_that_weekday_only(self) -> None:
        """A range of one weekday fires on that weekday only. Finding 17 of issue 15."""
        fires = iterate(parse_cron("0 9 * * sat-sat"), UTC_ZONE, utc(2024, 6, 3), 3)  # a Monday
        assert fires == [utc(2024, 6, 8, 9), utc(2024, 6, 15, 9), utc(2024, 6, 22, 9)]

    def test_one_month_range_with_a_step_fires_in_that_month_only(self) -> None:
        """A range of one month with a step fires in that month only. Finding 17 of issue 15."""
        fires = iterate(parse_cron("0 0 1 12-12/4 *"), UTC_ZONE, utc(2024, 1, 1), 2)
        assert fires == [utc(2024, 12, 1), utc(2025, 12, 1)]

    def test_one_month_range_that_never_fires_is_refused(self) -> None:
        """A range of one month that never fires is refused. Finding 17 of issue 15."""
        with pytest.raises(InvalidSchedule, match="never fires"):
            parse_cron("0 0 31 2-2 *")

    def test_nth_weekday_and_day_of_month_fire_on_either(self) -> None:
        """An nth weekday and a day of month fire on either. Finding 17 of issue 15."""
        # The 1st of each month, and each second Monday: never refused as "never fires".
        fires = iterate(parse_cron("0 0 1 * 1#2"), UTC_ZONE, utc(2024, 1, 1), 5)
        assert fires == [
            utc(2024, 1, 8),
            utc(2024, 2, 1),
            utc(2024, 2, 12),
            utc(2024, 3, 1),
            utc(2024, 3, 11),
        ]

    def test_last_weekday_and_day_of_month_fire_on_either(self) -> None:
        """A last weekday and a day of month fire on either. Finding 17 of issue 15."""
        # The 15th, and the last Friday of each month.
        fires = iterate(parse_cron("0 0 15 * L5"), UTC_ZONE, utc(2024, 1, 1), 4)
        assert fires == [utc(2024, 1, 15), utc(2024, 1, 26), utc(2024, 2, 15), utc(2024, 2, 23)]

    @pytest.mark.parametrize(
        ("expression", "start", "expected"),
        [
            ("0 0 L * *", "2024-01-31", "2024-02-29 2024-03-31 2024-04-30"),
            ("0 0 25-L/3 2 *", "2024-01-01", "2024-02-25 2024-02-28"),
            # The weekday nearest the 1st: Sat 1 Jun 2024 -> Mon 3; Sun 1 Sep -> Mon 2.
            ("0 0 1W 6,9 *", "2024-01-01", "2024-06-03 2024-09-02"),
            # The weekday nearest the 30th: Sat 30 Nov 2024 -> Fri 29; Sun 30 Jun -> Fri 28.
            ("0 0 30W 6,11 *", "2024-01-01", "2024-06-28 2024-11-29"),
            ("0 0 * 2 L1", "2024-01-01", "2024-02-26 2025-02-24"),  # the last Monday
            ("0 0 * * MON-WED#1", "2024-07-01", "2024-07-02 2024-07-03 2024-08-05"),
            ("0 0 * * 7", "2024-07-01", "2024-07-07 2024-07-14"),
            ("0 0 * * 5-7", "2024-07-01", "2024-07-05 2024-07-06 2024-07-07 2024-07-12"),
            ("0 0 * * fri-mon", "2024-07-02", "2024-07-05 2024-07-06 2024-07-07 2024-07-08"),
            ("0 0 1 nov-feb *", "2024-03-01", "2024-11-01 2024-12-01 2025-01-01 2025-02-01"),
            ("50-10/7 0 * * *", "2024-07-01", "2024-07-01T00:04 2024-07-01T00:50 2024-07-01T00:57"),
            ("45/5 0 * * *", "2024-07-01", "2024-07-01T00:45 2024-07-01T00:50 2024-07-01T00:55"),
            ("59/15 0 * * *", "2024-07-01", "2024-07-01T00:59 2024-07-02T00:59"),
            ("0 0 13 * ?", "2024-07-01", "2024-07-13 2024-08-13"),
            ("30-30/10 0 0 * * *", "2024-07-01", "2024-07-01T00:00:30 2024-07-02T00:00:30"),
        ],
    )
    def test_special_values(self, expression: str, start: str, expected: str) -> None:
        fires = [datetime.fromisoformat(text).replace(tzinfo=UTC) for text in expected.split()]
        begin = datetime.fromisoformat(start).replace(tzinfo=UTC)
        assert iterate(parse_cron(expression), UTC_ZONE, begin, len(fires)) == fires


class TestZones:
    @pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "America/St_Johns", "Etc/GMT+5"])
    def test_known_zones(self, name: str) -> None:
        assert parse_zone(name) == ZoneInfo(name)

    @pytest.mark.parametrize(
        "name", ["Mars/Base", "", "../etc", "/etc/localtime", "Europe", "zone.tab", "localtime"]
    )
    def test_unknown_zones(self, name: str) -> None:
        with pytest.raises(InvalidSchedule, match="unknown time zone") as raised:
            parse_zone(name)
        assert repr(name) in str(raised.value)
        assert "IANA" in str(raised.value)


class TestNaiveInstants:
    naive = datetime(2024, 1, 1, 12)

    @pytest.mark.parametrize(
        "trigger",
        [parse_cron("* * * * *"), every(60, anchor=utc(2024, 1, 1)), once(utc(2024, 2, 1))],
        ids=["cron", "every", "once"],
    )
    def test_are_refused(self, trigger: Trigger) -> None:
        with pytest.raises(ValueError, match="after='2024-01-01T12:00:00' is naive"):
            next_fire_after(trigger, UTC_ZONE, self.naive)
        with pytest.raises(ValueError, match=r"after=.* is naive"):
            fire_times(trigger, UTC_ZONE, after=self.naive, until=utc(2024, 2, 1), limit=5)
        with pytest.raises(ValueError, match=r"until=.* is naive"):
            fire_times(trigger, UTC_ZONE, after=utc(2024, 1, 1), until=self.naive, limit=5)

    def test_negative_limit(self) -> None:
        with pytest.raises(ValueError, match="limit=-1"):
            fire_times(
                parse_cron("* * * * *"),
                UTC_ZONE,
                after=utc(2024, 1, 1),
                until=utc(2024, 2, 1),
                limit=-1,
            )


# ---------------------------------------------------------------------------
# Cron across DST transitions
# ---------------------------------------------------------------------------

# (zone, date, kind) of the transitions of 2024 and 2025
TRANSITION_DAYS = [
    (NEW_YORK, (2024, 3, 10), "spring"),
    (NEW_YORK, (2024, 11, 3), "fall"),
    (NEW_YORK, (2025, 3, 9), "spring"),
    (NEW_YORK, (2025, 11, 2), "fall"),
    (BERLIN, (2024, 3, 31), "spring"),
    (BERLIN, (2024, 10, 27), "fall"),
    (BERLIN, (2025, 3, 30), "spring"),
    (BERLIN, (2025, 10, 26), "fall"),
]


class TestDaylightSavingSpecificHours:
    @pytest.mark.parametrize(
        ("zone", "day", "expected"),
        [
            # New York: 02:30 is skipped in spring (runs at 03:00 EDT), exists once in fall.
            (NEW_YORK, (2024, 3, 10), utc(2024, 3, 10, 7, 0)),
            (NEW_YORK, (2024, 11, 3), utc(2024, 11, 3, 7, 30)),
            (NEW_YORK, (2025, 3, 9), utc(2025, 3, 9, 7, 0)),
            (NEW_YORK, (2025, 11, 2), utc(2025, 11, 2, 7, 30)),
            # Berlin: 02:30 is skipped in spring (runs at 03:00 CEST), repeated in fall
            # (runs at its first occurrence, 02:30 CEST).
            (BERLIN, (2024, 3, 31), utc(2024, 3, 31, 1, 0)),
            (BERLIN, (2024, 10, 27), utc(2024, 10, 27, 0, 30)),
            (BERLIN, (2025, 3, 30), utc(2025, 3, 30, 1, 0)),
            (BERLIN, (2025, 10, 26), utc(2025, 10, 26, 0, 30)),
        ],
    )
    def test_daily_0230_runs_exactly_once(
        self, zone: ZoneInfo, day: tuple[int, int, int], expected: datetime
    ) -> None:
        assert fires_on(parse_cron("30 2 * * *"), zone, *day) == [expected]
        assert fires_on(parse_cron("0 30 2 * * *"), zone, *day) == [expected]

    @pytest.mark.parametrize(
        ("zone", "expression", "day", "expected"),
        [
            (NEW_YORK, "0 1 * * *", (2024, 11, 3), utc(2024, 11, 3, 5)),  # 01:00 EDT
            (NEW_YORK, "0 1 * * *", (2025, 11, 2), utc(2025, 11, 2, 5)),
            (BERLIN, "0 2 * * *", (2024, 10, 27), utc(2024, 10, 27, 0)),  # 02:00 CEST
            (BERLIN, "0 1 * * *", (2024, 10, 27), utc(2024, 10, 26, 23)),  # not repeated
            (BERLIN, "0 2 * * *", (2025, 10, 26), utc(2025, 10, 26, 0)),
        ],
    )
    def test_repeated_hour_runs_once_at_first_occurrence(
        self, zone: ZoneInfo, expression: str, day: tuple[int, int, int], expected: datetime
    ) -> None:
        assert fires_on(parse_cron(expression), zone, *day) == [expected]

    def test_several_skipped_wall_times_run_once(self) -> None:
        # 02:00, 02:20, 02:40 are all skipped: one run at 03:00 EDT, then 03:00 itself
        # would be the same instant again.
        trigger = parse_cron("0,20,40 2,3 * * *")
        fires = fires_on(trigger, NEW_YORK, 2024, 3, 10)
        assert fires == [utc(2024, 3, 10, 7, 0), utc(2024, 3, 10, 7, 20), utc(2024, 3, 10, 7, 40)]

    def test_every_minute_of_a_skipped_hour_runs_once(self) -> None:
        fires = fires_on(parse_cron("* 2 * * *"), NEW_YORK, 2024, 3, 10)
        assert fires == [utc(2024, 3, 10, 7, 0)]

    def test_every_minute_of_a_repeated_hour_runs_sixty_times(self) -> None:
        fires = fires_on(parse_cron("* 1 * * *"), NEW_YORK, 2024, 11, 3)
        assert fires == [utc(2024, 11, 3, 5) + timedelta(minutes=m) for m in range(60)]

    def test_from_the_second_pass_of_a_repeated_hour(self) -> None:
        trigger = parse_cron("*/10 1 * * *")
        second_pass = utc(2024, 11, 3, 6, 25)  # 01:25 EST
        assert next_fire_after(trigger, NEW_YORK, second_pass) == utc(2024, 11, 4, 6)
        first_pass = utc(2024, 11, 3, 5, 25)  # 01:25 EDT
        assert next_fire_after(trigger, NEW_YORK, first_pass) == utc(2024, 11, 3, 5, 30)

    def test_business_hours(self) -> None:
        trigger = parse_cron("0 9-17 * * 1-5")
        fires = fires_on(trigger, NEW_YORK, 2024, 11, 4)  # the Monday after fall-back
        assert fires == hours(utc(2024, 11, 4, 14), 9)

    def test_range_with_step_is_specific(self) -> None:
        # 1-23/2 names hours: 01:00 runs once on fall-back.
        fires = fires_on(parse_cron("0 1-23/2 * * *"), NEW_YORK, 2024, 11, 3)
        assert fires[0] == utc(2024, 11, 3, 5)
        assert len(fires) == 12

    def test_iteration_through_the_transitions(self) -> None:
        for zone, (year, month, day), _ in TRANSITION_DAYS:
            start = datetime(year, month, day, tzinfo=zone).astimezone(UTC) - timedelta(days=1)
            fires = iterate(parse_cron("30 2 * * *"), zone, start, 3)
            assert fires == sorted(set(fires))
            assert fires[1] == fires_on(parse_cron("30 2 * * *"), zone, year, month, day)[0]


class TestDaylightSavingEveryHour:
    def test_new_york_fall_back_hourly_at_half_past(self) -> None:
        fires = fires_on(parse_cron("30 * * * *"), NEW_YORK, 2024, 11, 3)
        assert fires == hours(utc(2024, 11, 3, 4), 25, minute=30)
        assert walls(fires, NEW_YORK)[:4] == [
            "00:30-0400",
            "01:30-0400",
            "01:30-0500",
            "02:30-0500",
        ]

    def test_new_york_spring_forward_hourly_at_half_past(self) -> None:
        fires = fires_on(parse_cron("30 * * * *"), NEW_YORK, 2024, 3, 10)
        assert fires == hours(utc(2024, 3, 10, 5), 23, minute=30)
        assert walls(fires, NEW_YORK)[:3] == ["00:30-0500", "01:30-0500", "03:30-0400"]

    @pytest.mark.parametrize(
        ("zone", "day", "kind"), TRANSITION_DAYS, ids=[f"{z}-{d}" for z, d, _ in TRANSITION_DAYS]
    )
    def test_on_the_hour_runs_in_every_real_hour(
        self, zone: ZoneInfo, day: tuple[int, int, int], kind: str
    ) -> None:
        fires = fires_on(parse_cron("0 * * * *"), zone, *day)
        midnight = datetime(*day, tzinfo=zone).astimezone(UTC)
        count = 25 if kind == "fall" else 23
        assert fires == hours(midnight, count)

    @pytest.mark.parametrize(
        ("zone", "day", "kind"), TRANSITION_DAYS, ids=[f"{z}-{d}" for z, d, _ in TRANSITION_DAYS]
    )
    def test_quarter_hours_run_in_every_real_hour(
        self, zone: ZoneInfo, day: tuple[int, int, int], kind: str
    ) -> None:
        fires = fires_on(parse_cron("*/15 * * * *"), zone, *day)
        midnight = datetime(*day, tzinfo=zone).astimezone(UTC)
        count = 100 if kind == "fall" else 92
        assert fires == [midnight + timedelta(minutes=15 * step) for step in range(count)]

    def test_new_york_fall_back_quarter_hours_exact(self) -> None:
        fires = fire_times(
            parse_cron("*/15 * * * *"),
            NEW_YORK,
            after=utc(2024, 11, 3, 4, 50),
            until=utc(2024, 11, 3, 7, 0),
            limit=100,
        )
        assert fires == [
            utc(2024, 11, 3, 5, 0),  # 01:00 EDT
            utc(2024, 11, 3, 5, 15),
            utc(2024, 11, 3, 5, 30),
            utc(2024, 11, 3, 5, 45),
            utc(2024, 11, 3, 6, 0),  # 01:00 EST
            utc(2024, 11, 3, 6, 15),
            utc(2024, 11, 3, 6, 30),
            utc(2024, 11, 3, 6, 45),
            utc(2024, 11, 3, 7, 0),  # 02:00 EST
        ]

    @pytest.mark.parametrize(
        ("after", "expected"),
        [
            (utc(2024, 11, 3, 5, 50), utc(2024, 11, 3, 6, 0)),  # 01:50 EDT -> 01:00 EST
            (utc(2024, 11, 3, 5, 0), utc(2024, 11, 3, 5, 15)),  # 01:00 EDT -> 01:15 EDT
            (utc(2024, 11, 3, 6, 20), utc(2024, 11, 3, 6, 30)),  # 01:20 EST -> 01:30 EST
            (utc(2024, 11, 3, 6, 50), utc(2024, 11, 3, 7, 0)),  # 01:50 EST -> 02:00 EST
        ],
    )
    def test_from_inside_the_repeated_hour(self, after: datetime, expected: datetime) -> None:
        assert next_fire_after(parse_cron("*/15 * * * *"), NEW_YORK, after) == expected

    def test_step_in_the_hour_field_is_every_hour(self) -> None:
        # */2 names even hours; 02:00 does not exist on spring-forward: no run.
        fires = fires_on(parse_cron("0 */2 * * *"), NEW_YORK, 2024, 3, 10)
        assert walls(fires, NEW_YORK)[:3] == ["00:00-0500", "04:00-0400", "06:00-0400"]
        assert len(fires) == 11

    def test_seconds_field_in_a_repeated_hour(self) -> None:
        fires = fire_times(
            parse_cron("0 59 * * * *"),
            BERLIN,
            after=utc(2024, 10, 26, 23, 0),
            until=utc(2024, 10, 27, 3, 0),
            limit=100,
        )
        assert walls(fires, BERLIN) == ["01:59+0200", "02:59+0200", "02:59+0100", "03:59+0100"]
        assert fires == hours(utc(2024, 10, 26, 23), 4, minute=59)


class TestLordHowe:
    """Australia/Lord_Howe moves its clocks by 30 minutes: +10:30 <-> +11:00."""

    def test_fall_back_repeats_half_an_hour(self) -> None:
        # 7 Apr 2024: 02:00 +11 becomes 01:30 +10:30, at 15:00Z.
        fires = fires_on(parse_cron("*/15 * * * *"), LORD_HOWE, 2024, 4, 7)
        assert len(fires) == 98  # 24.5 real hours
        around = [
            fire for fire in fires if utc(2024, 4, 6, 14, 0) <= fire <= utc(2024, 4, 6, 15, 45)
        ]
        assert walls(around, LORD_HOWE) == [
            "01:00+1100",
            "01:15+1100",
            "01:30+1100",
            "01:45+1100",
            "01:30+1030",
            "01:45+1030",
            "02:00+1030",
            "02:15+1030",
        ]

    def test_fall_back_specific_hour_once(self) -> None:
        assert fires_on(parse_cron("45 1 * * *"), LORD_HOWE, 2024, 4, 7) == [
            utc(2024, 4, 6, 14, 45)
        ]

    def test_spring_forward_skips_half_an_hour(self) -> None:
        # 6 Oct 2024: 02:00 +10:30 becomes 02:30 +11, at 15:30Z on the 5th.
        assert fires_on(parse_cron("15 2 * * *"), LORD_HOWE, 2024, 10, 6) == [
            utc(2024, 10, 5, 15, 30)
        ]
        assert fires_on(parse_cron("0 2 * * *"), LORD_HOWE, 2024, 10, 6) == [
            utc(2024, 10, 5, 15, 30)
        ]
        assert fires_on(parse_cron("45 2 * * *"), LORD_HOWE, 2024, 10, 6) == [
            utc(2024, 10, 5, 15, 45)
        ]
        hourly = fires_on(parse_cron("0 * * * *"), LORD_HOWE, 2024, 10, 6)
        assert len(hourly) == 23
        assert walls(hourly, LORD_HOWE)[:3] == ["00:00+1030", "01:00+1030", "03:00+1100"]


# ---------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------


def test_concurrent_callers_get_the_same_answers() -> None:
    expressions = ["*/5 * * * *", "30 2 * * *", "0 30 2 * * *", "*/15 * * * *", "0 1 * * *"]
    starts = [utc(2024, 11, 3, 4) + timedelta(minutes=7 * step) for step in range(40)]
    jobs = [
        (parse_cron(e), zone, s) for e in expressions for zone in (NEW_YORK, BERLIN) for s in starts
    ]
    expected = {index: next_fire_after(*job) for index, job in enumerate(jobs)}
    threads = 8
    barrier = threading.Barrier(threads)

    def worker(rotation: int) -> dict[int, datetime | None]:
        # Each thread walks the jobs from a different place, so that the threads
        # ask about different expressions at the same moment.
        barrier.wait()
        order = list(enumerate(jobs))
        order = order[rotation:] + order[:rotation]
        answers: dict[int, datetime | None] = {}
        for _ in range(3):
            for index, job in order:
                answers[index] = next_fire_after(*job)
        return answers

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(worker, [37 * thread for thread in range(threads)]))
    assert all(answers == expected for answers in results)


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

PROPERTY_ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "America/St_Johns",
    "Pacific/Chatham",
    "Europe/London",
    "Asia/Tehran",
    "UTC",
    "America/Sao_Paulo",
    "Africa/Casablanca",
    "Australia/Sydney",
]
# None of these zones moves its clocks by more than an hour at once.
LARGEST_SHIFT = timedelta(hours=1)


def values(low: int, high: int) -> st.SearchStrategy[str]:
    """A cron field with no '*': one value, a list, a range, or a range with a step."""
    value = st.integers(low, high)
    return st.one_of(
        value.map(str),
        st.lists(value, min_size=2, max_size=4, unique=True).map(
            lambda picked: ",".join(str(v) for v in sorted(picked))
        ),
        st.tuples(value, value).map(lambda pair: f"{min(pair)}-{max(pair)}"),
        st.tuples(value, value, st.integers(1, 5)).map(
            lambda triple: f"{min(triple[:2])}-{max(triple[:2])}/{triple[2]}"
        ),
    )


def stars(high: int) -> st.SearchStrategy[str]:
    return st.one_of(st.just("*"), st.integers(2, high).map(lambda step: f"*/{step}"))


SECONDS = st.sampled_from(["0", "30", "0,30", "15,45", "*/20", "59"])
ANY_DAY = st.just(("*", "*", "*"))
SOME_DAYS = st.tuples(
    st.one_of(st.just("*"), values(1, 28)),
    st.one_of(st.just("*"), st.just("*"), values(1, 12)),
    st.one_of(st.just("*"), st.just("*"), values(0, 6)),
)


@st.composite
def cron_expressions(
    draw: st.DrawFn, *, hours: st.SearchStrategy[str], days: st.SearchStrategy[tuple[str, ...]]
) -> str:
    fields = [draw(st.one_of(values(0, 59), stars(30))), draw(hours), *draw(days)]
    if draw(st.booleans()):
        fields.insert(0, draw(SECONDS))
    return " ".join(fields)


ANY_CRON = cron_expressions(hours=st.one_of(values(0, 23), stars(12)), days=SOME_DAYS)
# Near a transition, the hours that matter are the small ones (every zone here
# shifts between midnight and 04:00), and the day must be the transition's.
SPECIFIC_HOURS_AT_NIGHT = cron_expressions(hours=values(0, 4), days=ANY_DAY)
EVERY_HOUR = cron_expressions(hours=st.sampled_from(["*", "*", "*/2", "*/3"]), days=ANY_DAY)

START_INSTANTS = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2035, 12, 31), timezones=st.just(UTC)
)
ZONES = st.sampled_from(PROPERTY_ZONES).map(ZoneInfo)


@functools.cache
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """The instants at which the zone changed its UTC offset in ``year``: a day scan."""
    zone = ZoneInfo(zone_name)
    found = []
    day = utc(year, 1, 1)
    while day.year == year:
        following = day + timedelta(days=1)
        if day.astimezone(zone).utcoffset() != following.astimezone(zone).utcoffset():
            found.append(first_instant_with_offset_of(following, day, zone))
        day = following
    return tuple(found)


def first_instant_with_offset_of(later: datetime, earlier: datetime, zone: ZoneInfo) -> datetime:
    """Bisect whole seconds: zone transitions happen on them."""
    offset = later.astimezone(zone).utcoffset()
    while later - earlier > timedelta(seconds=1):
        middle = earlier + timedelta(seconds=(later - earlier) // timedelta(seconds=2))
        if middle.astimezone(zone).utcoffset() == offset:
            later = middle
        else:
            earlier = middle
    return later


TRANSITIONS = (
    st.tuples(st.sampled_from(PROPERTY_ZONES), st.integers(2000, 2035))
    .map(lambda zone_year: (ZoneInfo(zone_year[0]), transitions(*zone_year)))
    .filter(lambda zone_found: bool(zone_found[1]))
    .flatmap(lambda zone_found: st.tuples(st.just(zone_found[0]), st.sampled_from(zone_found[1])))
)


def is_specific_hour(expression: str) -> bool:
    return "*" not in expression.split()[-4]


def wall_clock(instant: datetime, zone: ZoneInfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def occurrences(wall: datetime, zone: ZoneInfo) -> list[datetime]:
    """The real instants whose local wall time is ``wall``, by round trip."""
    candidates = {wall.replace(tzinfo=zone, fold=fold).astimezone(UTC) for fold in (0, 1)}
    return sorted(instant for instant in candidates if wall_clock(instant, zone) == wall)


def end_of_gap(wall: datetime, zone: ZoneInfo) -> datetime:
    """The first instant whose wall time is later than the skipped ``wall``: a scan
    by hours, then minutes, then seconds, from well before it."""
    instant = wall.replace(tzinfo=UTC) - timedelta(hours=15)
    for step in (timedelta(hours=1), timedelta(minutes=1), timedelta(seconds=1)):
        while wall_clock(instant + step, zone) <= wall:
            instant += step
    return instant + timedelta(seconds=1)


def is_first_instant_after_a_gap(instant: datetime, zone: ZoneInfo) -> bool:
    """The wall clock jumped forward between the previous second and ``instant``."""
    previous = instant - timedelta(seconds=1)
    return wall_clock(instant, zone) - wall_clock(previous, zone) > timedelta(seconds=1)


# An independent brute-force reading of cron, for the properties: each field is a
# plain set of values, every day is tested against the day fields, and every
# second (or minute) of a matching day against the rest. Only the syntax the
# strategies write: *, a, a-b (never wrapping), /step after * or a range, lists,
# names, 7 = Sunday, L in the day of month, a#n in the day of week.

MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def plain_values(field: str, low: int, high: int, names: tuple[str, ...] = ()) -> set[int]:
    def number(text: str) -> int:
        return names.index(text) + low if text in names else int(text)

    found: set[int] = set()
    for part in field.lower().split(","):
        body, _, step = part.partition("/")
        if body == "*":
            first, last = low, high
        else:
            start, _, end = body.partition("-")
            first, last = number(start), number(end or start)
        found.update(range(first, last + 1, int(step or 1)))
    return found


@dataclass(frozen=True)
class OracleCron:
    seconds: set[int]
    minutes: set[int]
    hours: set[int]
    months: set[int]
    days_of_month: set[int]
    last_day_of_month: bool
    weekdays: set[int]  # 0 = Sunday
    nth_weekdays: set[tuple[int, int]]
    month_restricts: bool
    week_restricts: bool
    both_days: bool = False  # both restricting day fields must match, not either

    @classmethod
    def parse(cls, expression: str, both_days: bool = False) -> OracleCron:
        fields = expression.split()
        second = fields.pop(0) if len(fields) == 6 else "0"
        minute, hour, day_of_month, month, day_of_week = fields
        dom_parts = day_of_month.lower().split(",")
        dow_parts = day_of_week.lower().split(",")
        plain_days = ",".join(part for part in dom_parts if part != "l")
        plain_weekdays = ",".join(part for part in dow_parts if "#" not in part)
        return cls(
            seconds=plain_values(second, 0, 59),
            minutes=plain_values(minute, 0, 59),
            hours=plain_values(hour, 0, 23),
            months=plain_values(month, 1, 12, MONTH_NAMES),
            days_of_month=plain_values(plain_days, 1, 31) if plain_days else set(),
            last_day_of_month="l" in dom_parts,
            weekdays={day % 7 for day in plain_values(plain_weekdays, 0, 6, WEEKDAY_NAMES)}
            if plain_weekdays
            else set(),
            nth_weekdays={
                (day % 7, int(nth))
                for part in dow_parts
                if "#" in part
                for which, nth in [part.split("#")]
                for day in plain_values(which, 0, 6, WEEKDAY_NAMES)
            },
            month_restricts=day_of_month != "*",
            week_restricts=day_of_week != "*",
            both_days=both_days,
        )

    def day_matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        last = calendar.monthrange(day.year, day.month)[1]
        by_month = day.day in self.days_of_month or (self.last_day_of_month and day.day == last)
        weekday = day.isoweekday() % 7
        nth = (day.day - 1) // 7 + 1
        by_week = weekday in self.weekdays or (weekday, nth) in self.nth_weekdays
        if self.month_restricts and self.week_restricts and not self.both_days:
            return by_month or by_week
        return (by_month or not self.month_restricts) and (by_week or not self.week_restricts)

    def matches(self, wall: datetime) -> bool:
        return (
            self.day_matches(wall.date())
            and wall.hour in self.hours
            and wall.minute in self.minutes
            and wall.second in self.seconds
        )

    def walls(self, first: datetime, last: datetime) -> Iterator[datetime]:
        """Every matching naive wall time from ``first`` to ``last``, in order."""
        day = first.date()
        while day <= last.date():
            if self.day_matches(day):
                yield from (wall for wall in self.walls_of(day) if first <= wall <= last)
            day += timedelta(days=1)

    def walls_of(self, day: date) -> Iterator[datetime]:
        for hour in range(24):
            if hour not in self.hours:
                continue
            for minute in range(60):
                if minute not in self.minutes:
                    continue
                for second in range(60):
                    if second in self.seconds:
                        yield datetime.combine(day, time(hour, minute, second))

    def fires_in_a_calendar_cycle(self) -> bool:
        day = date(2000, 1, 1)
        while day.year < 2400:
            if self.day_matches(day):
                return True
            day += timedelta(days=1)
        return False


def reference_fires(
    expression: str,
    zone: ZoneInfo,
    after: datetime,
    until: datetime,
    limit: int | None = None,
    both_days: bool = False,
) -> list[datetime]:
    """The DST rules applied literally to every matching wall time around the window:
    specific hours take the first occurrence of a wall time or, for a skipped one,
    the end of the gap; every-hour jobs take all occurrences. The ``limit`` oldest."""
    oracle = OracleCron.parse(expression, both_days)
    first = wall_clock(after, zone) - 2 * LARGEST_SHIFT
    last = wall_clock(until, zone) + 2 * LARGEST_SHIFT
    instants: set[datetime] = set()
    for wall in oracle.walls(first, last):
        if wall > last:
            break
        real = occurrences(wall, zone)
        if is_specific_hour(expression):
            real = [real[0] if real else end_of_gap(wall, zone)]
        instants.update(instant for instant in real if after < instant <= until)
        if limit is not None and len(instants) >= limit:
            # Wall times later than this by more than a shift are later instants.
            last = min(last, wall_clock(sorted(instants)[limit - 1], zone) + 2 * LARGEST_SHIFT)
    return sorted(instants)[:limit]


def check_cron_fires(expression: str, zone: ZoneInfo, start: datetime) -> None:
    fires = iterate(parse_cron(expression), zone, start, 20)

    assert all(fire.tzinfo is UTC for fire in fires)
    assert fires[0] > start
    assert all(earlier < later for earlier, later in itertools.pairwise(fires))
    local = [fire.astimezone(zone) for fire in fires]
    assert len({(moment.replace(tzinfo=None), moment.fold) for moment in local}) == len(fires)

    oracle = OracleCron.parse(expression)
    for fire, moment in zip(fires, local, strict=True):
        matches = oracle.matches(moment.replace(tzinfo=None))
        if is_specific_hour(expression):
            assert matches or is_first_instant_after_a_gap(fire, zone)
        else:
            assert matches

    assert fires == reference_fires(expression, zone, start, fires[-1])


@PROPERTY_SETTINGS
@given(expression=ANY_CRON, zone=ZONES, start=START_INSTANTS)
def test_cron_follows_the_dst_rules(expression: str, zone: ZoneInfo, start: datetime) -> None:
    check_cron_fires(expression, zone, start)


# Random instants rarely fall near a transition: these start within two hours of one.


@PROPERTY_SETTINGS
@given(
    expression=SPECIFIC_HOURS_AT_NIGHT,
    transition=TRANSITIONS,
    offset=st.integers(-7200, 7200).map(lambda seconds: timedelta(seconds=seconds)),
)
def test_specific_hours_near_transitions(
    expression: str, transition: tuple[ZoneInfo, datetime], offset: timedelta
) -> None:
    zone, instant = transition
    check_cron_fires(expression, zone, instant + offset)


@PROPERTY_SETTINGS
@given(
    expression=EVERY_HOUR,
    transition=TRANSITIONS,
    offset=st.integers(-7200, 7200).map(lambda seconds: timedelta(seconds=seconds)),
)
def test_every_hour_near_transitions(
    expression: str, transition: tuple[ZoneInfo, datetime], offset: timedelta
) -> None:
    zone, instant = transition
    check_cron_fires(expression, zone, instant + offset)


# Finding 17: random expressions in every spelling the oracle reads (names, ranges
# from a value to itself, steps, lists, L, a#n, both day fields restricted) against
# the brute-force matcher, from random instants and from instants near transitions.

FINDING_17_ZONES = [
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "UTC",
]


@st.composite
def field_element(draw: st.DrawFn, low: int, high: int, names: tuple[str, ...] = ()) -> str:
    """One list element: a value, a range (often from a value to itself), a step."""

    def spelled(value: int) -> str:
        if value - low < len(names) and draw(st.booleans()):
            return names[value - low]
        return str(value)

    first, last = sorted(draw(st.tuples(st.integers(low, high), st.integers(low, high))))
    step = draw(st.integers(1, 7))
    shape = draw(st.sampled_from(["value", "same", "same/step", "range", "range/step", "*/step"]))
    if shape == "value":
        return spelled(first)
    if shape == "same":
        return f"{spelled(first)}-{spelled(first)}"
    if shape == "same/step":
        return f"{spelled(first)}-{spelled(first)}/{step}"
    if shape == "range":
        return f"{spelled(first)}-{spelled(last)}"
    if shape == "range/step":
        return f"{spelled(first)}-{spelled(last)}/{step}"
    return f"*/{step + 1}"


def cron_field(
    low: int, high: int, names: tuple[str, ...] = (), *, star: int = 1
) -> st.SearchStrategy[str]:
    """``*`` (``star`` times as likely as one other shape) or a list of 1 to 3 elements."""
    elements = st.lists(field_element(low, high, names), min_size=1, max_size=3).map(",".join)
    return st.one_of(*[st.just("*")] * star, elements)


FINDING_17_DAYS_OF_MONTH = st.one_of(
    st.just("*"),
    cron_field(1, 31),
    cron_field(29, 31),  # days some months lack: some expressions never fire
    st.just("L"),
    cron_field(1, 31).map(lambda field: f"{field},L"),
)
NTH_WEEKDAYS = st.lists(
    st.tuples(st.integers(0, 7), st.integers(1, 5), st.booleans()).map(
        lambda day_nth_named: (
            f"{WEEKDAY_NAMES[day_nth_named[0] % 7] if day_nth_named[2] else day_nth_named[0]}"
            f"#{day_nth_named[1]}"
        )
    ),
    min_size=1,
    max_size=2,
).map(",".join)
FINDING_17_DAYS_OF_WEEK = st.one_of(st.just("*"), cron_field(0, 7, WEEKDAY_NAMES), NTH_WEEKDAYS)
FINDING_17_MONTHS = st.one_of(
    cron_field(1, 12, MONTH_NAMES, star=3),
    # Months without a 30th or 31st: with late days, some expressions never fire.
    st.sampled_from(["2", "feb", "2-2/3", "4,6", "apr-apr", "9,11", "feb,nov"]),
)
FINDING_17_SECONDS = st.sampled_from(["0", "7-7", "10-10/5", "*/20", "15,45", "50-59/3"])


@st.composite
def finding_17_crons(draw: st.DrawFn) -> str:
    fields = [
        draw(cron_field(0, 59)),
        draw(cron_field(0, 23, star=2)),
        draw(FINDING_17_DAYS_OF_MONTH),
        draw(FINDING_17_MONTHS),
        draw(FINDING_17_DAYS_OF_WEEK),
    ]
    if draw(st.integers(0, 4)) == 0:  # seconds first, now and then
        fields.insert(0, draw(FINDING_17_SECONDS))
    return " ".join(fields)


@st.composite
def zones_and_starts(draw: st.DrawFn) -> tuple[ZoneInfo, datetime]:
    """A zone, and an instant: anywhere, or within two days of one of its transitions."""
    name = draw(st.sampled_from(FINDING_17_ZONES))
    changes = transitions(name, draw(st.integers(2000, 2035)))
    near_a_change = draw(st.booleans())
    if changes and near_a_change:
        change: datetime = draw(st.sampled_from(changes))
        offset = timedelta(minutes=draw(st.integers(-2 * 24 * 60, 2 * 24 * 60)))
        return ZoneInfo(name), change + offset
    return ZoneInfo(name), draw(START_INSTANTS)


@PROPERTY_SETTINGS
@given(expression=finding_17_crons(), zone_and_start=zones_and_starts())
def test_cron_fire_times_equal_a_brute_force_matchers(
    expression: str, zone_and_start: tuple[ZoneInfo, datetime]
) -> None:
    """Cron fire times equal a brute-force matcher's. Finding 17 of issue 15."""
    # Within a bounded window, so that rare expressions keep the oracle quick.
    check_against_the_brute_force_matcher(expression, *zone_and_start, days=45)


def check_against_the_brute_force_matcher(
    expression: str, zone: ZoneInfo, start: datetime, *, days: int, both_days: bool = False
) -> None:
    """Refused as never firing exactly when the oracle finds no date in a calendar
    cycle; otherwise the first 8 fire times within ``days`` after ``start`` agree."""
    if not OracleCron.parse(expression, both_days).fires_in_a_calendar_cycle():
        with pytest.raises(InvalidSchedule, match="never fires"):
            Cron(expression=expression, both_days=both_days)
        return
    trigger = Cron(expression=expression, both_days=both_days)
    assert trigger.both_days is both_days
    until = start + timedelta(days=days)
    fires = fire_times(trigger, zone, after=start, until=until, limit=8)
    assert fires == reference_fires(expression, zone, start, until, limit=8, both_days=both_days)


# A day must match both restricted day fields (how a beat_schedule crontab() is
# read): the same brute-force matcher, testing each day against both.

BOTH_DAYS_OF_MONTH = st.one_of(
    cron_field(1, 31, star=0),
    cron_field(29, 31, star=0),  # with the weekdays, some expressions never fire
    st.just("L"),
    cron_field(1, 31, star=0).map(lambda field: f"{field},L"),
)
BOTH_DAYS_OF_WEEK = st.one_of(cron_field(0, 7, WEEKDAY_NAMES, star=0), NTH_WEEKDAYS)


@st.composite
def both_days_crons(draw: st.DrawFn) -> str:
    fields = draw(finding_17_crons()).split()
    fields[-3] = draw(BOTH_DAYS_OF_MONTH)
    fields[-1] = draw(BOTH_DAYS_OF_WEEK)
    return " ".join(fields)


@PROPERTY_SETTINGS
@given(expression=both_days_crons(), zone_and_start=zones_and_starts())
def test_both_days_fire_times_equal_a_brute_force_matchers(
    expression: str, zone_and_start: tuple[ZoneInfo, datetime]
) -> None:
    # A year: days matching both fields can be a few a year.
    check_against_the_brute_force_matcher(expression, *zone_and_start, days=366, both_days=True)


@pytest.mark.parametrize(
    ("expression", "both_days", "fires"),
    [
        ("0 0 30 2 1", False, True),  # every Monday in February
        ("0 0 30 2 1", True, False),  # 30 February, a Monday: never
        ("0 0 29 2 1", True, True),  # 29 February 2016, a Monday
        ("0 0 1-7 * 1#2", True, False),  # the second Monday is never in the first week
    ],
)
def test_both_days_never_fires_is_decided_by_the_calendar(
    expression: str, both_days: bool, fires: bool
) -> None:
    assert OracleCron.parse(expression, both_days).fires_in_a_calendar_cycle() is fires
    if fires:
        Cron(expression=expression, both_days=both_days)
    else:
        with pytest.raises(InvalidSchedule, match="never fires"):
            Cron(expression=expression, both_days=both_days)


@pytest.mark.parametrize(
    ("expression", "both_days"),
    [("0 9 * * 1", False), ("0 9 1-7 * *", False), ("0 9 1-7 * ?", False), ("0 9 1-7 * 1", True)],
)
def test_both_days_is_kept_only_where_it_changes_something(
    expression: str, both_days: bool
) -> None:
    trigger = Cron(expression=expression, both_days=True)
    assert trigger.both_days is both_days
    assert (trigger == Cron(expression=expression)) is not both_days
    suffix = " (day of month and day of week both match)" if both_days else ""
    assert trigger.describe() == expression + suffix


def test_both_days_must_be_a_bool() -> None:
    with pytest.raises(InvalidSchedule, match="both_days must be True or False"):
        Cron(expression="0 9 1-7 * 1", both_days="yes")  # type: ignore[arg-type]


@PROPERTY_SETTINGS
@given(
    seconds=st.one_of(
        st.integers(1, 10**7).map(float),
        st.floats(1.0, 1e6, allow_nan=False, allow_infinity=False),
    ),
    anchor=START_INSTANTS,
    start=START_INSTANTS,
)
def test_every_is_anchor_plus_whole_periods(
    seconds: float, anchor: datetime, start: datetime
) -> None:
    trigger = every(seconds, anchor=anchor)
    period = round(seconds * 1_000_000)
    fires = iterate(trigger, NEW_YORK, start, 20)
    indices = []
    for fire in fires:
        elapsed = (fire - anchor) // timedelta(microseconds=1)
        index, remainder = divmod(elapsed, period)
        assert remainder == 0
        indices.append(index)
    assert indices == list(range(indices[0], indices[0] + 20))
    assert indices[0] >= 0
    assert fires[0] > start
    assert indices[0] == 0 or fires[0] - timedelta(microseconds=period) <= start
    assert fire_times(trigger, NEW_YORK, after=start, until=fires[-1], limit=100) == fires


@pytest.mark.parametrize(
    ("expression", "fires"),
    [
        ("0 0 30 2 *", False),
        ("0 0 30-31 feb *", False),
        ("0 0 31 4,6,9,11 *", False),
        ("0 0 31 2-2/3 *", False),
        ("0 0 29 2 *", True),  # leap years
        ("0 0 30 2 1#5", True),  # a fifth Monday in February: 29 Feb 2016, 2044
        ("0 0 31 2 */3", True),  # Sundays, Wednesdays and Saturdays in February
        ("0 0 L 2 *", True),
    ],
)
def test_cron_never_fires_is_decided_by_the_calendar(expression: str, fires: bool) -> None:
    """Whether a cron never fires is decided by the calendar. Finding 17 of issue 15."""
    assert OracleCron.parse(expression).fires_in_a_calendar_cycle() is fires
    if fires:
        parse_cron(expression)
    else:
        with pytest.raises(InvalidSchedule, match="never fires"):
            parse_cron(expression)
