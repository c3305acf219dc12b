"""The claim window (``beat.claim.window``): how far ahead the leader claims before a
burst, checked against a simulated leader that claims at the planned times, and on
the leader loop's fakes (``tests.fakes``) where a claim takes time per schedule."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beat.claim.window import (
    SAFETY,
    SMALL_LEAD,
    DueSecond,
    Pace,
    claim_window,
    lead_time,
    seconds_until_claim,
)
from beat.publish.dispatch import BUILD_STEP
from tests.fakes import World, beat_config

BASE = 1.0


def profile_of(due: dict[float, int]) -> list[DueSecond]:
    return [DueSecond(seconds=at, count=count) for at, count in sorted(due.items()) if count]


def test_a_small_load_is_left_to_the_fixed_window() -> None:
    due = profile_of({2.5: 10, 20.0: 10})
    assert claim_window(due, base=BASE, per_run=0.001, room=1000) == BASE
    assert seconds_until_claim(due, base=BASE, per_run=0.001) is None


def test_a_burst_widens_the_window_once_its_claim_must_start() -> None:
    per_run = 0.0002  # 100,000 runs: 40 s to allow for, with the safety factor
    assert lead_time(100_000, per_run) == pytest.approx(100_000 * per_run * SAFETY)
    due = profile_of({25.0: 50_000})  # 20 s to allow for
    start = seconds_until_claim(due, base=BASE, per_run=per_run)
    assert start == pytest.approx(25.0 - 20.0 - BASE)
    assert claim_window(due, base=BASE, per_run=per_run, room=10**6) == BASE, "not yet"
    now_due = profile_of({21.0: 50_000})
    assert claim_window(now_due, base=BASE, per_run=per_run, room=10**6) == 22.0, "all its second"


def test_the_window_holds_no_more_runs_than_there_is_room_for() -> None:
    due = profile_of({5.0: 4000, 6.0: 4000, 7.0: 4000})
    per_run = 0.001
    assert claim_window(due, base=BASE, per_run=per_run, room=10_000) == 7.0
    assert claim_window(due, base=BASE, per_run=per_run, room=3000) == BASE


def test_the_pace_is_measured_from_large_claims_and_follows_the_latest() -> None:
    pace = Pace(0.001)
    pace.observe(10, 5.0)  # a small claim: its fixed cost says nothing of the pace
    assert pace.per_run == pytest.approx(0.001)
    for _ in range(30):
        pace.observe(1000, 0.1)
    assert pace.per_run == pytest.approx(0.0001, rel=0.01)


due_profiles = st.dictionaries(
    st.integers(min_value=0, max_value=300).map(lambda tenth: tenth / 10),
    st.integers(min_value=1, max_value=5000),
    max_size=12,
)


@given(due=due_profiles, per_run=st.floats(min_value=1e-5, max_value=2e-3))
def test_a_leader_claiming_as_planned_has_every_run_ready_before_its_fire_time(
    due: dict[float, int], per_run: float
) -> None:
    """Oracle: a leader that waits as ``seconds_until_claim`` says, then claims what
    ``claim_window`` says, earliest first, each run taking ``per_run`` (the estimate
    without its safety factor). Wherever a schedule leaves it the time to (it could
    claim everything at once from now and be ready), each run is ready ``BASE``
    before its fire time, or a small claim's time after that (``SMALL_LEAD``: the
    fixed window's own claims)."""
    total = sum(due.values())
    if not due or lead_time(total, per_run) / SAFETY + BASE > min(due):
        return  # not doable from the start
    left = dict(due)
    now = 0.0
    ready: dict[float, float] = {}
    while left:
        shifted = profile_of({at - now: count for at, count in left.items()})
        start = seconds_until_claim(shifted, base=BASE, per_run=per_run)
        fixed = min(left) - now - BASE  # the fixed window's own claim
        now += max(fixed if start is None else min(start, fixed), 0.0)
        window = claim_window(
            profile_of({at - now: count for at, count in left.items()}),
            base=BASE,
            per_run=per_run,
            room=10**9,
        )
        taken = sorted(at for at in left if at - now <= window + 1e-6)
        assert taken, "woken for nothing"
        for at in taken:
            now += left.pop(at) * per_run
            ready[at] = now
    late = {at: done for at, done in ready.items() if done > at - BASE + SMALL_LEAD + 1e-6}
    assert late == {}, "claimed too late for the fixed window to cover"


# -- on the leader loop --------------------------------------------------------------------------


def burst_world(**settings: float) -> World:
    config = {"lock_ttl": 10.0, "standby_poll": 0.5, "max_wait": 1.0, "claim_ahead": 1.0}
    config |= {"claim_batch": 100, "claim_ahead_max": 30.0}
    w = World(beat_config(**(config | settings)))
    w.store.latency = 0.002
    w.store.latency_per_schedule = 0.0004  # 5,000 schedules: 2 s of claims
    return w


