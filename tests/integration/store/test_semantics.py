"""Overlap policies, windows, jitter and one-offs, claimed against real PostgreSQL."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from beat.claim.policies import jitter_delay, plan_fires
from beat.models import DueSchedule, FirePlan, RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from beat.store.run_guard import Started
from beat.store.runs import RunStore
from tests.integration.helpers import make_due, run_rows, slow_client_clock

pytestmark = pytest.mark.integration


def planner(due: DueSchedule, now: datetime, until: datetime | None = None) -> FirePlan:
    return plan_fires(due, now, until=until, misfire_grace=60, max_catchup=100)


@pytest.fixture
def leader(store: Store) -> int:
    assert store.take_leadership(1, "test")
    return 1


def states(store: Store) -> list[tuple[str, str | None]]:
    return [(row.state, row.reason) for row in run_rows(store)]


def claim_after(store: Store, leader: int, seconds_ago: float) -> list[uuid.UUID]:
    make_due(store, seconds_ago=seconds_ago)
    return [run.id for run in store.claim_due(leader, batch=10, plan=planner).runs]


def test_overlap_skip_records_fire_times_while_a_run_is_active(store: Store, leader: int) -> None:
    Schedules(store).create("s", "t", every=1, overlap_policy="skip", allow_unregistered=True)
    first = claim_after(store, leader, 2.5)
    assert len(first) == 1, "of the fire times in one claim only the latest runs"
    assert claim_after(store, leader, 0.5) == [], "the first run is still waiting"
    reasons = [reason for state, reason in states(store) if state == RunState.SKIPPED.value]
    assert any(reason and "the previous run is still active" in reason for reason in reasons)
    assert any(reason and "a newer fire time in the same claim" in reason for reason in reasons)


def test_overlap_queue_one_allows_one_waiting_behind_a_running_run(
    store: Store, leader: int
) -> None:
    Schedules(store).create("s", "t", every=1, overlap_policy="queue_one", allow_unregistered=True)
    (first,) = claim_after(store, leader, 0.5)
    run_store = RunStore(store.engine)
    started = run_store.start(
        first,
        owner="w",
        worker="w",
        lease_seconds=30,
        task="t",
        args=[],
        kwargs={},
        options={},
        retries=0,
        max_attempts=3,
    )
    assert isinstance(started, Started)
    assert len(claim_after(store, leader, 0.5)) == 1, "one may wait behind the running one"
    assert claim_after(store, leader, 0.5) == [], "but not two"


def test_overlap_cancel_previous_cancels_the_active_run(store: Store, leader: int) -> None:
    Schedules(store).create(
        "s", "t", every=1, overlap_policy="cancel_previous", allow_unregistered=True
    )
    (first,) = claim_after(store, leader, 0.5)
    make_due(store, seconds_ago=0.5)
    claim = store.claim_due(leader, batch=10, plan=planner)
    assert claim.cancelled == [first]
    rows = {row.id: row for row in run_rows(store)}
    assert rows[first].state == RunState.CANCELLED.value
    assert rows[claim.runs[0].id].state == RunState.PENDING.value


def test_overlap_allow_runs_every_fire_time(store: Store, leader: int) -> None:
    Schedules(store).create("s", "t", every=1, allow_unregistered=True)
    assert len(claim_after(store, leader, 2.5)) == 3
    assert len(claim_after(store, leader, 0.5)) == 1


def test_max_runs_disables_the_schedule_and_says_why(store: Store, leader: int) -> None:
    schedules = Schedules(store)
    schedules.create("s", "t", every=1, max_runs=3, allow_unregistered=True)
    assert len(claim_after(store, leader, 9.5)) == 3
    schedule = schedules.get("s")
    assert not schedule.definition.enabled
    assert schedule.runs_count == 3
    assert schedule.disabled_reason == "it reached its max_runs of 3"
    assert claim_after(store, leader, 0.5) == []


def test_end_at_ends_the_window(store: Store, leader: int) -> None:
    schedules = Schedules(store)
    end = datetime.now(UTC) + timedelta(hours=1)
    schedules.create("s", "t", every=1, end_at=end, allow_unregistered=True)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE beat_schedules SET end_at = now() - interval '1.2 second'"))
    assert len(claim_after(store, leader, 2.5)) == 2, "fire times up to end_at run"
    schedule = schedules.get("s")
    assert not schedule.definition.enabled
    assert schedule.disabled_reason is not None
    assert "window ended" in schedule.disabled_reason


def test_start_at_holds_the_first_fire_time(store: Store) -> None:
    start = datetime.now(UTC) + timedelta(days=2)
    created = Schedules(store).create(
        "s", "t", cron="*/5 * * * *", start_at=start, allow_unregistered=True
    )
    assert created.next_fire_at is not None
    assert created.next_fire_at >= start
    assert created.next_fire_at - start < timedelta(minutes=5)


def test_jittered_runs_wait_in_the_outbox_until_their_time(store: Store, leader: int) -> None:
    Schedules(store).create("s", "t", every=3600, jitter=3600, allow_unregistered=True)
    make_due(store, seconds_ago=0.5)
    claim = store.claim_due(leader, batch=10, plan=planner)
    assert (claim.runs, claim.deferred) == ([], 1)
    (row,) = run_rows(store)
    assert row.not_before == row.fire_at + jitter_delay(row.id, 3600), (
        "stable: derived from the run ID"
    )
    assert store.pending_runs(leader, grace=10, limit=10) == []
    assert store.seconds_until_next_fire() is not None
    with store.engine.begin() as conn:
        # Its time has come: the jitter is over (fire_at is half a second ago).
        conn.execute(text("UPDATE beat_runs SET not_before = fire_at + interval '1 ms'"))
    assert [run.id for run in store.pending_runs(leader, grace=10, limit=10)] == [row.id]


def test_a_one_off_in_n_seconds(store: Store) -> None:
    created = Schedules(store).create("s", "t", in_seconds=30, allow_unregistered=True)
    assert created.next_fire_at is not None
    delay = created.next_fire_at - datetime.now(UTC)
    assert timedelta(seconds=25) < delay <= timedelta(seconds=30)


def test_relative_times_count_from_the_database_clock(
    store: Store, leader: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Relative times count from the database's clock. Finding 9 of issue 15."""
    slow_client_clock(monkeypatch, timedelta(seconds=120))
    schedules = Schedules(store)

    soon = schedules.create("soon", "t", in_seconds=90, allow_unregistered=True)
    tick = schedules.create("tick", "t", every=60, allow_unregistered=True)

    # created_at is the database's now() of the inserting transaction.
    assert soon.next_fire_at == soon.created_at + timedelta(seconds=90)
    assert tick.next_fire_at == tick.created_at + timedelta(seconds=60), "one period from now"
    assert store.claim_due(leader, batch=10, plan=planner).runs == [], "nothing is due yet"
    later = schedules.update("soon", in_seconds=300)
    assert later.next_fire_at == later.updated_at + timedelta(seconds=300)
    slower = schedules.update("tick", every=600)
    assert slower.next_fire_at == slower.updated_at + timedelta(seconds=600)


