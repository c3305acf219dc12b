"""The leader row: the newest epoch, a takeover that records a new one (with the row's
hold, ``hold``), who leads, and the notification of a clean hand-over."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy import and_, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from beat.errors import StoreUnavailable
from beat.records import Session
from beat.store.leader.base import FencedStore
from beat.store.leader.hold import (
    ask_to_end,
    held_for_column,
    hold_values,
    lock_not_available,
    open_to,
    wait_at_most,
)
from beat.store.leader.records import LeaderInfo
from beat.store.tables import leader

logger = logging.getLogger(__name__)

#: Channel a leader notifies when it hands over cleanly, so standbys take over at once.
LEADER_RELEASED_CHANNEL = "beat_leader_released"


class TermStatements(FencedStore):
    """The leader row of cluster ``leader_name``."""

    def current_epoch(self) -> int:
        """The newest epoch recorded by any leader (0 before the first)."""
        with self._transaction() as conn:
            epoch = conn.execute(
                select(leader.c.epoch).where(leader.c.name == self.leader_name)
            ).scalar_one_or_none()
        return epoch or 0

    def take_leadership(
        self,
        epoch: int,
        holder: str,
        *,
        session: Session | None = None,
        hold: float | None = None,
        ask_within: float = 1.0,
        lock_timeout: float = 2.0,
    ) -> datetime | None:
        """Record ``epoch`` as the newest, with the ``session`` its holder keeps for its
        term (``beat.lease.beacon``), and return PostgreSQL's clock as the statement that
        recorded it read it (the new leader's first reading of the database's time,
        before its first claim); None if an equal or newer epoch is recorded, or while
        another holder leads on the row alone (``beat.store.leader.hold``): that term is
        asked to end within ``ask_within`` seconds. The row is held for ``hold`` seconds
        (None: never taken without the lease).

        Waits for claims in flight (they hold the row in share mode), at most
        ``lock_timeout`` seconds, so a stalled old leader cannot block a takeover
        for long: its idle transaction is aborted by PostgreSQL anyway.
        """
        values = {
            "epoch": epoch,
            "holder": holder,
            # The beacon's halves are in beat_beacons; these two columns are left empty
            # (a standby of the release before reads them, and finds nothing to evict).
            "session_pid": None,
            "session_started_at": None,
            "beacon": None if session is None else session.beacon,
            **hold_values(epoch, hold, on_database=False),
        }
        statement = (
            pg_insert(leader)
            .values(name=self.leader_name, **values)
            .on_conflict_do_update(
                index_elements=[leader.c.name],
                set_={**values, "acquired_at": func.now()},
                where=and_(leader.c.epoch < epoch, open_to(holder)),
            )
            # Read once the row is ours (not now(): the transaction may have waited).
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        try:
            with self._transaction() as conn:
                wait_at_most(conn, lock_timeout)
                row = conn.execute(statement).one_or_none()
                if row is None:
                    ask_to_end(conn, self.leader_name, holder, ask_within)
                if row is None or row[0] != epoch:
                    return None
                taken_at: datetime = row[1]
                return taken_at
        except StoreUnavailable as exc:
            if lock_not_available(exc):
                logger.warning(
                    "takeover waited %.1fs for a claim in flight; will retry", lock_timeout
                )
                return None
            raise

    def leader_info(self) -> LeaderInfo | None:
        with self._transaction() as conn:
            row = conn.execute(
                select(leader, held_for_column().label("held_for")).where(
                    leader.c.name == self.leader_name
                )
            ).one_or_none()
        if row is None:
            return None
        return LeaderInfo(
            name=row.name,
            epoch=row.epoch,
            holder=row.holder,
            acquired_at=row.acquired_at,
            held_for=None if row.held_for is None else float(row.held_for),
        )

    def notify_leader_released(self) -> None:
        with self._transaction() as conn:
            conn.execute(select(func.pg_notify(LEADER_RELEASED_CHANNEL, self.leader_name)))
