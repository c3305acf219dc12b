"""The failing monitor's pass, fenced: the leader reads the newest outcomes of each
schedule whose runs finished since its last pass, and opens, updates and resolves its
incidents, and pauses schedules, as ``beat.monitors.failing`` decides, in one
transaction. Operators read the incidents through ``beat.store.leader.incident_reads``.

Which schedules are looked at: those with a run that failed, and those with an open
incident with a run that finished, since ``beat_monitor_progress`` says the last pass
looked (by the retention index's key, ``coalesce(finished_at, claimed_at)``), less
``MARGIN`` (a worker's transaction that stamped its run's end and committed later is
seen by a pass after it); at most ``BATCH`` a pass. In a cluster that works that is a
few schedules, whatever their number. Every decision is idempotent, so a run looked at
twice changes nothing. Every time is the database's.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.limits import MAX_FAILURE_THRESHOLD
from beat.models import FINISHED_STATES, ChangeEntry, IncidentKind, NotificationEvent
from beat.monitors.failing import Decision, OpenIncident, Outcome, Thresholds, decide
from beat.records import ChangeContext
from beat.store.leader.base import FencedStore
from beat.store.leader.incident_writes import open_incident, resolve_incident
from beat.store.leader.notifications import notify_incident
from beat.store.schedule_changes import acting_as
from beat.store.tables import incidents, monitor_progress, schedules
from beat.store.unreleased_runs import cancel_unreleased

#: Runs that finished this long before the last pass's time are looked at again: a
#: worker's transaction stamps ``finished_at`` with its start, and commits a moment later.
MARGIN = timedelta(seconds=60)
#: How far back the first pass of a cluster looks.
FIRST_LOOKBACK = timedelta(hours=1)
#: Most schedules one pass looks at (a pass is one transaction of the leader's loop).
BATCH = 500
#: Longest error kept on an incident (the run keeps all of it).
ERROR_CHARS = 500

_FAILURES = ("failed", "lost", "expired")
_FINISHED = ", ".join(repr(state.value) for state in FINISHED_STATES)
_FAILURE_STATES = ", ".join(repr(state) for state in _FAILURES)

#: Who the audit log names for a pause after failures in a row.
AUTO_PAUSE = "system:auto-pause"


@dataclass(frozen=True, kw_only=True, slots=True)
class MonitorReport:
    """What one pass did, by schedule name."""

    opened: list[tuple[str, int]] = field(default_factory=list)
    paused: list[tuple[str, int]] = field(default_factory=list)
    resolved: list[tuple[str, str]] = field(default_factory=list)
    #: The runs claimed ahead that the pauses cancelled (the leader forgets them).
    cancelled: list[uuid.UUID] = field(default_factory=list)
    #: Schedules looked at.
    looked_at: int = 0
    #: Incidents open after the pass, by kind.
    open: dict[IncidentKind, int] = field(default_factory=dict)


class MonitorStatements(FencedStore):
    """The failing monitor's pass, and the incidents as operators read them."""

    def watch_failures(
        self, epoch: int, *, alert_after: int, pause_after: int, idle_timeout: float
    ) -> MonitorReport:
        """One pass of the failing monitor as leader ``epoch``, with the cluster's
        default thresholds; StaleEpoch if a newer leader exists (nothing written)."""
        with self._transaction() as conn:
            now = self._fence(conn, epoch, idle_timeout)
            # A cluster without a leader for long looks back FIRST_LOOKBACK at most.
            since = max(_progress(conn, now) - MARGIN, now - FIRST_LOOKBACK)
            rows = conn.execute(
                text(_CANDIDATES_SQL),
                {
                    "since": since,
                    "alert": alert_after,
                    "pause": pause_after,
                    "streak_limit": MAX_FAILURE_THRESHOLD,
                    "batch": BATCH,
                },
            ).all()
            report = MonitorReport(looked_at=len(rows))
            written = _Pass(
                conn=conn, epoch=epoch, now=now, cluster=self.leader_name, report=report
            )
            for row in rows:
                written.apply(row, _decision(row, alert_after, pause_after))
            written.resolve_orphans()
            if not rows or rows[0].touched <= len(rows):
                # All looked at. Else the schedules left out are taken by the next passes
                # (at random) over the same runs; those looked at again change nothing.
                conn.execute(update(monitor_progress).values(checked_until=now))
            report.open.update(_open_counts(conn))
        return report


