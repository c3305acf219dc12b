"""The leader row's hold (``beat.lease.database_hold``): until when the leader of
``held_epoch`` holds the row by PostgreSQL's clock (``held_until``), and whether it leads
on the row alone (``held_on_database``). Every time here is PostgreSQL's
``clock_timestamp()``; every write waits for the row at most ``lock_timeout``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from sqlalchemy import Connection, case, func, not_, or_, select, update
from sqlalchemy.exc import DBAPIError

from beat.errors import StoreUnavailable
from beat.store.leader.base import FencedStore
from beat.store.tables import leader

#: Seconds a write of the hold waits for the row (claims hold it in share mode).
LOCK_TIMEOUT = 2.0


def hold_values(epoch: int, hold: float | None, *, on_database: bool) -> dict[str, Any]:
    """The columns of a hold of ``hold`` seconds from now for ``epoch`` (None: no hold)."""
    if hold is None:
        return {"held_until": None, "held_epoch": None, "held_on_database": None}
    return {"held_until": _held_for(hold), "held_epoch": epoch, "held_on_database": on_database}


def open_to(holder: str) -> Any:
    """No term of another holder leads on the row alone now: a process the Redis lease
    elected may record a newer epoch. Else it asks that term to end (``ask_to_end``)
    and records once its hold has ended."""
    return or_(
        leader.c.held_on_database.is_not(True),
        leader.c.held_epoch.is_(None),
        leader.c.held_epoch != leader.c.epoch,
        leader.c.held_until < func.clock_timestamp(),
        leader.c.holder == holder,
    )


def lock_not_available(exc: StoreUnavailable) -> bool:
    """The statement gave up waiting for the row (``lock_timeout``)."""
    return isinstance(exc.__cause__, DBAPIError) and isinstance(
        exc.__cause__.orig, psycopg.errors.LockNotAvailable
    )


def wait_at_most(conn: Connection, seconds: float) -> None:
    """Wait for the row at most ``seconds``, and let PostgreSQL end this transaction if
    it stays idle that long: a process cut off after its statement ran (its packets
    arrive, the answers do not) would otherwise hold the row, and every takeover, until
    the server's keepalives end its session; aborted, its write is undone."""
    timeout = f"{int(seconds * 1000)}ms"
    conn.execute(
        select(
            func.set_config("lock_timeout", timeout, True),
            func.set_config("idle_in_transaction_session_timeout", timeout, True),
        )
    )


def ask_to_end(conn: Connection, leader_name: str, holder: str, within: float) -> None:
    """A term of another holder leads on the row alone: end its hold ``within`` seconds
    from now (no later than it would end). That term renews no hold left this short and
    confirms no send with it (``beat.lease.database_hold``), so whatever it confirmed
    before was sent before the hold ends and the asker records its epoch."""
    conn.execute(
        update(leader)
        .where(leader.c.name == leader_name, not_(open_to(holder)))
        .values(held_until=func.least(leader.c.held_until, _held_for(within)))
    )


