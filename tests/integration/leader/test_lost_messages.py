"""The leader's search for lost messages (``beat.leader.lost_messages``) against real Redis and
PostgreSQL: runs published as the leader publishes them, messages taken with kombu's
own channel, the leader's looks driven by a fake clock, the workers' replies to Celery's
remote control given by the test (one worker, which records runs)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import redis
from celery import Celery
from sqlalchemy import text

from app.factory import create_app
from beat.leader import lost_messages
from beat.leader.lost_messages import (
    CHECK_INTERVAL,
    DELIVERY_CLOCK_MARGIN,
    UNRECORDED_AFTER,
    UNTAKEN_AFTER,
    LostMessages,
)
from beat.models import RunState, RunToPublish
from beat.ops.schedules import Schedules
from beat.publish import dispatch
from beat.store.all_roles import Store
from beat.store.leader import MAX_SENDS
from beat.store.runs import RunStore
from tests.conftest import SessionEnv
from tests.integration.helpers import run_rows
from tests.integration.store.test_store import planner

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv, redis_client: redis.Redis) -> Iterator[Celery]:
    app = create_app(test_env.settings())
    yield app
    app.close()


RECORDING_WORKER = "worker1@host"


@pytest.fixture(autouse=True)
def recording_fleet(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker consumes ``celery`` and records runs (it is in ``beat_workers``); the
    leader's checks of the consumers run at once rather than on a thread."""
    RunStore(store.engine).worker_seen(RECORDING_WORKER, pid=1, booted_at=datetime.now(UTC))
    replies = {RECORDING_WORKER: ["celery"]}
    monkeypatch.setattr(lost_messages, "active_queues", lambda *_, **__: replies, raising=False)
    monkeypatch.setattr(lost_messages, "_start_thread", lambda check: check(), raising=False)


class FakeClock:
    """The leader's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def published_run(app: Celery, store: Store, *, seconds_ago: float) -> RunToPublish:
    """A run claimed, published and marked ``queued`` as the leader does it, its
    publication moved ``seconds_ago`` into the past."""
    Schedules(store).create(
        f"s-{uuid.uuid4().hex[:8]}", "tasks.demo.add", at=datetime.now(UTC), allow_unregistered=True
    )
    assert store.take_leadership(1, "leader")
    [run] = store.claim_due(1, batch=10, plan=planner).runs
    assert dispatch.publish_runs(app, [run]).published == [run.id]
    assert store.mark_published([run.id]) == 1
    published_ago(store, seconds_ago)
    return run


def published_ago(store: Store, seconds: float) -> None:
    """Move the runs' publication ``seconds`` into the past."""
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_runs SET published_at = now() - make_interval(secs => :ago)"),
            {"ago": seconds},
        )


def taken_by_a_worker_that_dies(
    app: Celery, test_env: SessionEnv, redis_client: redis.Redis, *, delivered_ago: float
) -> str:
    """A worker takes the oldest message of the ``celery`` queue and is SIGKILLed before its
    ``task_received`` handler records the receipt: the message stays in kombu's unacked hash
    (and ``unacked_index``, scored with the time of the delivery), until the visibility
    timeout. Returns the message's task ID.

    kombu's own channel takes it (RPOP, then ``QoS.append``: the hash entry and its score,
    in one transaction, as for a BRPOP delivery); the death is that the channel never hands
    it back (a clean close would restore it), and the delivery is moved ``delivered_ago``
    seconds into the past."""
    connection = app.connection_for_write()
    channel = connection.default_channel
    message = channel.basic_get("celery", no_ack=False)
    assert message is not None
    tag = message.delivery_tag
    channel.do_restore = False  # killed: nothing is restored when the process goes
    connection.release()
    index = f"{test_env.broker_key_prefix}unacked_index"
    score = redis_client.zscore(index, tag)
    assert score is not None
    assert abs(score - time.time()) < 5, "kombu scores the time of the delivery"
    assert redis_client.hexists(f"{test_env.broker_key_prefix}unacked", tag)
    redis_client.zadd(index, {tag: time.time() - delivered_ago})
    assert redis_client.llen(f"{test_env.broker_key_prefix}celery") == 0
    return str(message.headers["id"])


def two_looks(lost: LostMessages, clock: FakeClock, store: Store) -> list[RunToPublish]:
    """The leader's looks, as far apart as its check interval, until a message missing in
    the first is confirmed: three, the consumers checked after it was first missed."""
    republished: list[RunToPublish] = []
    for _ in range(3):
        republished += lost.look(store, 1, limit=100, idle_timeout=10).republish
        clock.now += CHECK_INTERVAL
        assert lost.due()
    return republished