def _progress(conn: Connection, now: datetime) -> datetime:
    """Where the last pass looked up to (held for this transaction); the first pass of a
    cluster looks ``FIRST_LOOKBACK`` back."""
    conn.execute(
        pg_insert(monitor_progress)
        .values(id=True, checked_until=now - FIRST_LOOKBACK)
        .on_conflict_do_nothing()
    )
    checked: datetime = conn.execute(
        select(monitor_progress.c.checked_until).with_for_update()
    ).scalar_one()
    return checked


def _decision(row: Row[Any], alert_after: int, pause_after: int) -> Decision:
    thresholds = Thresholds(
        alert_after=_or_default(row.alert_after_failures, alert_after),
        pause_after=_or_default(row.pause_after_failures, pause_after),
    )
    outcomes = [
        Outcome(fire_at=fire_at, failed=state in _FAILURES, error=error)
        for fire_at, state, error in zip(row.fire_times, row.states, row.errors, strict=True)
    ]
    incident = None
    if row.incident_id is not None:
        incident = OpenIncident(
            id=row.incident_id,
            failures=row.incident_failures,
            paused_after_fire_at=row.paused_after_fire_at,
        )
    return decide(outcomes, thresholds, enabled=row.enabled, incident=incident)


def _or_default(own: int | None, default: int) -> int:
    return default if own is None else own


@dataclass(kw_only=True)
class _Pass:
    """One pass's transaction, as leader ``epoch`` at database time ``now``: applies the
    decisions, and writes each event's notifications in the same transaction."""

    conn: Connection
    epoch: int
    now: datetime
    cluster: str
    report: MonitorReport

    def apply(self, row: Row[Any], decision: Decision) -> None:
        if decision.resolve is not None:
            self._resolve(
                row.incident_id, (row.id, row.name), decision.resolve, row.incident_failures
            )
            return
        if decision.failures is None:
            return
        error = None if decision.last_error is None else decision.last_error[:ERROR_CHARS]
        incident_id = row.incident_id
        if decision.open:
            incident_id = self._open(row, decision, error)
            if incident_id is None:
                return  # one is open already (this pass holds the fence: none should be)
        elif decision.failures != row.incident_failures:
            self.conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(failures=decision.failures, last_error=error)
            )
        if decision.pause_after_fire_at is not None and self._pause(row, incident_id, decision):
            self.report.paused.append((row.name, decision.failures))
            self._notify(
                NotificationEvent.PAUSED, incident_id, (row.id, row.name), decision.failures, error
            )

    def _open(self, row: Row[Any], decision: Decision, error: str | None) -> int | None:
        assert decision.failures is not None
        incident_id = open_incident(
            self.conn,
            schedule=(row.id, row.name),
            kind=IncidentKind.FAILING,
            epoch=self.epoch,
            count=decision.failures,
            first_at=decision.first_failure_at,
            finding=error,
        )
        if incident_id is not None:
            self.report.opened.append((row.name, decision.failures))
            self._notify(
                NotificationEvent.OPENED, incident_id, (row.id, row.name), decision.failures, error
            )
        return incident_id

    def _pause(self, row: Row[Any], incident_id: int, decision: Decision) -> bool:
        """Pause the schedule because of incident ``incident_id``, with the reason as its
        pause note; its runs claimed ahead are cancelled, as an operator's pause does.
        False if it was paused already."""
        note = (
            f"paused by the scheduler after {decision.failures} failures in a row"
            f" (incident {incident_id})"
        )
        if decision.last_error:
            note += f"; the last: {decision.last_error[:200]}"
        acting_as(self.conn, ChangeContext(actor=AUTO_PAUSE, entry=ChangeEntry.SYSTEM, note=note))
        paused = self.conn.execute(
            update(schedules)
            .where(schedules.c.id == row.id, schedules.c.enabled)
            .values(enabled=False, disabled_reason=note, updated_at=func.now())
            .returning(schedules.c.id)
        ).scalar_one_or_none()
        if paused is None:
            return False
        self.report.cancelled.extend(
            cancel_unreleased(self.conn, row.id, "its schedule was paused after failures in a row")
        )
        self.conn.execute(
            update(incidents)
            .where(incidents.c.id == incident_id)
            .values(paused_at=func.now(), paused_after_fire_at=decision.pause_after_fire_at)
        )
        return True

    def _resolve(
        self, incident_id: int, schedule: tuple[int | None, str], resolution: str, failures: int
    ) -> None:
        resolve_incident(self.conn, incident_id, resolution)
        self.report.resolved.append((schedule[1], resolution))
        self._notify(
            NotificationEvent.RESOLVED, incident_id, schedule, failures, None, resolution=resolution
        )

    def resolve_orphans(self) -> None:
        """Resolve the open incidents of schedules removed since."""
        resolution = "its schedule was removed"
        resolved = self.conn.execute(
            update(incidents)
            .where(
                incidents.c.kind == IncidentKind.FAILING.value,
                incidents.c.schedule_id.is_(None),
                incidents.c.resolved_at.is_(None),
            )
            .values(resolved_at=func.now(), resolution=resolution)
            .returning(incidents.c.id, incidents.c.schedule_name, incidents.c.failures)
        ).all()
        for incident_id, name, failures in resolved:
            self.report.resolved.append((name, resolution))
            self._notify(
                NotificationEvent.RESOLVED,
                incident_id,
                (None, name),
                failures,
                None,
                resolution=resolution,
            )

    def _notify(
        self,
        event: NotificationEvent,
        incident_id: int,
        schedule: tuple[int | None, str],
        failures: int | None,
        error: str | None,
        *,
        resolution: str | None = None,
    ) -> None:
        """One notification of the event per channel, in the outbox (``beat.notify``)."""
        schedule_id, name = schedule
        notify_incident(
            self.conn,
            event,
            cluster=self.cluster,
            incident_id=incident_id,
            schedule=name,
            schedule_id=schedule_id,
            kind=IncidentKind.FAILING,
            at=self.now,
            failures=failures,
            last_error=error,
            resolution=resolution,
        )


