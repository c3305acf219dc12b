"""The outbox: runs claimed and not yet published, what is sent from it and when, and
runs whose message cannot be built."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, and_, any_, case, func, or_, select, update
from sqlalchemy.dialects.postgresql import UUID

from beat.models import Quarantine, RunState, RunToPublish, UnpublishableRun
from beat.schedule.workflow import WORKFLOW_TASK
from beat.store.leader.base import FencedStore, _quarantine, _run_from_row
from beat.store.pg_arrays import array_param, uuid_array
from beat.store.tables import runs


class OutboxStatements(FencedStore):
    """The runs waiting in ``pending`` to be published, and their publication."""

    def pending_runs(self, epoch: int, *, grace: float, limit: int) -> list[RunToPublish]:
        """The outbox: runs claimed but not published, by an earlier leader (any age)
        or by this one (older than ``grace`` seconds, i.e. its publish failed), and
        jittered runs whose time has come; none before its ``not_before``."""
        query = (
            select(runs)
            .where(runs.c.state == RunState.PENDING.value)
            .where(_released_now())
            .where(
                or_(
                    runs.c.epoch.is_distinct_from(epoch),
                    runs.c.claimed_at < func.now() - func.make_interval(0, 0, 0, 0, 0, 0, grace),
                    # A jittered run whose time has come. (A run claimed ahead, whose
                    # not_before is its fire time, is this leader's to send from memory.)
                    _deferred(),
                )
            )
            .order_by(runs.c.claimed_at)
            .limit(limit)
        )
        with self._transaction() as conn:
            return [_run_from_row(row) for row in conn.execute(query)]

    def mark_published(self, run_ids: Sequence[uuid.UUID]) -> int:
        """``pending`` -> ``queued`` for the runs published, in one statement; a workflow
        run one of whose steps started already -> ``running`` (its steps' starts leave it
        ``pending`` until then, migration 0023: a sender that died between two of its
        messages leaves it in the outbox, to be sent again whole)."""
        if not run_ids:
            return 0
        first_step = _first_started_step()
        started = and_(runs.c.task == WORKFLOW_TASK, first_step.started_at.is_not(None))
        with self._transaction() as conn:
            return conn.execute(
                update(runs)
                .where(runs.c.id == any_(array_param("ids", UUID(as_uuid=True))))
                .where(runs.c.state == RunState.PENDING.value)
                .values(
                    state=case((started, RunState.RUNNING.value), else_=RunState.QUEUED.value),
                    published_at=func.now(),
                    first_published_at=func.coalesce(runs.c.first_published_at, func.now()),
                    **_started_by_its_first_step(started, first_step),
                ),
                {"ids": uuid_array(run_ids)},
            ).rowcount

    def fail_unpublishable(self, rejected: Sequence[UnpublishableRun]) -> list[Quarantine]:
        """Mark ``failed``, with their error, the runs whose message cannot be built, and
        quarantine their schedules (see ``_quarantine``); returns the quarantines."""
        quarantined: dict[int, Quarantine] = {}
        with self._transaction() as conn:
            for entry in rejected:
                row = conn.execute(
                    update(runs)
                    .where(runs.c.id == entry.run.id, runs.c.state == RunState.PENDING.value)
                    .values(
                        state=RunState.FAILED.value,
                        error=f"cannot be published: {entry.error}",
                        finished_at=func.now(),
                    )
                    .returning(runs.c.schedule_id)
                ).one_or_none()
                if row is None or row.schedule_id is None or row.schedule_id in quarantined:
                    continue
                quarantined[row.schedule_id] = Quarantine(
                    schedule_id=row.schedule_id,
                    name=entry.run.schedule_name or "?",
                    reason=f"run {entry.run.id} cannot be published: {entry.error}",
                )
            _quarantine(conn, list(quarantined.values()))
        return list(quarantined.values())


def _released_now() -> ColumnElement[bool]:
    """SQL of ``planning.release_of(run, now()) is Release.NOW``: no ``not_before``,
    or its time has come."""
    return or_(runs.c.not_before.is_(None), runs.c.not_before <= func.now())


def _deferred() -> ColumnElement[bool]:
    """SQL of a run held back by its jitter (``Release.DEFERRED`` until its time):
    ``not_before`` after its fire time. A run claimed ahead (``Release.ARMED``) has
    ``not_before`` equal to its fire time."""
    return runs.c.not_before > runs.c.fire_at


class _FirstStep(NamedTuple):
    started_at: Any
    worker: Any


def _first_started_step() -> _FirstStep:
    """The start and worker of a workflow run's first step that started (scalar
    subqueries; NULL where none did). The ``CASE`` that reads them compares the task
    first: a run of another task is never looked up."""
    step = runs.alias("first_step")
    first = (
        select(step.c.started_at, step.c.worker)
        .where(step.c.workflow_run_id == runs.c.id, step.c.started_at.is_not(None))
        .order_by(step.c.started_at)
        .limit(1)
    )
    return _FirstStep(
        started_at=first.with_only_columns(step.c.started_at).scalar_subquery(),
        worker=first.with_only_columns(step.c.worker).scalar_subquery(),
    )


def _started_by_its_first_step(
    started: ColumnElement[bool], first_step: _FirstStep
) -> dict[str, Any]:
    """What a workflow run whose steps started while it was ``pending`` takes from the
    first of them when it is marked published (as the trigger gives a run that was
    ``queued``): its start, and the worker of that step."""
    at = first_step.started_at

    def kept_else(column: Any, value: Any) -> Any:
        return case((started, func.coalesce(column, value)), else_=column)

    return {
        "attempt": case((started, func.greatest(runs.c.attempt, 1)), else_=runs.c.attempt),
        "received_at": kept_else(runs.c.received_at, at),
        "started_at": kept_else(runs.c.started_at, at),
        "first_started_at": kept_else(runs.c.first_started_at, at),
        "worker": kept_else(runs.c.worker, first_step.worker),
    }
