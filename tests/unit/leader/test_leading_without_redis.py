"""Scheduling through an election outage (``habeat_lead_without_redis``): the leader
row's hold (``beat.lease.database_hold``) on the loop's fakes. A process that cannot
reach the lease's Redis leads on the row once its hold ended; a leader that Redis
elected holds the row too, so the two paths never lead at once; Redis answering again
takes the lease back. Every fire time is sent once, in the term that claimed it."""

from __future__ import annotations

import functools
import itertools
from datetime import timedelta
from typing import Any

import pytest

from beat.errors import StaleEpoch
from tests.fakes import Process, World, beat_config
from tests.unit.leader.test_leader_loop import check_every_fire_time_published_once

#: Short settings: the row's hold is 3 + 1 + 1 + 3 = 8 s.
QUICK: dict[str, Any] = {
    "lock_ttl": 3.0,
    "standby_poll": 0.25,
    "max_wait": 1.0,
    "claim_ahead": 1.0,
}
HOLD = 8.0


def world(**settings: Any) -> World:
    w = World(beat_config(**{**QUICK, **settings}))
    w.store.add_schedule("every-second", every=1, in_seconds=0.5)
    w.store.add_schedule("every-3s", every=3, in_seconds=0.7)
    return w


def longest_gap_between_claims(w: World, *, since: float) -> float:
    """The longest time without a claim that claimed a run, by any process."""
    times = sorted(
        claim.clock
        for process in w.processes
        for claim in process.claims
        if claim.clock >= since and (claim.runs or claim.armed)
    )
    return max(later - earlier for earlier, later in itertools.pairwise(times))


def leader_cut_from_postgresql_and_standby_from_redis() -> tuple[World, Process, Process]:
    """``a`` leads, then can no longer reach PostgreSQL (its renewer thread still reaches
    Redis); ``b`` stands by, cut from Redis."""
    w = world()
    a = w.start("a")
    w.run_for(2)
    b = w.start("b")
    b.lease.cut_off = True
    w.run_for(3)
    w.store.cut_off.add("a")
    return w, a, b


def on_the_row_after_an_outage(**settings: Any) -> tuple[World, Process]:
    """Two processes; the lease's Redis goes down; one leads on the row (returned)."""
    w = world(**settings)
    w.start("a")
    w.start("b")
    w.run_for(3)
    w.lease_server.reachable = False
    w.run_for(HOLD + 5)
    (leader,) = lead_on_database(w)
    return w, leader


def progress_of(w: World, process: Process) -> None:
    """``process``'s loop makes progress (building runs claimed ahead, say), in its pass."""
    w.running.append(process)
    try:
        process.leadership.made_progress()
    finally:
        w.running.remove(process)


def lead_on_database(w: World) -> list[Process]:
    return [process for process in w.leaders if process.leadership.on_database]


def test_with_redis_down_a_process_leads_on_the_row_once_its_hold_ended() -> None:
    w = world()
    a = w.start("a")
    w.start("b")
    w.run_for(5)
    assert a.leads
    w.lease_server.reachable = False
    down_at = w.clock()

    w.run_for(HOLD + 2)

    (leader,) = lead_on_database(w)
    assert w.store.leader is not None
    assert (w.store.leader.epoch, w.store.leader.holder) == (2, leader.name)
    w.run_for(60)  # a minute more without Redis: scheduling goes on
    assert longest_gap_between_claims(w, since=down_at - 1) <= HOLD + 1
    assert lead_on_database(w) == [leader]
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_while_redis_is_down_scheduling_waits_when_the_fallback_is_off() -> None:
    w = world(lead_without_redis=False)
    a = w.start("a")
    w.start("b")
    w.run_for(5)
    w.lease_server.reachable = False
    w.run_for(30)

    assert w.leaders == []
    assert w.store.leader is not None
    assert w.store.leader.epoch == 1
    assert w.store.leader.held_until is None, "never taken without the lease"
    assert a.hold is None