def _open_counts(conn: Connection) -> Sequence[tuple[IncidentKind, int]]:
    rows = conn.execute(
        select(incidents.c.kind, func.count())
        .where(incidents.c.resolved_at.is_(None))
        .group_by(incidents.c.kind)
    ).all()
    counts = {kind: 0 for kind in IncidentKind}
    counts.update({IncidentKind(kind): count for kind, count in rows})
    return list(counts.items())


#: The schedules to look at: a run of theirs failed since :since, or one finished while
#: they have an open incident, at most :batch of them taken at random (after a failure
#: of many schedules at once, each pass takes others; one left out is looked at when its
#: next run fails). Each with its thresholds, its open failing incident and its newest
#: counted outcomes: as many as its larger threshold, or, while an incident is open, up
#: to MAX_FAILURE_THRESHOLD, so that the incident counts its whole streak. A state the
#: schedule does not count as a failure (its ``failure_states``) is passed over.
_CANDIDATES_SQL = f"""
WITH open_incident AS (
    SELECT i.schedule_id FROM beat_incidents AS i
    WHERE i.resolved_at IS NULL AND i.kind = 'failing' AND i.schedule_id IS NOT NULL
), touched AS (
    SELECT DISTINCT r.schedule_id
    FROM beat_runs AS r
    WHERE coalesce(r.finished_at, r.claimed_at) >= :since
      AND r.state IN ({_FINISHED})
      AND r.schedule_id IS NOT NULL
      AND r.fire_at IS NOT NULL
      AND (r.state IN ({_FAILURE_STATES})
           OR r.schedule_id IN (SELECT schedule_id FROM open_incident))
), picked AS (
    SELECT schedule_id FROM touched ORDER BY random() LIMIT :batch
)
SELECT s.id, s.name, s.enabled, s.alert_after_failures, s.pause_after_failures,
       i.id AS incident_id, i.failures AS incident_failures, i.paused_after_fire_at,
       coalesce(newest.fire_times, '{{}}') AS fire_times,
       coalesce(newest.states, '{{}}') AS states,
       coalesce(newest.errors, '{{}}') AS errors,
       (SELECT count(*) FROM touched) AS touched
FROM picked
JOIN beat_schedules AS s ON s.id = picked.schedule_id
LEFT JOIN beat_incidents AS i
       ON i.schedule_id = s.id AND i.kind = 'failing' AND i.resolved_at IS NULL
CROSS JOIN LATERAL (
    SELECT array_agg(r.fire_at ORDER BY r.fire_at DESC) AS fire_times,
           array_agg(r.state ORDER BY r.fire_at DESC) AS states,
           array_agg(left(coalesce(r.error, r.reason), {ERROR_CHARS}) ORDER BY r.fire_at DESC)
               AS errors
    FROM (
        SELECT r.fire_at, r.state, r.error, r.reason
        FROM beat_runs AS r
        WHERE r.schedule_id = s.id
          AND r.fire_at IS NOT NULL
          AND (r.state = 'succeeded'
               OR r.state = ANY(coalesce(s.failure_states, ARRAY[{_FAILURE_STATES}])))
        ORDER BY r.fire_at DESC
        LIMIT CASE WHEN i.id IS NULL THEN greatest(
            coalesce(s.alert_after_failures, :alert), coalesce(s.pause_after_failures, :pause), 1
        ) ELSE :streak_limit END
    ) AS r
) AS newest
ORDER BY s.name
"""
