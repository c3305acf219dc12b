"""A schedule's monitor settings for people (``beat.monitors``): ``schedules show`` and
the UI's schedule page list the same (label, text) pairs, so a setting added here
appears in both."""

from __future__ import annotations

from beat.models import ScheduleDefinition
from beat.monitors.timing import span_text


def threshold_text(failures: int | None) -> str:
    """A failing monitor's threshold, for people."""
    if failures is None:
        return "the cluster's default"
    if failures == 0:
        return "never"
    return f"{failures} failures in a row"


def monitor_settings(definition: ScheduleDefinition) -> list[tuple[str, str]]:
    """A schedule's monitor settings as (label, text), for people: ``show`` and the UI's
    schedule page both list these, so a setting added here appears in both."""
    return [
        ("alert after", threshold_text(definition.alert_after_failures)),
        ("pause after", threshold_text(definition.pause_after_failures)),
        ("failures", ", ".join(definition.failure_states or ("failed", "lost", "expired"))),
        ("max runtime", _max_runtime_text(definition)),
        ("late after", _monitor_seconds_text(definition.late_after_seconds)),
        ("missed after", _monitor_seconds_text(definition.missed_after_seconds)),
        (
            "channels",
            "every channel" if definition.channels is None else ", ".join(definition.channels),
        ),
    ]


def _monitor_seconds_text(seconds: float | None) -> str:
    return "-" if seconds is None else span_text(seconds)


def _max_runtime_text(definition: ScheduleDefinition) -> str:
    told = _monitor_seconds_text(definition.max_runtime_seconds)
    return f"{told}, then revoked" if definition.revoke_after_max_runtime else told
