"""Runs whose message the broker lost, found by looking for it, and published again.

A run stays ``queued`` (or ``retrying``) while its message waits in the broker
or a worker holds it. A message can vanish without a worker ever taking it:
Redis restarted without persistence, a key evicted, a worker killed between
popping a message and recording it as unacknowledged. Waiting for twice the
visibility timeout (an hour by default) to notice is too long; publishing
again everything not yet taken would flood a long but healthy queue with
copies. So the leader asks the broker (``beat.publish.inventory``) whether the
message of each run that should have been taken by now is still there, and
publishes again only the runs whose message is missing in two looks at least
``CONFIRM_AFTER`` seconds apart: a message in flight between the queue and
the unacknowledged hash is missing from both for a moment, never for seconds.

**A message missing is proof only if every consumer records runs.** A worker
without this package (a rolling deploy that upgraded beat first, a worker built
from another image, any consumer of the queue that is not a Celery worker with
``beat.delivery.tracking``) takes a message and records nothing: the run reads as
untaken, the message is gone, and a copy sent again runs again, for ever. So
the leader checks which consumers record runs: workers that do announce
themselves in ``beat_workers`` (``LeaderStore.live_workers``); Celery's remote
control (``inspect().active_queues()``, replies keyed by node name) names every
worker and the queues it consumes. A queue consumed by a node that is not in
``beat_workers`` has an unrecorded consumer. What the leader found is kept in
``beat_unrecorded_consumers`` (with the database's time it was first and last
seen), said once in a WARNING line, and shown by ``schedules health``, the UI's
cluster page and the ``habeat_unrecorded_consumers`` gauge. While a queue has
such a row, no run of that queue is sent again by this recovery: it is left to
the reaper's visibility-timeout rule (``stale_queued_after``). A row is kept for
twice the visibility timeout after its consumer was last seen, not dropped at the
first check it misses: a worker busy with a long task (``-P solo``) or slow to
answer may still hold a message it took, and a worker that stopped may have run
one; by then the reaper's rule has taken over any run published while it
consumed. No reply at all while some workers record runs (the broker restarting,
the control disabled) tells nothing: it is recorded as queue ``*`` and said, and no
run is sent again until a check is answered. No reply and no worker recording runs
means nothing is known to consume: recovery goes on (a message lost while no
worker runs is sent again), and the bound below holds for a consumer that never
answers.

The check runs on a thread of its own (its replies take
``CONSUMERS_REPLY_TIMEOUT``; the leader's loop does not wait for them) every
``CONSUMERS_CHECK_INTERVAL``, and sooner when a message is missing: a run is
sent again only after a check that started after its message was first seen
missing found no unrecorded consumer on its queue. The consumer that took the
message was consuming then, so the check sees it unless it stopped (or does not
answer) in between.

What the control cannot show: a consumer that is not a Celery worker, or one
started and stopped between two checks. On Redis a queue's consumers cannot be
counted (``BRPOP`` leaves no trace); on RabbitMQ the broker's content cannot be
read, and this recovery does nothing there. For those, **copies are bounded**:
a run whose message was sent ``beat.store.leader.MAX_SENDS`` times in all (its
publication and the copies of this recovery, ``beat_runs.recovery_sends``) and
that no worker recorded ends ``lost``, with the reason, instead of being sent
again. The reaper's visibility-timeout rule, which takes over where this recovery
does nothing, counts its copies in the same column and ends a run ``lost`` at the
same bound; on Redis it first looks for the message (``waiting_in_queues``): a run
whose message still waits in its queue is in a backlog, neither sent again nor
counted (``LeaderStore.reclaim`` says what a backlog costs where nothing can be read).

A message can also be stranded in kombu's unacknowledged hash: a worker took it
and was killed before its ``task_received`` handler (``beat.delivery.tracking``)
recorded the receipt. The run is still ``queued``, with no receipt lease for
the reaper to see expire, and kombu hands the message back only after the
visibility timeout. So a delivery counts as missing, for a run no worker
recorded (the only runs looked for), once it is old enough: see
``LostMessages._missing``. **How old is decided without a worker's clock.**
kombu's ``unacked_index`` score, the only time the broker keeps for a delivery,
is the consuming worker's ``time.time()``, a clock neither the leader nor
PostgreSQL sets. So the proof is the leader's own sight: a delivery it has seen
holding a message no worker recorded, for ``UNRECORDED_AFTER`` on its monotonic
clock, is that old at least, whatever any clock says (a copy then goes out some
75 s after the delivery; a new leader starts its sight afresh, later, never
earlier). The score is a hint that only saves that wait for a delivery that is
plainly old: read against the database's ``now()`` (not the leader's clock),
with ``DELIVERY_CLOCK_MARGIN`` added for the worker's skew. A worker behind the
database's clock by more than the margin may thus see a copy sent early, which
is waste, not a second execution: that worker is alive and records the
receipt, and the run is taken by one of the two deliveries only (the receipt of
a plain run, the guard of an idempotent one).

A run whose ``expires`` has passed is ended ``expired`` instead: published
again it would only be discarded, or run late. Brokers whose queues cannot be
read (RabbitMQ) keep the visibility-timeout rule of the reaper.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from beat import metrics
from beat.config import BeatConfig
from beat.models import RunToPublish
from beat.publish.dispatch import expiry_of
from beat.publish.inventory import broker_holdings, queue_of
from beat.store.leader import LeaderStore, LostRun, UnrecordedConsumer
from beat.store.tables import ALL_QUEUES

logger = logging.getLogger(__name__)

#: A run not taken by any worker this long after it was published (or after its retry
#: was due) is looked for in the broker (seconds).
UNTAKEN_AFTER = 30.0
#: The leader looks at most this often (seconds).
CHECK_INTERVAL = 10.0
#: A message must be missing in two looks at least this far apart (seconds).
CONFIRM_AFTER = 5.0
#: A run's message delivered to a worker this long ago, the receipt still not recorded,
#: counts as missing (seconds, by the database's clock; see the module docstring). A
#: live worker records the run right after the delivery: at receipt in the main process
#: (the ``task_received`` signal, before the request is reserved), or, for a request
#: that runs at once, as the pool process starts it: one PostgreSQL statement either way.
#: The bound is the one a publication gets (``UNTAKEN_AFTER``): generous against a slow
#: PostgreSQL, and with the confirmation a copy is sent some 40 s (plus the clock
#: margin) after the delivery instead of an hour. Too short is not unsafe, only
#: wasteful (see ``LostMessages._missing``).
UNRECORDED_AFTER = UNTAKEN_AFTER
#: How far a worker's clock (kombu's delivery score) may be behind the database's
#: before a delivery is read as older than it is (seconds).
DELIVERY_CLOCK_MARGIN = 120.0
#: The leader asks the workers which queues they consume at most this often (seconds),
#: and sooner when a run is to be sent again.
CONSUMERS_CHECK_INTERVAL = 30.0
#: How long it waits for their replies (seconds).
CONSUMERS_REPLY_TIMEOUT = 1.0

#: The consumers of each queue, by node name (``celery@host``) -> queue names, as
#: Celery's remote control tells them; None: no worker answered.
Consumers = Mapping[str, Sequence[str]] | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Recovery:
    """What one look did."""

    #: Runs put back in the outbox: their message is gone.
    republish: list[RunToPublish] = field(default_factory=list)
    #: Runs ended ``expired``.
    expired: int = 0
    #: Runs whose message was missing in this look, not yet confirmed.
    suspected: int = 0
    #: Runs ended ``lost``: their message was sent ``MAX_SENDS`` times, none recorded.
    lost: list[LostRun] = field(default_factory=list)


def active_queues(app: Any, *, timeout: float) -> Consumers:
    """Which queues each worker consumes, by Celery's remote control; None when no
    worker answered within ``timeout`` seconds or the broker could not be reached."""
    try:
        replies = app.control.inspect(timeout=timeout).active_queues()
    except Exception as exc:  # any broker error: nothing is known
        logger.info("could not ask the workers which queues they consume: %s", exc)
        return None
    if not replies:
        return None
    return {
        str(node): [str(queue["name"]) for queue in queues or () if isinstance(queue, dict)]
        for node, queues in replies.items()
    }


def unrecorded_pairs(consumers: Consumers, recording: Collection[str]) -> list[tuple[str, str]]:
    """The (queue, consumer) pairs of the consumers that do not record runs: the nodes
    that are not among ``recording`` (the node names of ``beat_workers``), with each
    queue they consume. When no worker answered: ``(ALL_QUEUES, "")`` if some record
    runs (they should have answered: the broker is restarting, or the control is
    disabled), else nothing (no worker is known to consume at all)."""
    if consumers is None:
        return [(ALL_QUEUES, "")] if recording else []
    return sorted(
        {
            (queue, node)
            for node, queues in consumers.items()
            if node not in recording
            for queue in queues
        }
    )


def may_send_again(
    queue: str, published_at: datetime | None, found: Sequence[UnrecordedConsumer]
) -> bool:
    """Whether a run of ``queue`` published at ``published_at`` may be sent again because
    its message is missing, given what the checks ``found``: no consumer that does not
    record runs was seen on that queue lately. A row is kept for twice the visibility
    timeout after its last sighting, and counts whether or not the latest check saw it:
    a consumer busy with a long task (``-P solo``), slow to answer or stopped may have
    taken the message all the same. A run whose publication was not recorded is not
    sent again (nothing says how old it is)."""
    if published_at is None:
        return False
    return not any(consumer.queue == queue for consumer in found)


def _start_thread(check: Callable[[], None]) -> None:
    threading.Thread(target=check, name="habeat-consumers-check", daemon=True).start()


class LostMessages:
    """The leader's search for lost messages (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        *,
        clock: Callable[[], float] = time.monotonic,
        inspect: Callable[[], Consumers] | None = None,
        start: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        self.app = app
        self._clock = clock
        self._inspect = inspect or partial(active_queues, app, timeout=CONSUMERS_REPLY_TIMEOUT)
        #: Runs a check of the consumers (on a thread of its own, by default).
        self._start = start or _start_thread
        self._missing_since: dict[uuid.UUID, float] = {}
        #: clock() when each delivery holding a message no worker recorded was first seen.
        self._delivered_since: dict[str, float] = {}
        self._next_look = 0.0
        self._lock = threading.Lock()
        self._checking = False
        #: A check done and not yet taken by a look: when it started, what it found.
        self._checked: tuple[float, Consumers] | None = None
        self._next_check = 0.0
        #: clock() when the latest check taken started; None: none since this leads.
        self._view_started: float | None = None

    def due(self) -> bool:
        return self._clock() >= self._next_look

    def forget(self) -> None:
        """Drop what earlier looks saw (this process no longer leads)."""
        self._missing_since.clear()
        self._delivered_since.clear()
        self._view_started = None
        metrics.UNRECORDED_CONSUMERS.clear()  # what a leader found: this one no longer leads

    def look(self, store: LeaderStore, epoch: int, *, limit: int, idle_timeout: float) -> Recovery:
        self._next_look = self._clock() + CHECK_INTERVAL
        self._take_check(store, epoch, idle_timeout)
        if self._clock() >= self._next_check:
            self._check_consumers()
        unconfirmed = store.unconfirmed_runs(older_than=UNTAKEN_AFTER, limit=limit)
        if not unconfirmed.runs:
            self._missing_since.clear()
            self._delivered_since.clear()
            return Recovery()
        expired = [run.id for run in unconfirmed.runs if _expired(run, unconfirmed.now)]
        ended = store.expire_runs(epoch, expired, idle_timeout=idle_timeout)
        waiting = [run for run in unconfirmed.runs if run.id not in set(expired)]
        queues = self._recoverable_queues(store, waiting, unconfirmed.published_at)
        missing = self._missing(waiting, queues, now=unconfirmed.now)
        if missing is None:
            return Recovery(expired=ended)
        now = self._clock()
        self._missing_since = {run_id: self._missing_since.get(run_id, now) for run_id in missing}
        confirmed = [
            run_id for run_id, since in self._missing_since.items() if now - since >= CONFIRM_AFTER
        ]
        # Only a check of the consumers started after the message was seen missing can
        # tell that no consumer that records nothing took it: wait for one.
        checked = [run_id for run_id in confirmed if self._checked_since(run_id)]
        if not all(self._checked_since(run_id) for run_id in self._missing_since):
            self._check_consumers()
        requeued = store.requeue_missing(epoch, checked, idle_timeout=idle_timeout)
        for run_id in checked:
            del self._missing_since[run_id]
        _report_lost(requeued.lost)
        return Recovery(
            republish=requeued.runs,
            expired=ended,
            suspected=len(self._missing_since),
            lost=requeued.lost,
        )

    # -- the consumers ----------------------------------------------------------------

    def _checked_since(self, run_id: uuid.UUID) -> bool:
        """Whether the consumers were checked after the run's message was first missed."""
        started = self._view_started
        return started is not None and started > self._missing_since[run_id]

    def _check_consumers(self) -> None:
        """Start a check of the consumers unless one is running; the next look takes it."""
        with self._lock:
            if self._checking:
                return
            self._checking = True
        self._next_check = self._clock() + CONSUMERS_CHECK_INTERVAL
        started = self._clock()

        def check() -> None:
            consumers: Consumers = None
            try:
                consumers = self._inspect()
            finally:
                with self._lock:
                    self._checked = (started, consumers)
                    self._checking = False

        self._start(check)

    def _take_check(self, store: LeaderStore, epoch: int, idle_timeout: float) -> None:
        """Record what the last check found (fenced), say once what is new, and set the
        gauge."""
        with self._lock:
            checked, self._checked = self._checked, None
        if checked is None:
            return
        started, consumers = checked
        config = BeatConfig.from_celery_conf(self.app.conf)
        # A node that recorded its presence lately is a worker with this package, also
        # while it starts again and answers the control before it writes its row: as long
        # as the fallback a consumer that records nothing would cause.
        recent = timedelta(seconds=2 * config.visibility_timeout)
        recording = {worker.name for worker in store.live_workers(within=recent)}
        found = unrecorded_pairs(consumers, recording)
        new = store.record_consumers(
            epoch,
            found,
            forget_after=2 * config.visibility_timeout,
            answered=consumers is not None,
            recording=recording,
            idle_timeout=idle_timeout,
        )
        # Workers that record runs did not answer (the broker restarting, the control off):
        # this check tells nothing about the consumers, and decides no copy.
        if consumers is not None or not recording:
            self._view_started = started
        _report_consumers(found, new, 2 * config.visibility_timeout)

    def _recoverable_queues(
        self,
        store: LeaderStore,
        waiting: list[RunToPublish],
        published_at: Mapping[uuid.UUID, datetime | None],
    ) -> dict[uuid.UUID, str]:
        """The queue of each run whose message may be looked for and sent again: routed to
        one queue the broker can be read for (not by topic or fanout), that no consumer
        recording nothing may have taken it from."""
        found = store.unrecorded_consumers()
        queues: dict[uuid.UUID, str] = {}
        for run in waiting:
            queue = queue_of(self.app, run.task, run.options, args=run.args, kwargs=run.kwargs)
            if queue is not None and may_send_again(queue, published_at.get(run.id), found):
                queues[run.id] = queue
        return queues

    # -- the broker -------------------------------------------------------------------

    def waiting_in_queues(self, runs: Sequence[RunToPublish]) -> set[uuid.UUID]:
        """Which of ``runs`` (``queued``, no worker holding them) still have their message
        waiting in its queue: in a backlog, not lost. A delivery in kombu's unacked hash
        does not count: a consumer took it (one that records nothing runs it). Nothing
        where the broker cannot be read (RabbitMQ, a route to no single queue, a broker
        error): the reaper then counts every copy (``beat.store.leader.InQueue``)."""
        try:
            queues = {
                run.id: queue_of(self.app, run.task, run.options, args=run.args, kwargs=run.kwargs)
                for run in runs
            }
            readable = {run_id: queue for run_id, queue in queues.items() if queue is not None}
            ids = {run.celery_task_id: run.id for run in runs if run.id in readable}
            holdings = broker_holdings(self.app, set(readable.values()), list(ids))
        except Exception as exc:  # a broker error, a route gone: nothing is known to wait
            logger.info("could not look for the messages of stale runs: %s", exc)
            return set()
        return {ids[task_id] for task_id in holdings.waiting} if holdings else set()

    def _missing(
        self, waiting: list[RunToPublish], queues: Mapping[uuid.UUID, str], *, now: datetime
    ) -> set[uuid.UUID] | None:
        """The runs among ``queues`` whose message the broker does not hold; None if it
        cannot tell. ``now``: the database's.

        ``waiting`` are runs no worker recorded (no receipt, no lease). A delivery of
        one that is ``UNRECORDED_AFTER`` old (``_stranded``) does not hold it: its
        worker died before recording the receipt (or cannot reach PostgreSQL), and the
        run is sent again like a lost one. That is safe, whoever holds the old delivery:

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

        A consumer that records nothing is the exception, hence ``queues``: runs of the
        queues it may have taken from are not looked for at all.
        """
        if not queues:
            self._delivered_since.clear()
            return set()
        looked_for = [run for run in waiting if run.id in queues]
        holdings = broker_holdings(
            self.app, set(queues.values()), [run.celery_task_id for run in looked_for]
        )
        if holdings is None:
            return None
        stranded = self._stranded(holdings.delivered, now=now)
        held = holdings.waiting | (holdings.delivered.keys() - stranded)
        return {run.id for run in looked_for if run.celery_task_id not in held}

    def _stranded(self, delivered: Mapping[str, float | None], *, now: datetime) -> set[str]:
        """The deliveries, among those holding a message no worker recorded, that are
        ``UNRECORDED_AFTER`` old: by this leader's own sight of them (proof: it has seen
        them held by the delivery alone for that long, on its monotonic clock), or by
        their score read against the database's ``now`` with ``DELIVERY_CLOCK_MARGIN``
        for the consuming worker's clock (a hint, which only saves the wait for a
        delivery that is plainly old)."""
        seen_at = self._clock()
        self._delivered_since = {
            task_id: self._delivered_since.get(task_id, seen_at) for task_id in delivered
        }
        oldest_score = now.timestamp() - UNRECORDED_AFTER - DELIVERY_CLOCK_MARGIN
        return {
            task_id
            for task_id, score in delivered.items()
            if seen_at - self._delivered_since[task_id] >= UNRECORDED_AFTER
            or (score is not None and score < oldest_score)
        }


