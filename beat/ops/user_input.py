"""What people type, read the same way by the CLI and the schedules UI: durations
(``90s``, ``1h30m``, ``2d``), ISO 8601 times, and wall times in a schedule's zone.

Each parser raises ``ValueError`` (or :class:`beat.errors.InvalidSchedule` for a
wall time the clocks skip or repeat) with a message that says what to type instead.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from beat.errors import InvalidSchedule
from beat.limits import MAX_DURATION
from beat.schedule import timing

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^(?:\d+(?:\.\d+)?[smhdw])+$")
_PLAIN_SECONDS = re.compile(r"^\d+(?:\.\d+)?$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


#: The fields whose time may be a wall time, read in the schedule's zone, and how the
#: CLI names them in its messages.
CLI_TIME_OPTIONS = {"at": "--at", "start_at": "--start-at", "end_at": "--end-at"}


def with_wall_times_read(
    fields: dict[str, Any],
    zone_name: Callable[[], str],
    labels: Mapping[str, str] = CLI_TIME_OPTIONS,
) -> dict[str, Any]:
    """``fields`` with the times given without an offset read as wall times in the zone
    ``zone_name()`` names (asked only if there is one). ``labels`` names each time
    field (``at``, ``start_at``, ``end_at``) in error messages."""
    wall = [
        key
        for key in labels
        if isinstance(fields.get(key), datetime) and fields[key].utcoffset() is None
    ]
    if not wall:
        return fields
    zone = timing.parse_zone(zone_name())
    return fields | {key: wall_time_in(fields[key], zone, labels[key]) for key in wall}


def wall_time_in(wall: datetime, zone: ZoneInfo, what: str) -> datetime:
    """The instant of wall time ``wall`` in ``zone``. InvalidSchedule if the clocks skip
    it or show it twice (daylight saving time): which instant was meant is not known."""
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    try:
        first_in_utc = first.astimezone(UTC)
        second.astimezone(UTC)
    except OverflowError:
        raise InvalidSchedule(
            f"{what} {wall.isoformat()} in {zone.key} lies outside the years 1 to 9999 once"
            " in UTC: give a time within them"
        ) from None
    if first.utcoffset() == second.utcoffset():
        return first
    if first_in_utc.astimezone(zone).replace(tzinfo=None) != wall:
        raise InvalidSchedule(
            f"{what} {wall.isoformat()} does not exist in {zone.key}: the clocks skip it"
            " (daylight saving time); give another time, or one with a UTC offset"
        )
    raise InvalidSchedule(
        f"{what} {wall.isoformat()} happens twice in {zone.key} (the clocks go back):"
        f" give it with its UTC offset, {first.isoformat()} or {second.isoformat()}"
    )


def duration_seconds(text: str, *, plain_seconds: bool = True) -> float:
    """Seconds in ``90s``, ``10m``, ``1h30m``, ``2d``, ``1w`` (units add up) and, with
    ``plain_seconds``, in a bare number (``90``, ``1.5``); ValueError for anything else.

    Not bounded: a huge amount gives a huge (or infinite) number for the API to refuse."""
    compact = text.strip().lower()
    if plain_seconds and _PLAIN_SECONDS.match(compact):
        return float(compact)
    if not _DURATION.match(compact):
        forms = "90, 90s, 10m, 1h30m or 2d" if plain_seconds else "90s, 10m, 12h, 1h30m or 30d"
        raise ValueError(f"{text!r} is not a duration such as {forms}")
    return sum(
        float(amount) * _DURATION_UNITS[unit] for amount, unit in _DURATION_PART.findall(compact)
    )


def parse_duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``1h30m``, ``90s``, ``2w`` (a unit is required: ``--older-than 30``
    could mean seconds or days, and prune deletes); ValueError for anything else, zero,
    or more than ``MAX_DURATION``."""
    seconds = duration_seconds(text, plain_seconds=False)
    if seconds <= 0:
        raise ValueError(f"{text!r} is zero: give a positive duration")
    if seconds > MAX_DURATION.total_seconds():
        raise ValueError(
            f"{text!r} is longer than {MAX_DURATION.days} days, the longest duration:"
            " give a shorter one"
        )
    return timedelta(seconds=seconds)


def parse_time(value: str) -> datetime:
    """An ISO 8601 time; without an offset it is a wall time, to be read in the zone of
    the schedule (``with_wall_times_read``). ValueError names the forms expected."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{value!r} is not an ISO 8601 time such as 2027-01-31T09:00"
            " or 2027-01-31T09:00:00+01:00"
        ) from None
    if moment.utcoffset() is not None:
        try:
            moment.astimezone(UTC)
        except OverflowError:
            raise ValueError(
                f"{value!r} lies outside the years 1 to 9999 once in UTC: give a time within them"
            ) from None
    return moment


def is_duration(text: str) -> bool:
    """Whether ``text`` is a duration with units (``2h``, ``1h30m``)."""
    return bool(_DURATION.match(text.strip().lower()))
