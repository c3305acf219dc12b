"""Claiming ahead (``habeat_claim_ahead``): runs due within the window are claimed
before their fire time, built ahead, and published at that time, never before;
a leader that dies in between leaves them to the next one, which keeps the time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis
from kombu import Exchange, Queue
from sqlalchemy import text
from sqlalchemy.engine import make_url

from beat.claim.policies import plan_fires
from beat.config import BeatConfig
from beat.errors import ConfigError
from beat.lease.holder import lock_key
from beat.models import DueSchedule, FirePlan, Origin, RunState
from beat.ops.schedules import Schedules
from beat.publish import dispatch
from beat.schedule.define import define
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from beat.store.leader import Claim
from tests.conftest import SessionEnv
from tests.e2e.proxy import CuttableProxy
from tests.integration.conftest import SchedulerFactory
from tests.integration.helpers import broker_messages, run_rows, task_ids

pytestmark = pytest.mark.integration


def planner(due: DueSchedule, now: datetime, until: datetime | None = None) -> FirePlan:
    return plan_fires(due, now, until=until, misfire_grace=60, max_catchup=100)


def test_only_allow_schedules_due_within_the_window_are_claimed_ahead(store: Store) -> None:
    schedules = Schedules(store)
    soon = schedules.create("soon", "t", in_seconds=1.5, allow_unregistered=True)
    schedules.create(
        "soon-skip", "t", in_seconds=1.5, overlap_policy="skip", allow_unregistered=True
    )
    schedules.create("later", "t", in_seconds=30, allow_unregistered=True)
    assert store.take_leadership(1, "me")

    assert store.claim_due(1, batch=10, plan=planner).schedules_claimed == 0, "ahead=0: none"
    claim = store.claim_due(1, batch=10, plan=planner, ahead=2.0)

    assert claim.runs == [], "nothing is due yet"
    assert [run.schedule_name for run in claim.armed] == ["soon"]
    armed = claim.armed[0]
    assert armed.fire_at == soon.next_fire_at
    assert armed.not_before == armed.fire_at > claim.now
    (row,) = run_rows(store)
    assert (row.state, row.not_before) == (RunState.PENDING.value, soon.next_fire_at)


def watch_queue(
    store: Store, client: redis.Redis, key: str, seconds: float = 10.0
) -> tuple[threading.Thread, list[datetime]]:
    """A thread that notes the database's clock when a message first shows in the
    queue ``key`` (within ``seconds``); started."""
    first_seen: list[datetime] = []

    def watch() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not client.llen(key):
            time.sleep(0.001)
        first_seen.append(db_now(store))

    watcher = threading.Thread(target=watch)
    watcher.start()
    return watcher, first_seen


def test_an_armed_run_reaches_the_queue_at_its_fire_time_not_before(
    store: Store, make_scheduler: SchedulerFactory, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    created = Schedules(store).create("soon", "t", in_seconds=1.5, allow_unregistered=True)
    scheduler = make_scheduler(claim_ahead=2.0)
    watcher, first_seen = watch_queue(store, redis_client, f"{test_env.broker_key_prefix}celery")
    deadline = time.monotonic() + 10
    while watcher.is_alive() and time.monotonic() < deadline:
        scheduler.tick()  # leads, claims ahead, then sends it at its fire time
    watcher.join()

    assert created.next_fire_at is not None
    assert first_seen[0] >= created.next_fire_at, "published before its fire time"
    (row,) = run_rows(store)
    assert row.state == RunState.QUEUED.value
    assert task_ids(broker_messages(redis_client, test_env.broker_key_prefix)) == [str(row.id)]


def test_runs_armed_by_a_dead_leader_wait_for_their_time_in_the_next_ones_outbox(
    store: Store,
) -> None:
    Schedules(store).create("soon", "t", in_seconds=1.0, allow_unregistered=True)
    assert store.take_leadership(1, "dies")
    (armed,) = store.claim_due(1, batch=10, plan=planner, ahead=2.0).armed
    assert store.take_leadership(2, "next")

    assert store.pending_runs(2, grace=10, limit=10) == [], "not before its fire time"
    assert armed.fire_at is not None
    with store.engine.connect() as conn:
        wait = (armed.fire_at - conn.execute(text("SELECT now()")).scalar_one()).total_seconds()
    time.sleep(max(0.0, wait) + 0.05)
    assert [run.id for run in store.pending_runs(2, grace=10, limit=10)] == [armed.id]


def test_claim_ahead_is_validated() -> None:
    with pytest.raises(ConfigError, match="habeat_claim_ahead"):
        BeatConfig(claim_ahead=-1).validate()
    assert BeatConfig(claim_ahead=0).claim_ahead == 0


def test_every_fire_time_within_the_window_is_claimed_ahead_in_one_claim(store: Store) -> None:
    Schedules(store).create("second", "t", every=1, allow_unregistered=True)
    assert store.take_leadership(1, "me")

    claim = store.claim_due(1, batch=10, plan=planner, ahead=2.0)

    fire_times = [run.fire_at for run in claim.runs + claim.armed]
    assert len(fire_times) == len(set(fire_times))
    assert len(claim.armed) >= 1
    assert all(claim.now < t <= claim.now + timedelta(seconds=2) for t in fire_times if t)
    assert len(fire_times) >= 2, "a 1-second schedule has two fire times in 2 seconds"
    (schedule,) = Schedules(store).list()
    assert schedule.next_fire_at is not None
    assert schedule.next_fire_at > claim.now + timedelta(seconds=2), "advanced past the window"


def db_now(store: Store) -> datetime:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT clock_timestamp()")).scalar_one()  # type: ignore[no-any-return]


def tick_until(
    scheduler: HAScheduler, store: Store, done: Callable[[], bool], *, until: datetime
) -> None:
    """Tick as ``celery beat`` does (sleeping the back-off a failed tick asks for) until
    ``done()`` or the database's clock passes ``until``."""
    while not done() and db_now(store) < until:
        time.sleep(min(scheduler.tick(), 1.0))


