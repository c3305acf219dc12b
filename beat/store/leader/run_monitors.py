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
from beat.store.tables import incidents, runs
from beat.store.workflow_steps import cancel_steps_of

#: Most runs, and most schedules, one pass looks at.
BATCH = 500
#: Most runs past their max_runtime one pass reads (and revokes) of one schedule: the
#: others of a schedule with more are revoked by the next passes.
OVERRUNS_PER_SCHEDULE = 20
#: Longest finding kept on an incident.
FINDING_CHARS = 500

_KINDS = (IncidentKind.OVERRAN, IncidentKind.LATE, IncidentKind.MISSED)


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
    found = conn.execute(
        text(_OVERRUNS_SQL), {"batch": BATCH, "per_schedule": OVERRUNS_PER_SCHEDULE}
    ).all()
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
        verdict = timing.overran(
            overruns, first.max_runtime_seconds, revoked=revoked, of_schedule=first.of_schedule
        )
        writer.apply(schedule_id, first.name, IncidentKind.OVERRAN, verdict)
    if len(found) < BATCH:  # every schedule with overruns was read: the others have none
        cleared = timing.overran([], 0.0, revoked=False, of_schedule=0)
        for schedule_id, name in writer.open_of(IncidentKind.OVERRAN):
            if schedule_id not in by_schedule:
                writer.apply(schedule_id, name, IncidentKind.OVERRAN, cleared)


def _end_revoked(conn: Connection, rows: list[Row[Any]], report: RunMonitorReport) -> bool:
    """End ``failed`` the runs of those still running past ``max_runtime``; their task
    IDs go to the report, to be revoked once this transaction commits. Judged again in
    the statement: an attempt that started since the read (a retry, a run sent again)
    is not past it, and goes on."""
    max_runtime = rows[0].max_runtime_seconds
    limit = timing.span_text(max_runtime)
    ended = conn.execute(
        update(runs)
        .where(
            runs.c.id == func.any(bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))),
            runs.c.state == RunState.RUNNING.value,
            runs.c.started_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, max_runtime),
        )
        .values(
            state=RunState.FAILED.value,
            error=f"revoked: it ran past its max_runtime of {limit}",
            finished_at=func.now(),
            lease_owner=None,
            lease_expires_at=None,
            duration_seconds=func.extract("epoch", func.now() - runs.c.started_at),
        )
        .returning(runs.c.id, func.coalesce(runs.c.task_id, cast(runs.c.id, Text))),
        {"ids": [row.run_id for row in rows]},
    ).all()
    report.revoke.extend(task_id for _, task_id in ended)
    # A workflow run's steps: cancelled with it, and their processes terminated too.
    why = f"its workflow run was revoked: it ran past its max_runtime of {limit}"
    report.revoke.extend(cancel_steps_of(conn, [run_id for run_id, _ in ended], why))
    return bool(ended)


def _watch_fire_times(conn: Connection, writer: _Incidents, now: datetime) -> None:
    """The late and missed monitors, on the schedules that have them."""
    found = conn.execute(text(_FIRE_TIMES_SQL), {"batch": BATCH}).all()
    for row in found:
        late, missed = _verdicts(row, now)
        writer.apply(row.id, row.name, IncidentKind.LATE, late)
        writer.apply(row.id, row.name, IncidentKind.MISSED, missed)


def _verdicts(row: Row[Any], now: datetime) -> tuple[timing.Verdict, timing.Verdict]:
    # Disabled with a fire time to come is a pause; disabled once its window ended, its
    # last fire time is judged still.
    paused = not row.enabled and row.next_fire_at is not None
    late: timing.Verdict = timing.Cleared(resolution="its late monitor was turned off")
    if row.late_after_seconds is not None:
        late = timing.late(_facts(row, "late"), row.late_after_seconds, now=now, enabled=not paused)
    missed: timing.Verdict = timing.Cleared(resolution="its missed monitor was turned off")
    if row.missed_after_seconds is not None:
        missed = timing.missed(
            _facts(row, "missed"),
            row.missed_after_seconds,
            now=now,
            enabled=not paused,
            unclaimed_since=row.unclaimed_fire_at,
        )
    return late, missed


