"""Documents (JSON-ready dicts) and text of what the scheduler reports: schedules,
runs, the leader, health, and the results of commands.

Pure functions of the values :class:`beat.ops.schedules.Schedules` returns: no database,
no Redis, no clock. ``celery -A app schedules`` prints them (``--json`` prints the
documents); a web page may serve the same documents.

Times in documents are ISO 8601 with their offset; in text, UTC to the second.

Text goes to a terminal, and the values in it may come from anyone who can write a
row or a task's result: the CLI prints nothing but through :func:`printable`, which
escapes what a terminal would act on (an escape sequence, a bidi override, a line
break). Text of several lines keeps its own line breaks (:func:`terminal_text`), so
the values inside it are escaped where they are laid out: each table cell, each name
on a line of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import Any

from beat.models import FINISHED_STATES, Schedule, ScheduleDefinition
from beat.ops.health import ClusterStatus, Health
from beat.ops.monitor_rendering import monitor_settings
from beat.ops.schedules import (
    BeatProcess,
    ClusterOverview,
    OverdueSchedule,
    QueueBacklog,
    ScheduleDetails,
    ScheduleSummary,
    StoredSchedule,
    UnreadableSchedule,
    WorkerPresence,
)
from beat.ops.terminal import printable
from beat.records import RunRecord
from beat.schedule import timing
from beat.schedule.timing import Cron, Every, Once
from beat.schedule.workflow import WORKFLOW_TASK, described
from beat.store.code_sync import SyncReport
from beat.store.history import LastRun
from beat.store.leader import PruneReport

#: Longest error text in a table cell (the documents give it whole).
ERROR_WIDTH = 60
#: Longest problem of a row that cannot be read in a line of ``schedules list``.
PROBLEM_WIDTH = 100


# -- schedules: documents and text -----------------------------------------------------


def spec_text(schedule: StoredSchedule) -> str:
    if isinstance(schedule, UnreadableSchedule):
        return schedule.timing
    return trigger_text(schedule.definition.trigger)


def trigger_text(trigger: Cron | Every | Once) -> str:
    if isinstance(trigger, Cron):
        return f"cron {trigger.describe()}"
    if isinstance(trigger, Every):
        return f"every {trigger.seconds:g}s"
    assert isinstance(trigger, Once)
    return f"at {trigger.at.isoformat()}"


def schedule_document(schedule: StoredSchedule) -> dict[str, Any]:
    if isinstance(schedule, UnreadableSchedule):
        return unreadable_document(schedule)
    definition = schedule.definition
    return {
        "name": definition.name,
        "task": definition.task,
        "schedule": spec_text(schedule),
        "timezone": definition.timezone,
        "args": list(definition.args),
        "kwargs": definition.kwargs,
        "options": definition.options,
        "enabled": definition.enabled,
        "origin": definition.origin.value,
        "misfire_policy": definition.misfire_policy.value,
        "max_attempts": definition.max_attempts,
        "overlap_policy": definition.overlap_policy.value,
        "jitter_seconds": definition.jitter_seconds,
        "start_at": iso(definition.start_at),
        "end_at": iso(definition.end_at),
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
        "runs_count": schedule.runs_count,
        "disabled_reason": schedule.disabled_reason,
        "quarantined_at": iso(schedule.quarantined_at),
        "next_fire_at": iso(schedule.next_fire_at),
        "last_fire_at": iso(schedule.last_fire_at),
        "version": schedule.version,
        "problem": None,
    }


def enabled_text(schedule: StoredSchedule, *, with_reason: bool = False) -> str:
    if schedule.quarantined_at is not None:
        reason = f" since {time_text(schedule.quarantined_at)} UTC: {schedule.disabled_reason}"
        return "quarantined" + (reason if with_reason else "")
    enabled = (
        schedule.enabled
        if isinstance(schedule, UnreadableSchedule)
        else schedule.definition.enabled
    )
    if enabled:
        return "yes"
    # The scheduler's reason for a pause it made (a schedule failing in a row).
    return (
        f"paused: {schedule.disabled_reason}"
        if with_reason and schedule.disabled_reason
        else "paused"
    )


def _target_text(definition: ScheduleDefinition) -> str:
    """Its task, or its workflow in one line (the canvas in full is in its kwargs)."""
    if definition.task != WORKFLOW_TASK:
        return definition.task
    return f"{WORKFLOW_TASK}: {described(definition.kwargs)}"


def definition_text(schedule: Schedule) -> str:
    definition = schedule.definition
    rows = [
        ("name", definition.name),
        ("task", _target_text(definition)),
        ("schedule", spec_text(schedule)),
        ("zone", definition.timezone),
        ("enabled", enabled_text(schedule, with_reason=True)),
        ("origin", _origin_text(schedule)),
        *([("description", schedule.description)] if schedule.description else []),
        ("args", json.dumps(list(definition.args))),
        ("kwargs", json.dumps(definition.kwargs)),
        ("options", json.dumps(definition.options)),
        ("misfire policy", definition.misfire_policy.value),
        ("max attempts", str(definition.max_attempts)),
        *monitor_settings(definition),
        ("next fire", f"{time_text(schedule.next_fire_at)} UTC"),
        ("last fire", f"{time_text(schedule.last_fire_at)} UTC" if schedule.last_fire_at else "-"),
        ("created", f"{time_text(schedule.created_at)} UTC"),
        ("updated", f"{time_text(schedule.updated_at)} UTC"),
    ]
    return table(("", ""), rows, show_header=False)


def _origin_text(schedule: Schedule) -> str:
    origin = schedule.definition.origin.value
    if schedule.source is None:
        return origin
    return f"{origin}, imported from {schedule.source} {schedule.source_id}"


def upcoming_text(schedule: Schedule, upcoming: Sequence[datetime]) -> str:
    zone_name = schedule.definition.timezone
    title = "next fire times" + ("" if schedule.definition.enabled else " (if resumed now)")
    if not upcoming:
        return f"{title}: none (a one-off that has fired)"
    zone = timing.parse_zone(zone_name)
    rows = [
        (moment.astimezone(zone).strftime("%Y-%m-%d %H:%M:%S %Z"), time_text(moment))
        for moment in upcoming
    ]
    return f"{title}\n" + table((zone_name, "UTC"), rows, indent="  ")


def details_document(details: ScheduleDetails) -> dict[str, Any]:
    """A schedule's document, with its next fire times (UTC and in its zone) and its
    latest runs."""
    if isinstance(details.schedule, UnreadableSchedule):
        recent = {"upcoming": [], "recent_runs": runs_document(details.recent_runs)}
        return unreadable_document(details.schedule) | recent
    zone = timing.parse_zone(details.schedule.definition.timezone)
    return schedule_document(details.schedule) | {
        "upcoming": [
            {"utc": iso(moment), "local": iso(moment.astimezone(zone))}
            for moment in details.upcoming
        ],
        "recent_runs": runs_document(details.recent_runs),
    }


def details_text(details: ScheduleDetails) -> str:
    """A schedule's definition, next fire times and latest runs."""
    recent = details.recent_runs
    if isinstance(details.schedule, UnreadableSchedule):
        first = [unreadable_text(details.schedule)]
    else:
        first = [
            definition_text(details.schedule),
            "",
            upcoming_text(details.schedule, details.upcoming),
        ]
    parts = [
        *first,
        "",
        f"latest runs ({len(recent)})",
    ]
    if recent:
        parts.append(runs_table(recent))
    return "\n".join(parts)