@pytest.mark.parametrize(
    ("policy", "runs"), [("fire_once", 1 + 6), ("fire_all", 16 + 6), ("skip", 6)]
)
def test_misfire_policies_record_what_did_not_run(
    store: Store, leader: int, policy: str, runs: int
) -> None:
    """Every 10 s, last fired 215 s ago, 60 s grace: 16 misfires (-215 s .. -65 s), 6 on time."""
    Schedules(store).create("s", "t", every=10, misfire_policy=policy, allow_unregistered=True)
    make_due(store, seconds_ago=215)
    claim = store.claim_due(leader, batch=10, plan=planner)
    rows = run_rows(store)
    assert len(claim.runs) == runs
    assert len(rows) == 22, "every fire time has a run or a skip record"
    skipped = [row for row in rows if row.state == RunState.SKIPPED.value]
    assert len(skipped) == 22 - runs
    assert all(row.reason.startswith("misfire") for row in skipped)


def test_new_schedules_take_the_policy_defaults_of_the_settings(store: Store) -> None:
    schedules = Schedules(store, defaults={"misfire_policy": "skip", "overlap_policy": "skip"})
    plain = schedules.create("plain", "t", every=5, allow_unregistered=True)
    own = schedules.create("own", "t", every=5, overlap_policy="allow", allow_unregistered=True)
    assert (plain.definition.misfire_policy.value, plain.definition.overlap_policy.value) == (
        "skip",
        "skip",
    )
    assert own.definition.overlap_policy.value == "allow"