def queued(store: Store, name: str) -> bool:
    return any(row.state == RunState.QUEUED.value for row in run_rows(store, schedule_name=name))


def test_a_leader_paused_past_its_lease_sends_nothing_it_claimed_ahead(
    store: Store,
    make_scheduler: SchedulerFactory,
    redis_client: redis.Redis,
    test_env: SessionEnv,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The leader pauses as it starts waiting for the fire time of runs it claimed
    ahead; meanwhile its lease expires and another process leads. Woken, it must not
    send them: the next leader publishes them from the outbox, once. Finding 8 of issue 15."""
    created = Schedules(store).create("soon", "t", in_seconds=1.5, allow_unregistered=True)
    assert created.next_fire_at is not None
    paused = make_scheduler(claim_ahead=2.0)
    send_at_fire_time = dispatch.publish_at
    taken_over: list[int] = []

    def another_process_leads_meanwhile(*args: Any, **kwargs: Any) -> Any:
        if not taken_over:
            epoch = paused.epoch
            assert epoch is not None
            redis_client.set(lock_key(test_env.key_prefix), "another", px=10_000)
            assert store.take_leadership(epoch + 1, "another")
            taken_over.append(epoch + 1)
        return send_at_fire_time(*args, **kwargs)

    monkeypatch.setattr(dispatch, "publish_at", another_process_leads_meanwhile)
    fire_at = created.next_fire_at
    tick_until(paused, store, lambda: False, until=fire_at + timedelta(seconds=0.5))

    assert taken_over, "the paused leader never came to send"
    assert broker_messages(redis_client, test_env.broker_key_prefix) == [], (
        "the replaced leader sent what it claimed ahead"
    )
    assert not paused.is_leader
    (row,) = run_rows(store)
    assert row.state == RunState.PENDING.value, "left to the next leader's outbox"

    redis_client.delete(lock_key(test_env.key_prefix))  # the other process hands over
    successor = make_scheduler(claim_ahead=2.0)
    tick_until(
        successor, store, lambda: queued(store, "soon"), until=db_now(store) + timedelta(seconds=5)
    )
    paused.tick()
    assert task_ids(broker_messages(redis_client, test_env.broker_key_prefix)) == [str(row.id)]


def test_a_run_routed_to_many_queues_reaches_none_before_its_fire_time(
    store: Store, make_scheduler: SchedulerFactory, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """A message takes one Redis command per queue its exchange routes it to: kombu's
    batch used to flush itself as the message was built, seconds before its time.
    Finding 10 of issue 15."""
    exchange = Exchange("reports", type="topic")
    queues = [Queue(f"reports-{index}", exchange, routing_key="reports.#") for index in range(20)]
    # The default longest wait: the tick that claims the run builds its message at once.
    scheduler = make_scheduler(claim_ahead=2.0, max_wait=5.0, conf={"task_queues": queues})
    with scheduler.app.connection_for_write() as conn:  # as the workers consuming them do
        for queue in queues:
            queue(conn.default_channel).declare()
    created = Schedules(store).create(
        "soon",
        "t",
        in_seconds=1.5,
        queue="reports-0",
        options={"routing_key": "reports.daily"},
        allow_unregistered=True,
    )
    assert created.next_fire_at is not None
    keys = [f"{test_env.broker_key_prefix}{queue.name}" for queue in queues]
    first_seen: list[datetime] = []

    def watch() -> None:  # the database's clock as the message shows in any of the queues
        if redis_client.brpop(keys, timeout=10):
            first_seen.append(db_now(store))

    watcher = threading.Thread(target=watch)
    watcher.start()
    deadline = time.monotonic() + 10
    while watcher.is_alive() and time.monotonic() < deadline:
        scheduler.tick()
    watcher.join()

    assert first_seen, "the run was never published"
    print(f"seen {(first_seen[0] - created.next_fire_at).total_seconds():+.4f}s from its fire time")
    assert first_seen[0] >= created.next_fire_at, "published before its fire time"
    assert sum(int(redis_client.llen(key)) for key in keys) == len(keys) - 1, (  # type: ignore[arg-type]
        "one copy in each queue (the watcher took one)"
    )


#: A send through a cut link fails within half a second. kombu's default (reconnect
#: for ``broker_connection_timeout``, 4 s, two seconds apart) held the failing send
#: longer than the leader's longest step (TTL 2 s + wait + claim-ahead): the lease
#: watchdog then let the lease go and the armed run waited for the outbox.
CUT_FAILS_FAST = {"broker_connection_timeout": 0.5}


@pytest.fixture
def broker_proxy(test_env: SessionEnv) -> Any:
    """A link to the broker that the test can cut."""
    url = make_url(test_env.redis_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 6379)
    yield proxy, url.set(port=proxy.port).render_as_string(hide_password=False)
    proxy.close()


def test_a_broker_error_on_a_claims_runs_due_now_leaves_its_runs_ahead_on_time(
    store: Store, make_scheduler: SchedulerFactory, broker_proxy: Any
) -> None:
    """The error raised by the publish of the runs due now skipped the arming of the
    runs claimed ahead in the same claim: they waited for the outbox's grace.
    Finding 12 of issue 15."""
    proxy, broker_url = broker_proxy
    schedules = Schedules(store)
    schedules.create("now", "t", in_seconds=0, allow_unregistered=True)
    soon = schedules.create("soon", "t", in_seconds=1.5, allow_unregistered=True)
    assert soon.next_fire_at is not None
    scheduler = make_scheduler(claim_ahead=2.0, broker_url=broker_url, conf=CUT_FAILS_FAST)
    with scheduler.app.producer_or_acquire() as producer:
        assert producer.channel is not None  # connected, as after any earlier publish

    def broker_fails(claim: Claim) -> None:
        if claim.runs and claim.armed:
            proxy.cut()

    scheduler.after_claim_commit = broker_fails
    assert scheduler.tick() > 0, "the publish of the runs due now failed"
    proxy.heal()
    fire_at = soon.next_fire_at
    tick_until(
        scheduler, store, lambda: queued(store, "soon"), until=fire_at + timedelta(seconds=5)
    )

    (row,) = run_rows(store, schedule_name="soon")
    assert row.state == RunState.QUEUED.value, "left to the outbox's grace"
    print(f"published {(row.published_at - fire_at).total_seconds():+.4f}s from its fire time")
    assert row.published_at >= fire_at


def test_runs_claimed_ahead_the_broker_refuses_are_sent_once_it_is_back(
    store: Store,
    make_scheduler: SchedulerFactory,
    broker_proxy: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The broker is down at the fire time: the send fails, and the runs must go out as
    soon as it is back, not after the outbox's grace (10 s after they were claimed).
    Finding 12 of issue 15."""
    proxy, broker_url = broker_proxy
    schedules = Schedules(store)
    schedules.create("now", "t", in_seconds=0, allow_unregistered=True)  # connects the pool
    soon = schedules.create("soon", "t", in_seconds=1.5, allow_unregistered=True)
    assert soon.next_fire_at is not None
    scheduler = make_scheduler(claim_ahead=2.0, broker_url=broker_url, conf=CUT_FAILS_FAST)
    send_at_fire_time = dispatch.publish_at
    failed: list[int] = []

    def broker_down_over_the_fire_time(*args: Any, **kwargs: Any) -> Any:
        if failed:
            return send_at_fire_time(*args, **kwargs)
        proxy.cut()
        result = send_at_fire_time(*args, **kwargs)
        failed.append(1)
        proxy.heal()
        return result

    monkeypatch.setattr(dispatch, "publish_at", broker_down_over_the_fire_time)
    fire_at = soon.next_fire_at
    tick_until(
        scheduler, store, lambda: queued(store, "soon"), until=fire_at + timedelta(seconds=5)
    )

    assert failed, "the send at the fire time never happened"
    (row,) = run_rows(store, schedule_name="soon")
    assert row.state == RunState.QUEUED.value, "left to the outbox's grace"
    print(f"published {(row.published_at - fire_at).total_seconds():+.4f}s from its fire time")
    assert row.published_at >= fire_at


@pytest.mark.parametrize("change", ["pause", "delete"])
def test_a_schedule_paused_or_deleted_after_its_run_was_claimed_ahead_does_not_run_it(
    store: Store, change: str
) -> None:
    """Before a burst the window reaches tens of seconds: a schedule paused (or deleted)
    in that time must not run at its fire time, though its run was claimed already.
    The run is cancelled; the leader holding it may still send it, and the worker's
    guard refuses a cancelled run."""
    schedules = Schedules(store)
    schedules.create("soon", "t", in_seconds=20, allow_unregistered=True)
    schedules.create("other", "t", in_seconds=20, allow_unregistered=True)
    assert store.take_leadership(1, "me")
    claim = store.claim_due(1, batch=10, plan=planner, ahead=25.0)
    assert sorted(run.schedule_name or "" for run in claim.armed) == ["other", "soon"]

    if change == "pause":
        schedules.pause("soon")
    else:
        schedules.delete("soon")

    (soon,) = [run for run in run_rows(store) if run.schedule_name == "soon"]
    assert soon.state == RunState.CANCELLED.value, "it would still run at its fire time"
    assert "before its fire time" in soon.reason
    (other,) = [run for run in run_rows(store) if run.schedule_name == "other"]
    assert other.state == RunState.PENDING.value, "only the schedule changed"
    assert store.mark_published([soon.id, other.id]) == 1, "a send does not revive it"


def test_a_run_past_its_fire_time_is_not_cancelled_by_a_pause(store: Store) -> None:
    """What was due before the pause went out at its time (or is being sent): a pause
    stops what comes next."""
    schedules = Schedules(store)
    schedules.create("now", "t", in_seconds=0, allow_unregistered=True)
    assert store.take_leadership(1, "me")
    assert len(store.claim_due(1, batch=10, plan=planner).runs) == 1

    schedules.pause("now")

    (row,) = run_rows(store)
    assert row.state == RunState.PENDING.value


def two_runs_claimed(store: Store) -> Schedules:
    """Schedules ``paused`` and ``edited``, due now, their runs claimed by leader 1."""
    schedules = Schedules(store)
    for name in ("paused", "edited"):
        schedules.create(name, "t", in_seconds=0, allow_unregistered=True)
    assert store.take_leadership(1, "me")
    assert len(store.claim_due(1, batch=10, plan=planner).runs) == 2
    return schedules


def pause_one_and_edit_the_other(schedules: Schedules) -> None:
    schedules.pause("paused")
    schedules.update("edited", kwargs={"changed": True}, allow_unregistered=True)


def test_a_run_sent_and_due_again_later_is_not_cancelled_by_a_pause_or_an_edit(
    store: Store,
) -> None:
    """A run published at its time and pending again, due later (its worker was killed
    and the reaper gave it back, or its lost message is sent again), came due before the
    change: a pause or an edit leaves it to run, as it does a run past its fire time.
    Seen in the chaos run of seed 1: such a run ended cancelled "before its fire time"."""
    schedules = two_runs_claimed(store)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_runs SET published_at = now() - interval '2 seconds',"
                " attempt = 1, not_before = now() + interval '30 seconds'"
            )
        )

    pause_one_and_edit_the_other(schedules)

    assert {row.state for row in run_rows(store)} == {RunState.PENDING.value}