def _report_consumers(
    found: Sequence[tuple[str, str]], new: Sequence[UnrecordedConsumer], fallback: float
) -> None:
    metrics.UNRECORDED_CONSUMERS.clear()
    for queue, _ in found:
        metrics.UNRECORDED_CONSUMERS.labels(queue=queue).inc()
    for consumer in new:
        if consumer.queue == ALL_QUEUES:
            logger.warning(
                "no worker answered Celery's remote control (inspect active_queues) though"
                " some record runs: lost-message recovery sends nothing again until they"
                " answer (meanwhile the visibility timeout, %.0f s, applies)",
                fallback,
                extra={"queue": consumer.queue},
            )
        else:
            logger.warning(
                "queue %s is consumed by %s, which does not record runs (a worker without"
                " celery-habeat, or without beat.worker in its imports): lost-message"
                " recovery for %s falls back to the visibility timeout (%.0f s)",
                consumer.queue,
                consumer.consumer,
                consumer.queue,
                fallback,
                extra={"queue": consumer.queue, "consumer": consumer.consumer},
            )


def _report_lost(lost: Sequence[LostRun]) -> None:
    metrics.RUNS_GIVEN_UP.inc(len(lost))
    for run in lost:
        logger.error(
            "run %s of schedule %s is lost: %s",
            run.id,
            run.schedule_name,
            run.error,
            extra={"run_id": str(run.id), "schedule": run.schedule_name},
        )


def _expired(run: RunToPublish, now: datetime) -> bool:
    expires = expiry_of(run)
    return expires is not None and expires <= now
