"""A plain run's receipt fails closed: whatever stops the worker from recording that
it took the run, the body does not run.
Celery only logs what a ``task_received`` handler raises, so an error the receipt did
not catch let the body run unrecorded (the PgBouncer chaos run: an effect committed
while its run stayed ``queued``, for the leader to send again)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from celery.exceptions import TaskRevokedError

from beat.delivery import receipts
from beat.errors import StoreUnavailable
from beat.publish.messages import ATTEMPT_HEADER


class Request:
    def __init__(self) -> None:
        self.id = str(uuid.uuid4())
        self.name = "jobs.plain"
        self.hostname = "w@host"
        self.eta = None
        self.delivery_info: dict[str, Any] = {"routing_key": "celery"}
        self.request_dict: dict[str, Any] = {ATTEMPT_HEADER: 1, "retries": 0}
        self.task = SimpleNamespace(app=SimpleNamespace(conf={}))
        self.handed_back: list[bool] = []

    def execute_using_pool(self, pool: Any, **_: Any) -> None:
        raise AssertionError("the body must not run")

    def reject(self, requeue: bool = False) -> None:
        self.handed_back.append(requeue)

    def acknowledge(self) -> None:
        self.handed_back.append(False)


class Store:
    def __init__(self, error: Exception) -> None:
        self.error = error

    def receive_plain(self, *_: Any, **__: Any) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "handed_back"),
    [
        (StoreUnavailable("PostgreSQL is unreachable"), [True]),
        # Not handed back for ever (it would hold the worker's intake): acknowledged unrun,
        # for the leader's lost-message recovery, which bounds its copies.
        (RuntimeError("an error nobody expected"), [False]),
    ],
    ids=["unreachable", "unexpected"],
)
def test_a_plain_run_whose_receipt_fails_does_not_run(
    monkeypatch: pytest.MonkeyPatch, error: Exception, handed_back: list[bool]
) -> None:
    config = SimpleNamespace(database_url="postgresql://x/y", lease_timeout=30.0)
    leases = SimpleNamespace(store=Store(error), owner="w:1:received")
    monkeypatch.setattr(receipts, "delivery_config", lambda conf: config)
    monkeypatch.setattr(receipts, "_leases_of", lambda config, hostname: leases)
    monkeypatch.setattr(receipts, "REQUEUE_DELAY", 0)
    request = Request()

    receipts._hold_received_run(request=request)

    with pytest.raises(TaskRevokedError):
        request.execute_using_pool(pool=None)
    assert request.handed_back == handed_back


def test_a_receipt_that_cannot_even_read_its_settings_does_not_run_the_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(conf: Any) -> None:
        raise KeyError("habeat_database_url")

    monkeypatch.setattr(receipts, "delivery_config", broken)
    request = Request()

    receipts._hold_received_run(request=request)

    with pytest.raises(TaskRevokedError):
        request.execute_using_pool(pool=None)
    assert request.handed_back == [False]