def summaries_document(found: Sequence[ScheduleSummary]) -> list[dict[str, Any]]:
    return [
        schedule_document(s.schedule) | {"last_run": last_run_document(s.last_run)} for s in found
    ]


def summaries_table(found: Sequence[ScheduleSummary]) -> str:
    rows = [_summary_row(s) for s in found]
    header = ("NAME", "TASK", "SCHEDULE", "ZONE", "ENABLED", "NEXT FIRE (UTC)", "LAST RUN")
    return table(header, rows)


# -- schedules whose rows cannot be read -------------------------------------------------


def unreadable_document(schedule: UnreadableSchedule) -> dict[str, Any]:
    """The document of a row that cannot be read: its values as stored (text, cut), and
    its problem in place of its fire times."""
    return {
        "name": schedule.name,
        "task": schedule.task,
        "schedule": schedule.timing,
        "timezone": schedule.timezone,
        "args": schedule.args,
        "kwargs": schedule.kwargs,
        "options": schedule.options,
        "enabled": schedule.enabled,
        "origin": schedule.origin.value,
        "runs_count": schedule.runs_count,
        "disabled_reason": schedule.disabled_reason,
        "quarantined_at": iso(schedule.quarantined_at),
        "next_fire_at": iso(schedule.next_fire_at),
        "last_fire_at": iso(schedule.last_fire_at),
        "problem": schedule.problem,
    }


