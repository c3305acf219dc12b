"""The due schedules a claim reads: the query that locks them, and each row read as a
schedule, or set aside for quarantine when its stored definition cannot be read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from sqlalchemy import Row, Text, func, or_, select

from beat.errors import error_text
from beat.models import DueSchedule, MisfirePolicy, OverlapPolicy, Quarantine
from beat.schedule.options import check_publish_options
from beat.schedule.payload import decoded_json, stored_payload
from beat.schedule.timing import Trigger, parse_zone
from beat.store.leader.base import _seconds
from beat.store.rows import (
    SCHEDULE_TIMES,
    finite,
    infinite_times,
    preview,
    stored_times_problem,
    trigger_from_row,
)
from beat.store.tables import schedules


def _due_query(batch: int) -> Any:
    """Due schedules (and, with ``:ahead`` seconds, those due that soon whose overlap
    policy is ``allow``), oldest first, locked, skipping rows locked elsewhere. The
    columns are in the order ``_due_from_row`` unpacks them."""
    ahead = func.now() + _seconds("ahead")
    return (
        select(
            schedules.c.id,
            schedules.c.name,
            schedules.c.task,
            schedules.c.trigger_kind,
            schedules.c.cron,
            schedules.c.cron_both_days,
            schedules.c.every_seconds,
            finite(schedules.c.anchor_at),
            finite(schedules.c.run_at),
            schedules.c.timezone,
            # As text: a value Python's json cannot read fails its row, not the claim.
            schedules.c.args.cast(Text).label("args"),
            schedules.c.kwargs.cast(Text).label("kwargs"),
            schedules.c.options.cast(Text).label("options"),
            schedules.c.misfire_policy,
            schedules.c.max_attempts,
            finite(schedules.c.next_fire_at),
            schedules.c.overlap_policy,
            schedules.c.jitter_seconds,
            finite(schedules.c.end_at),
            schedules.c.max_runs,
            schedules.c.runs_count,
            # Infinite times are read as NULL above, and quarantine the row.
            infinite_times(*SCHEDULE_TIMES),
        )
        .where(
            schedules.c.enabled,
            schedules.c.next_fire_at <= ahead,
            or_(
                schedules.c.next_fire_at <= func.now(),
                schedules.c.overlap_policy == OverlapPolicy.ALLOW.value,
            ),
        )
        .order_by(schedules.c.next_fire_at)
        .limit(batch)
        .with_for_update(skip_locked=True)
    )


def _due_from_row(row: Row[Any], triggers: dict[tuple[Any, ...], Trigger]) -> DueSchedule:
    """A due row as a schedule. A burst's rows mostly share their trigger (one cron for
    thousands of schedules): ``triggers`` keeps the one built for each trigger's
    columns, for the rows of one claim."""
    (
        schedule_id,
        name,
        task,
        *trigger_columns,
        timezone,
        args,
        kwargs,
        options,
        misfire_policy,
        max_attempts,
        next_fire_at,
        overlap_policy,
        jitter_seconds,
        end_at,
        max_runs,
        runs_count,
        infinite,
    ) = cast(tuple[Any, ...], row)
    stored_times_problem(infinite)
    key = tuple(trigger_columns)
    trigger = triggers.get(key)
    if trigger is None:
        trigger = triggers[key] = trigger_from_row(row)
    # A row written with psql may carry what the API refuses (args of 10 MB, options a
    # schedule may not have): it is quarantined.
    args, kwargs = stored_payload(args, kwargs)
    return DueSchedule(
        id=schedule_id,
        name=name,
        task=task,
        trigger=trigger,
        zone=parse_zone(timezone),
        args=args,
        kwargs=kwargs,
        options={} if options == "{}" else check_publish_options(decoded_json(options, "options")),
        misfire_policy=_MISFIRE_POLICIES.get(misfire_policy) or MisfirePolicy(misfire_policy),
        max_attempts=max_attempts,
        next_fire_at=next_fire_at,
        overlap_policy=_OVERLAP_POLICIES.get(overlap_policy) or OverlapPolicy(overlap_policy),
        jitter_seconds=jitter_seconds,
        end_at=end_at,
        max_runs=max_runs,
        runs_count=runs_count,
    )


#: The policies by their stored value (a look-up, cheaper than the enum's call; a value
#: not listed goes through the call, whose error names it).
_MISFIRE_POLICIES = {policy.value: policy for policy in MisfirePolicy}
_OVERLAP_POLICIES = {policy.value: policy for policy in OverlapPolicy}


def _due_schedules(rows: Sequence[Row[Any]]) -> tuple[list[DueSchedule], list[Quarantine]]:
    """The due rows as schedules, and those whose stored definition cannot be read
    (e.g. a zone or cron written with psql): each alone is quarantined."""
    due: list[DueSchedule] = []
    unreadable: list[Quarantine] = []
    triggers: dict[tuple[Any, ...], Trigger] = {}
    for row in rows:
        try:
            due.append(_due_from_row(row, triggers))
        except Exception as exc:  # bad data in one row must not stop every claim
            reason = preview(f"its stored definition cannot be read: {error_text(exc)}")
            unreadable.append(Quarantine(schedule_id=row.id, name=row.name, reason=reason))
    return due, unreadable
