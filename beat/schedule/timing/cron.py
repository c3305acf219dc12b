"""Cron expressions: parsing and validation, into the sets of values a
:class:`~beat.schedule.timing.wall_clock.WallClockCron` matches wall times with.

Fields hold values, names (``jan``-``dec``, ``sun``-``sat``; ``7`` is Sunday too),
lists ``a,b``, ranges ``a-b`` (a range from a value to itself is that value;
one that runs past the field's end wraps around: ``fri-mon``), steps ``*/n``,
``a-b/n`` and ``a/n`` (from ``a`` to the field's end), ``L`` (last day of the
month), ``15W`` (the weekday nearest the 15th), ``1#2`` (the second Monday) and
``L5`` (the last Friday). croniter checks the syntax; which wall times match is
decided here, from plain sets of values, because croniter reads ``N-N`` as the
whole field and lets ``#`` and ``W`` turn the day fields' "either" into "both".
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Final

from croniter import CroniterError, croniter

from beat.errors import InvalidSchedule
from beat.schedule.timing.wall_clock import DayRule, WallClockCron

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


@functools.lru_cache(maxsize=4096)
def compile_cron(expression: str, both_days: bool = False) -> WallClockCron:
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
) -> WallClockCron:
    """The sets of values of fields croniter accepted."""
    lowered = [field.lower() for field in fields]
    second = lowered[0] if seconds_first else "0"
    minute, hour, day_of_month, month, day_of_week = lowered[-5:]
    try:
        day_rule = _day_rule(day_of_month, day_of_week, both_days)
        return WallClockCron(
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


def _check_it_fires(expression: str, cron: WallClockCron) -> None:
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


def _day_rule(day_of_month: str, day_of_week: str, both_days: bool) -> DayRule:
    days_of_month, last_day_of_month, nearest_weekday_to = _read_day_of_month(day_of_month)
    weekdays, nth_weekdays, last_weekdays = _read_day_of_week(day_of_week)
    month_restricts = day_of_month not in ("*", "?")
    week_restricts = day_of_week not in ("*", "?")
    # With a day field unrestricted, "both" and "either" select the same days:
    # say "both" only where it means something.
    both_days = both_days and month_restricts and week_restricts
    return DayRule(
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
