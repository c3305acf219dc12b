"""Which runs a worker's heartbeat keeps holding: those whose request Celery still has
in hand (waiting for its ETA, reserved, running), not one Celery lists as waiting for
an ETA long past without ever running it."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery.worker import state

from beat.delivery import heartbeat
from beat.delivery.heartbeat import WorkerHeartbeat
from beat.store.runs import RunStore

LEASE = 30.0


@dataclass(eq=False)
class _Request:
    """What the heartbeat reads of a Celery request (weakly referenced, as Celery's
    ``scheduled_requests`` holds them)."""

    id: str
    eta: datetime | None = None
    task: Any = None


@pytest.fixture
def celery_state() -> Iterator[None]:
    """Celery's lists of requests, empty, and restored after the test."""
    saved = (
        dict(state.requests),
        set(state.reserved_requests),
        set(state.active_requests),
        list(state.scheduled_requests),
    )
    state.requests.clear()
    state.reserved_requests.clear()
    state.active_requests.clear()
    state.scheduled_requests.clear()
    yield
    state.requests.clear()
    state.requests.update(saved[0])
    state.reserved_requests.clear()
    state.reserved_requests.update(saved[1])
    state.active_requests.clear()
    state.active_requests.update(saved[2])
    state.scheduled_requests.clear()
    state.scheduled_requests.update(saved[3])


def heartbeat_holding(*requests: _Request, taken_ago: float = 60.0) -> WorkerHeartbeat:
    beat = WorkerHeartbeat(cast(RunStore, object()), "w@host", LEASE)
    for request in requests:
        beat._taken[uuid.UUID(request.id)] = (request.id, time.monotonic() - taken_ago)
    return beat


def scheduled(request: _Request) -> _Request:
    state.requests[request.id] = cast(Any, request)
    state.scheduled_requests.add(cast(Any, request))
    return request


def eta_in(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


@pytest.mark.usefixtures("celery_state")
def test_a_request_waiting_for_its_eta_stays_held() -> None:
    request = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(3600)))
    assert heartbeat_holding(request)._still_held() == [uuid.UUID(request.id)]


@pytest.mark.usefixtures("celery_state")
def test_a_request_just_past_its_eta_stays_held() -> None:
    request = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-LEASE / 2)))
    assert heartbeat_holding(request)._still_held() == [uuid.UUID(request.id)]


@pytest.mark.usefixtures("celery_state")
def test_a_request_listed_as_waiting_a_lease_past_its_eta_is_let_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Celery lost its timer entry (a broker connection lost around it): it lists the
    request as scheduled for ever and never runs it. Held, the run would be stuck for as
    long as the worker lives; let go, its lease expires and the leader sends it again."""
    stalled = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-2 * LEASE)))
    waiting = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(10)))
    beat = heartbeat_holding(stalled, waiting)
    with caplog.at_level(logging.WARNING, logger=heartbeat.__name__):
        assert beat._still_held() == [uuid.UUID(waiting.id)]
        assert beat._still_held() == [uuid.UUID(waiting.id)]
    said = [record for record in caplog.records if stalled.id in record.getMessage()]
    assert len(said) == 1, "said once, when let go"


@pytest.mark.usefixtures("celery_state")
def test_a_stalled_request_that_celery_runs_after_all_is_held_again() -> None:
    """A loop only slow to fire the ETA (a false alarm): once the request is reserved,
    its lease is renewed again, so a plain run that starts keeps it while it runs."""
    stalled = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-2 * LEASE)))
    beat = heartbeat_holding(stalled)
    assert beat._still_held() == []
    state.scheduled_requests.discard(cast(Any, stalled))
    state.reserved_requests.add(cast(Any, stalled))
    assert beat._still_held() == [uuid.UUID(stalled.id)]


@pytest.mark.usefixtures("celery_state")
def test_a_request_past_its_eta_that_celery_reserved_or_runs_stays_held() -> None:
    """A retry delivered while an earlier attempt of the same task ID still runs on this
    worker: the ID is running, whatever the scheduled copy says."""
    reserved = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-2 * LEASE)))
    running = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-2 * LEASE)))
    # Celery's sets hold their requests weakly: keep them alive for the test.
    moving = [_Request(reserved.id), _Request(running.id)]
    state.reserved_requests.add(cast(Any, moving[0]))
    state.active_requests.add(cast(Any, moving[1]))
    held = heartbeat_holding(reserved, running)._still_held()
    assert sorted(held) == sorted([uuid.UUID(reserved.id), uuid.UUID(running.id)])


@pytest.mark.usefixtures("celery_state")
def test_a_rate_limited_request_waiting_past_its_eta_in_its_bucket_stays_held() -> None:
    """Celery keeps a rate-limited request listed as scheduled while it waits for a
    token after its ETA: the limit, not a lost timer entry, holds it."""
    limited = SimpleNamespace(rate_limit="1/m")
    request = scheduled(_Request(str(uuid.uuid4()), eta=eta_in(-10 * LEASE), task=limited))
    assert heartbeat_holding(request)._still_held() == [uuid.UUID(request.id)]


@pytest.mark.usefixtures("celery_state")
def test_a_request_just_taken_is_held_before_celery_lists_it() -> None:
    request = _Request(str(uuid.uuid4()))
    beat = heartbeat_holding(request, taken_ago=0.0)
    assert beat._still_held() == [uuid.UUID(request.id)]


@pytest.mark.usefixtures("celery_state")
def test_a_request_celery_no_longer_lists_is_let_go() -> None:
    request = _Request(str(uuid.uuid4()))
    assert heartbeat_holding(request)._still_held() == []
