"""``python fire_times.py <module> <count> <instant>...``: for each entry of the app in
``<module>``, its next ``count`` fire times from each instant as this scheduler computes
them, and as Celery's own schedule object gives them when stepped as ``celery beat``
steps it; prints one JSON document: the app's zone and, per entry, the differences.

Celery beat, stepped: at each wake-up ``is_due(last_run_at)``; when due the entry runs
and ``last_run_at`` becomes now; it sleeps the seconds ``is_due`` returned (its
``max_interval`` only wakes it earlier, which changes no answer: ``is_due`` compares
now with the same next time). A new entry's ``last_run_at`` is the time beat starts.
"""

import importlib
import json
import sys
from datetime import datetime, timedelta
from typing import Any

from celery.schedules import maybe_schedule

from beat.config import BeatConfig
from beat.models import ScheduleDefinition
from beat.schedule import code as code_schedules
from beat.schedule import timing

#: Wake-ups stepped per fire time before giving up (one that never comes due).
MAX_WAKEUPS_PER_FIRE = 100


def celery_fires(app: Any, entry: dict[str, Any], start: datetime, count: int) -> list[datetime]:
    schedule = maybe_schedule(entry["schedule"], entry.get("relative", False), app=app)
    now = start
    schedule.nowfun = lambda: now.astimezone(schedule.tz)
    last_run_at = now
    fires: list[datetime] = []
    wakeups = 0
    while len(fires) < count and wakeups < MAX_WAKEUPS_PER_FIRE * count:
        wakeups += 1
        due, wait = schedule.is_due(last_run_at)
        if due:
            fires.append(now)
            last_run_at = now
        now = now + timedelta(seconds=wait)
    return fires


def our_fires(definition: ScheduleDefinition, start: datetime, count: int) -> list[datetime]:
    trigger = definition.trigger
    if isinstance(trigger, timing.Every):  # anchored where beat starts, as Celery's is
        trigger = timing.every(trigger.seconds, anchor=start)
    zone = timing.parse_zone(definition.timezone)
    fires: list[datetime] = []
    following = timing.next_fire_after(trigger, zone, start)
    while following is not None and len(fires) < count:
        fires.append(following)
        following = timing.next_fire_after(trigger, zone, following)
    return fires


def _second(moment: datetime) -> datetime:
    """To the second: Celery's sleeps are floats, its wake-ups off by microseconds."""
    return (moment + timedelta(microseconds=500_000)).replace(microsecond=0)


#: A difference this close to a change of the zone's UTC offset is one of the cases
#: the README's "Scheduling rules" documents (a skipped wall time, hour ``*`` on the
#: fall-back day); any other difference is not.
NEAR_DST = timedelta(hours=3)


def offset_changes(zone: Any, start: datetime, end: datetime) -> list[datetime]:
    """The instants between ``start`` and ``end`` where ``zone``'s UTC offset changes
    (found hour by hour: zones change on the hour or half hour, hours apart)."""
    changes = []
    moment = start.replace(minute=0, second=0, microsecond=0)
    while moment < end:
        following = moment + timedelta(minutes=30)
        if moment.astimezone(zone).utcoffset() != following.astimezone(zone).utcoffset():
            changes.append(following)
        moment = following
    return changes


def differences(
    celery: list[datetime], ours: list[datetime], zone: Any
) -> tuple[int, list[str], list[str]]:
    """Fire times compared (Celery's, up to where both lists reach), and those only one
    side has: at a DST change (documented), elsewhere (not)."""
    horizon = min(celery[-1], ours[-1])
    theirs = {moment for moment in celery if moment <= horizon}
    mine = {moment for moment in ours if moment <= horizon}
    changes = offset_changes(zone, min(celery[0], ours[0]) - NEAR_DST, horizon + NEAR_DST)
    documented, other = [], []
    for moment in sorted(theirs ^ mine):
        side = "celery only" if moment in theirs else "habeat only"
        line = f"{moment.isoformat()} {side}"
        near = any(abs(moment - change) <= NEAR_DST for change in changes)
        (documented if near else other).append(line)
    return len(theirs), documented, other


def compare(module: str, count: int, starts: list[datetime]) -> dict[str, Any]:
    app = importlib.import_module(module).app
    code_schedules.load_as_beat_does(app)
    config = BeatConfig.from_celery_conf(app.conf)
    definitions = {
        definition.name: definition
        for definition, _ in code_schedules.collect(app, default_tz=config.default_timezone)
    }
    entries: dict[str, Any] = {}
    for name, entry in app.conf.beat_schedule.items():
        definition = definitions[name]
        zone = timing.parse_zone(definition.timezone)
        result: dict[str, Any] = {"compared": 0, "at_dst": [], "elsewhere": []}
        for start in starts:
            theirs = [_second(f) for f in celery_fires(app, entry, start, count)]
            ours = [_second(f) for f in our_fires(definition, start, count)]
            if len(theirs) != count or len(ours) != count:
                result["elsewhere"].append(f"from {start}: {len(theirs)} against {len(ours)}")
                continue
            compared, documented, other = differences(theirs, ours, zone)
            result["compared"] += compared
            result["at_dst"] += documented
            result["elsewhere"] += other
        entries[name] = result
    zone_name = code_schedules.app_zone(app, config.default_timezone)
    return {"zone": zone_name, "celery_zone": str(app.timezone), "entries": entries}


if __name__ == "__main__":
    module, count, *instants = sys.argv[1:]
    starts = [datetime.fromisoformat(instant) for instant in instants]
    print(json.dumps(compare(module, int(count), starts)))