def test_a_process_cut_from_redis_alone_never_takes_the_row_from_a_leader_that_renews_it() -> None:
    w = world()
    a = w.start("a")
    w.run_for(2)
    b = w.start("b")
    b.lease.cut_off = True

    w.run_for(120)

    assert a.leads
    assert not b.leads
    assert w.store.leader is not None
    assert w.store.leader.epoch == 1
    assert b.errors == [], "a standby cut from Redis stands by quietly"
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_a_redis_leader_cut_from_postgresql_stops_leading_before_its_hold_can_be_taken() -> None:
    # The leader keeps its Redis lease but cannot reach PostgreSQL; the standby cannot
    # reach Redis. The standby may take the row only once its hold ended: by then the
    # leader no longer believes it leads, whatever its watchdog did.
    w, a, b = leader_cut_from_postgresql_and_standby_from_redis()

    w.run_for(HOLD + 5)

    assert b.leads
    assert b.leadership.on_database
    assert not a.leads
    assert w.double_leaders == []
    assert w.violations == []


def test_a_redis_leader_whose_loop_still_progresses_stops_at_its_hold_not_its_watchdog() -> None:
    # While it builds and sends runs claimed ahead, a leader's loop makes progress
    # without PostgreSQL, so its watchdog keeps its Redis lease. Its hold, unrenewed,
    # still ends its term before a process cut off from Redis may take the row.
    w, a, b = leader_cut_from_postgresql_and_standby_from_redis()
    renewed = w.clock()  # a renewed its hold within the last renewal interval
    for step in range(1, 40):
        w.at(renewed + step * 0.5, functools.partial(progress_of, w, a))

    w.run_for(0.9 * HOLD - 0.1)
    assert a.lease.is_held(), "the watchdog still keeps the Redis lease"
    w.run_for(0.2)

    assert a.leadership.epoch is None, "the hold lapsed by a's own clock"
    with pytest.raises(StaleEpoch, match="hold lapsed"):
        a.leadership.confirm_for_send()
    w.run_for(HOLD)
    assert b.leads
    assert w.double_leaders == []
    assert w.violations == []


def test_a_paused_leader_on_the_row_sends_nothing_once_another_took_it() -> None:
    w, leader = on_the_row_after_an_outage()
    w.start("c")
    leader.pause(HOLD + 4)  # SIGSTOP: its hold ends meanwhile

    w.run_for(HOLD + 10)

    (other,) = lead_on_database(w)
    assert other is not leader
    assert w.violations == []
    assert w.double_leaders == []
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_when_redis_answers_again_the_lease_goes_back_to_it_with_a_newer_epoch() -> None:
    w, on_row = on_the_row_after_an_outage()
    row_epoch = on_row.epoch
    assert row_epoch is not None

    w.lease_server.reachable = True
    w.run_for(QUICK["lock_ttl"] + 2)

    (leader,) = w.leaders
    assert not leader.leadership.on_database
    assert leader.epoch is not None
    assert leader.epoch > row_epoch
    assert w.lease_server.holder == leader.name
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_a_process_that_reaches_redis_takes_over_by_asking_the_term_on_the_row_to_end() -> None:
    # The term on the row cannot reach Redis; another process can, and takes the lease.
    # It records its epoch only once it asked the term on the row to end and that hold
    # ended: the term on the row confirms no send after the ask.
    w, on_row = on_the_row_after_an_outage()
    on_row.lease.cut_off = True
    w.lease_server.reachable = True

    w.run_for(3)

    (leader,) = w.leaders
    assert leader is not on_row
    assert not leader.leadership.on_database
    w.run_for(30)
    assert not on_row.leads, "it cannot take the row: the new leader renews its hold"
    assert w.double_leaders == []
    assert w.violations == []
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_a_term_on_the_row_that_reaches_redis_again_hands_the_lease_back_itself() -> None:
    w, on_row = on_the_row_after_an_outage()
    for process in w.processes:
        if process is not on_row:
            process.hand_over()  # nobody else to take the lease
    row_epoch = on_row.epoch
    assert row_epoch is not None
    w.lease_server.reachable = True

    w.run_for(QUICK["lock_ttl"] + 1)

    assert on_row.leads
    assert not on_row.leadership.on_database
    assert on_row.epoch is not None
    assert on_row.epoch > row_epoch
    assert w.lease_server.holder == on_row.name


