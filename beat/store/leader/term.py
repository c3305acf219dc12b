"""The leader row: the newest epoch, a takeover that records a new one, who leads, the
row's hold (``held_until``: renewed by its leader, taken once it ended by a process that
cannot reach the lease's Redis, ``beat.lease.database_hold``), and the notification of a
clean hand-over. Every time here is PostgreSQL's ``clock_timestamp()``."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.exc import DBAPIError

from beat.errors import StoreUnavailable
from beat.records import Session
from beat.store.leader.base import FencedStore
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
        lock_timeout: float = 2.0,
    ) -> datetime | None:
        """Record ``epoch`` as the newest, with the ``session`` its holder keeps for its
        term (``beat.lease.beacon``), and return PostgreSQL's clock as the statement that
        recorded it read it (the new leader's first reading of the database's time,
        before its first claim); None if an equal or newer epoch is recorded. The row is
        held for ``hold`` seconds (None: never taken without the lease).

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
            "held_until": None if hold is None else _held_for(hold),
        }
        statement = (
            pg_insert(leader)
            .values(name=self.leader_name, **values)
            .on_conflict_do_update(
                index_elements=[leader.c.name],
                set_={**values, "acquired_at": func.now()},
                where=leader.c.epoch < epoch,
            )
            # Read once the row is ours (not now(): the transaction may have waited).
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        try:
            with self._transaction() as conn:
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'"))
                row = conn.execute(statement).one_or_none()
                if row is None or row[0] != epoch:
                    return None
                taken_at: datetime = row[1]
                return taken_at
        except StoreUnavailable as exc:
            if _lock_not_available(exc):
                logger.warning(
                    "takeover waited %.1fs for a claim in flight; will retry", lock_timeout
                )
                return None
            raise

    def renew_hold(self, epoch: int, holder: str, hold: float) -> bool:
        """Hold the row ``hold`` seconds from now, as the leader of ``epoch``; False if
        the row has another epoch or holder now (this term is over)."""
        with self._transaction() as conn:
            renewed = conn.execute(
                update(leader)
                .where(*self._term_is(epoch, holder))
                .values(held_until=_held_for(hold))
                .returning(leader.c.epoch)
            ).one_or_none()
        return renewed is not None

    def take_ended_hold(
        self, holder: str, hold: float, *, lock_timeout: float = 2.0
    ) -> tuple[int, datetime] | None:
        """Take the row with the next epoch if its hold has ended (NULL never has), held
        ``hold`` seconds: the new epoch and PostgreSQL's clock as the statement read it,
        or None while it is held. Two processes asking at once: the row lock orders
        them, and the second finds the first's hold."""
        statement = (
            update(leader)
            .where(
                leader.c.name == self.leader_name,
                leader.c.held_until < func.clock_timestamp(),
            )
            .values(
                epoch=leader.c.epoch + 1,
                holder=holder,
                acquired_at=func.now(),
                session_pid=None,
                session_started_at=None,
                beacon=None,
                held_until=_held_for(hold),
            )
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        try:
            with self._transaction() as conn:
                conn.execute(text(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'"))
                row = conn.execute(statement).one_or_none()
        except StoreUnavailable as exc:
            if _lock_not_available(exc):
                return None  # a claim in flight held the row: its leader lives
            raise
        if row is None:
            return None
        taken_at: datetime = row[1]
        return int(row[0]), taken_at

    def hold_left(self, epoch: int, holder: str) -> float | None:
        """Seconds the row is still held by the leader of ``epoch``, by PostgreSQL's
        clock (negative once it ended); None if the row is no longer this term's."""
        with self._transaction() as conn:
            left = conn.execute(
                select(func.extract("epoch", leader.c.held_until - func.clock_timestamp())).where(
                    *self._term_is(epoch, holder), leader.c.held_until.is_not(None)
                )
            ).one_or_none()
        return None if left is None else float(left[0])

    def end_hold(self, epoch: int, holder: str) -> None:
        """End the hold of ``epoch`` now (a clean hand-over), so that a process that
        cannot reach the lease's Redis takes the row at once."""
        with self._transaction() as conn:
            conn.execute(
                update(leader)
                .where(*self._term_is(epoch, holder), leader.c.held_until.is_not(None))
                .values(held_until=func.clock_timestamp())
            )

    def _term_is(self, epoch: int, holder: str) -> tuple[Any, ...]:
        return (
            leader.c.name == self.leader_name,
            leader.c.epoch == epoch,
            leader.c.holder == holder,
        )

    def leader_info(self) -> LeaderInfo | None:
        held_for = func.extract("epoch", leader.c.held_until - func.clock_timestamp())
        with self._transaction() as conn:
            row = conn.execute(
                select(leader, held_for.label("held_for")).where(leader.c.name == self.leader_name)
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


def _held_for(hold: float) -> Any:
    """PostgreSQL's clock ``hold`` seconds from now (the statement's own reading)."""
    return func.clock_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, hold)


def _lock_not_available(exc: StoreUnavailable) -> bool:
    """The statement gave up waiting for the row (``lock_timeout``)."""
    return isinstance(exc.__cause__, DBAPIError) and isinstance(
        exc.__cause__.orig, psycopg.errors.LockNotAvailable
    )
