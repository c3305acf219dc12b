"""An import's report as text (a line a schedule: what is done with it and why) and
as a JSON document."""

from __future__ import annotations

from typing import Any

from beat.ops.importing import ImportAction, ImportLine, ImportReport
from beat.ops.rendering import iso, table, time_text, trigger_text
from beat.ops.terminal import printable
from beat.schedule.timing import Cron

_COLUMNS = ("ACTION", "NAME", "TIMING", "NEXT FIRE (UTC)", "LAST RUN (UTC)", "RUNS", "WHY")


def import_text(report: ImportReport) -> str:
    """The heading, the table, and the totals."""
    changes = report.count(ImportAction.CREATE) + report.count(ImportAction.UPDATE)
    if report.dry_run:
        outcome = "dry run, nothing written"
    elif report.stopped:
        outcome = "stopped, nothing written"
    elif changes:
        outcome = "written in one transaction"
    else:
        outcome = "nothing to change"
    heading = f"import from {printable(report.source)} ({outcome})"
    rows = table(_COLUMNS, [_cells(line) for line in report.lines])
    return "\n".join([heading, rows, totals_text(report)])


def totals_text(report: ImportReport) -> str:
    done = report.written
    counts = [
        f"{report.count(ImportAction.CREATE)} {'created' if done else 'to create'}",
        f"{report.count(ImportAction.UPDATE)} {'updated' if done else 'to update'}",
        f"{report.count(ImportAction.UNCHANGED)} unchanged",
        f"{report.count(ImportAction.SKIP)} skipped",
        f"{report.count(ImportAction.CONFLICT)} in conflict",
        f"{report.count(ImportAction.REFUSE)} refused",
    ]
    return ", ".join(counts)


def stop_reasons(report: ImportReport) -> list[str]:
    """One line for each schedule that stops the import, naming the fix."""
    stopping = {ImportAction.CONFLICT}
    if not report.skip_invalid:
        stopping.add(ImportAction.REFUSE)
    return [
        f"{line.name} ({line.source_id}): {line.reason}"
        for line in report.lines
        if line.action in stopping
    ]


def _cells(line: ImportLine) -> tuple[str, ...]:
    schedule = line.schedule
    if schedule is None:
        return (line.action.value, line.name, "-", "-", "-", "-", line.reason)
    definition = schedule.definition
    timing = trigger_text(definition.trigger)
    if isinstance(definition.trigger, Cron):
        timing = f"{timing} in {definition.timezone}"
    return (
        line.action.value,
        line.name,
        timing if definition.enabled else f"{timing}, paused",
        time_text(schedule.next_fire_at),
        "-" if schedule.last_fire_at is None else time_text(schedule.last_fire_at),
        str(schedule.runs_count),
        line.reason,
    )


def import_document(report: ImportReport) -> dict[str, Any]:
    return {
        "source": report.source,
        "dry_run": report.dry_run,
        "written": report.written,
        "stopped": report.stopped,
        "schedules": [_line_document(line) for line in report.lines],
    }


def _line_document(line: ImportLine) -> dict[str, Any]:
    document: dict[str, Any] = {
        "action": line.action.value,
        "name": line.name,
        "source_id": line.source_id,
        "reason": line.reason,
    }
    schedule = line.schedule
    if schedule is not None:
        document |= {
            "timing": trigger_text(schedule.definition.trigger),
            "timezone": schedule.definition.timezone,
            "enabled": schedule.definition.enabled,
            "next_fire_at": iso(schedule.next_fire_at),
            "last_fire_at": iso(schedule.last_fire_at),
            "runs_count": schedule.runs_count,
        }
    return document
