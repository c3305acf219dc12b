"""The oracle of the import tests: a source's own scheduler stepped as its beat steps
it, against the fire times this scheduler takes from the imported row.

A source's beat wakes up, asks its entry ``is_due()``; when due the entry runs and
its last run becomes now; it sleeps the seconds ``is_due`` returned. Its fire times
from ``start`` are where it found the entry due."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from beat.models import Schedule
from beat.schedule.timing import next_fire_after, parse_zone

#: ``is_due(now) -> (due, seconds to sleep)``, and what running it at ``now`` records.
IsDue = Callable[[datetime], tuple[bool, float]]
Ran = Callable[[datetime], None]


def entry_steps(entry: Any, zone: str) -> tuple[IsDue, Ran]:
    """A Celery ``ScheduleEntry`` (celery beat's, RedBeat's) on a clock the caller
    moves, its schedule reading that clock in ``zone``."""
    clock = [datetime.now(UTC)]
    entry.schedule.nowfun = lambda: clock[0].astimezone(ZoneInfo(zone))

    def is_due(at: datetime) -> tuple[bool, float]:
        clock[0] = at
        due, wait = entry.is_due()
        return bool(due), float(wait)

    def ran(at: datetime) -> None:
        entry.last_run_at = at

    return is_due, ran


def source_fires(
    is_due: IsDue, ran: Ran, *, start: datetime, count: int, horizon: timedelta
) -> list[datetime]:
    """The first ``count`` fire times of the source from ``start`` (fewer if it stops
    firing within ``horizon``)."""
    now, fires = start, []
    while len(fires) < count and now < start + horizon:
        due, wait = is_due(now)
        if due:
            fires.append(now)
            ran(now)
        now += timedelta(seconds=wait)
    return fires


def our_fires(schedule: Schedule, count: int) -> list[datetime]:
    """The first ``count`` fire times of an imported schedule: its next fire time, then
    its trigger's, within its window and its runs left."""
    definition = schedule.definition
    zone = parse_zone(definition.timezone)
    fires: list[datetime] = []
    following, runs = schedule.next_fire_at, schedule.runs_count
    while following is not None and len(fires) < count:
        if definition.end_at is not None and following > definition.end_at:
            break
        if definition.max_runs is not None and runs >= definition.max_runs:
            break
        fires.append(following)
        runs += 1
        following = next_fire_after(definition.trigger, zone, following)
    return fires


#: How soon after a change of a zone's UTC offset a fire time may differ from Celery's.
NEAR_DST = timedelta(hours=3)


def assert_same_fires(ours: list[datetime], theirs: list[datetime], zone: str, name: str) -> None:
    """The same fire times to the second, but where ``docs/explanation/scheduling-rules.md``
    says this scheduler differs from Celery around DST: a wall time the clock skipped
    fires at the first instant after the gap (Celery: as long after it as it was into
    it), so earlier than Celery's, just after an offset change."""
    assert len(ours) == len(theirs), name
    place = ZoneInfo(zone)
    for mine, source in zip(to_the_second(ours), to_the_second(theirs), strict=True):
        if mine == source:
            continue
        here, there = datetime.fromisoformat(mine), datetime.fromisoformat(source)
        changed = (
            there.astimezone(place).utcoffset() != (there - NEAR_DST).astimezone(place).utcoffset()
        )
        differs = f"{name}: {mine} here, {source} in the source"
        assert changed, differs
        assert here < there, differs


def last_wall_time(zone: str, *, hour: int, minute: int, weekday: int | None = None) -> datetime:
    """The latest wall time ``hour:minute`` in ``zone`` (on ``weekday``, 0 for Monday, if
    given) at or before now: when a beat that kept time last ran such a crontab."""
    place, now = ZoneInfo(zone), datetime.now(UTC)
    day = now.astimezone(place).date()
    while True:
        moment = datetime.combine(day, time(hour, minute), tzinfo=place)
        if moment <= now and weekday in (None, day.weekday()):
            return moment.astimezone(UTC)
        day -= timedelta(days=1)


def to_the_second(fires: list[datetime]) -> list[str]:
    """Celery sleeps in float seconds: its wake-ups are off by microseconds."""
    return [
        (moment + timedelta(microseconds=500_000)).replace(microsecond=0).isoformat()
        for moment in fires
    ]