def test_a_retry_given_back_by_the_reaper_due_later_is_not_cancelled_by_a_pause_or_an_edit(
    store: Store,
) -> None:
    """A run that ran at its time and asked for a retry, whose worker stopped while it
    held the retry for its countdown: the reaper gives it back to the outbox, due at the
    retry's time, and clears the times of the deliveries before it (published_at too).
    It came due before the change: a pause or an edit leaves it to run. Seen in the
    chaos run of seed 1: such a plain run ended cancelled "before its fire time"."""
    schedules = two_runs_claimed(store)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_runs SET state = 'retrying', retries = 1, attempt = 1,"
                " published_at = now() - interval '3 seconds',"
                " received_at = now() - interval '2 seconds',"
                " retry_due_at = now() + interval '30 seconds',"
                " lease_owner = 'w1@host:1:received',"
                " lease_expires_at = now() - interval '1 second'"
            )
        )
    store.reclaim(1, stale_queued_after=3600, limit=10)
    given_back = run_rows(store)
    assert {(row.state, row.published_at) for row in given_back} == {(RunState.PENDING.value, None)}

    pause_one_and_edit_the_other(schedules)

    assert {row.state for row in run_rows(store)} == {RunState.PENDING.value}


def test_an_edit_after_a_run_was_claimed_ahead_applies_to_that_fire_time(store: Store) -> None:
    """New arguments given seconds before a fire time whose run was claimed already:
    the run is withdrawn and its fire time claimed again, with them. (The leader may
    still send the message it built: a run without a row is refused by workers.)"""
    schedules = Schedules(store)
    created = schedules.create("soon", "t", every=3600, args=[1], allow_unregistered=True)
    assert store.take_leadership(1, "me")
    (old,) = store.claim_due(1, batch=10, plan=planner, ahead=3600.0).armed
    assert old.fire_at == created.next_fire_at
    count_before = schedules.get("soon").runs_count

    edited = schedules.update("soon", args=[2])

    assert edited.next_fire_at == old.fire_at, "its fire time is due again"
    assert edited.runs_count == count_before - 1
    assert [row.id for row in run_rows(store)] == [], "the old run is withdrawn"
    (new,) = store.claim_due(1, batch=10, plan=planner, ahead=3600.0).armed
    assert (new.fire_at, new.args) == (old.fire_at, [2])
    assert new.id != old.id
    assert schedules.get("soon").runs_count == count_before


