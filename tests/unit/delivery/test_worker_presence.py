"""A worker's presence (``beat_workers``) names the beacon the reaper reads to tell a
dead worker from a living one. Written only every third of the run lease, a presence
that could not be written (PostgreSQL restarting as the worker became ready) or that
named no beacon (Redis restarting) stayed so for 20 s at a 60-s lease: a worker killed
in that window had its run counted as an attempt, not an interruption (CI, the crash
proof after both servers restarted)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from beat.delivery.heartbeat import WorkerHeartbeat
from beat.errors import StoreUnavailable
from beat.records import Session
from tests.e2e.cluster import wait_until
from tests.fakes import ManualClock


class PresenceStore:
    """Records each presence written; the first ``failures`` writes find PostgreSQL down."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.seen: list[str | None] = []

    def heartbeat_received(self, *_: Any, **__: Any) -> int:
        return 0

    def worker_seen(self, name: str, *, session: Session | None = None, **_: Any) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreUnavailable("PostgreSQL at postgresql://db/test: the server is starting")
        self.seen.append(None if session is None else session.beacon)

    def database_now(self) -> datetime:
        return datetime.now(UTC)


def session(name: str) -> Session:
    now = datetime.now(UTC)
    return Session(beacon=name, pid=1, started_at=now, postgres_server="s", redis_server="r")


def test_a_presence_that_could_not_be_written_is_written_within_seconds() -> None:
    store = PresenceStore(failures=1)
    heartbeat = WorkerHeartbeat(store, "w", lease_seconds=60)  # type: ignore[arg-type]
    heartbeat.start()
    wait_until(lambda: store.seen == [None], timeout=5, interval=0.05)


def test_a_beacon_opened_again_is_named_by_the_presence_within_seconds() -> None:
    beacons: list[Session | None] = [None]  # Redis restarting: no beacon yet
    store = PresenceStore()
    heartbeat = WorkerHeartbeat(store, "w", lease_seconds=60, beacon=lambda: beacons[-1])  # type: ignore[arg-type]
    heartbeat.start()
    wait_until(lambda: store.seen == [None], timeout=5, interval=0.05)
    beacons.append(session("beacon:w:1"))
    wait_until(lambda: store.seen == [None, "beacon:w:1"], timeout=5, interval=0.05)


def test_a_steady_worker_writes_its_presence_once_a_third_of_its_lease() -> None:
    store = PresenceStore()
    name = f"beacon:w:{uuid.uuid4().hex[:8]}"
    heartbeat = WorkerHeartbeat(store, "w", lease_seconds=60, beacon=lambda: session(name))  # type: ignore[arg-type]
    for _ in range(5):
        heartbeat.pulse()
    assert store.seen == [name], "the beacon is looked at each pulse, written when due"


def test_renewals_failing_in_a_row_are_tried_less_often_up_to_the_steady_cadence() -> None:
    # An outage must cost PostgreSQL no more than the steady cadence: every worker of a
    # fleet tries again, and a server coming back meets them all at once.
    store = PresenceStore(failures=6)
    clock = ManualClock(monotonic=0.0)
    heartbeat = WorkerHeartbeat(store, "w", lease_seconds=30, clock=clock)  # type: ignore[arg-type]
    tried_at = []
    for tick in range(40):  # one pulse a second
        clock.advance_to(float(tick))
        before = store.failures, len(store.seen)
        heartbeat.pulse()
        if (store.failures, len(store.seen)) != before:
            tried_at.append(tick)
    assert tried_at == [0, 1, 3, 7, 15, 25, 35], "1 s, then doubled, up to a third of the lease"
    assert store.seen == [None], "written once the outage ended"
