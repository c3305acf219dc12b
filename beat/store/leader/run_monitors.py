"""The run monitors' pass, fenced: the leader reads the runs running past their
schedule's ``max_runtime``, and the newest fire times of the schedules with a
``late_after`` or ``missed_after``, and opens, updates and resolves their incidents as
``beat.monitors.timing`` decides, in one transaction with their notifications.

A run past its ``max_runtime`` whose schedule says ``revoke_after_max_runtime`` ends
``failed`` in this transaction, before anyone is told to terminate it: from then on no
lease, reaper or redelivery can start it again, and its worker's outcome is not
recorded over it. The leader broadcasts the revoke once the transaction committed
(``RunMonitorReport.revoke``); a leader that dies in between leaves the run to end on
its own, never to run twice.

Every time is the database's. At most ``BATCH`` runs and ``BATCH`` schedules a pass
(schedules with a ``late_after`` or ``missed_after`` beyond it are taken at random, so
each is looked at within a few passes).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Row, Text, bindparam, cast, func, text, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from beat.models import IncidentKind, NotificationEvent, RunState
from beat.monitors import timing
from beat.store.leader.base import FencedStore
from beat.store.leader.incident_writes import open_incident, resolve_incident
from beat.store.leader.notifications import notify_incident
from beat.store.operator_runs import BACKFILL_REASON, TRIGGER_REASON
from beat.store.tables import incidents, runs

#: Most runs, and most schedules, one pass looks at.
BATCH = 500
#: Longest finding kept on an incident.
FINDING_CHARS = 500

_KINDS = (IncidentKind.OVERRAN, IncidentKind.LATE, IncidentKind.MISSED)
_FINISHED = ", ".join(f"'{state}'" for state in ("succeeded", "failed", "lost", "expired"))


@dataclass(kw_only=True, slots=True)
class RunMonitorReport:
    """What one pass did: incidents opened and resolved, by schedule name and kind."""

    opened: list[tuple[str, IncidentKind]] = field(default_factory=list)
    resolved: list[tuple[str, IncidentKind]] = field(default_factory=list)
    #: The task IDs of the runs this pass ended because they ran past their
    #: ``max_runtime``: the leader asks the workers to terminate them.
    revoke: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Open:
    id: int
    count: int
    text: str | None


class RunMonitorStatements(FencedStore):
    """The run monitors' pass (``beat.monitors.timing``)."""

    def watch_runs(self, epoch: int, *, idle_timeout: float) -> RunMonitorReport:
        """One pass of the run monitors as leader ``epoch``; StaleEpoch if a newer
        leader exists (nothing written)."""
        report = RunMonitorReport()
        with self._transaction() as conn:
            now = self._fence(conn, epoch, idle_timeout)
            writer = _Incidents(
                conn=conn,
                epoch=epoch,
                now=now,
                cluster=self.leader_name,
                report=report,
                open=_open_incidents(conn),
            )
            _watch_overruns(conn, writer)
            _watch_fire_times(conn, writer, now)
            writer.resolve_orphans()
        return report


def _watch_overruns(conn: Connection, writer: _Incidents) -> None:
    """The overran monitor: each schedule with runs past its ``max_runtime`` has its
    incident (those it revokes end ``failed`` first); the others with one open resolve."""
    found = conn.execute(text(_OVERRUNS_SQL), {"batch": BATCH}).all()
    by_schedule: dict[int, list[Row[Any]]] = defaultdict(list)
    for row in found:
        by_schedule[row.schedule_id].append(row)
    for schedule_id, rows in by_schedule.items():
        first = rows[0]
        revoked = first.revoke_after_max_runtime and _end_revoked(conn, rows, writer.report)
        overruns = [
            timing.Overrun(run_id=row.run_id, fire_at=row.fire_at, running_for=row.running_for)
            for row in rows
        ]
        verdict = timing.overran(overruns, first.max_runtime_seconds, revoked=revoked)
        writer.apply(schedule_id, first.name, IncidentKind.OVERRAN, verdict)
    if len(found) < BATCH:  # every overrun was read: the schedules without one have none
        cleared = timing.overran([], 0.0, revoked=False)
        for schedule_id, name in writer.open_of(IncidentKind.OVERRAN):
            if schedule_id not in by_schedule:
                writer.apply(schedule_id, name, IncidentKind.OVERRAN, cleared)


