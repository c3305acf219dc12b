"""What every part of the leader's store shares: the engine and the name of the
cluster's leader row (:class:`FencedStore`), the fence each write goes through
(``FencedStore._fence``), and the statements and row mapping several parts use."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Double,
    Engine,
    Row,
    bindparam,
    case,
    func,
    literal,
    select,
    update,
)

from beat.errors import StaleEpoch
from beat.models import Quarantine, RunState, RunToPublish
from beat.store.db import StoreConnection
from beat.store.schedule_changes import RECORDED_SETTING, record_quarantines
from beat.store.tables import leader, runs, schedules


class FencedStore(StoreConnection):
    """PostgreSQL access for the leader of cluster ``leader_name``: every write fenced
    by the leader row (``_fence``)."""

    def __init__(
        self, engine: Engine, *, leader_name: str = "habeat", setting: str = "habeat_database_url"
    ) -> None:
        super().__init__(engine, setting=setting)
        self.leader_name = leader_name

    def _fence(
        self, conn: Connection, epoch: int, idle_timeout: float, *, claiming: bool = False
    ) -> datetime:
        """Hold the leader row (shared) for this transaction, as leader ``epoch``; the
        database's time (the transaction's). With ``claiming``, the transaction's writes
        to schedules do not notify the leader (the trigger reads ``beat.claiming``).

        A leader paused inside the transaction (SIGSTOP, a VM pause) would keep the
        row and block every takeover: PostgreSQL ends the transaction once it has
        been idle for ``idle_timeout`` seconds. One statement does it all: a burst's
        claims follow each other, and each round trip is paid per batch."""
        settings = [
            func.set_config(
                "idle_in_transaction_session_timeout", f"{int(idle_timeout * 1000)}ms", True
            )
        ]
        if claiming:
            settings.append(func.set_config("beat.claiming", "on", True))
            # The claim records the schedules it ends or quarantines itself, set-wise.
            settings.append(func.set_config(RECORDED_SETTING, "on", True))
        row = conn.execute(
            select(leader.c.epoch, func.now(), *settings)
            .where(leader.c.name == self.leader_name)
            .with_for_update(read=True)
        ).one_or_none()
        current = None if row is None else row[0]
        if current != epoch:
            raise StaleEpoch(
                f"claim refused: this process leads with epoch {epoch}, the newest is {current}"
            )
        assert row is not None
        now: datetime = row[1]
        return now


def _run_from_row(row: Row[Any]) -> RunToPublish:
    return RunToPublish(
        id=row.id,
        task=row.task,
        args=row.args,
        kwargs=row.kwargs,
        options=row.options,
        schedule_name=row.schedule_name,
        fire_at=row.fire_at,
        attempt=row.attempt,
        not_before=row.not_before,
        task_id=row.task_id,
        retries=row.retries,
    )


def _quarantine(conn: Connection, quarantined: Sequence[Quarantine]) -> None:
    """Disable each schedule with its reason and fail its runs waiting in the outbox
    (they would fail the same way). A schedule quarantined already keeps its first
    reason and time: that is the cause to fix. The audit log records each first
    quarantine as the scheduler's."""
    if not quarantined:
        return
    first_time = schedules.c.quarantined_at.is_(None)
    record_quarantines(conn, [(entry.schedule_id, entry.reason) for entry in quarantined])
    for entry in quarantined:
        conn.execute(
            update(schedules)
            .where(schedules.c.id == entry.schedule_id)
            .values(
                enabled=False,
                quarantined_at=func.coalesce(schedules.c.quarantined_at, func.now()),
                disabled_reason=case(
                    (first_time, literal(entry.reason)), else_=schedules.c.disabled_reason
                ),
                updated_at=func.now(),
                version=schedules.c.version + case((first_time, 1), else_=0),
            )
        )
        conn.execute(
            update(runs)
            .where(runs.c.schedule_id == entry.schedule_id, runs.c.state == RunState.PENDING.value)
            .values(
                state=RunState.FAILED.value,
                error=f"not published: its schedule was quarantined ({entry.reason})",
                finished_at=func.now(),
            )
        )


def _seconds(name: str) -> Any:
    """An interval of the bound parameter ``name`` seconds."""
    return func.make_interval(0, 0, 0, 0, 0, 0, bindparam(name, type_=Double))