def test_a_term_on_the_row_paused_past_its_hold_cannot_confirm_a_send() -> None:
    w, on_row = on_the_row_after_an_outage()
    on_row.lease.cut_off = True
    w.lease_server.reachable = True
    on_row.pause(HOLD + 3)  # SIGSTOP: its hold ends meanwhile
    w.start("c")
    w.run_for(HOLD + 1)
    (leader,) = w.leaders
    assert leader is not on_row
    assert not leader.leadership.on_database, "elected by Redis once the hold ended"
    assert on_row.leadership.on_database, "the paused term has not noticed yet"

    with pytest.raises(StaleEpoch):
        on_row.leadership.confirm_for_send()
    w.run_for(10)
    assert not on_row.leads
    assert w.violations == []
    assert w.double_leaders == []


def test_when_redis_goes_down_the_leader_goes_on_on_the_row_at_once() -> None:
    # Its lease lapses, or a send finds Redis gone and it steps down, ending its hold:
    # either way the row is taken at once, by the same process (same epoch) or another.
    w = world()
    w.start("a")
    w.start("b")
    w.run_for(5)
    down_at = w.clock()
    w.lease_server.reachable = False

    w.run_for(30)

    (leader,) = lead_on_database(w)
    assert leader.epoch in (1, 2), "the same term, or one takeover"
    assert longest_gap_between_claims(w, since=down_at - 1) <= 1.5
    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=3))


def test_a_redis_term_whose_lease_lapsed_goes_on_on_the_row_with_the_next_epoch() -> None:
    w = world(claim_ahead=0.0)  # nothing sent ahead: the lease lapses before a send
    w.store.schedules.clear()
    w.store.add_schedule("hourly", every=3600, in_seconds=1800)
    a = w.start("a")
    w.run_for(3)
    assert a.epoch == 1
    w.lease_server.reachable = False

    w.run_for(4)

    assert lead_on_database(w) == [a], "at once: no hold to wait for"
    assert a.epoch == 2, "the next term, on the row"


def test_a_clean_hand_over_on_the_row_lets_a_standby_cut_off_from_redis_take_it_at_once() -> None:
    w, leader = on_the_row_after_an_outage()
    leader.hand_over()
    w.run_for(0.01)
    handed_at = w.clock()

    w.run_for(2)

    (other,) = lead_on_database(w)
    assert other is not leader
    took_over = min(c.clock for c in other.claims if c.clock >= handed_at)
    assert took_over - handed_at <= QUICK["standby_poll"] + 0.5
    assert w.violations == []


def test_a_term_on_the_row_asked_to_end_confirms_no_send_and_renews_nothing() -> None:
    w, on_row = on_the_row_after_an_outage()
    assert on_row.hold is not None
    epoch = on_row.epoch
    assert epoch is not None
    on_row.leadership.confirm_for_send()  # its hold has most of its length left

    refused = w.store.take_leadership(
        epoch + 5, "elected-by-redis", hold=HOLD, ask_within=on_row.hold.ask_within
    )

    assert refused is None, "no newer epoch while a term leads on the row"
    with pytest.raises(StaleEpoch, match="too soon to send"):
        on_row.leadership.confirm_for_send()
    w.run_for(QUICK["lock_ttl"])
    assert on_row.epoch != epoch, "that term ended: its renewal was refused"
    assert w.violations == []
