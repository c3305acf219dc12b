"""The leader row's hold: the half of the leader lease that PostgreSQL keeps, so that
scheduling goes on while the lease's Redis is unreachable.

The epoch that fences every write of a leader is in PostgreSQL already; Redis only
elects. So the leader row carries a hold too (``beat_leader.held_until``, PostgreSQL's
clock), and one rule keeps the two paths apart:

- **a leader elected by Redis holds both halves**: it records its epoch with a hold of
  ``seconds`` and renews the hold as it leads (every renewal interval, from its loop).
  It leads only while *both* are its own by its own clock: the Redis lease's TTL, and
  ``seconds`` less the drift margin since the last renewal of the hold it *sent*;
- **while Redis is unreachable**, a process may take the row alone once its hold has
  ended by PostgreSQL's clock, with the next epoch, and leads on the hold alone,
  renewing it the same way. Before every send of runs claimed ahead it asks PostgreSQL
  how long the hold has left, as a Redis leader asks Redis;
- **when Redis answers again**, the lease goes back to it: the fallback leader asks
  Redis every lock TTL, takes the lease once it answers and records the next epoch.
  A process the Redis lease elected meanwhile records no newer epoch while a term
  leads on the row alone (``held_on_database``): it asks that term to end, shortening
  its hold to half its margin (a tenth of it). The term then confirms no send and
  renews nothing, and the asker records once the hold has ended: what the term
  confirmed before the ask had the margin left, as a Redis leader's sends have a
  tenth of the TTL;
- **a Redis leader whose lease lapses because Redis is unreachable** goes on leading
  on the row alone, with the next epoch, if the row is still its own: no gap.

So a hold taken over has, by PostgreSQL's clock, gone unrenewed for ``seconds``, and its
previous leader, paused or cut off, stopped believing it leads before that (its own
clock, measured from a renewal it sent earlier still). Whoever leads, the epoch in the
row fences every claim: a claim is made under one epoch only.

The hold is longer than the Redis lease (its leader's longest step plus a TTL): a
leader whose loop is slow, or whose PostgreSQL link fails for a moment, loses its
Redis lease to the watchdog first, never its hold to a process cut off from Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from beat.errors import StaleEpoch, StoreUnavailable
from beat.lease.holder import DRIFT_MARGIN

logger = logging.getLogger(__name__)


class HoldRow(Protocol):
    """The leader row's hold in PostgreSQL (``beat.store.leader.term``)."""

    def renew_hold(
        self, epoch: int, holder: str, hold: float, *, on_database: bool, margin: float = ...
    ) -> bool: ...
    def take_ended_hold(self, holder: str, hold: float) -> tuple[int, datetime] | None: ...
    def carry_hold_on(
        self, epoch: int, holder: str, hold: float
    ) -> tuple[int, datetime] | None: ...
    def hold_left(self, epoch: int, holder: str) -> float | None: ...
    def end_hold(self, epoch: int, holder: str) -> None: ...


