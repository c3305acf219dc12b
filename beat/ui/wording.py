"""A schedule's timing in words ("every day at 02:30", "every 15 minutes"), beside the
timing as written. Only the common shapes are put in words; for any other the page
shows the expression alone, rather than words that might mislead."""

from __future__ import annotations

import re

from beat.schedule.timing import Cron, Every, Once, Trigger

_WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_NUMBER = re.compile(r"\d{1,2}")
_STEP = re.compile(r"\*/(\d{1,2})")
_DAY_NUMBERS = {name[:3].lower(): str(number) for number, name in enumerate(_WEEKDAYS)}
_UNITS = (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1))


def in_words(trigger: Trigger, timezone: str) -> str | None:
    """The timing in words, or None when it is not one of the shapes put in words."""
    if isinstance(trigger, Every):
        return f"every {interval_words(trigger.seconds)}"
    if isinstance(trigger, Once):
        return "once"
    assert isinstance(trigger, Cron)
    words = _cron_words(trigger.expression.split())
    if words is None or trigger.both_days:
        return words
    return f"{words} ({timezone})" if _has_wall_time(trigger.expression) else words


def interval_words(seconds: float) -> str:
    """``5400`` → ``1 hour 30 minutes``; a fraction of a second is given as seconds."""
    if seconds != int(seconds):
        return f"{seconds:g} seconds"
    left, parts = int(seconds), []
    for name, size in _UNITS:
        amount, left = divmod(left, size)
        if amount:
            parts.append(f"{amount} {name}{'' if amount == 1 else 's'}")
    return " ".join(parts)


def _has_wall_time(expression: str) -> bool:
    fields = expression.split()
    return len(fields) == 5 and _NUMBER.fullmatch(fields[1]) is not None


def _cron_words(fields: list[str]) -> str | None:
    if len(fields) == 6:
        return _seconds_cron_words(fields)
    minute, hour, day, month, weekday = fields
    if month != "*":
        return None
    if (day, weekday) == ("*", "*"):
        return _daily_words(minute, hour)
    if not (_NUMBER.fullmatch(minute) and _NUMBER.fullmatch(hour)):
        return None
    clock = f"{int(hour):02d}:{int(minute):02d}"
    if day == "*" and (days := _weekdays_words(weekday)) is not None:
        return f"at {clock} on {days}"
    if weekday == "*" and _NUMBER.fullmatch(day):
        return f"at {clock} on day {int(day)} of every month"
    return None


def _daily_words(minute: str, hour: str) -> str | None:
    if (minute, hour) == ("*", "*"):
        return "every minute"
    if hour == "*" and (step := _STEP.fullmatch(minute)):
        return _every(int(step[1]), "minute")
    if hour == "*" and _NUMBER.fullmatch(minute):
        return f"every hour at minute {int(minute)}"
    if _NUMBER.fullmatch(minute) and (step := _STEP.fullmatch(hour)):
        return f"{_every(int(step[1]), 'hour')} at minute {int(minute)}"
    if _NUMBER.fullmatch(minute) and _NUMBER.fullmatch(hour):
        return f"every day at {int(hour):02d}:{int(minute):02d}"
    return None


def _weekdays_words(field: str) -> str | None:
    """``1-5`` → ``Monday to Friday``; ``1,3`` → ``Monday and Wednesday``; days as numbers
    or names (``mon-fri``)."""
    field = re.sub(r"[a-z]{3}", lambda name: _DAY_NUMBERS.get(name[0], name[0]), field.lower())
    if (found := re.fullmatch(r"([0-6])-([0-6])", field)) and found[1] < found[2]:
        return f"{_WEEKDAYS[int(found[1])]} to {_WEEKDAYS[int(found[2])]}"
    if re.fullmatch(r"[0-7](,[0-7])*", field):
        names = [_WEEKDAYS[int(day) % 7] for day in field.split(",")]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return None


def _seconds_cron_words(fields: list[str]) -> str | None:
    second, rest = fields[0], fields[1:]
    if rest != ["*"] * 5:
        return None
    if second == "*":
        return "every second"
    if step := _STEP.fullmatch(second):
        return _every(int(step[1]), "second")
    return None


def _every(amount: int, unit: str) -> str:
    return f"every {unit}" if amount == 1 else f"every {amount} {unit}s"