def _end_revoked(conn: Connection, rows: list[Row[Any]], report: RunMonitorReport) -> bool:
    """End ``failed`` the runs still running of those past ``max_runtime``; their task
    IDs go to the report, to be revoked once this transaction commits."""
    limit = timing.span_text(rows[0].max_runtime_seconds)
    ended = conn.execute(
        update(runs)
        .where(
            runs.c.id == func.any(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
            runs.c.state == RunState.RUNNING.value,
        )
        .values(
            state=RunState.FAILED.value,
            error=f"revoked: it ran past its max_runtime of {limit}",
            finished_at=func.now(),
            lease_owner=None,
            lease_expires_at=None,
            duration_seconds=func.extract("epoch", func.now() - runs.c.started_at),
        )
        .returning(func.coalesce(runs.c.task_id, cast(runs.c.id, Text))),
        {"ids": [row.run_id for row in rows]},
    ).scalars()
    task_ids = list(ended)
    report.revoke.extend(task_ids)
    return bool(task_ids)


def _watch_fire_times(conn: Connection, writer: _Incidents, now: datetime) -> None:
    """The late and missed monitors, on the schedules that have them."""
    found = conn.execute(
        text(_FIRE_TIMES_SQL),
        {"batch": BATCH, "operator_reasons": [TRIGGER_REASON, BACKFILL_REASON]},
    ).all()
    for row in found:
        late, missed = _verdicts(row, now)
        writer.apply(row.id, row.name, IncidentKind.LATE, late)
        writer.apply(row.id, row.name, IncidentKind.MISSED, missed)


def _verdicts(row: Row[Any], now: datetime) -> tuple[timing.Verdict, timing.Verdict]:
    late: timing.Verdict = timing.Cleared(resolution="its late monitor was turned off")
    if row.late_after_seconds is not None:
        started = None
        if row.late_fire_at is not None:
            started = timing.StartFacts(
                fire_at=row.late_fire_at,
                state=row.late_state,
                started_at=row.late_started_at,
                finished_at=row.late_finished_at,
            )
        late = timing.late(started, row.late_after_seconds, now=now)
    missed: timing.Verdict = timing.Cleared(resolution="its missed monitor was turned off")
    if row.missed_after_seconds is not None:
        missed = timing.missed(_fire_facts(row), row.missed_after_seconds, enabled=row.enabled)
    return late, missed


def _fire_facts(row: Row[Any]) -> timing.FireFacts | None:
    if row.unclaimed_fire_at is not None:
        return timing.FireFacts(fire_at=row.unclaimed_fire_at)
    if row.missed_fire_at is None:
        return None
    return timing.FireFacts(
        fire_at=row.missed_fire_at,
        claimed_at=row.missed_claimed_at,
        state=row.missed_state,
        reason=row.missed_reason,
        sent=row.missed_sent,
    )


def _open_incidents(conn: Connection) -> dict[tuple[int | None, IncidentKind], list[Any]]:
    """The open incidents of the run monitors' kinds, by schedule and kind."""
    rows = conn.execute(
        text(
            "SELECT id, schedule_id, schedule_name, kind, failures, last_error"
            " FROM beat_incidents WHERE resolved_at IS NULL AND kind = ANY(:kinds)"
        ),
        {"kinds": [kind.value for kind in _KINDS]},
    ).all()
    found: dict[tuple[int | None, IncidentKind], list[Any]] = defaultdict(list)
    for row in rows:
        found[(row.schedule_id, IncidentKind(row.kind))].append(row)
    return found


@dataclass(kw_only=True)
class _Incidents:
    """The run monitors' incidents in one pass's transaction, as leader ``epoch`` at
    database time ``now``: each verdict applied, each event's notifications written in
    the same transaction."""

    conn: Connection
    epoch: int
    now: datetime
    cluster: str
    report: RunMonitorReport
    open: dict[tuple[int | None, IncidentKind], list[Any]]

    def open_of(self, kind: IncidentKind) -> list[tuple[int, str]]:
        return [
            (schedule_id, rows[0].schedule_name)
            for (schedule_id, of_kind), rows in self.open.items()
            if of_kind is kind and schedule_id is not None
        ]

    def apply(
        self, schedule_id: int, name: str, kind: IncidentKind, verdict: timing.Verdict
    ) -> None:
        current = next(iter(self.open.get((schedule_id, kind), ())), None)
        if isinstance(verdict, timing.Finding):
            finding = verdict.text[:FINDING_CHARS]
            if current is None:
                self._open(schedule_id, name, kind, verdict, finding)
            elif (current.failures, current.last_error) != (verdict.count, finding):
                self.conn.execute(
                    update(incidents)
                    .where(incidents.c.id == current.id)
                    .values(failures=verdict.count, last_error=finding)
                )
        elif isinstance(verdict, timing.Cleared) and current is not None:
            self._resolve(current.id, (schedule_id, name), kind, verdict.resolution)

    def resolve_orphans(self) -> None:
        """Resolve the open incidents of schedules removed since."""
        for (schedule_id, kind), rows in self.open.items():
            if schedule_id is None:
                for row in rows:
                    self._resolve(
                        row.id, (None, row.schedule_name), kind, "its schedule was removed"
                    )

    def _open(
        self,
        schedule_id: int,
        name: str,
        kind: IncidentKind,
        finding: timing.Finding,
        text_: str,
    ) -> None:
        incident_id = open_incident(
            self.conn,
            schedule=(schedule_id, name),
            kind=kind,
            epoch=self.epoch,
            count=finding.count,
            first_at=finding.first_fire_at,
            finding=text_,
        )
        if incident_id is None:
            return  # one is open already (this pass holds the fence: none should be)
        self.report.opened.append((name, kind))
        self._notify(NotificationEvent.OPENED, incident_id, (schedule_id, name), kind, detail=text_)

    def _resolve(
        self,
        incident_id: int,
        schedule: tuple[int | None, str],
        kind: IncidentKind,
        resolution: str,
    ) -> None:
        resolve_incident(self.conn, incident_id, resolution)
        self.report.resolved.append((schedule[1], kind))
        self._notify(NotificationEvent.RESOLVED, incident_id, schedule, kind, resolution=resolution)

    def _notify(
        self,
        event: NotificationEvent,
        incident_id: int,
        schedule: tuple[int | None, str],
        kind: IncidentKind,
        *,
        detail: str | None = None,
        resolution: str | None = None,
    ) -> None:
        schedule_id, name = schedule
        notify_incident(
            self.conn,
            event,
            cluster=self.cluster,
            incident_id=incident_id,
            schedule=name,
            schedule_id=schedule_id,
            kind=kind,
            at=self.now,
            resolution=resolution,
            detail=detail,
        )


#: The runs running past their schedule's max_runtime, by the database's clock, longest
#: first (the partial index of running runs holds the few running now).
_OVERRUNS_SQL = """
SELECT s.id AS schedule_id, s.name, s.max_runtime_seconds, s.revoke_after_max_runtime,
       r.id AS run_id, r.fire_at,
       extract(epoch FROM now() - r.started_at)::float8 AS running_for
FROM beat_runs AS r
JOIN beat_schedules AS s ON s.id = r.schedule_id
WHERE r.state = 'running'
  AND r.started_at IS NOT NULL
  AND s.max_runtime_seconds IS NOT NULL
  AND r.started_at < now() - make_interval(secs => s.max_runtime_seconds)
ORDER BY r.started_at
LIMIT :batch
"""

#: The schedules with a late or missed monitor (a partial index holds them) or an open
#: incident of one (turned off since), at most :batch at random, each with the facts its
#: verdicts need (runs an operator made, triggered or backfilled, are not fire times of
#: its timing: passed over):
#: - late: its newest run due by now, not skipped or cancelled, not retried, whose start
#:   is known (started, or ended) or overdue (still waiting past late_after);
#: - missed: its next fire time if it waits unclaimed past missed_after (a schedule that
#:   is enabled), else its newest run at least missed_after old that a skip by the
#:   overlap policy or an operator's cancel did not take out.
_FIRE_TIMES_SQL = f"""
SELECT s.id, s.name, s.enabled, s.late_after_seconds, s.missed_after_seconds,
       late.fire_at AS late_fire_at, late.state AS late_state,
       late.started_at AS late_started_at, late.finished_at AS late_finished_at,
       CASE WHEN s.missed_after_seconds IS NOT NULL AND s.enabled
                 AND isfinite(s.next_fire_at)
                 AND s.next_fire_at < now() - make_interval(secs => s.missed_after_seconds)
            THEN s.next_fire_at END AS unclaimed_fire_at,
       missed.fire_at AS missed_fire_at, missed.claimed_at AS missed_claimed_at,
       missed.state AS missed_state, missed.reason AS missed_reason,
       missed.sent AS missed_sent
FROM (
    SELECT * FROM beat_schedules
    WHERE late_after_seconds IS NOT NULL OR missed_after_seconds IS NOT NULL
       OR id IN (SELECT schedule_id FROM beat_incidents
                 WHERE resolved_at IS NULL AND kind IN ('late', 'missed'))
    ORDER BY random()
    LIMIT :batch
) AS s
LEFT JOIN LATERAL (
    SELECT r.fire_at, r.state, r.started_at, r.finished_at
    FROM beat_runs AS r
    WHERE s.late_after_seconds IS NOT NULL
      AND r.schedule_name = s.name AND r.schedule_id = s.id
      AND r.fire_at <= now()
      AND r.state NOT IN ('skipped', 'cancelled')
      AND NOT coalesce(r.reason, '') = ANY(:operator_reasons)
      AND r.retries = 0
      AND (r.started_at IS NOT NULL
           OR r.state IN ({_FINISHED})
           OR r.fire_at < now() - make_interval(secs => s.late_after_seconds))
    ORDER BY r.fire_at DESC
    LIMIT 1
) AS late ON true
LEFT JOIN LATERAL (
    SELECT r.fire_at, r.claimed_at, r.state, r.reason,
           (r.published_at IS NOT NULL OR r.attempt > 0) AS sent
    FROM beat_runs AS r
    WHERE s.missed_after_seconds IS NOT NULL
      AND r.schedule_name = s.name AND r.schedule_id = s.id
      AND r.fire_at <= now() - make_interval(secs => s.missed_after_seconds)
      AND r.state <> 'cancelled'
      AND NOT coalesce(r.reason, '') = ANY(:operator_reasons)
      AND NOT (r.state = 'skipped' AND r.reason NOT LIKE '{timing.MISFIRE_REASON_PREFIX}%')
    ORDER BY r.fire_at DESC
    LIMIT 1
) AS missed ON true
"""