def _summary_row(summary: ScheduleSummary) -> tuple[str, ...]:
    """A row of ``schedules list``: a row that cannot be read has its problem in place
    of its next fire time."""
    schedule = summary.schedule
    last = "-" if summary.last_run is None else summary.last_run.state.value
    if isinstance(schedule, UnreadableSchedule):
        problem = _truncate(f"unreadable: {schedule.problem}", PROBLEM_WIDTH)
        return (
            schedule.name,
            schedule.task,
            schedule.timing,
            schedule.timezone,
            enabled_text(schedule),
            problem,
            last,
        )
    definition = schedule.definition
    return (
        schedule.name,
        definition.task,
        spec_text(schedule),
        definition.timezone,
        enabled_text(schedule),
        time_text(schedule.next_fire_at),
        last,
    )


def unreadable_text(schedule: UnreadableSchedule) -> str:
    rows = [
        ("name", schedule.name),
        ("task", schedule.task),
        ("schedule", schedule.timing),
        ("zone", schedule.timezone),
        ("enabled", enabled_text(schedule, with_reason=True)),
        ("problem", f"its row cannot be read: {schedule.problem}"),
    ]
    return table(("", ""), rows, show_header=False)


def sync_document(report: SyncReport) -> dict[str, Any]:
    return asdict(report)


def sync_text(synced: int, report: SyncReport) -> str:
    """What a sync of ``synced`` code schedules did: counts, then one line a change."""
    lines = [
        f"synced {synced} code schedules: {len(report.created)} created,"
        f" {len(report.updated)} updated, {len(report.unchanged)} unchanged,"
        f" {len(report.removed)} removed"
    ]
    for outcome in ("created", "updated", "removed"):
        lines.extend(f"  {outcome} {printable(name)}" for name in getattr(report, outcome))
    return "\n".join(lines)


def sync_conflicts(report: SyncReport) -> list[str]:
    """One warning a code schedule not synced because of a runtime schedule's name."""
    return [
        f"code schedule {name} not synced: a schedule created at runtime"
        " has that name (rename one of them)"
        for name in report.conflicts
    ]


# -- runs: documents and text ----------------------------------------------------------


def run_document(run: RunRecord) -> dict[str, Any]:
    lateness = run.lateness
    return {
        "id": str(run.id),
        "schedule": run.schedule_name,
        "task": run.task,
        "state": run.state.value,
        "fire_at": iso(run.fire_at),
        "claimed_at": iso(run.claimed_at),
        "published_at": iso(run.published_at),
        "started_at": iso(run.started_at),
        "finished_at": iso(run.finished_at),
        "lateness_seconds": None if lateness is None else lateness.total_seconds(),
        "duration_seconds": run.duration_seconds,
        "worker": run.worker,
        "attempt": run.attempt,
        "max_attempts": run.max_attempts,
        "retries": run.retries,
        "duplicate_deliveries": run.duplicate_deliveries,
        "epoch": run.epoch,
        "reason": run.reason,
        "error": run.error,
        "args": run.args,
        "kwargs": run.kwargs,
    }


