"""Wall clock <-> real instants in a time zone: whether a wall time happens once,
twice (the clock went back over it) or never (the clock jumped over it), and the
offset change that repeats or skips it.

Transitions are found to the second, so shifts that are not one hour long or do
not happen at a full hour (Australia/Lord_Howe moves by 30 minutes) work too.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Final
from zoneinfo import ZoneInfo

_ONE_SECOND: Final = timedelta(seconds=1)
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


class WallKind(Enum):
    REGULAR = "regular"  # happens exactly once
    REPEATED = "repeated"  # happens twice: the clock went back over it
    SKIPPED = "skipped"  # never happens: the clock jumped over it


@dataclass(frozen=True, slots=True)
class Shift:
    """One change of UTC offset, seen from the wall clock."""

    instant: datetime  # when the offset changed (UTC)
    start: datetime  # first wall time repeated or skipped (naive)
    end: datetime  # first wall time after the repeated or skipped ones (naive)


def wall_kind(wall: datetime, zone: ZoneInfo) -> WallKind:
    # PEP 495: fold=0 reads a wall time with the offset in force before a change,
    # fold=1 with the offset after it; they differ only around a change.
    before = wall.replace(tzinfo=zone, fold=0).utcoffset()
    after = wall.replace(tzinfo=zone, fold=1).utcoffset()
    assert before is not None
    assert after is not None
    if before == after:
        return WallKind.REGULAR
    # The clock goes back when the offset shrinks, forward when it grows.
    return WallKind.REPEATED if before > after else WallKind.SKIPPED


def instant_at(wall: datetime, zone: ZoneInfo, fold: int) -> datetime:
    return wall.replace(tzinfo=zone, fold=fold).astimezone(UTC)


def shift_around(wall: datetime, zone: ZoneInfo) -> Shift:
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
    return Shift(
        instant=instant,
        start=naive + min(old_offset, new_offset),
        end=naive + max(old_offset, new_offset),
    )


def _utc_seconds(moment: datetime) -> int:
    return (moment - _EPOCH) // _ONE_SECOND


def _offset_at(utc_seconds: int, zone: ZoneInfo) -> timedelta | None:
    return (_EPOCH + timedelta(seconds=utc_seconds)).astimezone(zone).utcoffset()