def add_burst(w: World, count: int, *, in_seconds: float) -> None:
    for index in range(count):
        w.store.add_schedule(f"tenant-{index:05}", every=86_400, in_seconds=in_seconds)


def lateness(w: World) -> list[float]:
    return sorted(
        (sent.at - sent.run.fire_at).total_seconds() for sent in w.sent if sent.run.fire_at
    )


def test_a_burst_is_claimed_early_enough_to_be_sent_at_its_fire_time() -> None:
    w = burst_world()
    add_burst(w, 5000, in_seconds=20.0)
    w.start("a")

    w.run_for(25)

    late = lateness(w)
    assert len(late) == 5000, "each run sent once"
    assert min(late) >= 0, "never early"
    assert max(late) == 0, "all sent at their fire time, built ahead"
    assert w.violations == []


def test_with_the_window_fixed_the_same_burst_is_late() -> None:
    """The counterpart of the test above: what the wider window is for."""
    w = burst_world(claim_ahead_max=0.0)
    add_burst(w, 5000, in_seconds=20.0)
    w.start("a")

    w.run_for(30)

    late = lateness(w)
    assert len(late) == 5000
    assert max(late) > 1.0, "claiming 5,000 takes 2 s, the fixed window is 1 s"


def test_no_more_runs_than_max_armed_are_held_and_the_rest_are_claimed_later() -> None:
    w = burst_world(max_armed=1000)
    add_burst(w, 5000, in_seconds=20.0)
    a = w.start("a")
    most_armed = 0

    def watch() -> None:
        nonlocal most_armed
        most_armed = max(most_armed, len(a.loop.armed))
        if w.clock() < 40:
            w.after(0.05, watch)

    w.after(0.05, watch)
    w.run_for(40)

    assert most_armed <= 1000 + 100, "at most one claim batch past the bound"
    late = lateness(w)
    assert len(late) == 5000, "none lost"
    assert min(late) >= 0, "none early"
    assert Counter(sent.run.id for sent in w.sent).most_common(1)[0][1] == 1


def test_a_leader_that_dies_mid_burst_leaves_the_rest_to_the_next_once() -> None:
    w = burst_world()
    add_burst(w, 5000, in_seconds=20.0)
    a = w.start("a")
    a.run_pass()
    assert a.leads
    w.start("b")
    w.run_for(15.5)  # the burst is being claimed ahead: some armed, some not yet
    assert 0 < len(a.loop.armed) < 5000
    a.crash()

    w.run_for(30)

    late = lateness(w)
    assert len(late) == 5000, "each run sent once, by one leader or the other"
    assert min(late) >= 0, "never early"
    assert w.violations == []


def test_a_leader_slower_than_it_first_assumes_learns_its_pace_by_the_next_burst() -> None:
    w = burst_world()
    w.store.latency_per_schedule = 0.0015  # three times the pace first assumed
    add_burst(w, 3000, in_seconds=20.0)
    for index in range(3000):
        w.store.add_schedule(f"later-{index:05}", every=86_400, in_seconds=60.0)
    a = w.start("a")

    w.run_for(65)

    def lateness_of(prefix: str) -> list[timedelta]:
        return [
            sent.at - sent.run.fire_at
            for sent in w.sent
            if sent.run.fire_at and (sent.run.schedule_name or "").startswith(prefix)
        ]

    first, second = lateness_of("tenant-"), lateness_of("later-")
    assert len(first) == len(second) == 3000
    assert max(first) > timedelta(0), "late at first"
    assert set(second) == {timedelta(0)}, "on time once measured"
    assert a.loop.claim_pace.per_run == pytest.approx(0.0015, rel=0.1)


def test_a_small_fire_time_just_before_a_burst_is_sent_on_time_while_the_burst_is_built() -> None:
    """Building 5,000 messages takes 0.75 s here, and must start before the fire time
    of a single run due half a second before the burst: that one is sent from the
    build, at its time, and the burst at its own."""
    w = burst_world()
    add_burst(w, 5000, in_seconds=20.0)
    w.store.add_schedule("just-before", every=86_400, in_seconds=19.5)
    a = w.start("a")
    a.publisher.build_seconds_per_run = 0.00015

    w.run_for(25)

    late = {
        sent.run.schedule_name: sent.at - sent.run.fire_at for sent in w.sent if sent.run.fire_at
    }
    assert len(late) == 5001
    chunk = timedelta(seconds=BUILD_STEP * a.publisher.build_seconds_per_run)
    assert timedelta(0) <= late["just-before"] <= chunk, "sent within the burst's build"
    del late["just-before"]
    assert set(late.values()) == {timedelta(0)}, "the burst too: built before its fire time"
