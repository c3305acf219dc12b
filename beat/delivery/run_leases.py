"""The leases of the runs a worker process executes on the idempotent base, renewed
together.

Each run an ``IdempotentTask`` executes holds a lease on its row (taken by the guard
when the body starts). One thread per process extends all of them, every
``habeat_lease_heartbeat`` seconds, with one statement (``RunStore.renew_run_leases``):
the cost grows with the worker processes, not with the runs they execute (a threads
pool running 1,000 long runs sends one statement an interval, not 1,000), and a run
starts no thread of its own.

A run whose lease the statement did not extend is no longer this delivery's (another
worker reclaimed it, or it moved on): its execution is told (``lease_lost``), unless it
is being completed. While PostgreSQL cannot be reached, a lease is taken as lost once
it has expired by this process's monotonic clock, counted from when its last renewal
was sent (an earlier instant than the one PostgreSQL extended it from).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from beat.errors import HABeatError
from beat.process_locks import ForkSafeLock
from beat.store.runs import RunStore

logger = logging.getLogger(__name__)


class HeldRun(Protocol):
    """One execution of a run whose lease this process renews."""

    run_id: uuid.UUID
    owner: str
    lease_seconds: float
    #: Until when the lease is known to hold (``time.monotonic()``).
    valid_until: float

    def finishing(self) -> bool:
        """Whether its outcome is being recorded (a lease that ends then is not lost)."""
        ...

    def lose(self, reason: str) -> None:
        """Another worker may hold the run now: stop, record nothing."""
        ...


class RunLeases:
    """The leases this process holds on the runs it executes (see the module docstring)."""

    def __init__(self, store: RunStore, every: float) -> None:
        self.store = store
        self.every = every
        #: Keeps this process's beacon (``beat.lease.beacon``) open while runs execute,
        #: also in a pool process that has no other timer.
        self.keep_beacon: Callable[[], object] = lambda: None
        self._held: dict[uuid.UUID, HeldRun] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def hold(self, run: HeldRun) -> None:
        with self._lock:
            self._held[run.run_id] = run
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._renew_forever, name="habeat-run-leases", daemon=True
                )
                self._thread.start()

    def release(self, run: HeldRun) -> None:
        with self._lock:
            if self._held.get(run.run_id) is run:
                del self._held[run.run_id]

    def _renew_forever(self) -> None:
        while True:
            time.sleep(self.every)
            try:
                self.renew()
            except Exception:  # this thread must outlive any error: every lease needs it
                logger.exception("renewing the leases of this process's runs failed")

    def renew(self) -> None:
        """Extend every held lease (one statement); tell the runs that lost theirs."""
        with self._lock:
            held = list(self._held.values())
        if not held:
            return
        sent_at = time.monotonic()
        by_length: dict[float, list[HeldRun]] = {}
        for run in held:
            by_length.setdefault(run.lease_seconds, []).append(run)
        try:
            renewed: set[uuid.UUID] = set()
            for seconds, runs in by_length.items():
                pairs = [(run.run_id, run.owner) for run in runs]
                renewed |= self.store.renew_run_leases(pairs, lease_seconds=seconds)
        except Exception as exc:  # whatever failed, a lease that expired is lost
            logger.warning(
                "lease heartbeat of %d runs failed: %s",
                len(held),
                exc,
                exc_info=not isinstance(exc, HABeatError),
            )
            for run in held:
                if time.monotonic() >= run.valid_until:
                    self._lost(run, "its lease expired while PostgreSQL was unreachable")
            return
        for run in held:
            if run.run_id in renewed:
                run.valid_until = sent_at + run.lease_seconds
            elif not run.finishing():
                self._lost(run, "another worker holds it now")
        self.keep_beacon()  # after the leases: opening a half again may take time

    def _lost(self, run: HeldRun, reason: str) -> None:
        self.release(run)
        run.lose(reason)


_leases: dict[tuple[int, int], RunLeases] = {}
_leases_lock = ForkSafeLock()


def run_leases_of(store: RunStore, every: float) -> RunLeases:
    """This process's leases on ``store``, renewed every ``every`` seconds (a forked pool
    child has its own)."""
    key = (os.getpid(), id(store))
    with _leases_lock:
        leases = _leases.get(key)
        if leases is None:
            leases = _leases[key] = RunLeases(store, every)
        return leases
