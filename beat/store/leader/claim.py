"""The claim of due schedules, fenced by the leader's epoch.

The contract of the claim (``claim_due``), which the leader loop relies on:

- eligible rows are enabled schedules whose ``next_fire_at <= now()``, oldest
  first, at most ``batch``, skipping rows another transaction has locked;
- the claim holds a share lock on the leader row for its whole transaction and
  aborts with :class:`~beat.errors.StaleEpoch` unless the row's epoch is the
  caller's, so a takeover (which needs the row exclusively) waits for claims in
  flight and every claim after it fails for the old leader;
- what to write is decided by :func:`beat.claim.planning.plan_claim`; in the same
  transaction it inserts one ``pending`` run per planned fire time (unique per
  schedule and fire time: a fire time is never claimed twice), records skipped
  fire times, and advances ``next_fire_at``;
- it returns only the runs it inserted, to be published after commit.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.claim.planning import (
    Advance,
    NewRun,
    Release,
    SchedulePlanner,
    claim_horizon,
    plan_claim,
    release_of,
)
from beat.models import (
    ACTIVE_STATES,
    WAITING_STATES,
    DueSchedule,
    FirePlan,
    OverlapPolicy,
    RunState,
    RunToPublish,
)
from beat.store.leader.base import FencedStore, _quarantine
from beat.store.leader.due_rows import _due_query, _due_schedules
from beat.store.leader.records import Claim
from beat.store.pg_arrays import (
    bigint_array,
    integer_array,
    parallel_arrays,
    text_array,
    time_array,
    uuid_array,
)
from beat.store.rows import new_run_values, run_copy_columns
from beat.store.schedule_changes import record_ends
from beat.store.tables import TZ, runs, schedules
from beat.store.workflow_steps import cancel_steps_of

logger = logging.getLogger(__name__)


class ClaimStatements(FencedStore):
    """The claim of due schedules (see the module docstring)."""

    def claim_due(
        self,
        epoch: int,
        *,
        batch: int,
        plan: SchedulePlanner,
        idle_timeout: float = 10.0,
        ahead: float = 0.0,
    ) -> Claim:
        """Claim due schedules as leader ``epoch`` (see the module docstring), planned
        by :func:`beat.claim.planning.plan_claim` with ``plan`` for each schedule.

        With ``ahead`` > 0, schedules of the ``allow`` overlap policy due within
        ``ahead`` seconds are claimed too, planned as of their fire time, and returned
        as ``armed`` runs whose ``not_before`` is their fire time. (Overlap policies
        look at the runs active when a fire time comes: those schedules wait for it.)
        """
        with self._transaction() as conn:
            # The claim's own updates must not wake the leader through the NOTIFY trigger.
            now = self._fence(conn, epoch, idle_timeout, claiming=True)
            clock = time.monotonic()
            rows = conn.execute(_due_query(batch), {"ahead": ahead}).all()
            if not rows:
                return Claim(runs=[], now=now, clock=clock, schedules_claimed=0, skipped=0)
            due, unreadable = _due_schedules(rows)
            due = self._with_active_runs(conn, due)
            claim_plan = plan_claim(due, now, claim_horizon(now, ahead), plan)
            # A schedule that cannot be read or planned is set aside; the batch goes on.
            quarantined = [*unreadable, *claim_plan.quarantined]
            _quarantine(conn, quarantined)
            cancelled = self._cancel_active(conn, claim_plan.cancel_active_of)
            inserted = self._insert_runs(conn, epoch, claim_plan.new_runs)
            skipped = self._insert_skipped(conn, epoch, claim_plan.plans, now)
            self._advance(conn, claim_plan.advances)
        released: dict[Release, list[RunToPublish]] = {release: [] for release in Release}
        for run in inserted:
            released[release_of(run, now)].append(run)
        return Claim(
            runs=released[Release.NOW],
            armed=released[Release.ARMED],
            now=now,
            clock=clock,
            schedules_claimed=len(rows),
            skipped=skipped,
            skips=claim_plan.skip_counts,
            cancelled=cancelled,
            deferred=len(released[Release.DEFERRED]),
            disabled=claim_plan.disabled,
            quarantined=quarantined,
        )

    @staticmethod
    def _with_active_runs(conn: Connection, due: list[DueSchedule]) -> list[DueSchedule]:
        """Add each schedule's waiting and running runs (where an overlap policy needs them)."""
        ids = [s.id for s in due if s.overlap_policy is not OverlapPolicy.ALLOW]
        if not ids:
            return due
        counts = {
            row.schedule_id: (row.waiting, row.running)
            for row in conn.execute(
                select(
                    runs.c.schedule_id,
                    func.count().filter(runs.c.state.in_(WAITING_STATES)).label("waiting"),
                    func.count().filter(runs.c.state == RunState.RUNNING.value).label("running"),
                )
                .where(runs.c.schedule_id.in_(ids), runs.c.state.in_(ACTIVE_STATES))
                .group_by(runs.c.schedule_id)
            )
        }
        return [
            replace(s, waiting=counts[s.id][0], running=counts[s.id][1]) if s.id in counts else s
            for s in due
        ]

    @staticmethod
    def _cancel_active(conn: Connection, ids: list[int]) -> list[uuid.UUID]:
        """Cancel the active runs of schedules ``ids`` (overlap policy cancel_previous)."""
        if not ids:
            return []
        reason = "overlap (cancel_previous): a newer run of the schedule started"
        cancelled = list(
            conn.scalars(
                update(runs)
                .where(runs.c.schedule_id.in_(ids), runs.c.state.in_(ACTIVE_STATES))
                .values(
                    state=RunState.CANCELLED.value,
                    finished_at=func.now(),
                    reason=reason,
                    lease_owner=None,
                    lease_expires_at=None,
                )
                .returning(runs.c.id)
            )
        )
        # A workflow run's steps are runs of their own: cancelled with it, revoked too.
        steps = cancel_steps_of(conn, cancelled, f"its workflow run was cancelled: {reason}")
        return [*cancelled, *map(uuid.UUID, steps)]

    @staticmethod
    def _insert_runs(conn: Connection, epoch: int, fires: list[NewRun]) -> list[RunToPublish]:
        """Insert a ``pending`` run per planned fire time in one statement.

        Only the fire times travel as arrays; each run's payload is copied from its
        schedule row (locked by this claim) inside PostgreSQL.
        """
        if not fires:
            return []
        inserted = set(
            conn.scalars(
                _INSERT_RUNS,
                {
                    "ids": uuid_array(fire.id for fire in fires),
                    "schedule_ids": bigint_array(fire.schedule.id for fire in fires),
                    "fire_ats": time_array(fire.fire_at for fire in fires),
                    "not_befores": time_array(fire.not_before for fire in fires),
                    "epoch": epoch,
                },
            )
        )
        if len(inserted) < len(fires):
            logger.warning(
                "%d fire times were claimed before and were not claimed again",
                len(fires) - len(inserted),
            )
        return [fire.to_publish() for fire in fires if fire.id in inserted]

    @staticmethod
    def _insert_skipped(
        conn: Connection, epoch: int, plans: list[tuple[DueSchedule, FirePlan]], now: datetime
    ) -> int:
        rows = [
            new_run_values(
                schedule,
                fire_at=skip.fire_at,
                state=RunState.SKIPPED,
                reason=skip.reason,
                epoch=epoch,
                finished_at=now,
            )
            for schedule, plan in plans
            for skip in plan.skipped
        ]
        if rows:
            conn.execute(
                pg_insert(runs).on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at"),
                rows,
            )
            logger.warning(
                "recorded %d skipped fire times (misfire or overlap policy)",
                len(rows),
                extra={"skipped": len(rows)},
            )
        return len(rows)

    @staticmethod
    def _advance(conn: Connection, advances: list[Advance]) -> None:
        """Advance every claimed schedule in one statement (``UPDATE ... FROM unnest(...)``),
        after recording those it ends in the audit log (one statement more, if any)."""
        record_ends(
            conn,
            [
                (advance.schedule_id, advance.disable_reason)
                for advance in advances
                if advance.next_fire_at is None or advance.disable_reason is not None
            ],
        )
        conn.execute(
            _ADVANCE,
            {
                "ids": bigint_array(advance.schedule_id for advance in advances),
                "next_fire_ats": time_array(advance.next_fire_at for advance in advances),
                "last_fire_ats": time_array(advance.last_fire_at for advance in advances),
                "fired": integer_array(advance.fired for advance in advances),
                "reasons": text_array(advance.disable_reason for advance in advances),
            },
        )


