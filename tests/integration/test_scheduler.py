"""HAScheduler.tick() in-process against real PostgreSQL and Redis."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from celery.schedules import crontab
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError

from beat.lease.holder import lock_key
from beat.models import FINISHED_STATES, Origin, RunState
from beat.ops.schedules import Schedules
from beat.schedule.code import periodic
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from beat.store.leader import Claim
from tests.conftest import SessionEnv
from tests.e2e.proxy import CuttableProxy
from tests.integration.helpers import (
    add_interval_schedules,
    broker_messages,
    make_due,
    run_rows,
    task_ids,
)

pytestmark = pytest.mark.integration

SchedulerFactory = Callable[..., HAScheduler]


class SimulatedCrash(BaseException):
    """Stands for the process dying: not an Exception, so tick() does not swallow it."""


def test_leader_claims_and_publishes_with_the_run_id_as_task_id(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    # Two fire times past each, the next 5 s away: a slow start cannot make it due too.
    add_interval_schedules(Schedules(store), 3, every=10, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=15)
    scheduler = make_scheduler(claim_ahead=0.0)  # the overdue fire times only

    scheduler.tick()

    assert scheduler.is_leader
    rows = run_rows(store)
    assert len(rows) == 6
    assert {row.state for row in rows} == {RunState.QUEUED.value}
    messages = broker_messages(redis_client, test_env.broker_key_prefix)
    assert sorted(task_ids(messages)) == sorted(str(row.id) for row in rows)
    first = messages[0]
    assert first["headers"]["task"] == "tasks.demo.add"
    assert first["headers"]["habeat_schedule"] in {"s00000", "s00001", "s00002"}
    assert "eta" not in first["headers"] or first["headers"]["eta"] is None


def test_only_one_of_several_schedulers_leads(make_scheduler: SchedulerFactory) -> None:
    schedulers = [make_scheduler() for _ in range(3)]
    for scheduler in schedulers:
        scheduler.tick()
    assert sum(scheduler.is_leader for scheduler in schedulers) == 1
    epochs = {scheduler.epoch for scheduler in schedulers} - {None}
    assert epochs == {1}


def test_a_crash_between_commit_and_publish_is_published_by_the_next_leader(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    add_interval_schedules(Schedules(store), 4, every=10, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=25)  # three fire times past each, the next 5 s away
    # Overdue runs only: runs claimed ahead wait for their time in the outbox
    # (tests/integration/leader/test_claim_ahead.py).
    crashed = make_scheduler(lock_ttl=1.0, claim_ahead=0.0)
    claims: list[Claim] = []

    def crash(claim: Claim) -> None:
        claims.append(claim)
        raise SimulatedCrash

    crashed.after_claim_commit = crash
    with pytest.raises(SimulatedCrash):
        crashed.tick()
    claimed = {str(run.id) for run in claims[0].runs}
    assert len(claimed) == 12
    assert {row.state for row in run_rows(store)} == {RunState.PENDING.value}
    assert broker_messages(redis_client, test_env.broker_key_prefix) == []
    crashed.lease.abandon("simulated crash")  # the dead process renews nothing
    time.sleep(1.1)  # ... and its lease expires

    successor = make_scheduler()
    successor.tick()

    assert successor.is_leader
    pending = RunState.PENDING.value
    left = [r for r in run_rows(store) if r.state == pending and str(r.id) in claimed]
    assert left == []
    published = task_ids(broker_messages(redis_client, test_env.broker_key_prefix))
    assert claimed <= set(published)
    assert len(published) == len(set(published)), "each run is published once"


def test_a_new_schedule_due_now_fires_at_once_woken_by_notify(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    scheduler = make_scheduler(max_wait=30.0)  # without a wake-up it would sleep 30 s
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            scheduler.tick()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    # Leading (and so listening) before the schedule is made: on a loaded machine the
    # first pass can take longer than any fixed pause.
    deadline = time.monotonic() + 15
    while not scheduler.is_leader and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    created_at = time.monotonic()
    Schedules(store).create("now", "tasks.demo.add", at=datetime.now(UTC), allow_unregistered=True)
    deadline = created_at + 10
    while time.monotonic() < deadline and not run_rows(store, state=RunState.QUEUED.value):
        time.sleep(0.02)
    elapsed = time.monotonic() - created_at
    stop.set()
    Schedules(store).create("wake", "tasks.demo.add", every=3600, allow_unregistered=True)
    thread.join(timeout=10)
    assert run_rows(store, state=RunState.QUEUED.value), "the new schedule fired"
    assert elapsed < 3, (
        f"fired {elapsed:.2f}s after creation: LISTEN/NOTIFY did not wake the leader"
    )


def test_unreachable_postgres_is_logged_with_its_url_and_retried(
    make_scheduler: SchedulerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler(database_url="postgresql+psycopg://nobody@127.0.0.1:1/nowhere")
    with caplog.at_level(logging.ERROR, logger="beat.scheduler"):
        delays = [scheduler.tick() for _ in range(3)]
    assert all(delay > 0 for delay in delays)
    assert delays == sorted(delays), "backs off"
    messages = [record.getMessage() for record in caplog.records]
    assert (
        "PostgreSQL at postgresql+psycopg://nobody@127.0.0.1:1/nowhere is unreachable"
        in messages[0]
    )
    assert "docker compose up -d postgres" in messages[0]
    assert len(messages) == 1, "a failure that repeats is not logged on every attempt"


def test_unreachable_redis_is_logged_and_retried(
    make_scheduler: SchedulerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler(redis_url="redis://127.0.0.1:1/0")
    with caplog.at_level(logging.ERROR, logger="beat.scheduler"):
        scheduler.tick()
        scheduler.tick()  # retried: a standby polls
    assert not scheduler.is_leader, "no leader row to take: none ever led"
    [record] = caplog.records  # once per streak
    assert "Redis at 127.0.0.1:1/0 is unreachable" in record.getMessage()
    assert "leads on the leader row in PostgreSQL once its hold ends" in record.getMessage()


def test_a_leader_fenced_out_by_a_newer_epoch_steps_down(
    make_scheduler: SchedulerFactory, store: Store, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    add_interval_schedules(Schedules(store), 1, every=1, start_at=datetime.now(UTC))
    scheduler = make_scheduler()
    scheduler.tick()
    assert scheduler.is_leader
    assert store.take_leadership(99, "a newer leader")  # e.g. after a pause longer than the TTL
    make_due(store, seconds_ago=1.5)
    before = len(run_rows(store))

    scheduler.tick()

    assert not scheduler.is_leader
    assert len(run_rows(store)) == before, "the stale leader claimed nothing"
    assert redis_client.get(lock_key(test_env.key_prefix)) is None, "it gave the lease up"


def test_code_schedules_are_synced_without_clobbering_runtime_changes(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    def conf(minute: str) -> dict[str, Any]:
        return {
            "beat_schedule": {
                "every-ten": {"task": "tasks.demo.add", "schedule": 10.0, "args": (1, 2)},
                "nightly": {
                    "task": "tasks.demo.add",
                    "schedule": crontab(minute=minute, hour="2"),
                    "options": {"queue": "reports"},
                },
            }
        }

    make_scheduler(conf("30")).tick()
    schedules = Schedules(store)
    nightly = schedules.get("nightly")
    assert nightly.definition.origin is Origin.CODE
    assert nightly.definition.options == {"queue": "reports"}
    assert schedules.get("every-ten").definition.args == (1, 2)
    schedules.pause("nightly")

    make_scheduler(conf("30")).tick()  # a restart with the same code
    assert not schedules.get("nightly").definition.enabled, "the pause survives a restart"

    make_scheduler(conf("45")).tick()  # the code changed
    changed = schedules.get("nightly")
    assert changed.definition.trigger.expression == "45 2 * * *"  # type: ignore[union-attr]
    assert not changed.definition.enabled, "...and survives a code change"

    schedules.create("every-ten-api", "tasks.demo.add", every=60, allow_unregistered=True)
    make_scheduler({"beat_schedule": {}}).tick()  # both removed from code
    assert {s.name for s in schedules.list()} == {"every-ten-api"}, (
        "runtime schedules are untouched"
    )


def test_periodic_decorator_defines_a_schedule(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    def define_tasks(app: Any) -> None:
        @periodic(cron="0 9 * * 1-5", tz="Europe/Berlin", kwargs={"x": 1})
        @app.task(name="tests.weekday_report")
        def weekday_report(x: int) -> int:
            return x

    make_scheduler(prepare=define_tasks).tick()

    stored = Schedules(store).get("tests.weekday_report")
    assert stored.definition.origin is Origin.CODE
    assert stored.definition.timezone == "Europe/Berlin"
    assert stored.definition.kwargs == {"x": 1}
    assert stored.next_fire_at is not None
    local = stored.next_fire_at.astimezone(ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute, local.weekday() < 5) == (9, 0, True)
    assert stored.next_fire_at - datetime.now(UTC) < timedelta(days=4)


def test_beat_schedule_entries_carry_the_scheduling_rules(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    conf = {
        "beat_schedule": {
            "sync": {
                "task": "tasks.demo.add",
                "schedule": 60.0,
                "misfire_policy": "skip",
                "overlap_policy": "skip",
                "jitter": 5,
                "max_runs": 10,
            }
        }
    }
    make_scheduler(conf).tick()
    definition = Schedules(store).get("sync").definition
    assert (definition.misfire_policy.value, definition.overlap_policy.value) == ("skip", "skip")
    assert (definition.jitter_seconds, definition.max_runs) == (5.0, 10)
    conf["beat_schedule"]["sync"]["overlap_policy"] = "queue_one"  # the code changes
    make_scheduler(conf).tick()
    assert Schedules(store).get("sync").definition.overlap_policy.value == "queue_one"


def test_a_beat_schedule_entry_with_an_unknown_key_stops_beat_at_start(
    make_scheduler: SchedulerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SystemExit) as stopped:
        make_scheduler({"beat_schedule": {"x": {"task": "t", "schedule": 5.0, "overlap": "skip"}}})

    assert stopped.value.code == 2
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == "beat cannot start: beat_schedule['x']: unknown key(s) overlap"


FINISHED = sorted(state.value for state in FINISHED_STATES)


def insert_old_runs(store: Store, count: int, state: str, *, days: int = 40) -> None:
    """``count`` runs of ``state`` claimed (and, if finished, finished) ``days`` ago."""
    finished = "now() - make_interval(days => :days)" if state in FINISHED else "NULL"
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, task, state, claimed_at, finished_at)"
                " SELECT gen_random_uuid(), 't', :state, now() - make_interval(days => :days),"
                f" {finished} FROM generate_series(1, :count)"
            ),
            {"state": state, "days": days, "count": count},
        )


def count_runs(store: Store, *states: str) -> int:
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                text("SELECT count(*) FROM beat_runs WHERE state = ANY(:states)"),
                {"states": list(states)},
            ).scalar_one()
        )


def test_retention_deletes_a_backlog_at_every_pass_until_it_is_gone(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Retention deletes a backlog at every pass until it is gone. Finding 15 of issue 15."""
    backlog = 20_000
    for state in FINISHED:
        insert_old_runs(store, backlog // len(FINISHED), state)
    unfinished = ("pending", "queued", "running", "retrying")
    for state in unfinished:
        insert_old_runs(store, 3, state)
    scheduler = make_scheduler()

    started, passes, left = time.monotonic(), 0, [backlog]
    while left[-1] and passes < 40:  # each pass deletes one batch of 1,000 at least
        scheduler.tick()
        passes += 1
        left.append(count_runs(store, *FINISHED))
    elapsed, deleted = time.monotonic() - started, backlog - left[-1]
    print(
        f"retention deleted {deleted} runs in {passes} passes ({elapsed:.2f}s,"
        f" {deleted / elapsed:,.0f} runs/s with the ticks' waits); left after each pass: {left}"
    )

    assert left[-1] == 0, f"{left[-1]} old runs left after {passes} passes (one batch a minute?)"
    assert count_runs(store, *unfinished) == 3 * len(unfinished), "unfinished runs are kept"
    insert_old_runs(store, 1, "succeeded")
    scheduler.tick()
    assert count_runs(store, *FINISHED) == 1, "caught up: the next prune is a minute later"


def test_prune_deletes_batch_after_batch_within_its_budget(store: Store) -> None:
    """Prune deletes batch after batch within its time budget. Finding 15 of issue 15."""
    insert_old_runs(store, 20_000, "succeeded")
    first = store.prune(timedelta(days=30), batch=1000, budget=0.0)
    started = time.monotonic()
    rest = store.prune(timedelta(days=30), batch=1000)
    elapsed = time.monotonic() - started
    print(f"prune deleted {rest.deleted} runs in {elapsed:.2f}s: {rest.deleted / elapsed:,.0f}/s")

    assert (first.deleted, first.batches, first.caught_up) == (1000, 1, False)
    assert (rest.deleted, rest.caught_up) == (19_000, True)


def test_a_leader_cut_off_from_postgres_lets_a_standby_lead(
    make_scheduler: SchedulerFactory, test_env: SessionEnv
) -> None:
    """Redis still renews its lease, but a leader that cannot reach PostgreSQL claims
    nothing: it must let the lease go rather than keep everyone from leading."""
    url = make_url(test_env.database_url)
    proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
    try:
        cut_off = make_scheduler(
            database_url=url.set(port=proxy.port).render_as_string(hide_password=False)
        )
        standby = make_scheduler()
        cut_off.tick()
        assert cut_off.is_leader
        standby.tick()
        assert not standby.is_leader

        proxy.cut()
        deadline = time.monotonic() + 20
        while not standby.is_leader and time.monotonic() < deadline:
            cut_off.tick()  # fails: PostgreSQL is unreachable from here
            standby.tick()
            time.sleep(0.2)

        assert standby.is_leader, "the lease stayed with a leader that cannot claim"
        assert not cut_off.is_leader
    finally:
        proxy.close()


def test_a_shutdown_whose_exit_a_driver_error_replaced_still_stops_beat(
    make_scheduler: SchedulerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = make_scheduler()
    scheduler.tick()
    assert scheduler.is_leader

    def interrupted() -> None:
        # What SIGTERM does in the middle of a pass: beat's handler closes the scheduler
        # (Service.sync), then raises SystemExit into the call being made, which the
        # driver's cleanup of that call replaced by an error of its own (seen in CI:
        # psycopg restoring autocommit after an interrupted pre-ping).
        scheduler.close()
        raise ProgrammingError(
            "SET autocommit",
            {},
            Exception("can't change 'autocommit' now: connection in transaction status ACTIVE"),
        )

    monkeypatch.setattr(scheduler.loop, "run_once", interrupted)
    with pytest.raises(SystemExit):
        scheduler.tick()
    # And no pass after it, which would lead again after the hand-over.
    with pytest.raises(SystemExit):
        scheduler.tick()
    assert not scheduler.is_leader
