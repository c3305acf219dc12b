"""A plain task's retry that Celery could not publish (the broker down): ``Task.retry``
raises ``Reject`` and forgets the countdown; run tracking keeps it, and records the run
``retrying`` with that due time instead of ``failed``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Reject, Retry

from beat.delivery import plain_runs
from beat.delivery import tracking as run_tracking
from beat.delivery.tracking import _plain_outcome, _unsent_retries, note_unsent_retries
from beat.errors import StoreError
from beat.models import RunState

DEFAULT_DELAY = 42


def app_on(broker: str) -> Celery:
    return Celery("unsent", broker=broker, set_as_current=False)


def failing_publish(*_: Any, **__: Any) -> None:
    raise ConnectionError("Error 111 connecting to the broker. Connection refused.")


@pytest.fixture
def unreachable_broker_task() -> Iterator[Any]:
    """A bound task, inside a request, of an app that cannot publish (as with its broker
    down: the publish raises)."""
    app = app_on("memory://")
    app.send_task = failing_publish  # type: ignore[method-assign]

    @app.task(bind=True, default_retry_delay=DEFAULT_DELAY, shared=False)
    def job(self: Any) -> None:
        return None

    task = app.tasks[job.name]  # the task itself, as a worker has it
    task.push_request(id="task-1", retries=0, called_directly=False)
    yield task
    task.pop_request()
    _unsent_retries.clear()


@pytest.mark.parametrize(
    ("asked", "expected"),
    [({"countdown": 7}, 7.0), ({}, float(DEFAULT_DELAY))],
)
def test_a_retry_that_could_not_be_published_keeps_the_countdown_it_asked_for(
    unreachable_broker_task: Any, asked: dict[str, Any], expected: float
) -> None:
    note_unsent_retries(unreachable_broker_task)
    with pytest.raises(Reject):
        unreachable_broker_task.retry(**asked)
    assert expected - 1 < _unsent_retries.pop("task-1") - time.monotonic() <= expected


def test_an_unpublished_retry_with_an_eta_keeps_the_seconds_until_it(
    unreachable_broker_task: Any,
) -> None:
    note_unsent_retries(unreachable_broker_task)
    with pytest.raises(Reject):
        unreachable_broker_task.retry(eta=datetime.now(UTC) + timedelta(seconds=30))
    assert 29 < _unsent_retries.pop("task-1") - time.monotonic() <= 30


@pytest.mark.parametrize(
    "asked",
    [{"args": [1]}, {"kwargs": {"cursor": 2}}, {"queue": "slow"}, {"headers": {"h": 1}}],
)
def test_an_unpublished_retry_that_changes_its_message_is_not_kept(
    unreachable_broker_task: Any, asked: dict[str, Any]
) -> None:
    """The leader sends the run's own message: a retry that asked for other arguments
    or options cannot be sent as Celery would have, and ends ``failed`` as before."""
    note_unsent_retries(unreachable_broker_task)
    with pytest.raises(Reject):
        unreachable_broker_task.retry(countdown=5, **asked)
    assert "task-1" not in _unsent_retries


def test_a_countdown_wins_over_an_eta_as_in_celerys_message(
    unreachable_broker_task: Any,
) -> None:
    note_unsent_retries(unreachable_broker_task)
    with pytest.raises(Reject):
        unreachable_broker_task.retry(countdown=20, eta=datetime.now(UTC) + timedelta(seconds=5))
    assert 19 < _unsent_retries.pop("task-1") - time.monotonic() <= 20


def test_a_task_that_overrides_retry_is_not_wrapped() -> None:
    """Its countdown may be computed out of sight: an unsent retry of it ends ``failed``."""
    app = app_on("memory://")

    class Jittered(app.Task):  # type: ignore[name-defined,misc]
        def retry(self, *args: Any, **kwargs: Any) -> Any:
            return super().retry(*args, countdown=3600, **kwargs)

    @app.task(bind=True, base=Jittered, shared=False)
    def job(self: Any) -> None:
        return None

    task = app.tasks[job.name]
    note_unsent_retries(task)
    assert not getattr(task.retry, "habeat_notes_unsent", False)


def test_noting_twice_wraps_the_retry_once(unreachable_broker_task: Any) -> None:
    note_unsent_retries(unreachable_broker_task)
    wrapped = unreachable_broker_task.retry
    note_unsent_retries(unreachable_broker_task)
    assert unreachable_broker_task.retry is wrapped


def test_a_published_retry_is_not_noted() -> None:
    app = app_on("memory://")

    @app.task(bind=True, shared=False)
    def job(self: Any) -> None:
        return None

    task = app.tasks[job.name]
    note_unsent_retries(task)
    task.push_request(id="task-2", retries=0, called_directly=False)
    try:
        with pytest.raises(Retry):
            task.retry(countdown=5)
    finally:
        task.pop_request()
    assert "task-2" not in _unsent_retries


def test_a_rejected_body_whose_retry_was_not_sent_is_retrying() -> None:
    rejected = Reject(ConnectionError("refused"), requeue=False)
    state, _ = _plain_outcome("REJECTED", rejected, unsent_retry=True)
    assert state is RunState.RETRYING


def test_a_body_that_rejects_its_message_itself_failed() -> None:
    """A ``Reject`` the body raised, with no retry asked for, ends the run as before."""
    rejected = Reject("bad input", requeue=False)
    assert _plain_outcome("REJECTED", rejected)[0] is RunState.FAILED


def test_a_retry_recorded_late_keeps_the_due_time_it_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chaos seed 7: PostgreSQL was down when a plain task asked for a retry 1 s later.
    Its outcome was written once PostgreSQL was back, and the countdown was counted from
    then: the retry, whose message waits for the countdown from the ask, started before
    the due time recorded. What is left of the countdown is what is written."""
    written: list[float | None] = []

    class Store:
        def finish_plain(self, run_id: uuid.UUID, **values: Any) -> None:
            if not written:
                written.append(None)
                raise StoreError("PostgreSQL is unreachable")
            written.append(values["retry_in"])

    monkeypatch.setattr(plain_runs, "_store_of", lambda task: Store())
    monkeypatch.setattr(plain_runs, "PERSIST_RETRY_DELAY", 0.3)
    monkeypatch.setitem(run_tracking._running_plain, "task-3", uuid.uuid4())
    task = SimpleNamespace(request=SimpleNamespace(retries=0))
    run_tracking._plain_run_ended(task_id="task-3", task=task, retval=Retry(when=5), state="RETRY")
    [_, retry_in] = written
    assert retry_in is not None
    assert retry_in <= 5 - 0.3
