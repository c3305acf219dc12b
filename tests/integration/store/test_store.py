"""The store against real PostgreSQL: the claim, its races and its fencing."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import text

from beat.claim.policies import plan_fires
from beat.errors import StaleEpoch, StoreUnavailable
from beat.models import DueSchedule, FirePlan, RunState
from beat.ops.schedules import Schedules
from beat.schedule.define import first_fire_at
from beat.store.all_roles import Store
from beat.store.db import psycopg_conninfo
from beat.store.leader import Claim
from beat.store.tables import SCHEDULES_CHANNEL
from tests.conftest import SessionEnv
from tests.integration.helpers import add_interval_schedules, make_due, run_rows

pytestmark = pytest.mark.integration


def planner(due: DueSchedule, now: datetime, until: datetime | None = None) -> FirePlan:
    return plan_fires(due, now, until=until, misfire_grace=60, max_catchup=100)


def lenient_planner(due: DueSchedule, now: datetime, until: datetime) -> FirePlan:
    """Every missed fire time is on time: no misfire policy in the way."""
    return plan_fires(due, now, until=until, misfire_grace=3600, max_catchup=100)


def test_claim_inserts_one_run_per_fire_time_and_advances(store: Store) -> None:
    schedules = Schedules(store)
    add_interval_schedules(schedules, 3, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=4.5)
    assert store.take_leadership(1, "me")

    claim = store.claim_due(1, batch=100, plan=planner)

    assert claim.schedules_claimed == 3
    assert len(claim.runs) == 3 * 5  # fire times at -4.5, -3.5, ..., -0.5 s
    rows = run_rows(store)
    assert {row.state for row in rows} == {RunState.PENDING.value}
    assert {row.id for row in rows} == {run.id for run in claim.runs}
    for schedule in schedules.list():
        assert schedule.next_fire_at is not None
        assert schedule.next_fire_at > claim.now
    # Nothing is due any more: a second claim finds nothing.
    assert store.claim_due(1, batch=100, plan=planner).runs == []


def test_claim_with_a_stale_epoch_is_refused_and_writes_nothing(store: Store) -> None:
    add_interval_schedules(Schedules(store), 2, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=2)
    assert store.take_leadership(1, "old")
    assert store.take_leadership(2, "new")
    assert not store.take_leadership(2, "again"), "an epoch is taken once"
    assert not store.take_leadership(1, "older"), "epochs never go back"

    with pytest.raises(StaleEpoch, match="epoch 1, the newest is 2"):
        store.claim_due(1, batch=100, plan=planner)

    assert run_rows(store) == []
    assert len(store.claim_due(2, batch=100, plan=planner).runs) > 0


def test_eight_concurrent_claimers_claim_each_fire_time_once(store: Store) -> None:
    schedules = Schedules(store)
    add_interval_schedules(schedules, 200, every=10, start_at=datetime.now(UTC))
    # 10 fire times each (-95 s ... -5 s; the next is 5 s away): 2,000 runs to claim.
    make_due(store, seconds_ago=95)
    assert store.take_leadership(7, "forced")
    barrier = threading.Barrier(8)

    def claim_until_dry(epoch: int) -> list[Claim]:
        barrier.wait()
        claims = []
        while (claim := store.claim_due(epoch, batch=7, plan=lenient_planner)).schedules_claimed:
            claims.append(claim)
        return claims

    stale_barrier = threading.Barrier(2)

    def stale_claim() -> str:
        stale_barrier.wait()
        try:
            store.claim_due(6, batch=7, plan=planner)
        except StaleEpoch as exc:
            return str(exc)
        return "accepted"

    with ThreadPoolExecutor(max_workers=10) as pool:
        results = [pool.submit(claim_until_dry, 7) for _ in range(8)]
        stale = [pool.submit(stale_claim) for _ in range(2)]
        claims = [claim for future in results for claim in future.result()]
        refusals = [future.result() for future in stale]

    claimed = Counter((run.schedule_name, run.fire_at) for claim in claims for run in claim.runs)
    assert len(claimed) == 2000, "every fire time is claimed"
    assert max(claimed.values()) == 1, "no fire time is claimed twice"
    rows = run_rows(store)
    assert len(rows) == 2000
    assert {row.epoch for row in rows} == {7}
    assert sum(1 for claim in claims if claim.runs) > 8, "the claimers really ran concurrently"
    assert all(refusal.startswith("claim refused") for refusal in refusals)
    per_schedule = Counter(row.schedule_name for row in rows)
    assert set(per_schedule.values()) == {10}


def test_takeover_waits_for_a_claim_in_flight_then_fences_the_old_leader(store: Store) -> None:
    add_interval_schedules(Schedules(store), 5, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=3)
    assert store.take_leadership(1, "old")
    in_claim, takeover_done = threading.Event(), threading.Event()
    takeover_result: list[datetime | None] = []

    def slow_planner(due: DueSchedule, now: datetime, until: datetime) -> FirePlan:
        in_claim.set()
        time.sleep(0.5)  # the old leader is slow inside its claim transaction
        return planner(due, now, until)

    def take_over() -> None:
        in_claim.wait()
        takeover_result.append(store.take_leadership(2, "new", lock_timeout=10))
        takeover_done.set()

    thread = threading.Thread(target=take_over)
    thread.start()
    claim = store.claim_due(1, batch=100, plan=slow_planner)
    thread.join()

    assert claim.runs, "the claim in flight completes"
    (taken_at,) = takeover_result
    assert taken_at is not None, "the takeover recorded its epoch"
    assert taken_at - claim.now >= timedelta(seconds=0.5), (
        "the database's clock it returns is read once the claim let the row go"
    )
    with pytest.raises(StaleEpoch):
        store.claim_due(1, batch=100, plan=planner)


def test_a_leader_paused_inside_its_claim_is_cut_off_by_postgres(store: Store) -> None:
    add_interval_schedules(Schedules(store), 2, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=3)
    assert store.take_leadership(1, "old")

    def paused_planner(due: DueSchedule, now: datetime, until: datetime) -> FirePlan:
        time.sleep(2.5)  # longer than the idle timeout below: like SIGSTOP
        return planner(due, now, until)

    with pytest.raises(StoreUnavailable):
        store.claim_due(1, batch=100, plan=paused_planner, idle_timeout=1)
    assert run_rows(store) == [], "the paused claim wrote nothing"
    assert store.take_leadership(2, "new", lock_timeout=1)


def test_a_claim_s_own_writes_do_not_wake_the_leader_and_an_edit_does(
    store: Store, test_env: SessionEnv
) -> None:
    add_interval_schedules(Schedules(store), 3, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=3)
    assert store.take_leadership(1, "me")
    with psycopg.connect(psycopg_conninfo(test_env.database_url), autocommit=True) as listener:
        listener.execute(f"LISTEN {SCHEDULES_CHANNEL}")

        claim = store.claim_due(1, batch=100, plan=planner)
        after_claim = list(listener.notifies(timeout=0.5))
        Schedules(store).create("edited", "t", every=60, allow_unregistered=True)
        after_edit = list(listener.notifies(timeout=2.0, stop_after=1))

    assert claim.runs, "the claim advanced schedules"
    assert after_claim == [], "the claim woke the leader with its own writes"
    assert len(after_edit) == 1


def test_outbox_returns_earlier_leaders_runs_and_own_old_ones(store: Store) -> None:
    add_interval_schedules(Schedules(store), 2, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=1.5)
    assert store.take_leadership(1, "old")
    claim = store.claim_due(1, batch=100, plan=planner)
    assert store.take_leadership(2, "new")

    assert {run.id for run in store.pending_runs(1, grace=60, limit=100)} == set(), (
        "own and fresh: not yet"
    )
    pending = store.pending_runs(2, grace=60, limit=100)
    assert {run.id for run in pending} == {run.id for run in claim.runs}
    assert store.mark_published([run.id for run in pending]) == len(pending)
    assert store.pending_runs(2, grace=60, limit=100) == []
    assert store.mark_published([run.id for run in pending]) == 0, "published once"


def test_unique_fire_time_holds_even_if_next_fire_at_is_moved_back(store: Store) -> None:
    add_interval_schedules(Schedules(store), 1, every=1, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=2.5)
    assert store.take_leadership(1, "me")
    first = store.claim_due(1, batch=10, plan=planner)
    with store.engine.begin() as conn:  # an operator rewinds the schedule by hand
        conn.execute(
            text("UPDATE beat_schedules SET next_fire_at = :t"),
            {"t": min(r.fire_at for r in first.runs)},
        )
    second = store.claim_due(1, batch=10, plan=planner)
    assert second.runs == [], "already-claimed fire times are not claimed again"


def test_first_fire_of_a_past_one_off_is_its_own_time(store: Store) -> None:
    schedules = Schedules(store)
    past = datetime.now(UTC) - timedelta(hours=3)
    created = schedules.create(
        "once", "tasks.demo.add", at=past, allow_past=True, allow_unregistered=True
    )
    assert created.next_fire_at == past
    assert store.take_leadership(1, "me")
    claim = store.claim_due(1, batch=10, plan=planner)
    assert [run.fire_at for run in claim.runs] == [past], "a one-off in the past fires once, now"
    assert schedules.get("once").next_fire_at is None
    assert store.claim_due(1, batch=10, plan=planner).runs == []
    assert first_fire_at(created.definition, datetime.now(UTC)) == past


def test_a_leader_paused_inside_its_reaper_is_cut_off_by_postgres(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reaper holds the leader row like a claim: a pause there must not block a takeover."""
    assert store.take_leadership(1, "old")
    fence, paused = store._fence, threading.Event()

    def fence_then_pause(conn: Any, epoch: int, idle_timeout: float, **kwargs: Any) -> Any:
        now = fence(conn, epoch, idle_timeout, **kwargs)
        paused.set()
        time.sleep(2.5)  # holding the leader row, idle: like SIGSTOP
        return now

    def take_over() -> None:
        paused.wait()
        started = time.monotonic()
        taken.append(store.take_leadership(2, "new", lock_timeout=10) is not None)
        waited.append(time.monotonic() - started)

    taken: list[bool] = []
    waited: list[float] = []
    monkeypatch.setattr(store, "_fence", fence_then_pause)
    takeover = threading.Thread(target=take_over)
    takeover.start()
    with pytest.raises(StoreUnavailable):
        store.reclaim(1, stale_queued_after=60, limit=10, idle_timeout=1)
    takeover.join()
    assert taken == [True]
    assert waited[0] < 2.0, "the takeover waited for the pause to end"