class DatabaseHold:
    """This process's hold on the leader row, for the term ``epoch`` it leads (see the
    module docstring). ``clock`` is monotonic; nothing here reads the host's wall clock."""

    def __init__(
        self,
        row: HoldRow,
        *,
        holder: str,
        seconds: float,
        renew_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._row = row
        self.holder = holder
        #: How long the row stays held past a renewal, by PostgreSQL's clock.
        self.seconds = seconds
        self._renew_interval = renew_interval
        self._clock = clock
        self._epoch: int | None = None
        #: This term leads on the row alone (Redis elects no newer epoch meanwhile).
        self._on_database = False
        self._valid_until = 0.0  # clock() past which this process no longer holds the row
        self._renewed_at = 0.0  # clock() when the last renewal was sent
        self._failing = False  # the last renewal could not reach PostgreSQL (logged once)

    @property
    def margin(self) -> float:
        """A hold with less left than this confirms no send and is not renewed (on the
        row alone): where a term on the row stops once another process asks it to end."""
        return self.seconds * DRIFT_MARGIN

    @property
    def ask_within(self) -> float:
        """How soon a process the Redis lease elected asks a term on the row to end:
        inside its margin, so that nothing it confirmed after the ask is sent."""
        return self.margin / 2

    def started(self, epoch: int, sent_at: float, *, on_database: bool = False) -> None:
        """The statement sent at ``sent_at`` recorded ``epoch`` with a hold of ``seconds``."""
        self._epoch, self._on_database = epoch, on_database
        self._held_from(sent_at)

    def carry_on(self, epoch: int) -> tuple[int, datetime] | None:
        """The term ``epoch`` lost its Redis lease while Redis was unreachable: if it
        still holds the row, lead on it alone with the next epoch (its runs claimed
        ahead then go out from the outbox at their time, an earlier term's); the new
        epoch and PostgreSQL's clock, or None."""
        sent_at = self._clock()
        taken = self._row.carry_hold_on(epoch, self.holder, self.seconds)
        if taken is not None:
            self.started(taken[0], sent_at, on_database=True)
        return taken

    def is_held(self) -> bool:
        """True while this process may lead on the row (by its own clock)."""
        return self._epoch is not None and self._clock() < self._valid_until

    def keep(self) -> bool:
        """Renew the hold if a renewal interval passed since the last one was sent;
        False once the row belongs to another term (a newer epoch). A renewal that
        cannot reach PostgreSQL is tried again at the next pass: until then the hold
        lasts as long as the last renewal made it last."""
        if self._epoch is None:
            return False
        sent_at = self._clock()
        if sent_at - self._renewed_at < self._renew_interval:
            return self.is_held()
        try:
            renewed = self._row.renew_hold(
                self._epoch,
                self.holder,
                self.seconds,
                on_database=self._on_database,
                margin=self.margin,
            )
        except StoreUnavailable as exc:
            if not self._failing:
                logger.warning("could not renew the leader row's hold (tried again): %s", exc)
            self._failing = True
            return self.is_held()
        self._failing = False
        if not renewed:
            self.end()
            return False
        self._held_from(sent_at)
        return True

    def take_over(self) -> tuple[int, datetime] | None:
        """Take the row if its hold has ended (``beat.store.leader.term``): the new epoch
        and PostgreSQL's time as the statement read it, or None while it is held."""
        sent_at = self._clock()
        taken = self._row.take_ended_hold(self.holder, self.seconds)
        if taken is not None:
            self.started(taken[0], sent_at, on_database=True)
        return taken

    def time_left(self) -> float | None:
        """Seconds the hold has left by PostgreSQL's clock (one round trip), or None once
        the row is another term's (and this hold ends)."""
        if self._epoch is None:
            return None
        left = self._row.hold_left(self._epoch, self.holder)
        if left is None:
            self.end()
        return left

    def confirm_for_send(self) -> None:
        """Raise StaleEpoch unless PostgreSQL confirms that this term holds the row with
        enough of its hold left to send (a tenth of it), as a Redis leader asks Redis."""
        try:
            left = self.time_left()
        except StoreUnavailable as exc:
            raise StaleEpoch(
                f"cannot confirm the leader row's hold before sending runs: {exc}"
            ) from exc
        if left is None:
            raise StaleEpoch("another process leads (checked before sending runs)")
        if left < self.margin:
            raise StaleEpoch(f"the leader row's hold ends in {left:.3f}s, too soon to send runs")

    def release(self) -> None:
        """End the hold in PostgreSQL too (a clean hand-over): a process that cannot
        reach Redis takes the row at once. Best effort: otherwise it ends by itself."""
        epoch = self._epoch
        self.end()
        if epoch is None:
            return
        try:
            self._row.end_hold(epoch, self.holder)
        except StoreUnavailable as exc:
            logger.warning("could not end the leader row's hold (it ends by itself): %s", exc)

    def end(self) -> None:
        """Forget the hold (this term is over), touching nothing in PostgreSQL."""
        self._epoch, self._on_database = None, False
        self._valid_until = 0.0

    def _held_from(self, sent_at: float) -> None:
        self._renewed_at = sent_at
        self._valid_until = sent_at + self.seconds * (1 - DRIFT_MARGIN)
