"""The worker's main process seen from PostgreSQL: its presence (``beat_workers``)
and the receipt leases of the runs whose message it took, renewed while their
requests live (``WorkerHeartbeat``, one per process)."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from beat.config import BeatConfig, uses_this_scheduler
from beat.delivery.message_times import seconds_until
from beat.errors import HABeatError
from beat.lease.beacon import process_session
from beat.process_locks import ForkSafeLock
from beat.records import Session
from beat.store.runs import RunStore, run_store_for

logger = logging.getLogger(__name__)

#: A plain run taken this recently is renewed even before Celery lists its request
#: (the request is reserved just after ``task_received``).
RECEIPT_GRACE = 5.0

#: How often the heartbeat looks at the beacon, and tries again a renewal that failed
#: (seconds; at most a third of the lease).
PULSE_SECONDS = 1.0


class WorkerHeartbeat:
    """The worker's main process, seen from PostgreSQL: its presence (``beat_workers``)
    and the receipt leases of the runs whose message it took, renewed while their
    requests live.

    A request that finished, or whose pool process died, leaves Celery's lists of
    requests: its lease is then no longer renewed and expires, and the reaper acts
    (a run not started is published again; a plain run that started ends ``lost``).
    A worker that died stops being seen: the reaper then knows that the runs it held
    were interrupted, not that they crashed it."""

    def __init__(
        self,
        store: RunStore,
        hostname: str,
        lease_seconds: float,
        beacon: Callable[[], Session | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        #: This process's beacon (``beat.lease.beacon``), recorded with its presence: asked
        #: at every heartbeat, it opens again a half it lost.
        self.beacon = beacon
        self.hostname = hostname
        self.owner = f"{hostname}:{os.getpid()}:received"
        self.lease_seconds = lease_seconds
        self._started = time.monotonic()
        #: When this process started, by the database's clock (read at its first renewal).
        self.booted_at: datetime | None = None
        self._taken: dict[uuid.UUID, tuple[str, float]] = {}
        #: Runs whose request Celery lists as waiting long past its ETA: not renewed.
        self._stalled: set[uuid.UUID] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._clock = clock
        #: When the last renewal that succeeded began (``clock``), and the beacon it named.
        self._renewed_at: float | None = None
        self._named: str | None = None
        #: Renewals failed in a row, and when the next may be tried (``clock``).
        self._failures = 0
        self._retry_at = 0.0

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._beat, name="habeat-worker-heartbeat", daemon=True
                )
                self._thread.start()

    def add(self, run_id: uuid.UUID, task_id: str) -> None:
        with self._lock:
            self._taken[run_id] = (task_id, time.monotonic())
        self.start()

    def _beat(self) -> None:
        while True:
            try:
                self.pulse()
            except Exception:  # this thread must outlive any error: every lease needs it
                logger.exception("renewing this worker's receipt leases and presence failed")
            time.sleep(min(PULSE_SECONDS, self.lease_seconds / 3))

    def pulse(self) -> None:
        """Renew when a renewal is due (a third of the lease after the last one), else
        keep the beacon and renew if the beacon the presence names changed: a half lost
        to a server's restart is opened again and named within a second. The reaper
        reads the presence to tell a whole worker's death from a crash of its run;
        stale for a third of the lease after a restart, a worker killed then had its
        run counted as an attempt. After a failed renewal the next waits 1 s, then
        twice as long each time, up to a third of the lease: an outage costs the
        servers no more than the steady cadence."""
        now = self._clock()
        if self._failures and now < self._retry_at:
            return
        if self._renewed_at is None or now - self._renewed_at >= self.lease_seconds / 3:
            self.renew()
            return
        session = self.beacon()
        if (None if session is None else session.beacon) != self._named:
            self.renew(session, kept=True)

    def renew(self, session: Session | None = None, *, kept: bool = False) -> bool:
        """Renew the receipt leases of the runs still in hand, and this worker's
        presence naming its beacon (``session`` if ``kept`` already, else kept after the
        leases: opening a lost half again may take time); False if PostgreSQL could not
        be reached (said once an outage)."""
        began = self._clock()
        held = self._still_held()
        try:
            self.store.heartbeat_received(self.owner, held, lease_seconds=self.lease_seconds)
            if not kept:
                session = self.beacon()
            self.store.worker_seen(
                self.hostname, pid=os.getpid(), booted_at=self._boot_time(), session=session
            )
        except HABeatError as exc:
            self._failed(exc, len(held))
            return False
        if self._failures:
            logger.warning("renewed this worker's leases and presence again")
        self._failures = 0
        self._renewed_at = began
        self._named = None if session is None else session.beacon
        return True

    def _failed(self, exc: HABeatError, held: int) -> None:
        if not self._failures:
            logger.warning(
                "could not renew this worker's leases (%d runs): %s; trying again in %g s,"
                " then less often, up to every %g s",
                held,
                exc,
                self._backoff(1),
                self._backoff(64),
            )
        self._failures += 1
        self._retry_at = self._clock() + self._backoff(self._failures)

    def _backoff(self, failures: int) -> float:
        """Seconds before the renewal after ``failures`` failed in a row."""
        doubled: float = PULSE_SECONDS * 2.0 ** min(failures - 1, 16)
        return min(doubled, self.lease_seconds / 3)

    def _boot_time(self) -> datetime:
        """When this process started, by the database's clock: PostgreSQL's time less
        the monotonic seconds since, read once and kept, so every renewal of this
        process records the same instant. The reaper compares it with the start of a run
        (``_worker_died`` in ``beat.store.leader``) to tell a restarted worker from the
        same one: a wall clock set wrong would make either read as the other. The time
        the query takes counts as elapsed: the instant is early by at most that."""
        if self.booted_at is None:
            database_now = self.store.database_now()
            elapsed = time.monotonic() - self._started
            self.booted_at = database_now - timedelta(seconds=elapsed)
        return self.booted_at

    def _still_held(self) -> list[uuid.UUID]:
        from celery.worker import state

        scheduled = list(state.scheduled_requests)
        stalled = _stalled_past_eta(
            scheduled,
            moving={request.id for request in [*state.reserved_requests, *state.active_requests]},
            grace=self.lease_seconds,
        )
        live = set(state.requests) | {request.id for request in scheduled}
        now = time.monotonic()
        with self._lock:
            for run_id, (task_id, taken) in list(self._taken.items()):
                if task_id not in live and now - taken > RECEIPT_GRACE:
                    del self._taken[run_id]
            # A stalled request keeps its place: should Celery run it after all (its loop
            # was only slow), its lease is renewed again, or it is refused at its start
            # if the leader has given the run to another delivery meanwhile.
            for run_id, (task_id, _) in self._taken.items():
                if task_id in stalled and run_id not in self._stalled:
                    _say_stalled(run_id, task_id)
            self._stalled = {
                run_id for run_id, (task_id, _) in self._taken.items() if task_id in stalled
            }
            return [run_id for run_id in self._taken if run_id not in self._stalled]


def _stalled_past_eta(scheduled: list[Any], *, moving: set[str], grace: float) -> set[str]:
    """The task IDs of requests Celery still lists as waiting for their ETA a whole
    ``grace`` after it passed, none of them reserved or running: their timer entry is
    gone (Celery drops or cancels ETA entries around a lost broker connection and keeps
    nothing that would run them again). Renewing their leases would keep their runs
    held for as long as this worker lives; left to expire, the leader sends each run
    again at its time.

    The ETA is read on this worker's clock, the one Celery's timer waits by. A clock
    that jumped ahead only makes a request look stalled early: its run is then sent
    again while this worker still holds a delivery, and one delivery starts the run
    (the guard; a plain run's start needs its receipt lease, which this worker no
    longer holds). Waste, never a second execution."""
    return {
        request.id
        for request in scheduled
        if request.id not in moving
        and request.eta is not None
        and not _rate_limited(request)
        and seconds_until(request.eta) < -grace
    }


def _rate_limited(request: Any) -> bool:
    """Whether the request's task has a rate limit: once its ETA passed, Celery keeps
    such a request listed as scheduled while it waits in the task's token bucket, for
    as long as the limit makes it wait. That is not a stall: it stays held."""
    return bool(getattr(getattr(request, "task", None), "rate_limit", None))


def _say_stalled(run_id: uuid.UUID, task_id: str) -> None:
    logger.warning(
        "run %s: Celery lists its request %s as waiting for its ETA long after it passed,"
        " and does not run it; its receipt lease is left to expire so that the leader"
        " sends the run again",
        run_id,
        task_id,
        extra={"run_id": str(run_id)},
    )


_leases: dict[int, WorkerHeartbeat] = {}
_leases_lock = ForkSafeLock()


def _leases_of(config: BeatConfig, hostname: str) -> WorkerHeartbeat:
    with _leases_lock:
        leases = _leases.get(os.getpid())
        if leases is None:
            leases = _leases[os.getpid()] = WorkerHeartbeat(
                run_store_for(config.database_url),
                hostname,
                config.lease_timeout,
                beacon=lambda: process_session(config),
            )
        return leases


def _worker_ready(sender: Any = None, **_: Any) -> None:
    """Start being seen as soon as the worker consumes (its main process)."""
    hostname = getattr(sender, "hostname", None)
    app = getattr(sender, "app", None)
    if not hostname or app is None or not uses_this_scheduler(app.conf):
        return
    _leases_of(BeatConfig.from_celery_conf(app.conf), hostname).start()