def _facts(row: Row[Any], prefix: str) -> timing.RunFacts | None:
    """The run the query read for the late (``prefix`` "late") or the missed monitor."""
    fire_at = getattr(row, f"{prefix}_fire_at")
    if fire_at is None:
        return None
    return timing.RunFacts(
        fire_at=fire_at,
        due_at=getattr(row, f"{prefix}_due_at"),
        state=getattr(row, f"{prefix}_state"),
        reason=getattr(row, f"{prefix}_reason"),
        by_operator=getattr(row, f"{prefix}_by_operator"),
        sent_at=getattr(row, f"{prefix}_sent_at"),
        started_at=getattr(row, f"{prefix}_started_at"),
        finished_at=getattr(row, f"{prefix}_finished_at"),
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
#: first (the partial index of running runs holds the few running now): at most
#: :per_schedule of each schedule, so that one with many cannot hide the others, and
#: :batch in all; each with how many of its schedule's runs are past it.
_OVERRUNS_SQL = """
SELECT * FROM (
    SELECT s.id AS schedule_id, s.name, s.max_runtime_seconds, s.revoke_after_max_runtime,
           r.id AS run_id, r.fire_at,
           extract(epoch FROM now() - r.started_at)::float8 AS running_for,
           row_number() OVER (PARTITION BY s.id ORDER BY r.started_at) AS rank,
           count(*) OVER (PARTITION BY s.id) AS of_schedule
    FROM beat_runs AS r
    JOIN beat_schedules AS s ON s.id = r.schedule_id
    WHERE r.state = 'running'
      AND r.started_at IS NOT NULL
      AND s.max_runtime_seconds IS NOT NULL
      AND r.started_at < now() - make_interval(secs => s.max_runtime_seconds)
) AS past
WHERE rank <= :per_schedule
ORDER BY running_for DESC
LIMIT :batch
"""

#: A run's facts as the late and missed monitors read them (``timing.RunFacts``): its
#: first send and first start (``published_at`` and ``started_at`` for a run from before
#: they were kept), and when it was due (its fire time, or the end of its jitter).
_RUN_FACTS = """
    SELECT r.fire_at, coalesce(r.not_before, r.fire_at) AS due_at, r.state, r.reason,
           r.by_operator, coalesce(r.first_published_at, r.published_at) AS sent_at,
           coalesce(r.first_started_at, r.started_at) AS started_at, r.finished_at
    FROM beat_runs AS r
"""

#: The schedules with a late or missed monitor (a partial index holds them) or an open
#: incident of one (turned off since), at most :batch at random, each with its newest
#: run due by now (late), its newest run at least missed_after old (missed), and its
#: next fire time if it waits unclaimed past missed_after (an enabled schedule).
_FIRE_TIMES_SQL = f"""
SELECT s.id, s.name, s.enabled, s.next_fire_at, s.late_after_seconds,
       s.missed_after_seconds,
       CASE WHEN s.missed_after_seconds IS NOT NULL AND s.enabled
                 AND isfinite(s.next_fire_at)
                 AND s.next_fire_at < now() - make_interval(secs => s.missed_after_seconds)
            THEN s.next_fire_at END AS unclaimed_fire_at,
       late.fire_at AS late_fire_at, late.due_at AS late_due_at, late.state AS late_state,
       late.reason AS late_reason, late.by_operator AS late_by_operator,
       late.sent_at AS late_sent_at, late.started_at AS late_started_at,
       late.finished_at AS late_finished_at,
       missed.fire_at AS missed_fire_at, missed.due_at AS missed_due_at,
       missed.state AS missed_state, missed.reason AS missed_reason,
       missed.by_operator AS missed_by_operator, missed.sent_at AS missed_sent_at,
       missed.started_at AS missed_started_at, missed.finished_at AS missed_finished_at
FROM (
    SELECT * FROM beat_schedules
    WHERE late_after_seconds IS NOT NULL OR missed_after_seconds IS NOT NULL
       OR id IN (SELECT schedule_id FROM beat_incidents
                 WHERE resolved_at IS NULL AND kind IN ('late', 'missed'))
    ORDER BY random()
    LIMIT :batch
) AS s
LEFT JOIN LATERAL (
    {_RUN_FACTS}
    WHERE s.late_after_seconds IS NOT NULL
      AND r.schedule_name = s.name AND r.schedule_id = s.id
      AND r.fire_at <= now()
    ORDER BY r.fire_at DESC
    LIMIT 1
) AS late ON true
LEFT JOIN LATERAL (
    {_RUN_FACTS}
    WHERE s.missed_after_seconds IS NOT NULL
      AND r.schedule_name = s.name AND r.schedule_id = s.id
      AND r.fire_at <= now() - make_interval(secs => s.missed_after_seconds)
    ORDER BY r.fire_at DESC
    LIMIT 1
) AS missed ON true
"""