class HoldStatements(FencedStore):
    """The leader row's hold, for ``beat.lease.database_hold.DatabaseHold``."""

    def renew_hold(
        self, epoch: int, holder: str, hold: float, *, on_database: bool, margin: float = 0.0
    ) -> bool:
        """Hold the row ``hold`` seconds from now, as the leader of ``epoch`` (leading on
        the row alone with ``on_database``: only while its hold has more than ``margin``
        seconds left, else it was asked to end, or let lapse); False if the row has
        another epoch or holder now (this term is over). StoreUnavailable if the row
        stayed locked."""
        still_held = (
            [leader.c.held_until > _held_for(margin), leader.c.held_epoch == epoch]
            if on_database
            else []
        )
        with self._transaction() as conn:
            wait_at_most(conn, LOCK_TIMEOUT)
            renewed = conn.execute(
                update(leader)
                .where(*self._term_is(epoch, holder), *still_held)
                .values(**hold_values(epoch, hold, on_database=on_database))
                .returning(leader.c.epoch)
            ).one_or_none()
        return renewed is not None

    def take_ended_hold(self, holder: str, hold: float) -> tuple[int, datetime] | None:
        """Take the row with the next epoch, to lead on it alone, if its hold has ended
        (a hold of another epoch, or none, never has): the new epoch and PostgreSQL's
        clock as the statement read it, or None while it is held. Two processes asking
        at once: the row lock orders them, and the second finds the first's hold."""
        statement = (
            update(leader)
            .where(
                leader.c.name == self.leader_name,
                leader.c.held_epoch == leader.c.epoch,
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
                held_epoch=leader.c.epoch + 1,
                held_on_database=True,
            )
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        try:
            with self._transaction() as conn:
                wait_at_most(conn, LOCK_TIMEOUT)
                row = conn.execute(statement).one_or_none()
        except StoreUnavailable as exc:
            if lock_not_available(exc):
                return None  # a claim in flight held the row: its leader lives
            raise
        if row is None:
            return None
        taken_at: datetime = row[1]
        return int(row[0]), taken_at

    def carry_hold_on(self, epoch: int, holder: str, hold: float) -> tuple[int, datetime] | None:
        """The term ``epoch`` still holds the row: go on leading on it alone with the next
        epoch (so that what it claimed is an earlier term's, for the outbox), held
        ``hold`` seconds; the new epoch and PostgreSQL's clock, or None if the row is no
        longer held by this term."""
        statement = (
            update(leader)
            .where(
                *self._term_is(epoch, holder),
                leader.c.held_epoch == epoch,
                leader.c.held_until >= func.clock_timestamp(),
            )
            .values(
                epoch=epoch + 1,
                acquired_at=func.now(),
                beacon=None,
                held_until=_held_for(hold),
                held_epoch=epoch + 1,
                held_on_database=True,
            )
            .returning(leader.c.epoch, func.clock_timestamp())
        )
        with self._transaction() as conn:
            wait_at_most(conn, LOCK_TIMEOUT)
            row = conn.execute(statement).one_or_none()
        if row is None:
            return None
        taken_at: datetime = row[1]
        return int(row[0]), taken_at

    def hold_left(self, epoch: int, holder: str) -> float | None:
        """Seconds the row is still held by the leader of ``epoch``, by PostgreSQL's
        clock (negative once it ended); None if the row is no longer this term's."""
        with self._transaction() as conn:
            wait_at_most(conn, LOCK_TIMEOUT)
            # In share mode: an ask to end this term (``ask_to_end``) not yet committed
            # is waited for, never read past: a confirm after the ask sees it.
            left = conn.execute(
                select(func.extract("epoch", leader.c.held_until - func.clock_timestamp()))
                .where(*self._term_is(epoch, holder), leader.c.held_epoch == epoch)
                .with_for_update(read=True)
            ).one_or_none()
        return None if left is None else float(left[0])

    def end_hold(self, epoch: int, holder: str) -> None:
        """End the hold of ``epoch`` now (its term is over), so that a process that
        cannot reach the lease's Redis takes the row at once."""
        with self._transaction() as conn:
            wait_at_most(conn, LOCK_TIMEOUT)
            conn.execute(
                update(leader)
                .where(*self._term_is(epoch, holder), leader.c.held_epoch == epoch)
                .values(held_until=func.clock_timestamp())
            )

    def _term_is(self, epoch: int, holder: str) -> tuple[Any, ...]:
        return (
            leader.c.name == self.leader_name,
            leader.c.epoch == epoch,
            leader.c.holder == holder,
        )


def held_for_column() -> Any:
    """Seconds the row's hold has left, NULL when it has none of its epoch."""
    left = func.extract("epoch", leader.c.held_until - func.clock_timestamp())
    return case((leader.c.held_epoch == leader.c.epoch, left), else_=None)


def _held_for(hold: float) -> Any:
    """PostgreSQL's clock ``hold`` seconds from now (the statement's own reading)."""
    return func.clock_timestamp() + func.make_interval(0, 0, 0, 0, 0, 0, hold)
