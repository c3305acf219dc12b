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

Every datetime this package returns is aware and in UTC, and each is strictly
later than the instant it was asked about, so iterating ``next_fire_after`` on
its own results never repeats a fire time nor goes back. Naive datetimes are
refused. Instants past the end of the calendar (year 9999) are "no fire time".

The parts, each importing only the ones before it: ``wall_clock`` (the naive wall
times a cron expression matches), ``cron`` (parsing and validating expressions and
their fields), ``triggers`` (the triggers and the zone a schedule names), ``zones``
(wall times repeated or skipped by an offset change) and ``next_fire`` (fire times,
with the daylight saving time rules). Importers use the names re-exported here.
"""

from beat.schedule.timing.next_fire import fire_times, next_fire_after
from beat.schedule.timing.triggers import (
    MIN_INTERVAL_SECONDS,
    Cron,
    Every,
    Once,
    Trigger,
    every,
    once,
    parse_cron,
    parse_zone,
)

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