def sends_nothing_again(app: Celery, store: Store) -> bool:
    """The leader's looks until a missing message is confirmed send nothing again."""
    clock = FakeClock()
    return two_looks(LostMessages(app, clock=clock), clock, store) == []


def test_a_message_taken_by_a_worker_killed_before_its_receipt_is_sent_again(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """Chaos seed 1: a run stayed ``queued`` (attempt 0) for the whole quiescence. Its
    message was delivered to a worker that was SIGKILLed before its ``task_received``
    handler recorded the receipt: no receipt lease for the reaper, and the message sat in
    kombu's unacked hash, which the leader counted as held by the broker, so it never sent
    it again; kombu restores it only after the visibility timeout (an hour).
    Finding chaos seed 1 of issue 15."""
    stranded_for = UNRECORDED_AFTER + DELIVERY_CLOCK_MARGIN + 30
    run = published_run(app, store, seconds_ago=stranded_for)
    task_id = taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=stranded_for)
    assert task_id == run.celery_task_id
    clock = FakeClock()

    republished = two_looks(LostMessages(app, clock=clock), clock, store)

    assert [again.id for again in republished] == [run.id]
    [row] = run_rows(store)
    assert row.state == RunState.PENDING.value, "back in the outbox, to be published again"
    assert row.attempt == 0


def test_a_delivery_whose_receipt_may_still_be_written_is_left_alone(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """A run published long ago (a long queue) whose message a live worker took a moment
    ago: its receipt is on its way, the message is held."""
    run = published_run(app, store, seconds_ago=600)
    taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=1)
    assert sends_nothing_again(app, store)
    [row] = run_rows(store)
    assert (row.id, row.state) == (run.id, RunState.QUEUED.value)


def test_an_old_delivery_does_not_hide_a_copy_waiting_in_the_queue(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """The run was published again (same task ID) after a worker died holding it: the
    copy waiting in the queue holds it, whatever the old delivery's age."""
    run = published_run(app, store, seconds_ago=600)
    taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=600)
    assert dispatch.publish_runs(app, [run]).published == [run.id]
    assert sends_nothing_again(app, store)


def test_a_run_whose_receipt_was_recorded_is_left_to_the_reaper(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """The worker recorded the receipt (a lease) before it died: the reaper publishes the
    run again once the lease expires, the search for lost messages does not."""
    run = published_run(app, store, seconds_ago=600)
    taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=600)
    assert RunStore(store.engine).note_received(
        run.id, owner="w:1:received", worker="w", lease_seconds=30
    )
    assert sends_nothing_again(app, store)


