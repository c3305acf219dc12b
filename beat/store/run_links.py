"""The links of a succeeded run that may be unsent (``beat_runs.unsent_links``).

The idempotent base records a run ``succeeded`` before its callbacks and the rest of
its chain are sent (``beat.delivery.links``): a completion refused because the lease
was lost must send nothing. A worker that dies, or a broker that refuses the send,
between the two would lose them: the second delivery of the run finds it succeeded
and is a duplicate. So the completion keeps the value they are sent with, the worker
clears it once they are sent, and a second delivery that finds it still set once the
run's lease has passed since the completion (by the database's clock: the first
delivery's worker, if alive, has sent them or failed to) sends them itself.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, null, select, update

from beat.store.db import StoreConnection
from beat.store.tables import runs


@dataclass(frozen=True, kw_only=True, slots=True)
class UnsentLinks:
    """What a succeeded run's links are sent with, and whether its first delivery's time
    to send them is over."""

    result: Any
    settled: bool


class RunLinks(StoreConnection):
    def unsent_links(self, run_id: uuid.UUID, *, settle_seconds: float) -> UnsentLinks | None:
        """The run's links not sent yet (None: sent, or it has none). ``settled`` once
        ``settle_seconds`` have passed since it was recorded succeeded."""
        statement = select(
            runs.c.unsent_links,
            runs.c.finished_at <= func.now() - func.make_interval(0, 0, 0, 0, 0, 0, settle_seconds),
        ).where(runs.c.id == run_id, runs.c.unsent_links.is_not(None))
        with self._each_statement_commits() as conn:
            row = conn.execute(statement).one_or_none()
        if row is None:
            return None
        return UnsentLinks(result=row[0].get("result"), settled=bool(row[1]))

    def links_sent(self, run_id: uuid.UUID) -> None:
        """The run's links are sent: a later delivery of it sends nothing."""
        with self._each_statement_commits() as conn:
            conn.execute(
                update(runs)
                .where(runs.c.id == run_id, runs.c.unsent_links.is_not(None))
                .values(unsent_links=null())  # SQL NULL: None would be JSON null
            )
