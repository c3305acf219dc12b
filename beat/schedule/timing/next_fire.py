"""Next fire times: the first fire time of a trigger after an instant, and the
fire times in a span.

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
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final, assert_never
from zoneinfo import ZoneInfo

from beat.schedule.timing.cron import compile_cron
from beat.schedule.timing.triggers import Cron, Every, Once, Trigger
from beat.schedule.timing.wall_clock import WallClockCron
from beat.schedule.timing.zones import WallKind, instant_at, shift_around, wall_kind

_ONE_MICROSECOND: Final = timedelta(microseconds=1)


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
        return _next_cron_fire(compile_cron(trigger.expression, trigger.both_days), zone, after)
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


def _next_cron_fire(cron: WallClockCron, zone: ZoneInfo, after: datetime) -> datetime | None:
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
    cron: WallClockCron, zone: ZoneInfo, local: datetime
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
        following = cron.first_at_or_after(shift_around(wall, zone).end)
    else:
        following = cron.next_after(wall)
    if following is None:
        return None
    if wall_kind(following, zone) is WallKind.SKIPPED:
        return shift_around(following, zone).instant
    return instant_at(following, zone, fold=0)


def _next_fire_in_every_real_hour(
    cron: WallClockCron, zone: ZoneInfo, local: datetime
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
    if local.fold == 0 and wall_kind(wall, zone) is WallKind.REPEATED:
        # In the first pass over a repeated period: the second pass is still ahead,
        # including the wall times before ``wall``.
        shift = shift_around(wall, zone)
        repeated = cron.first_at_or_after(shift.start)
        if repeated is not None and repeated < shift.end:
            candidates.append(instant_at(repeated, zone, fold=1))
    later = _first_real_instant_from(cron, zone, cron.next_after(wall), after)
    if later is not None:
        candidates.append(later)
    return min(candidates, default=None)


def _first_real_instant_from(
    cron: WallClockCron, zone: ZoneInfo, wall: datetime | None, after: datetime
) -> datetime | None:
    """The earliest instant later than ``after`` at which the clock shows ``wall``
    or, failing that, one of the matching wall times after it."""
    while wall is not None:
        kind = wall_kind(wall, zone)
        if kind is WallKind.SKIPPED:
            # Jump over the gap rather than stepping through each of its matches
            # (a per-second job has 3,600 of them in a one-hour gap).
            wall = cron.first_at_or_after(shift_around(wall, zone).end)
            continue
        for fold in (0, 1) if kind is WallKind.REPEATED else (0,):
            instant = instant_at(wall, zone, fold)
            if instant > after:
                return instant
        wall = cron.next_after(wall)
    return None


def _require_aware(moment: datetime, name: str) -> datetime:
    """``moment`` in UTC; ValueError if it is naive."""
    if moment.utcoffset() is None:
        raise ValueError(
            f"{name}={moment.isoformat()!r} is naive: pass an aware datetime,"
            " e.g. with tzinfo=datetime.UTC"
        )
    return moment.astimezone(UTC)
