"""Where an imported schedule goes on from: the fire time its source would use next.

Celery's schedules (and so the three sources) count from the last run: a crontab
fires at its first time after the last run, an interval ``run_every`` after it.
A fire time that passed while no beat ran is due at once, and an interval counts
on from that run, as the source's beat would do at its first tick. Storing that as
the schedule's next fire time is what keeps the cut-over exact: a schedule that ran
30 s ago does not fire again at once, and one due during the switch fires once.
Pure: the clock is the one given.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from beat.models import ScheduleDefinition
from beat.schedule.timing import Cron, Every, Once, next_fire_after, parse_zone


def continued(
    definition: ScheduleDefinition,
    *,
    last_run: datetime | None,
    now: datetime,
    not_before: datetime | None = None,
) -> tuple[ScheduleDefinition, datetime | None]:
    """The definition (an interval anchored at its next fire time) and the next fire
    time of a schedule whose source last ran it at ``last_run`` (None: never, so it is
    due now), and fires nothing before ``not_before`` (django-celery-beat's
    ``start_time``, at which an overdue schedule fires). None: it never fires again."""
    trigger = definition.trigger
    if isinstance(trigger, Once):
        return definition, trigger.at
    following = _following(definition, trigger, last_run, now)
    if following is None:
        return definition, None
    if not_before is not None and following < not_before:
        following = not_before
    following = max(following, now)
    if isinstance(trigger, Every):
        # Every fire time from here is a whole number of intervals after this one.
        definition = replace(definition, trigger=Every(seconds=trigger.seconds, anchor=following))
    if definition.end_at is not None and following > definition.end_at:
        return definition, None
    return definition, following


def _following(
    definition: ScheduleDefinition, trigger: Cron | Every, last_run: datetime | None, now: datetime
) -> datetime | None:
    if last_run is None:
        return now
    if isinstance(trigger, Every):
        return last_run + timedelta(seconds=trigger.seconds)
    return next_fire_after(trigger, parse_zone(definition.timezone), last_run)