def runs_document(found: Sequence[RunRecord]) -> list[dict[str, Any]]:
    return [run_document(run) for run in found]


def last_run_document(last: LastRun | None) -> dict[str, Any] | None:
    if last is None:
        return None
    return {"id": str(last.id), "state": last.state.value, "fire_at": iso(last.fire_at)}


def runs_table(found: Sequence[RunRecord]) -> str:
    header = (
        "RUN ID",
        "SCHEDULE",
        "FIRE TIME (UTC)",
        "PUBLISHED",
        "STARTED",
        "FINISHED",
        "LATENESS",
        "WORKER",
        "ATTEMPT",
        "STATE",
        "ERROR",
    )
    rows = [
        (
            str(run.id),
            run.schedule_name or "-",
            time_text(run.fire_at) if run.fire_at else "-",
            _time_near(run.published_at, run.fire_at),
            _time_near(run.started_at, run.fire_at),
            _time_near(run.finished_at, run.fire_at),
            "-" if run.lateness is None else duration_text(run.lateness),
            run.worker or "-",
            f"{run.attempt}/{run.max_attempts}",
            run.state.value,
            _truncate(run.error or run.reason or ""),
        )
        for run in found
    ]
    return table(header, rows)


def prune_document(report: PruneReport) -> dict[str, Any]:
    return {
        "deleted": report.deleted,
        "batches": report.batches,
        "incidents": report.incidents,
        "notifications": report.notifications,
        "changes": report.changes,
        "cutoff": iso(report.cutoff),
        "states": [state.value for state in FINISHED_STATES],
    }


def prune_text(report: PruneReport, batch: int) -> str:
    return (
        f"deleted {report.deleted} finished runs older than {time_text(report.cutoff)} UTC"
        f" ({report.batches} batches of at most {batch}), {report.incidents} incidents"
        f" resolved, {report.notifications} notifications sent or given up and"
        f" {report.changes} changes of the audit log made before it"
    )


# -- the leader and health: documents and text -----------------------------------------


def leader_document(status: ClusterStatus) -> dict[str, Any]:
    info, lease = status.leader, status.lease
    return {
        "leader": None
        if info is None
        else {"holder": info.holder, "epoch": info.epoch, "since": iso(info.acquired_at)},
        "lease": {
            "key": lease.key,
            "holder": lease.holder,
            "expires_in_seconds": None if lease.ttl_ms is None else lease.ttl_ms / 1000,
        },
        "valid": status.valid,
    }


def leader_text(status: ClusterStatus) -> str:
    info, lease = status.leader, status.lease
    rows: list[tuple[str, str]] = []
    if info is None:
        rows.append(("leader", "none has ever led (no leader row)"))
    else:
        held_for = duration_text(status.now - info.acquired_at)
        rows += [
            ("holder", info.holder),
            ("epoch", str(info.epoch)),
            ("since", f"{time_text(info.acquired_at)} UTC ({held_for} ago)"),
        ]
    if lease.holder is None:
        rows.append(("lease", f"free: nobody holds {lease.key}"))
    else:
        expiry = "no expiry" if lease.ttl_ms is None else f"expires in {lease.ttl_ms / 1000:.1f}s"
        rows.append(("lease", f"{lease.key} held by {lease.holder}, {expiry}"))
    rows.append(("status", status.status))
    return table(("", ""), rows, show_header=False)


def health_document(health: Health) -> dict[str, Any]:
    return {
        "healthy": health.ok,
        "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in health.checks},
    }


def health_lines(health: Health) -> list[tuple[bool, str]]:
    """One line a check, and whether it passed (a failed one is an ``Error:`` line,
    for stderr)."""
    width = max(len(check.name) for check in health.checks)
    return [
        (True, f"ok  {check.name:<{width}}  {check.detail}")
        if check.ok
        else (False, f"Error: {check.name}: {check.detail}")
        for check in health.checks
    ]


