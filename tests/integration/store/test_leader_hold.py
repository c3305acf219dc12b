"""The leader row's hold on PostgreSQL (``beat.store.leader.hold``): taken with the next
epoch only once it ended by PostgreSQL's clock, by one process of many asking at once,
never while a claim holds the row, never where no hold of the row's epoch was recorded;
while a term leads on the row alone, no process the Redis lease elects records a newer
epoch but the holder itself."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import select, text

from beat.store.all_roles import Store
from beat.store.tables import leader


def held_for(store: Store) -> float:
    """Seconds the row is held from now, by PostgreSQL's clock."""
    with store.engine.connect() as conn:
        left = conn.execute(
            select(text("extract(epoch FROM held_until - clock_timestamp())")).select_from(leader)
        ).scalar_one()
    return float(left)


def test_a_takeover_records_the_hold_and_a_held_row_is_not_taken(store: Store) -> None:
    assert store.take_leadership(1, "redis-leader", hold=30.0)

    assert 29.0 < held_for(store) <= 30.0
    assert store.take_ended_hold("cut-off", 30.0) is None
    assert store.current_epoch() == 1


def test_an_ended_hold_is_taken_with_the_next_epoch_by_the_databases_clock(store: Store) -> None:
    assert store.take_leadership(4, "redis-leader", hold=0.5)
    time.sleep(0.7)

    taken = store.take_ended_hold("cut-off", 20.0)

    assert taken is not None
    epoch, taken_at = taken
    assert epoch == 5
    info = store.leader_info()
    assert info is not None
    assert (info.epoch, info.holder) == (5, "cut-off")
    assert 19.0 < held_for(store) <= 20.0
    assert taken_at.tzinfo is not None
    assert not store.renew_hold(4, "redis-leader", 30.0, on_database=False), "the old term"
    assert store.hold_left(4, "redis-leader") is None


def test_a_row_without_a_hold_is_never_taken(store: Store) -> None:
    assert store.take_leadership(1, "fallback-off")  # hold=None: the setting is off

    assert store.take_ended_hold("cut-off", 20.0) is None
    assert store.hold_left(1, "fallback-off") is None


def test_of_many_processes_asking_at_once_one_takes_the_row(store: Store) -> None:
    assert store.take_leadership(1, "gone", hold=0.1)
    time.sleep(0.3)
    barrier = threading.Barrier(8)

    def ask(index: int) -> tuple[int, object] | None:
        barrier.wait()
        return store.take_ended_hold(f"p{index}", 20.0)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(ask, range(8)))

    taken = [result for result in results if result is not None]
    assert len(taken) == 1
    assert store.current_epoch() == 2


def test_renewing_extends_the_hold_and_ending_it_lets_a_standby_take_it_at_once(
    store: Store,
) -> None:
    assert store.take_leadership(1, "leader", hold=2.0)
    assert store.renew_hold(1, "leader", 60.0, on_database=False)
    assert 59.0 < held_for(store) <= 60.0
    left = store.hold_left(1, "leader")
    assert left is not None
    assert 59.0 < left <= 60.0

    store.end_hold(1, "leader")

    assert store.take_ended_hold("standby", 20.0) is not None


def test_a_claim_in_flight_keeps_the_row_from_a_takeover(store: Store) -> None:
    assert store.take_leadership(1, "leader", hold=0.1)
    time.sleep(0.3)
    with store.engine.connect() as conn, conn.begin():
        conn.execute(select(leader.c.epoch).with_for_update(read=True))  # as the fence does

        assert store.take_ended_hold("standby", 20.0) is None  # after LOCK_TIMEOUT

    assert store.take_ended_hold("standby", 20.0) is not None


def test_while_a_term_leads_on_the_row_no_process_elected_by_redis_records_an_epoch(
    store: Store,
) -> None:
    assert store.take_leadership(1, "gone", hold=0.1)
    time.sleep(0.3)
    taken = store.take_ended_hold("on-row", 1.0)
    assert taken is not None
    epoch = taken[0]

    assert store.take_leadership(epoch + 5, "elected-by-redis", hold=20.0) is None
    assert store.take_leadership(epoch + 5, "on-row", hold=20.0), "its holder hands it back"
    info = store.leader_info()
    assert info is not None
    assert (info.epoch, info.holder) == (epoch + 5, "on-row")


def test_once_a_term_on_the_row_ended_a_process_elected_by_redis_records_its_epoch(
    store: Store,
) -> None:
    assert store.take_leadership(1, "gone", hold=0.1)
    time.sleep(0.3)
    assert store.take_ended_hold("on-row", 0.5) is not None
    time.sleep(0.7)

    assert store.take_leadership(9, "elected-by-redis", hold=20.0)


def test_a_hold_left_by_a_leader_of_an_earlier_release_is_never_taken(store: Store) -> None:
    assert store.take_leadership(1, "new-release", hold=0.1)
    with store.engine.begin() as conn:  # a takeover that writes no hold, as 0017's did
        conn.execute(text("UPDATE beat_leader SET epoch = 2, holder = 'earlier-release'"))
    time.sleep(0.3)

    assert store.take_ended_hold("cut-off", 20.0) is None
    info = store.leader_info()
    assert info is not None
    assert info.held_for is None, "no hold of its epoch"


def test_a_term_that_still_holds_the_row_carries_on_with_the_next_epoch(store: Store) -> None:
    assert store.take_leadership(3, "leader", hold=20.0)

    taken = store.carry_hold_on(3, "leader", 20.0)

    assert taken is not None
    assert taken[0] == 4
    assert store.carry_hold_on(3, "leader", 20.0) is None, "epoch 3 is over"
    assert store.take_leadership(9, "elected-by-redis", hold=20.0) is None, "on the row"
    store.end_hold(4, "leader")
    assert store.carry_hold_on(4, "leader", 20.0) is None, "an ended hold is not carried on"
