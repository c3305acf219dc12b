"""The way back: schedules written out as Celery's ``beat_schedule`` (Python to paste
in a settings module, or JSON), for a rollback to ``celery beat``. What celery beat
cannot express (a one-off, a paused schedule, a cron with seconds, this scheduler's
own rules) is left out or noted, each with the reason, never changed silently."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from beat.models import MisfirePolicy, OverlapPolicy, Schedule
from beat.schedule.timing import Cron, Every
from beat.store.stored_schedules import StoredSchedule


class ExportFormat(enum.StrEnum):
    PYTHON = "python"
    JSON = "json"


#: Celery's crontab arguments in cron's field order.
_CRONTAB_ARGUMENTS = ("minute", "hour", "day_of_month", "month_of_year", "day_of_week")


@dataclass(frozen=True, kw_only=True, slots=True)
class Export:
    """The ``beat_schedule`` entries, with the schedules left out and the notes on
    what an entry loses, each ``(name, reason)``."""

    entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)


def export_beat_schedule(found: Sequence[StoredSchedule], app_zone: str) -> Export:
    """``found`` as ``beat_schedule`` entries of an app whose zone is ``app_zone`` (the
    zone celery beat reads every crontab in). An entry's ``schedule`` is
    ``{"crontab": {...}}`` or ``{"every": seconds}``."""
    export = Export()
    for schedule in found:
        reason = _left_out_reason(schedule)
        if reason is not None:
            export.left_out.append((schedule.name, reason))
            continue
        assert isinstance(schedule, Schedule)
        export.entries[schedule.name] = _entry(schedule)
        export.notes.extend((schedule.name, note) for note in _losses(schedule, app_zone))
    return export


def _left_out_reason(schedule: StoredSchedule) -> str | None:
    if not isinstance(schedule, Schedule):
        return f"its row cannot be read ({schedule.problem})"
    trigger = schedule.definition.trigger
    if not schedule.definition.enabled:
        return "paused (celery beat has no paused entries): add it back when it resumes"
    if isinstance(trigger, Cron) and len(trigger.expression.split()) == 6:
        return "its cron has seconds, which Celery's crontab has not"
    if not isinstance(trigger, Cron | Every):
        return "a one-off: celery beat has none (send it with apply_async(eta=...))"
    return None


def _entry(schedule: Schedule) -> dict[str, Any]:
    definition = schedule.definition
    trigger = definition.trigger
    timing: dict[str, Any]
    if isinstance(trigger, Cron):
        fields = trigger.expression.split()
        timing = {"crontab": dict(zip(_CRONTAB_ARGUMENTS, fields, strict=True))}
    else:
        assert isinstance(trigger, Every)
        timing = {"every": trigger.seconds}
    entry: dict[str, Any] = {"task": definition.task, "schedule": timing}
    if definition.args:
        entry["args"] = list(definition.args)
    if definition.kwargs:
        entry["kwargs"] = definition.kwargs
    if definition.options:
        entry["options"] = definition.options
    return entry


def _losses(schedule: Schedule, app_zone: str) -> list[str]:
    """What celery beat will do differently with the entry."""
    definition = schedule.definition
    trigger = definition.trigger
    losses = []
    if isinstance(trigger, Cron):
        if definition.timezone != app_zone:
            losses.append(
                f"its cron is read in {definition.timezone}, celery beat reads it in the app's"
                f" zone {app_zone}"
            )
        fields = trigger.expression.split()
        if not trigger.both_days and "*" not in (fields[2], fields[4]):
            losses.append("Celery's crontab needs both day fields to match, cron either")
    if definition.start_at or definition.end_at or definition.max_runs:
        losses.append("its window (start_at, end_at, max_runs) is not kept")
    if definition.jitter_seconds:
        losses.append("its jitter is not kept")
    if definition.overlap_policy is not OverlapPolicy.ALLOW:
        losses.append(f"its overlap policy {definition.overlap_policy.value} is not kept")
    if (
        definition.alert_after_failures is not None
        or definition.pause_after_failures is not None
        or definition.failure_states is not None
    ):
        losses.append("its failing monitor (alert and pause after failures) is not kept")
    if any(
        seconds is not None
        for seconds in (
            definition.max_runtime_seconds,
            definition.late_after_seconds,
            definition.missed_after_seconds,
        )
    ):
        losses.append("its run monitors (max_runtime, late_after, missed_after) are not kept")
    if definition.misfire_policy is not MisfirePolicy.FIRE_ONCE:
        losses.append(f"its misfire policy {definition.misfire_policy.value} is not kept")
    return losses


def export_json(export: Export) -> str:
    document = {
        "beat_schedule": export.entries,
        "left_out": [{"name": name, "reason": reason} for name, reason in export.left_out],
        "notes": [{"name": name, "note": note} for name, note in export.notes],
    }
    return json.dumps(document, indent=2)


def export_python(export: Export) -> str:
    """A module defining ``beat_schedule``, for the app's configuration."""
    lines = [
        '"""beat_schedule exported by `celery -A app schedules export`."""',
        "",
        "from datetime import timedelta",
        "",
        "from celery.schedules import crontab",
        "",
    ]
    lines += [f"# {name}: {note}" for name, note in export.notes]
    lines += [f"# left out {name}: {reason}" for name, reason in export.left_out]
    lines.append("beat_schedule = {")
    for name, entry in export.entries.items():
        lines.append(f"    {name!r}: {{")
        lines.append(f"        'task': {entry['task']!r},")
        lines.append(f"        'schedule': {_python_schedule(entry['schedule'])},")
        for key in ("args", "kwargs", "options"):
            if key in entry:
                lines.append(f"        {key!r}: {entry[key]!r},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines)


def _python_schedule(timing: dict[str, Any]) -> str:
    if "every" in timing:
        return f"timedelta(seconds={timing['every']!r})"
    fields = ", ".join(f"{key}={value!r}" for key, value in timing["crontab"].items())
    return f"crontab({fields})"
