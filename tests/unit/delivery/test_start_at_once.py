"""A beat-published request that Celery runs at once needs no receipt of its own: a
plain run is taken and started by the pool process in one statement, and the idempotent
base's guard takes its run as it starts. What counts as "at once", and what the pool
process does when the take is refused or cannot be recorded."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import Ignore, Reject
from celery.worker import state

from beat.delivery import plain_runs, receipts
from beat.errors import StoreUnavailable
from beat.publish.messages import ATTEMPT_HEADER
from beat.store.run_guard import Refused, Started


class Request:
    """What the receipt reads of Celery's request (weak-referenceable, as Celery's lists
    of requests hold them)."""

    def __init__(self, *, guarded: bool = False, rate_limit: str | None = None) -> None:
        self.id = str(uuid.uuid4())
        self.name = "jobs.plain"
        self.hostname = "w@host"
        self.eta: datetime | None = None
        self.delivery_info: dict[str, Any] = {"routing_key": "celery"}
        self.request_dict: dict[str, Any] = {ATTEMPT_HEADER: 1, "retries": 0}
        self.task = SimpleNamespace(
            app=SimpleNamespace(conf={}), habeat_guarded=guarded, rate_limit=rate_limit
        )

    def execute_using_pool(self, pool: Any, **_: Any) -> str:
        return "Celery's own execute_using_pool"


def consumer(slots: int) -> Any:
    return SimpleNamespace(pool=SimpleNamespace(num_processes=slots))


@pytest.fixture(autouse=True)
def no_requests_in_hand() -> Iterator[None]:
    state.reserved_requests.clear()
    yield
    state.reserved_requests.clear()


def test_a_request_with_a_free_pool_slot_runs_at_once() -> None:
    request = Request()
    assert receipts._runs_at_once(consumer(2), request)


def test_a_request_beyond_the_pool_slots_waits_and_is_taken_at_receipt() -> None:
    held = [Request(), Request()]
    for other in held:
        state.reserved_requests.add(other)
    request = Request()
    assert not receipts._runs_at_once(consumer(2), request)
    assert receipts._runs_at_once(consumer(3), request)


@pytest.mark.parametrize(
    "waits",
    ["eta", "redelivered", "rate limit", "no consumer", "a pool without slots"],
)
def test_a_request_that_may_wait_is_taken_at_receipt(waits: str) -> None:
    request = Request(rate_limit="10/s" if waits == "rate limit" else None)
    given = consumer(4)
    if waits == "eta":
        request.eta = datetime.now(UTC)
    elif waits == "redelivered":
        request.delivery_info["redelivered"] = True
    elif waits == "no consumer":
        given = None
    elif waits == "a pool without slots":
        given = SimpleNamespace(pool=SimpleNamespace())
    assert not receipts._runs_at_once(given, request)


class NoStatements:
    """A store the receipt of a request that runs at once must not write to."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the receipt wrote to the run table ({name})")


def held_leases(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    config = SimpleNamespace(database_url="postgresql://x/y", lease_timeout=30.0)
    added: list[tuple[uuid.UUID, str]] = []
    leases = SimpleNamespace(
        store=NoStatements(),
        owner="w:1:received",
        add=lambda run_id, task_id: added.append((run_id, task_id)),
        added=added,
    )
    monkeypatch.setattr(receipts, "delivery_config", lambda conf: config)
    monkeypatch.setattr(receipts, "_leases_of", lambda config, hostname: leases)
    return leases


def test_the_receipt_of_a_guarded_request_that_runs_at_once_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its guard takes the run as it starts: no receipt statement, no receipt lease."""
    leases = held_leases(monkeypatch)
    request = Request(guarded=True)
    receipts._hold_received_run(sender=consumer(1), request=request)
    assert leases.added == []
    assert request.execute_using_pool(None) == "Celery's own execute_using_pool"


def test_the_receipt_of_a_plain_request_that_runs_at_once_leaves_the_take_to_the_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No statement at receipt; the request goes to the pool behind the take-and-start,
    its run listed for the heartbeat's renewals of this worker's receipt leases."""
    leases = held_leases(monkeypatch)
    request = Request()
    request.request_dict["retries"] = 2
    receipts._hold_received_run(sender=consumer(1), request=request)
    assert [task_id for _, task_id in leases.added] == [request.id]
    assert request.execute_using_pool.__name__ == "execute_using_pool"
    assert request.execute_using_pool is not Request.execute_using_pool
    assert plain_runs.RECEIPT_KEY not in request.request_dict  # nothing taken yet


class TakingStore:
    def __init__(self, answer: Started | Refused | Exception) -> None:
        self.answer = answer
        self.taken: list[dict[str, Any]] = []

    def take_and_start_plain(self, run_id: uuid.UUID, **fields: Any) -> Started | Refused:
        self.taken.append({"run_id": run_id, **fields})
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def start_at_once(monkeypatch: pytest.MonkeyPatch, answer: Any) -> tuple[Any, list[Any]]:
    store = TakingStore(answer)
    monkeypatch.setattr(plain_runs, "run_store_for", lambda url: store)
    monkeypatch.setattr(plain_runs, "REQUEUE_DELAY", 0)
    traced: list[Any] = []
    start = plain_runs.PlainStart(
        run_id=uuid.uuid4(),
        owner="w:1:received",
        attempt=None,
        database_url="postgresql://x/y",
        expires=None,
        worker="w@host",
        lease_seconds=30.0,
        retries=2,
    )
    task_id = str(start.run_id)
    result = plain_runs._start_then_trace(
        start, lambda *args: traced.append(args) or "traced", "jobs.plain", task_id, {}, b""
    )
    plain_runs._running_plain.pop(task_id, None)
    assert store.taken == [
        {
            "run_id": start.run_id,
            "owner": "w:1:received",
            "worker": "w@host",
            "lease_seconds": 30.0,
            "retries": 2,
            "expires": None,
        }
    ]
    return result, traced


def test_a_plain_run_taken_at_its_start_runs_its_body(monkeypatch: pytest.MonkeyPatch) -> None:
    result, traced = start_at_once(monkeypatch, Started(attempt=1))
    assert result == "traced"
    assert len(traced) == 1


def test_a_duplicate_refused_at_its_start_does_not_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acknowledged unrun, as a duplicate is at receipt (Celery's answer for ``Ignore``)."""
    result, traced = start_at_once(monkeypatch, Refused(state="running", lease_owner="b"))
    assert traced == []
    failed, einfo, _ = result
    assert failed == 1
    assert isinstance(einfo.exception.exc, Ignore)


def test_a_take_postgresql_cannot_record_hands_the_message_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing was taken: the message goes back to the broker (Celery's answer for
    ``Reject(requeue=True)``), for a worker that reaches PostgreSQL; the body never ran."""
    result, traced = start_at_once(monkeypatch, StoreUnavailable("PostgreSQL is unreachable"))
    assert traced == []
    failed, einfo, _ = result
    assert failed == 1
    assert isinstance(einfo.exception.exc, Reject)
    assert einfo.exception.exc.requeue
