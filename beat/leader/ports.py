"""What the leader loop sees of its collaborators: small protocols, implemented by
PostgreSQL, Redis and a Celery broker in production (``beat.scheduler``) and by
in-memory fakes in the unit tests (``tests/fakes.py``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from beat.claim.planning import SchedulePlanner
from beat.claim.window import DueSecond
from beat.leader.lost_messages import Recovery
from beat.lease.beacon import WorkerDeaths
from beat.models import Quarantine, RunToPublish, UnpublishableRun
from beat.publish.dispatch import PublishResult
from beat.records import DatabaseClock
from beat.store.leader import Claim, InQueue, MonitorReport, PruneReport, Reclaim
from beat.store.leader.notifications import PendingNotification
from beat.store.leader.run_monitors import RunMonitorReport
from beat.store.leader.stall import StallReport
from beat.store.schedule_series import ScheduleSeries
from beat.store.stats import SummaryReport


class ClaimStore(Protocol):
    """What the loop reads and writes as leader (``beat.store.leader.LeaderStore``)."""

    def claim_due(
        self,
        epoch: int,
        *,
        batch: int,
        plan: SchedulePlanner,
        idle_timeout: float = ...,
        ahead: float = ...,
    ) -> Claim: ...
    def pending_runs(self, epoch: int, *, grace: float, limit: int) -> list[RunToPublish]: ...
    def mark_published(self, run_ids: Sequence[uuid.UUID]) -> int: ...
    def fail_unpublishable(self, rejected: Sequence[UnpublishableRun]) -> list[Quarantine]: ...
    def reclaim(
        self,
        epoch: int,
        *,
        stale_queued_after: float,
        limit: int,
        idle_timeout: float = ...,
        lease_seconds: float = ...,
        dead: Sequence[uuid.UUID] = ...,
        interrupted: Sequence[uuid.UUID] = ...,
        in_queue: InQueue | None = ...,
    ) -> Reclaim: ...
    def links_left_unsent(
        self, epoch: int, *, older_than: float, limit: int, idle_timeout: float = ...
    ) -> list[RunToPublish]: ...
    def seconds_until_next_fire(self, epoch: int | None = ...) -> float | None: ...
    def due_profile(self, horizon: float) -> list[DueSecond]: ...
    def seconds_until_lease_expiry(self) -> float | None: ...
    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = ...,
        on_batch: Callable[[int], None] | None = ...,
        budget: float | None = ...,
    ) -> PruneReport: ...
    def summarise(
        self, *, until: datetime | None = ..., budget: float | None = ...
    ) -> SummaryReport: ...
    def schedule_series(self, *, limit: int) -> list[ScheduleSeries] | None: ...
    def watch_failures(
        self, epoch: int, *, alert_after: int, pause_after: int, idle_timeout: float
    ) -> MonitorReport: ...
    def watch_runs(self, epoch: int, *, idle_timeout: float) -> RunMonitorReport: ...
    def take_notifications(
        self,
        epoch: int | None,
        *,
        limit: int,
        lease: timedelta,
        idle_timeout: float,
        overdue_by: timedelta = ...,
    ) -> list[PendingNotification]: ...
    def watch_stall(self, *, stall_after: timedelta = ...) -> StallReport: ...
    def notification_sent(self, notification_id: int) -> None: ...
    def notification_failed(
        self, notification_id: int, error: str, *, epoch: int | None
    ) -> bool: ...


class Leader(Protocol):
    """This process's leadership (``beat.leader.leadership.Leadership``)."""

    @property
    def epoch(self) -> int | None: ...
    @property
    def database(self) -> DatabaseClock | None:
        """PostgreSQL's clock as the takeover of this term read it."""

    def lead(self) -> int | None: ...
    def made_progress(self) -> None: ...
    def confirm_for_send(self) -> None: ...


class Publisher(Protocol):
    """Sends runs to the broker with the run ID as task ID (``beat.publish.dispatch``);
    ``database`` is the database's clock, which times the messages' expiry."""

    def publish(
        self, runs: Sequence[RunToPublish], *, database: DatabaseClock | None = ...
    ) -> PublishResult: ...
    def publish_at(
        self,
        runs: Sequence[RunToPublish],
        deadline: float,
        *,
        database: DatabaseClock | None = ...,
        before_send: Callable[[], None] | None = ...,
        while_waiting: Callable[[], float] | None = ...,
    ) -> PublishResult: ...
    def revoke(self, run_ids: Sequence[uuid.UUID]) -> None: ...
    def terminate(self, task_ids: Sequence[str]) -> None: ...


class Waiter(Protocol):
    """Sleeps up to ``timeout`` seconds; returns early when woken (LISTEN/NOTIFY) since
    ``listen`` was called (or the last wait)."""

    def listen(self) -> None: ...
    def wait(self, timeout: float) -> bool: ...


class MessageRecovery(Protocol):
    """Finds runs whose message the broker lost (``beat.leader.lost_messages.LostMessages``)."""

    def due(self) -> bool: ...
    def forget(self) -> None: ...
    def look(self, store: Any, epoch: int, *, limit: int, idle_timeout: float) -> Recovery: ...
    def waiting_in_queues(self, runs: Sequence[RunToPublish]) -> Collection[uuid.UUID]: ...


class RunCrashes(Protocol):
    """Running runs whose worker process is dead (``beat.lease.beacon.CrashDetection``)."""

    def dead_runs(self, *, limit: int) -> WorkerDeaths: ...


class Sends(Protocol):
    """Where a burst's batch is sent while the next is claimed
    (``beat.leader.overlapped_send.OverlappedSend``): one send in flight at most."""

    @property
    def in_flight(self) -> bool: ...
    def start(self, send: Callable[[], None]) -> None: ...
    def finish(self) -> None: ...
    def finish_quietly(self, timeout: float | None = ...) -> None: ...