def test_a_new_timing_drops_the_fire_times_claimed_under_the_old_one(store: Store) -> None:
    schedules = Schedules(store)
    schedules.create("soon", "t", every=3600, allow_unregistered=True)
    assert store.take_leadership(1, "me")
    (old,) = store.claim_due(1, batch=10, plan=planner, ahead=3600.0).armed
    assert old.fire_at is not None

    edited = schedules.update("soon", every=7200)

    assert run_rows(store) == [], "not run at a fire time of the old timing"
    assert edited.next_fire_at is not None
    assert edited.next_fire_at != old.fire_at


def test_a_deploy_that_changes_a_code_schedule_applies_to_its_runs_claimed_ahead(
    store: Store,
) -> None:
    schedules = Schedules(store)
    v1 = define("deployed", "t", every=3600, kwargs={"v": 1}, origin=Origin.CODE)
    schedules.sync_code([(v1, "hash-1")])
    assert store.take_leadership(1, "me")
    (old,) = store.claim_due(1, batch=10, plan=planner, ahead=3600.0).armed

    v2 = define("deployed", "t", every=3600, kwargs={"v": 2}, origin=Origin.CODE)
    schedules.sync_code([(v2, "hash-2")])

    assert run_rows(store) == []
    (new,) = store.claim_due(1, batch=10, plan=planner, ahead=3600.0).armed
    assert (new.fire_at, new.kwargs) == (old.fire_at, {"v": 2})


