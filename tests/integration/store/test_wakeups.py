"""How long the leader waits between ticks: until the next fire time less
``claim_ahead``, or until a worker's lease expires, whichever comes first."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import redis
from sqlalchemy import text

from beat.leader.overlapped_send import OverlappedSend
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.conftest import SchedulerFactory
from tests.integration.helpers import broker_messages, run_rows, task_ids

pytestmark = pytest.mark.integration


def test_the_leader_waits_less_the_window_but_not_for_schedules_it_cannot_claim_ahead(
    store: Store, make_scheduler: SchedulerFactory
) -> None:
    scheduler = make_scheduler(claim_ahead=2.0, max_wait=60.0)
    Schedules(store).create("in-10s", "t", in_seconds=10, allow_unregistered=True)
    assert 7.5 < scheduler.loop.until_next_claim(claimed_any=False) <= 8.0, (
        "wakes claim_ahead before the fire time"
    )
    Schedules(store).create(
        "skip-in-1s", "t", in_seconds=1, overlap_policy="skip", allow_unregistered=True
    )
    assert 0.5 < scheduler.loop.until_next_claim(claimed_any=False) <= 1.0, (
        "the last claim did not take it: wait for the fire time itself"
    )
    assert scheduler.loop.until_next_claim(claimed_any=True) <= 0, "claim again at once"


def test_the_leader_wakes_when_a_workers_lease_expires(
    store: Store, make_scheduler: SchedulerFactory
) -> None:
    scheduler = make_scheduler(max_wait=60.0)
    assert scheduler.loop.until_next_claim(claimed_any=False) == 60.0, "nothing to wait for"
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, task, state, lease_owner, lease_expires_at)"
                " VALUES (:id, 't', 'running', 'w', now() + interval '3 seconds')"
            ),
            {"id": uuid.uuid4()},
        )
    assert 2.5 < scheduler.loop.until_next_claim(claimed_any=False) <= 3.1, (
        "the reaper runs just after the expiry"
    )


def test_a_burst_is_claimed_batch_after_batch_with_the_outbox_read_once_a_second(
    store: Store, make_scheduler: SchedulerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each outbox read would walk the runs just claimed ahead: during a burst it waits."""
    for index in range(20):
        Schedules(store).create(f"s{index}", "t", in_seconds=0, allow_unregistered=True)
    scheduler = make_scheduler(claim_batch=5, claim_ahead=0.0)
    scheduler.tick()  # leads, reads the outbox, claims the first batch of 5
    reads: list[int] = []
    pending_runs = scheduler.store.pending_runs

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return pending_runs(*args, **kwargs)

    monkeypatch.setattr(scheduler.store, "pending_runs", counted)
    for _ in range(3):
        scheduler.tick()  # the next batches, at once

    assert reads == [], "the outbox was read inside the burst"
    assert len(Schedules(store).runs(limit=100)) == 20
    time.sleep(1.1)
    scheduler.tick()  # the burst is over and a second has passed
    assert reads == [1]


def test_a_burst_s_batches_are_sent_on_a_thread_while_the_next_is_claimed(
    store: Store,
    make_scheduler: SchedulerFactory,
    redis_client: redis.Redis,
    test_env: SessionEnv,
) -> None:
    """The real thread, PostgreSQL and Redis: each batch but the last is sent while the
    next one is claimed, in claim order, each run once; ``close`` ends the send in
    flight before the lease is released."""
    for index in range(23):
        Schedules(store).create(f"s{index:02d}", "t", in_seconds=0, allow_unregistered=True)
    scheduler = make_scheduler(claim_batch=5, claim_ahead=0.0)
    threads: list[str] = []
    publish = scheduler.loop.publisher.publish

    def noted(runs: Any, **options: Any) -> Any:
        threads.append(threading.current_thread().name)
        return publish(runs, **options)

    scheduler.loop.publisher.publish = noted  # type: ignore[method-assign]
    claimed: list[uuid.UUID] = []
    scheduler.after_claim_commit = lambda claim: claimed.extend(run.id for run in claim.runs)

    scheduler.tick()
    assert isinstance(scheduler.loop.sends, OverlappedSend)
    assert scheduler.loop.sends.in_flight
    for _ in range(4):
        scheduler.tick()  # the other batches, the last (3 runs) sent by the loop itself

    assert threads == ["habeat-send"] * 4 + ["MainThread"]
    messages = broker_messages(redis_client, test_env.broker_key_prefix)
    assert task_ids(messages) == [str(run_id) for run_id in claimed]
    assert {row.state for row in run_rows(store)} == {RunState.QUEUED.value}
    assert len(claimed) == 23


def test_close_ends_the_send_in_flight_before_it_hands_over(
    store: Store,
    make_scheduler: SchedulerFactory,
    redis_client: redis.Redis,
    test_env: SessionEnv,
) -> None:
    for index in range(10):
        Schedules(store).create(f"s{index:02d}", "t", in_seconds=0, allow_unregistered=True)
    scheduler = make_scheduler(claim_batch=5, claim_ahead=0.0)
    publish = scheduler.loop.publisher.publish
    released: list[str] = []

    def slow(runs: Any, **options: Any) -> Any:
        time.sleep(0.5)  # still sending when beat is told to stop
        result = publish(runs, **options)
        released.append("sent")
        return result

    scheduler.loop.publisher.publish = slow  # type: ignore[method-assign]
    hand_over = scheduler.leadership.hand_over
    scheduler.leadership.hand_over = lambda: (released.append("released"), hand_over())[1]  # type: ignore[method-assign]

    scheduler.tick()  # leads, claims 5, their send in flight
    scheduler.close()

    assert released == ["sent", "released"]
    assert len(broker_messages(redis_client, test_env.broker_key_prefix)) == 5
    assert len(run_rows(store, state=RunState.QUEUED.value)) == 5
    assert len(run_rows(store, state=RunState.PENDING.value)) == 0


def test_a_change_committed_between_listen_and_wait_wakes_the_wait(
    store: Store, make_scheduler: SchedulerFactory
) -> None:
    """The loop listens before its claim reads what is due: a trigger committed
    after that read, before the loop waits, must not be slept through."""
    scheduler = make_scheduler(max_wait=30.0)
    Schedules(store).create("hourly", "t", every=3600, allow_unregistered=True)
    scheduler.listener.listen()
    Schedules(store).trigger("hourly")

    assert scheduler.listener.wait(10.0), "the trigger's NOTIFY was lost"
