"""The threads that renew a worker's leases never die: an error nobody expected (the
PgBouncer chaos run met SQLAlchemy's ``InvalidRequestError``) killed them, every lease
of the process then expired, and the leader took back runs that were still running."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from beat.delivery.heartbeat import WorkerHeartbeat
from beat.delivery.run_leases import RunLeases
from tests.e2e.cluster import wait_until


class FailsOnceStore:
    """Raises an error no code expects at its first call of each kind, then works."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if self.calls[name] == 1:
            raise RuntimeError(f"{name}: an error nobody expected")

    def renew_run_leases(self, pairs: list[tuple[uuid.UUID, str]], **_: Any) -> set[uuid.UUID]:
        self._count("renew_run_leases")
        return {run_id for run_id, _ in pairs}

    def heartbeat_received(self, *_: Any, **__: Any) -> None:
        self._count("heartbeat_received")

    def worker_seen(self, *_: Any, **__: Any) -> None:
        pass

    def database_now(self) -> datetime:
        return datetime.now(UTC)


class Run:
    def __init__(self) -> None:
        self.run_id = uuid.uuid4()
        self.owner = "w:1:x"
        self.lease_seconds = 30.0
        self.valid_until = time.monotonic() + 30
        self.lost: list[str] = []

    def finishing(self) -> bool:
        return False

    def lose(self, reason: str) -> None:
        self.lost.append(reason)


def test_the_run_leases_thread_renews_again_after_an_unexpected_error() -> None:
    store = FailsOnceStore()
    leases = RunLeases(store, every=0.01)  # type: ignore[arg-type]
    run = Run()
    leases.hold(run)
    wait_until(lambda: store.calls.get("renew_run_leases", 0) >= 3, timeout=5)
    assert run.lost == [], "a lease still valid is not lost to an error"


def test_the_worker_heartbeat_thread_renews_again_after_an_unexpected_error() -> None:
    store = FailsOnceStore()
    heartbeat = WorkerHeartbeat(store, "w", lease_seconds=0.03)  # type: ignore[arg-type]
    heartbeat.start()
    wait_until(lambda: store.calls.get("heartbeat_received", 0) >= 3, timeout=5)
