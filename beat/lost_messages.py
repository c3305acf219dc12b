"""Runs whose message the broker lost, found by looking for it, and published again.

A run stays ``queued`` (or ``retrying``) while its message waits in the broker
or a worker holds it. A message can vanish without a worker ever taking it:
Redis restarted without persistence, a key evicted, a worker killed between
popping a message and recording it as unacknowledged. Waiting for twice the
visibility timeout (an hour by default) to notice is too long; publishing
again everything not yet taken would flood a long but healthy queue with
copies. So the leader asks the broker (``beat.broker_inventory``) whether the
message of each run that should have been taken by now is still there, and
publishes again only the runs whose message is missing in two looks at least
``CONFIRM_AFTER`` seconds apart: a message in flight between the queue and
the unacknowledged hash is missing from both for a moment, never for seconds.

A message can also be stranded in kombu's unacknowledged hash: a worker took it
and was killed before its ``task_received`` handler (``beat.run_tracking``)
recorded the receipt. The run is still ``queued``, with no receipt lease for
the reaper to see expire, and kombu hands the message back only after the
visibility timeout. So a delivery older than ``UNRECORDED_AFTER`` counts as
missing for a run no worker recorded (the only runs looked for): see
``LostMessages._missing``.

A run whose ``expires`` has passed is ended ``expired`` instead: published
again it would only be discarded, or run late. Brokers whose queues cannot be
read (RabbitMQ) keep the visibility-timeout rule of the reaper.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from beat.broker_inventory import held_task_ids, queue_of
from beat.dispatch import expiry_of
from beat.leader_store import LeaderStore
from beat.models import RunToPublish

logger = logging.getLogger(__name__)

#: A run not taken by any worker this long after it was published (or after its retry
#: was due) is looked for in the broker (seconds).
UNTAKEN_AFTER = 30.0
#: The leader looks at most this often (seconds).
CHECK_INTERVAL = 10.0
#: A message must be missing in two looks at least this far apart (seconds).
CONFIRM_AFTER = 5.0
#: A run's message delivered to a worker this long ago, the receipt still not recorded,
#: counts as missing (seconds since kombu's delivery, its ``unacked_index`` score). A
#: live worker writes the receipt in the main process right after the delivery (the
#: ``task_received`` signal, before the request is reserved): one PostgreSQL statement.
#: The bound is the one a publication gets (``UNTAKEN_AFTER``): generous against a slow
#: PostgreSQL and against clock skew between a worker and the leader (the score is the
#: worker's wall clock), and with the confirmation a copy is sent some 40 s after the
#: delivery instead of an hour. Too short is not unsafe, only wasteful (see
#: ``LostMessages._missing``).
UNRECORDED_AFTER = UNTAKEN_AFTER


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """What one look did."""

    #: Runs put back in the outbox: their message is gone.
    republish: list[RunToPublish] = field(default_factory=list)
    #: Runs ended ``expired``.
    expired: int = 0
    #: Runs whose message was missing in this look, not yet confirmed.
    suspected: int = 0


class LostMessages:
    """The leader's search for lost messages (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self._clock = clock
        self._wall_clock = wall_clock
        self._missing_since: dict[uuid.UUID, float] = {}
        self._next_look = 0.0

    def due(self) -> bool:
        return self._clock() >= self._next_look

    def forget(self) -> None:
        """Drop what earlier looks saw (this process no longer leads)."""
        self._missing_since.clear()

    def look(self, store: LeaderStore, epoch: int, *, limit: int, idle_timeout: float) -> Recovery:
        self._next_look = self._clock() + CHECK_INTERVAL
        unconfirmed = store.unconfirmed_runs(older_than=UNTAKEN_AFTER, limit=limit)
        if not unconfirmed.runs:
            self._missing_since.clear()
            return Recovery()
        expired = [run.id for run in unconfirmed.runs if _expired(run, unconfirmed.now)]
        ended = store.expire_runs(epoch, expired, idle_timeout=idle_timeout)
        waiting = [run for run in unconfirmed.runs if run.id not in set(expired)]
        missing = self._missing(waiting)
        if missing is None:
            return Recovery(expired=ended)
        now = self._clock()
        confirmed = [
            run_id
            for run_id in missing
            if now - self._missing_since.get(run_id, now) >= CONFIRM_AFTER
        ]
        self._missing_since = {
            run_id: self._missing_since.get(run_id, now)
            for run_id in missing
            if run_id not in confirmed
        }
        republish = store.requeue_missing(epoch, confirmed, idle_timeout=idle_timeout)
        return Recovery(republish=republish, expired=ended, suspected=len(self._missing_since))

    def _missing(self, waiting: list[RunToPublish]) -> set[uuid.UUID] | None:
        """The runs whose message the broker does not hold; None if it cannot tell.

        ``waiting`` are runs no worker recorded (no receipt, no lease). A delivery of
        one older than ``UNRECORDED_AFTER`` does not hold it: its worker died before
        recording the receipt (or cannot reach PostgreSQL), and the run is sent again
        like a lost one. That is safe, whoever holds the old delivery:

        - the worker is dead: kombu restores the message after the visibility timeout;
          it then meets a run taken or finished, which the worker's receipt check (a
          plain task: ``receive_plain`` refuses it) or the guard (``IdempotentTask``)
          drops;
        - the worker lives but its receipt write failed (PostgreSQL down): for a
          guarded task it may still run the task, and the copy meets the guard, which
          lets one of the two deliveries start the run and refuses the other; a plain
          task never runs without its receipt (``_hold_received_run`` hands the message
          back to the queue when ``receive_plain`` fails), and whichever delivery takes
          the run first, the other is refused at receipt.
        """
        queues: dict[uuid.UUID, str] = {}
        for run in waiting:
            queue = queue_of(self.app, run.task, run.options, args=run.args, kwargs=run.kwargs)
            if queue is not None:  # routed by topic or fanout: the broker cannot be read
                queues[run.id] = queue
        if not queues:
            return set()
        looked_for = [run for run in waiting if run.id in queues]
        held = held_task_ids(
            self.app,
            set(queues.values()),
            [run.celery_task_id for run in looked_for],
            delivered_since=self._wall_clock() - UNRECORDED_AFTER,
        )
        if held is None:
            return None
        return {run.id for run in looked_for if run.celery_task_id not in held}


def _expired(run: RunToPublish, now: datetime) -> bool:
    expires = expiry_of(run)
    return expires is not None and expires <= now
