"""A schedule definition as the flat document of the fields it sets: the columns
of ``beat_schedules`` that the store writes, and what a code schedule's hash is
taken of (``beat.schedule.code.definition_hash``). Pure."""

from __future__ import annotations

from typing import Any

from beat.models import ScheduleDefinition, TriggerKind
from beat.schedule.timing import Cron, Every, Trigger


def _trigger_values(trigger: Trigger) -> dict[str, Any]:
    blank: dict[str, Any] = {
        "cron": None,
        "cron_both_days": False,
        "every_seconds": None,
        "anchor_at": None,
        "run_at": None,
    }
    if isinstance(trigger, Cron):
        return blank | {
            "trigger_kind": TriggerKind.CRON.value,
            "cron": trigger.expression,
            "cron_both_days": trigger.both_days,
        }
    if isinstance(trigger, Every):
        return blank | {
            "trigger_kind": TriggerKind.EVERY.value,
            "every_seconds": trigger.seconds,
            "anchor_at": trigger.anchor,
        }
    return blank | {"trigger_kind": TriggerKind.ONCE.value, "run_at": trigger.at}


def definition_values(definition: ScheduleDefinition) -> dict[str, Any]:
    """The ``beat_schedules`` columns that a definition sets."""
    return _trigger_values(definition.trigger) | {
        "name": definition.name,
        "task": definition.task,
        "timezone": definition.timezone,
        "args": list(definition.args),
        "kwargs": definition.kwargs,
        "options": definition.options,
        "enabled": definition.enabled,
        "misfire_policy": definition.misfire_policy.value,
        "max_attempts": definition.max_attempts,
        "origin": definition.origin.value,
        "code_hash": None,
        "overlap_policy": definition.overlap_policy.value,
        "jitter_seconds": definition.jitter_seconds,
        "start_at": definition.start_at,
        "end_at": definition.end_at,
        "max_runs": definition.max_runs,
        "alert_after_failures": definition.alert_after_failures,
        "pause_after_failures": definition.pause_after_failures,
        "failure_states": None
        if definition.failure_states is None
        else list(definition.failure_states),
        "max_runtime_seconds": definition.max_runtime_seconds,
        "revoke_after_max_runtime": definition.revoke_after_max_runtime,
        "late_after_seconds": definition.late_after_seconds,
        "missed_after_seconds": definition.missed_after_seconds,
        "channels": None if definition.channels is None else list(definition.channels),
    }