def cluster_document(overview: ClusterOverview) -> dict[str, Any]:
    """The cluster page's document: who leads (``leader_document``; None when it could
    not be read), the beat processes, the workers, the overdue schedules, the stuck
    queues, and what could not be read."""
    status = overview.status
    leader = None if status is None else status.lease.holder
    return {
        "status": None
        if status is None
        else leader_document(status) | {"detail": status.status, "now": iso(status.now)},
        "beats": [beat_document(beat, leader) for beat in overview.beats],
        "workers": [worker_document(worker) for worker in overview.workers],
        "overdue": {
            "total": overview.overdue_total,
            "schedules": [overdue_document(entry) for entry in overview.overdue],
        },
        "stuck_queues": [backlog_document(backlog) for backlog in overview.stuck_queues],
        "problems": list(overview.problems),
    }


def beat_document(beat: BeatProcess, leader: str | None) -> dict[str, Any]:
    """A beat process; ``leading``: it holds the lease (None when the lease is not known)."""
    return {
        "holder": beat.holder,
        "leading": None if leader is None else beat.holder == leader,
        "host": beat.host,
        "pid": beat.pid,
        "version": beat.version,
        "started_at": iso(beat.started_at),
        "seen_at": iso(beat.seen_at),
        "expires_at": iso(beat.expires_at),
    }


def worker_document(worker: WorkerPresence) -> dict[str, Any]:
    return {
        "name": worker.name,
        "pid": worker.pid,
        "booted_at": iso(worker.booted_at),
        "seen_at": iso(worker.seen_at),
    }


def overdue_document(entry: OverdueSchedule) -> dict[str, Any]:
    return {
        "name": entry.name,
        "next_fire_at": iso(entry.next_fire_at),
        "overdue_seconds": entry.overdue_by.total_seconds(),
    }


def backlog_document(backlog: QueueBacklog) -> dict[str, Any]:
    return {
        "queue": backlog.queue,
        "waiting": backlog.waiting,
        "oldest_published_at": iso(backlog.oldest_published_at),
    }


# -- formatting ------------------------------------------------------------------------


def iso(moment: datetime | None) -> str | None:
    """ISO 8601 with the offset, for documents."""
    return None if moment is None else moment.isoformat()


def time_text(moment: datetime | None) -> str:
    """UTC to the second, for text; ``finished`` for none (a schedule that fires no more)."""
    return "finished" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _time_near(moment: datetime | None, reference: datetime | None) -> str:
    """A time of day when it falls on the reference's (UTC) day, else date and time."""
    if moment is None:
        return "-"
    moment = moment.astimezone(UTC)
    if reference is not None and reference.astimezone(UTC).date() == moment.date():
        return moment.strftime("%H:%M:%S.%f")[:-3]
    return time_text(moment)


def duration_text(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    if seconds < 60:
        return f"{sign}{seconds:.3f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{sign}{hours}h{minutes:02d}m"
    return f"{sign}{hours // 24}d{hours % 24:02d}h"


def _truncate(text: str, width: int = ERROR_WIDTH) -> str:
    """One line of ``width`` at most: whitespace runs (a traceback's line breaks) become
    one space, the rest is escaped, then cut."""
    line = printable(" ".join(text.split()))
    return line if len(line) <= width else line[: width - 3] + "..."


def table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    show_header: bool = True,
    indent: str = "",
) -> str:
    lines = [
        [printable(str(cell)) for cell in row]
        for row in ([columns, *rows] if show_header else rows)
    ]
    if not lines:
        return ""
    widths = [max(len(str(cell)) for cell in column) for column in zip(*lines, strict=True)]
    return "\n".join(indent + _aligned(row, widths) for row in lines)


def _aligned(row: Sequence[str], widths: Sequence[int]) -> str:
    cells = (str(cell).ljust(width) for cell, width in zip(row, widths, strict=True))
    return "  ".join(cells).rstrip()