def test_a_burst_is_claimed_far_enough_ahead_to_be_built_by_its_fire_time(
    store: Store, make_scheduler: SchedulerFactory, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    """2,000 schedules due at one instant. The fixed window (half a second) is less
    than claiming and building them takes; the window widens (``beat.claim.window``):
    every run is claimed well before it, and none reaches the queue before its time."""
    count = 2000
    fire_at = db_now(store) + timedelta(seconds=6)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds,"
                " anchor_at, next_fire_at) SELECT 'tenant-' || i, 't', 'every', 86400,"
                " :at, :at FROM generate_series(1, :count) AS i"
            ),
            {"at": fire_at, "count": count},
        )
    scheduler = make_scheduler(claim_ahead=0.5, claim_ahead_max=10.0, claim_batch=200)
    key = f"{test_env.broker_key_prefix}celery"
    watcher, first_seen = watch_queue(store, redis_client, key, seconds=20)
    tick_until(
        scheduler,
        store,
        lambda: redis_client.llen(key) >= count,
        until=fire_at + timedelta(seconds=10),
    )
    watcher.join()

    rows = run_rows(store)
    assert len(rows) == count
    assert first_seen[0] >= fire_at, "published before its fire time"
    latest_claim = max(row.claimed_at for row in rows)
    assert latest_claim < fire_at - timedelta(seconds=0.5), (
        "claimed no earlier than the fixed window allows: it did not widen"
    )
    assert len(set(task_ids(broker_messages(redis_client, test_env.broker_key_prefix)))) == count
