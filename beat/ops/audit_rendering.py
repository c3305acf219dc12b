"""Documents and text of the audit log (``schedules audit``, the UI's history tab)."""

from __future__ import annotations

import json
from typing import Any

from beat.ops.rendering import _truncate, iso, table, time_text
from beat.records import ScheduleChange

#: Characters of a value shown in a change's line of text.
VALUE_WIDTH = 60


def change_document(change: ScheduleChange) -> dict[str, Any]:
    return {
        "id": change.id,
        "schedule": change.schedule_name,
        "version": change.version,
        "changed_at": iso(change.changed_at),
        "action": change.action.value,
        "actor": change.actor,
        "entry": change.entry.value,
        "host": change.host,
        "address": change.address,
        "note": change.note,
        "changes": {
            field: {"before": before, "after": after}
            for field, (before, after) in change.differences.items()
        },
        "before": change.before,
        "after": change.after,
    }


def changes_text(changes: list[ScheduleChange]) -> str:
    if not changes:
        return "no changes recorded"
    rows = [
        (
            time_text(change.changed_at),
            change.schedule_name,
            f"v{change.version}",
            change.action.value,
            who_text(change),
            what_text(change),
        )
        for change in changes
    ]
    return table(("WHEN (UTC)", "SCHEDULE", "VERSION", "ACTION", "BY", "WHAT"), rows)


def who_text(change: ScheduleChange) -> str:
    """``alice (ui from 192.0.2.7)``, ``root (cli on build-3)``: the actor, the entry,
    and the client's address, or else the machine."""
    if change.address:
        where = f" from {change.address}"
    elif change.host:
        where = f" on {change.host}"
    else:
        where = ""
    return f"{change.actor} ({change.entry.value}{where})"


def what_text(change: ScheduleChange) -> str:
    """The fields a change made different, ``field: before -> after``, then its note."""
    if change.before is None and change.after is not None:
        parts = ["created"]
    elif change.after is None and change.before is not None:
        parts = ["removed"]
    else:
        parts = [
            f"{field}: {value_text(before)} -> {value_text(after)}"
            for field, (before, after) in change.differences.items()
        ]
    if change.note:
        parts.append(f"note: {change.note}")
    return _truncate("; ".join(parts), 400) if parts else "-"


def value_text(value: Any) -> str:
    """A field's value as JSON, cut to ``VALUE_WIDTH`` characters."""
    return _truncate(json.dumps(value, ensure_ascii=False), VALUE_WIDTH)
