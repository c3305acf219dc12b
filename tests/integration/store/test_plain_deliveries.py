"""The statements behind a worker's deliveries of plain runs, and what a discard by a
worker's clock becomes: each decision made by one conditional statement, on the
database's clock."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.plain_runs import (
    CANCELLED_ON_CONNECTION_LOSS,
    PLAIN_RUN_TERMINATED,
    TAKEN_UNRECORDED,
)
from beat.store.run_guard import Refused, Started
from beat.store.runs import RunStore
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

LEASE = 30.0


@pytest.fixture
def run_store(store: Store) -> RunStore:
    return RunStore(store.engine)


def published_run(store: Store, name: str = "plain") -> uuid.UUID:
    from tests.integration.store.test_store import planner

    Schedules(store).create(name, "t", at=datetime.now(UTC), allow_unregistered=True)
    store.take_leadership(1, "leader")  # None when it leads already; the claim is fenced
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert store.mark_published([run.id]) == 1
    return run.id


def receive(
    run_store: RunStore, run_id: uuid.UUID, owner: str, *, at_once: bool = False, **fields: Any
) -> object:
    """A receipt of the run (``at_once``: its take and start in the pool, no receipt)."""
    take = run_store.take_and_start_plain if at_once else run_store.receive_plain
    return take(run_id, owner=owner, worker=owner, lease_seconds=LEASE, retries=0, **fields)


def take_and_start(run_store: RunStore, run_id: uuid.UUID, owner: str, **fields: object) -> object:
    return receive(run_store, run_id, owner, at_once=True, **fields)


def test_a_plain_run_starts_only_under_the_receipt_that_still_holds_it(
    run_store: RunStore, store: Store
) -> None:
    """issue 38, finding 8: worker a took the run, paused past its lease; the run went to
    b. a's reserved copy does not start; b's does, once."""
    run_id = published_run(store)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    store.reclaim(1, stale_queued_after=3600, limit=10, dead=[run_id])  # a's lease is gone
    assert receive(run_store, run_id, "b:received") == Started(attempt=2)

    refused = run_store.start_plain(run_id, owner="a:received", attempt=1)
    assert isinstance(refused, Refused)
    assert run_store.start_plain(run_id, owner="b:received", attempt=2) == Started(attempt=2)
    [row] = run_rows(store)
    assert (row.state, row.worker, row.duplicate_deliveries) == ("running", "b:received", 1)
    # b's start tried again (its commit's reply lost) passes, and keeps its start time.
    assert run_store.start_plain(run_id, owner="b:received", attempt=2) == Started(attempt=2)
    assert run_rows(store)[0].started_at == row.started_at


def test_a_plain_run_past_its_expiry_by_the_database_clock_does_not_start(
    run_store: RunStore, store: Store
) -> None:
    """issue 38, finding 10: the start checks ``expires`` against ``now()`` and ends the
    run expired."""
    run_id = published_run(store)
    passed = store.now() - timedelta(milliseconds=1)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    outcome = run_store.start_plain(run_id, owner="a:received", attempt=1, expires=passed)
    assert outcome == Refused(state=RunState.EXPIRED.value, lease_owner=None)
    [row] = run_rows(store)
    assert (row.state, row.started_at, row.lease_owner) == ("expired", None, None)


def test_a_plain_receipt_past_the_expiry_ends_the_run_expired(
    run_store: RunStore, store: Store
) -> None:
    run_id = published_run(store)
    passed = store.now() - timedelta(milliseconds=1)
    outcome = receive(run_store, run_id, "a:received", expires=passed)
    assert outcome == Refused(state=RunState.EXPIRED.value, lease_owner=None)
    [row] = run_rows(store)
    assert (row.state, row.duplicate_deliveries) == ("expired", 0)


def test_a_plain_retry_held_by_a_dead_worker_is_sent_again_at_its_due_time(
    run_store: RunStore, store: Store
) -> None:
    """issue 38, finding 7: the retry's receipt records its due time; the reaper, taking
    the run back from the dead worker, keeps it (the outbox waits for it)."""
    run_id = published_run(store)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    assert run_store.start_plain(run_id, owner="a:received", attempt=1) == Started(attempt=1)
    # The retry (countdown 60 s) reaches a worker before the first attempt's outcome.
    retry = run_store.receive_plain(
        run_id, owner="b:received", worker="b", lease_seconds=LEASE, retries=1, retry_due_in=60
    )
    assert retry == Started(attempt=2)
    reclaim = store.reclaim(1, stale_queued_after=3600, limit=10, dead=[run_id])
    assert reclaim.runs == [], "not sent again before it is due"
    [row] = run_rows(store)
    assert row.state == RunState.PENDING.value
    assert row.not_before == row.retry_due_at > store.now() + timedelta(seconds=55)
    assert (row.published_at, row.received_at, row.started_at) == (None, None, None)


def test_a_discard_the_database_clock_contradicts_sends_the_run_again(
    run_store: RunStore, store: Store
) -> None:
    """issue 38, finding 9: a worker's clock discarded the delivery; by the database's
    clock it has not expired: the run goes back to the outbox, it does not end."""
    run_id = published_run(store)
    later = store.now() + timedelta(seconds=60)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    state = run_store.end_discarded(run_id, expires=later, owner="a:received", attempt=1)
    assert state == RunState.PENDING.value
    [row] = run_rows(store)
    assert (row.lease_owner, row.started_at, row.finished_at) == (None, None, None)


def test_a_discard_the_database_clock_confirms_ends_the_run_expired(
    run_store: RunStore, store: Store
) -> None:
    run_id = published_run(store)
    passed = store.now() - timedelta(milliseconds=1)
    assert run_store.end_discarded(run_id, expires=passed, owner="a:received") == "expired"


def test_a_discard_leaves_a_run_another_delivery_holds(run_store: RunStore, store: Store) -> None:
    run_id = published_run(store)
    later = store.now() + timedelta(seconds=60)
    assert receive(run_store, run_id, "b:received") == Started(attempt=1)
    assert run_store.start_plain(run_id, owner="b:received", attempt=1) == Started(attempt=1)
    assert run_store.end_discarded(run_id, expires=later, owner="a:received", attempt=1) is None
    assert run_store.end_discarded(run_id, expires=later, owner="b:received", attempt=1) is None, (
        "started: its body may have run"
    )
    [row] = run_rows(store)
    assert row.state == RunState.RUNNING.value


def test_a_late_delivery_never_starts_a_plain_run_whose_body_started(
    run_store: RunStore, store: Store
) -> None:
    """A plain run's body started, then its lease expired before the reaper ended the run
    ``lost`` (a pool process OOM-killed, its message requeued behind a backlog; a stalled
    heartbeat): a late second delivery must not take it, nor end it ``expired``. A plain
    task runs at most once once started."""
    run_id = published_run(store)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    assert run_store.start_plain(run_id, owner="a:received", attempt=1) == Started(attempt=1)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_runs SET lease_expires_at = now() - interval '1 second'"))

    assert isinstance(receive(run_store, run_id, "b:received"), Refused)
    passed = store.now() - timedelta(milliseconds=1)
    assert isinstance(receive(run_store, run_id, "c:received", expires=passed), Refused)
    [row] = run_rows(store)
    assert (row.state, row.attempt, row.worker) == ("running", 1, "a:received")


def test_a_plain_run_cancelled_after_its_body_started_ends_lost_with_the_reason(
    run_store: RunStore, store: Store
) -> None:
    """issue 38, a plain run cancelled on a lost broker connection: its pool process may
    record first that the body did not return; Celery's cancel then says why, and the
    run ends ``lost`` with that reason. A run cancelled before its body started is left
    to its receipt lease (sent again), and a body that returned keeps its outcome."""
    run_id = published_run(store)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    assert not run_store.cancel_plain(run_id, attempt_retries=0), "its body never started"
    assert run_rows(store)[0].state == RunState.RUNNING.value

    assert run_store.start_plain(run_id, owner="a:received", attempt=1) == Started(attempt=1)
    assert run_store.finish_plain(
        run_id, state=RunState.LOST, error=PLAIN_RUN_TERMINATED, attempt_retries=0
    )
    assert run_store.cancel_plain(run_id, attempt_retries=0)
    assert not run_store.finish_plain(
        run_id, state=RunState.LOST, error=PLAIN_RUN_TERMINATED, attempt_retries=0
    ), "the reason Celery gave stays"
    [row] = run_rows(store)
    assert (row.state, row.error) == (RunState.LOST.value, CANCELLED_ON_CONNECTION_LOSS)
    assert row.finished_at is not None

    # The body had returned when the cancel came: its outcome stands, in either order.
    assert run_store.finish_plain(run_id, state=RunState.SUCCEEDED, attempt_retries=0)
    assert not run_store.cancel_plain(run_id, attempt_retries=0)
    assert run_rows(store)[0].state == RunState.SUCCEEDED.value


def test_a_plain_run_handed_out_again_from_a_consumer_that_records_nothing_is_not_run(
    run_store: RunStore, store: Store
) -> None:
    """The chaos suite's mixed fleet: a worker without the package took a plain run's
    message and ran it; across a Redis restart kombu restored the delivery it had not
    acknowledged, and a worker with the package, finding the run recorded by nobody,
    ran it again. A delivery the broker hands out again of a run no worker recorded, on
    a queue a consumer that records nothing takes from, cannot be proven unrun: the run
    ends ``lost`` with the reason. Elsewhere (or once recorded) it goes on as ever."""
    run_id = published_run(store)
    assert not run_store.end_taken_unrecorded(run_id, queue="celery"), "no such consumer"
    store.record_consumers(1, [("celery", "celery@old-image")], forget_after=3600)

    assert not run_store.end_taken_unrecorded(run_id, queue="reports"), "another queue"
    assert run_store.end_taken_unrecorded(run_id, queue="celery")
    [row] = run_rows(store)
    assert (row.state, row.error) == ("lost", TAKEN_UNRECORDED)

    recorded = published_run(store, "plain, taken")
    assert receive(run_store, recorded, "a:received") == Started(attempt=1)
    assert not run_store.end_taken_unrecorded(recorded, queue="celery"), "a worker took it"


def test_a_plain_run_that_runs_at_once_is_taken_and_started_in_one_statement(
    run_store: RunStore, store: Store
) -> None:
    """A request Celery runs at once has no receipt of its own: the pool process takes
    the run and starts it in one statement (received and started at the same instant,
    the statement's ``now()``), held under the worker's receipt lease."""
    run_id = published_run(store)
    assert take_and_start(run_store, run_id, "a:received") == Started(attempt=1)
    [row] = run_rows(store)
    assert (row.state, row.attempt, row.worker, row.lease_owner) == (
        "running",
        1,
        "a:received",
        "a:received",
    )
    assert row.plain is True
    assert row.received_at is not None
    assert row.received_at == row.started_at
    assert row.first_started_at == row.started_at
    assert row.lease_expires_at > row.started_at


def test_a_plain_run_taken_and_started_once_refuses_every_other_delivery(
    run_store: RunStore, store: Store
) -> None:
    """Once taken and started, a plain run is never taken again: not by a second delivery
    that runs at once, nor at a receipt, nor by the same take tried again, nor after its
    lease expired (only the reaper ends it, ``lost``)."""
    run_id = published_run(store)
    assert take_and_start(run_store, run_id, "a:received") == Started(attempt=1)
    assert isinstance(take_and_start(run_store, run_id, "b:received"), Refused)
    assert isinstance(receive(run_store, run_id, "c:received"), Refused)
    assert isinstance(take_and_start(run_store, run_id, "a:received"), Refused)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_runs SET lease_expires_at = now() - interval '1 second'"))
    assert isinstance(take_and_start(run_store, run_id, "d:received"), Refused)
    [row] = run_rows(store)
    assert (row.state, row.attempt, row.worker, row.duplicate_deliveries) == (
        "running",
        1,
        "a:received",
        4,
    )


def test_a_plain_run_taken_at_receipt_is_not_taken_again_by_a_delivery_that_runs_at_once(
    run_store: RunStore, store: Store
) -> None:
    """A copy that runs at once meets the run another worker's receipt holds: refused; the
    receipt's own start still passes."""
    run_id = published_run(store)
    assert receive(run_store, run_id, "a:received") == Started(attempt=1)
    assert isinstance(take_and_start(run_store, run_id, "b:received"), Refused)
    assert run_store.start_plain(run_id, owner="a:received", attempt=1) == Started(attempt=1)
    [row] = run_rows(store)
    assert (row.worker, row.attempt) == ("a:received", 1)


def test_a_plain_run_past_its_expiry_is_not_taken_by_a_delivery_that_runs_at_once(
    run_store: RunStore, store: Store
) -> None:
    """Past its expiry by the database's clock, the take ends the run ``expired`` and the
    body does not run; before it, the run is taken."""
    late, on_time = published_run(store, "late"), published_run(store, "on-time")
    passed = store.now() - timedelta(milliseconds=1)
    refused = take_and_start(run_store, late, "a:received", expires=passed)
    assert refused == Refused(state=RunState.EXPIRED.value, lease_owner=None)
    ahead = store.now() + timedelta(minutes=1)
    assert take_and_start(run_store, on_time, "a:received", expires=ahead) == Started(attempt=1)
    states = {row.id: row.state for row in run_rows(store)}
    assert states == {late: "expired", on_time: "running"}