def test_a_fresh_delivery_scored_by_a_worker_whose_clock_is_behind_is_held(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 38, the stranded-delivery age check: a worker whose clock is 2 minutes
    behind took a message a moment ago; kombu scored the delivery with that clock, 2
    minutes in the past. The age is decided by the database's clock, the score read
    with a margin: the delivery is held, the run is not sent again."""
    run = published_run(app, store, seconds_ago=600)
    taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=120)
    assert sends_nothing_again(app, store)
    [row] = run_rows(store)
    assert (row.id, row.state) == (run.id, RunState.QUEUED.value)


def test_a_stranded_delivery_scored_by_a_worker_whose_clock_is_ahead_is_sent_again(
    app: Celery, test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    """issue 38, the stranded-delivery age check: a worker whose clock is 10 minutes
    ahead took a message and was killed before recording it. kombu scored the delivery
    with that clock, in the future: by its score it is always fresh, and the run would
    wait for the visibility timeout (an hour). The leader's own sight decides: once it
    has seen the delivery hold the message alone for ``UNRECORDED_AFTER`` on its
    monotonic clock (and not before), the run is sent again."""
    run = published_run(app, store, seconds_ago=600)
    taken_by_a_worker_that_dies(app, test_env, redis_client, delivered_ago=-600)
    clock = FakeClock()
    lost = LostMessages(app, clock=clock)
    watched = 0.0
    republished: list[RunToPublish] = []
    while not republished and watched <= UNRECORDED_AFTER + 3 * CHECK_INTERVAL:
        republished = lost.look(store, 1, limit=100, idle_timeout=10).republish
        assert not republished or watched >= UNRECORDED_AFTER, "sent before it was watched"
        clock.now += CHECK_INTERVAL
        watched += CHECK_INTERVAL
    assert [again.id for again in republished] == [run.id]


def taken_by_a_consumer_that_records_nothing(app: Celery) -> bool:
    """A consumer the remote control does not show (a plain kombu consumer) takes the
    oldest message of ``celery`` and acknowledges it; False if there was none."""
    with app.connection_for_write() as connection:
        message = connection.default_channel.basic_get("celery", no_ack=True)
    return message is not None


def test_a_run_sent_again_while_nobody_records_it_ends_lost_at_the_bound(
    app: Celery, store: Store
) -> None:
    """issue 38, finding 1, the bound: a consumer that the checks cannot see takes every
    copy of a run and records nothing. Each copy is missing from the broker, so the
    run is sent again, but a run's message is sent at most MAX_SENDS times: then it ends
    ``lost`` with the reason, not sent again for ever."""
    run = published_run(app, store, seconds_ago=UNTAKEN_AFTER + 1)
    clock = FakeClock()
    lost = LostMessages(app, clock=clock)
    sends = 1
    for _ in range(2 * MAX_SENDS):
        assert taken_by_a_consumer_that_records_nothing(app)
        again = two_looks(lost, clock, store)
        if not again:
            break
        assert dispatch.publish_runs(app, again).published == [run.id]
        assert store.mark_published([run.id]) == 1
        sends += 1
        published_ago(store, UNTAKEN_AFTER + 1)

    assert sends == MAX_SENDS
    [row] = run_rows(store)
    assert row.state == RunState.LOST.value
    assert row.error == (
        f"its message was sent {MAX_SENDS} times and no worker recorded it: a consumer"
        " that does not record runs may have taken it"
    )
    assert row.finished_at is not None


STALE_AFTER = 60.0  # the reaper's stale_queued_after, tiny beside the default 2 hours


def reaped(app: Celery, store: Store) -> list[RunToPublish]:
    """One pass of the reaper as the leader runs it: the broker read for the messages of
    stale runs. Returns the runs sent again (published and marked, as the leader does)."""
    lost = LostMessages(app)
    reclaim = store.reclaim(
        1, stale_queued_after=STALE_AFTER, limit=10, in_queue=lost.waiting_in_queues
    )
    if reclaim.runs:
        assert dispatch.publish_runs(app, reclaim.runs).published == [
            run.id for run in reclaim.runs
        ]
        assert store.mark_published([run.id for run in reclaim.runs]) == len(reclaim.runs)
    return reclaim.runs


def test_the_visibility_timeout_rule_sends_a_run_nobody_records_at_most_the_bound(
    app: Celery, store: Store
) -> None:
    """issue 38, the bound on the reaper's visibility-timeout rule: a consumer that
    records nothing (where lost-message recovery falls back to this rule) takes every
    copy of a run and runs it. Reclaimed again and again past ``stale_queued_after``,
    the run's message is sent MAX_SENDS times in all, then the run ends ``lost`` with
    the reason instead of being executed once more every twice the visibility timeout."""
    run = published_run(app, store, seconds_ago=STALE_AFTER + 1)
    sends = 1
    for _ in range(3 * MAX_SENDS):
        assert taken_by_a_consumer_that_records_nothing(app)
        if not reaped(app, store):
            break
        sends += 1
        published_ago(store, STALE_AFTER + 1)

    assert sends == MAX_SENDS
    [row] = run_rows(store)
    assert (row.id, row.state) == (run.id, RunState.LOST.value)
    assert row.error == (
        f"its message was sent {MAX_SENDS} times and no worker recorded it: a consumer"
        " that does not record runs may have taken it"
    )
    assert not taken_by_a_consumer_that_records_nothing(app), "no copy after the bound"


def test_a_stale_run_whose_message_waits_in_the_queue_is_neither_sent_again_nor_counted(
    app: Celery, store: Store
) -> None:
    """issue 38, the bound on the reaper's visibility-timeout rule, on Redis: a run whose
    message still waits in its queue past ``stale_queued_after`` (a long backlog) is not
    lost. The reaper reads the queue: no copy, no count, however often it passes; once
    a consumer that records nothing took the message, the copies count."""
    run = published_run(app, store, seconds_ago=STALE_AFTER + 1)
    for _ in range(2 * MAX_SENDS):
        assert reaped(app, store) == []
    [row] = run_rows(store)
    assert (row.state, row.recovery_sends) == (RunState.QUEUED.value, 0)

    assert taken_by_a_consumer_that_records_nothing(app)
    assert [again.id for again in reaped(app, store)] == [run.id]
    assert run_rows(store)[0].recovery_sends == 1


def test_the_consumers_found_are_kept_with_their_times_and_said_once(store: Store) -> None:
    """What the leader's checks found about consumers that do not record runs: new or
    back pairs are returned (to be said once), a pair not found is gone since that
    check, and a pair last seen longer ago than ``forget_after`` is deleted."""
    assert store.take_leadership(1, "leader")
    pair = ("celery", "celery@old-image")

    [new] = store.record_consumers(1, [pair], forget_after=3600)
    assert (new.queue, new.consumer, new.gone_at) == (*pair, None)
    assert store.record_consumers(1, [pair], forget_after=3600) == [], "said once"
    assert store.record_consumers(1, [], forget_after=3600) == []
    [gone] = store.unrecorded_consumers()
    assert gone.gone_at is not None
    assert gone.first_seen_at == new.first_seen_at
    [back] = store.record_consumers(1, [pair], forget_after=3600)
    assert back.gone_at is None, "back: said again"
    [silent] = store.record_consumers(1, [("*", "")], forget_after=3600, answered=False)
    assert (silent.queue, silent.gone_at) == ("*", None)
    assert [entry.gone_at for entry in store.unrecorded_consumers()] == [None, None], (
        "a check nobody answered says nothing of the consumer it did not name"
    )

    time.sleep(0.01)
    assert store.record_consumers(1, [], forget_after=0) == []
    assert store.unrecorded_consumers() == []


def test_a_worker_taken_for_one_that_records_nothing_is_forgotten_once_it_records(
    app: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos suite's seed 20261202: a worker with the package, just restarted,
    answered the remote control before its presence was written. It was recorded as a
    consumer that records nothing, and lost-message recovery stood down on its queues
    for twice the visibility timeout (two hours): runs whose messages the broker lost
    meanwhile stayed ``queued``. Once its presence is written, the next check forgets
    it, and recovery acts again on those queues."""
    restarted = "worker2@host"
    replies = {RECORDING_WORKER: ["celery"], restarted: ["celery"]}
    monkeypatch.setattr(lost_messages, "active_queues", lambda *_, **__: replies, raising=False)
    run = published_run(app, store, seconds_ago=0)
    clock = FakeClock()
    lost = LostMessages(app, clock=clock)
    lost.look(store, 1, limit=100, idle_timeout=10)  # starts the check
    lost.look(store, 1, limit=100, idle_timeout=10)  # takes it
    assert [entry.consumer for entry in store.unrecorded_consumers()] == [restarted]

    RunStore(store.engine).worker_seen(restarted, pid=2, booted_at=datetime.now(UTC))
    clock.now += lost_messages.CONSUMERS_CHECK_INTERVAL
    lost.look(store, 1, limit=100, idle_timeout=10)  # starts the check
    lost.look(store, 1, limit=100, idle_timeout=10)  # takes it

    assert store.unrecorded_consumers() == []
    published_ago(store, UNTAKEN_AFTER + 1)
    assert taken_by_a_consumer_that_records_nothing(app)
    assert [again.id for again in two_looks(lost, clock, store)] == [run.id]


def test_a_worker_starting_again_is_not_taken_for_one_that_records_nothing(
    app: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chaos suite's seed 1: a worker killed and started again answered the remote
    control before it wrote its presence; its row was older than a lease, and it was
    taken for a consumer that records nothing, which turned lost-message recovery off on
    its queues while the broker lost messages. A node that recorded its presence lately
    records runs."""
    restarted = "worker2@host"
    RunStore(store.engine).worker_seen(restarted, pid=2, booted_at=datetime.now(UTC))
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_workers SET seen_at = now() - interval '5 minutes' WHERE name = :n"),
            {"n": restarted},
        )
    replies = {RECORDING_WORKER: ["celery"], restarted: ["celery"]}
    monkeypatch.setattr(lost_messages, "active_queues", lambda *_, **__: replies, raising=False)
    published_run(app, store, seconds_ago=0)
    lost = LostMessages(app, clock=FakeClock())
    lost.look(store, 1, limit=100, idle_timeout=10)  # starts the check
    lost.look(store, 1, limit=100, idle_timeout=10)  # takes it
    assert store.unrecorded_consumers() == []