#: New runs of a claim: only ids and fire times are sent, the payload is copied
#: from the (locked) schedule rows.
_FIRES = parallel_arrays(
    "fires",
    ids=UUID(as_uuid=True),
    schedule_ids=BigInteger,
    fire_ats=TZ,
    not_befores=TZ,
)


_NEW_RUN = run_copy_columns(
    id=_FIRES.c.ids,
    fire_at=_FIRES.c.fire_ats,
    state=literal(RunState.PENDING.value),
    epoch=bindparam("epoch", type_=BigInteger),
    attempt=literal(0),
    not_before=_FIRES.c.not_befores,
)
_INSERT_RUNS = (
    pg_insert(runs)
    .from_select(
        list(_NEW_RUN),
        select(*_NEW_RUN.values()).join_from(
            _FIRES, schedules, schedules.c.id == _FIRES.c.schedule_ids
        ),
    )
    .on_conflict_do_nothing(constraint="uq_beat_runs_schedule_fire_at")
    .returning(runs.c.id)
)

_ADVANCED = parallel_arrays(
    "advanced",
    ids=BigInteger,
    next_fire_ats=TZ,
    last_fire_ats=TZ,
    fired=Integer,
    reasons=Text,
)
#: Advances every schedule of a claim; a reason (its window ended) disables it.
_ADVANCE = (
    update(schedules)
    .where(schedules.c.id == _ADVANCED.c.ids)
    .values(
        next_fire_at=_ADVANCED.c.next_fire_ats,
        last_fire_at=_ADVANCED.c.last_fire_ats,
        runs_count=schedules.c.runs_count + _ADVANCED.c.fired,
        enabled=and_(schedules.c.enabled, _ADVANCED.c.reasons.is_(None)),
        disabled_reason=func.coalesce(_ADVANCED.c.reasons, schedules.c.disabled_reason),
        # A schedule the claim ends is a new version (``schedule_changes.record_ends``).
        version=schedules.c.version
        + case(
            (or_(_ADVANCED.c.reasons.is_not(None), _ADVANCED.c.next_fire_ats.is_(None)), 1),
            else_=0,
        ),
    )
)
