"""What the leader's store returns: the outcome of a claim, of a pass of the reaper, of
lost-message recovery and of retention, and what operators read about the cluster.
Values only (records other layers share are in ``beat.records``)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from beat.models import Quarantine, RunToPublish, SkipKind

#: Which of some runs still have their message waiting in a queue of the broker, where
#: it can be read (``beat.leader.lost_messages.waiting_in_queues``).
InQueue = Callable[[Sequence[RunToPublish]], Collection[uuid.UUID]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """The outcome of one claim transaction."""

    runs: list[RunToPublish]
    #: Database time of the claim.
    now: datetime
    #: Schedules claimed; equal to the batch size when more may be due.
    schedules_claimed: int
    skipped: int
    #: Skip records written, by kind (misfire or overlap policy).
    skips: Counter[SkipKind] = field(default_factory=Counter)
    #: Runs cancelled by the overlap policy cancel_previous (to revoke).
    cancelled: list[uuid.UUID] = field(default_factory=list)
    #: Runs claimed ahead of their fire time (``not_before == fire_at``): the claiming
    #: leader publishes them at that time; another leader, from the outbox.
    armed: list[RunToPublish] = field(default_factory=list)
    #: ``time.monotonic()`` just after ``now`` was read: turns a database time into a
    #: local deadline without trusting this host's wall clock.
    clock: float = 0.0
    #: Runs left in the outbox until their jittered time.
    deferred: int = 0
    #: Schedules disabled because their window ended, with the reason.
    disabled: list[tuple[str, str]] = field(default_factory=list)
    #: Schedules quarantined because they could not be read or planned.
    quarantined: list[Quarantine] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class LostRun:
    id: uuid.UUID
    schedule_name: str | None
    error: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Reclaim:
    """What one pass of the reaper did."""

    #: Runs put back in the outbox, to publish again under the same task ID.
    runs: list[RunToPublish]
    #: Runs whose attempts are exhausted.
    lost: list[LostRun]


@dataclass(frozen=True, kw_only=True, slots=True)
class Unconfirmed:
    """Runs no worker has taken although their message should have reached one."""

    runs: list[RunToPublish]
    #: Database time of the query.
    now: datetime
    #: When each run was published (database time; None if not recorded).
    published_at: dict[uuid.UUID, datetime | None] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, slots=True)
class UnrecordedConsumer:
    """A consumer of ``queue`` that does not record runs, as the leader found it
    (``beat_unrecorded_consumers``); queue ``*``: no worker answered the control."""

    queue: str
    consumer: str
    first_seen_at: datetime
    seen_at: datetime
    #: The first check that no longer found it; None while it is found.
    gone_at: datetime | None


@dataclass(frozen=True, kw_only=True, slots=True)
class LeaderInfo:
    name: str
    epoch: int
    holder: str
    acquired_at: datetime
    #: Seconds the leader row is still held, by PostgreSQL's clock (negative once it
    #: ended; None: no hold recorded). ``beat.lease.database_hold``.
    held_for: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class PruneReport:
    #: Finished runs deleted.
    deleted: int
    #: Transactions that deleted at least one run.
    batches: int
    #: Finished runs older than this were deleted, and so were the incidents resolved
    #: and the notifications sent or given up before it (database time).
    cutoff: datetime
    #: False when the time budget ran out before the last old run, incident or
    #: notification was deleted.
    caught_up: bool
    #: Resolved incidents deleted, and notifications deleted (those of these incidents
    #: included).
    incidents: int
    notifications: int
    #: Changes of the audit log deleted (made before the cutoff).
    changes: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class QueueBacklog:
    """Runs published to ``queue`` that no worker has taken for a while."""

    queue: str
    waiting: int
    oldest_published_at: datetime


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerPresence:
    """A worker (its Celery node name) that renewed its row of ``beat_workers`` lately."""

    name: str
    pid: int
    #: When its main process started.
    booted_at: datetime
    seen_at: datetime


#: The queue a run's message went to, from its task name and publish options.
QueueOf = Callable[[str, Mapping[str, Any]], str]
