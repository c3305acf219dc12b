"""The rules of the leader loop (``beat.leader.loop``), on in-memory fakes
(``tests.fakes``): the real ``LeaderLoop``, ``Leadership``, ``ArmedRuns`` and
planning, with a manual clock instead of time, PostgreSQL, Redis and a broker.
Each test runs in milliseconds; nothing connects anywhere."""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beat import metrics
from beat.errors import StoreUnavailable
from beat.leader import reporting
from beat.leader.claim_pacing import LEASE_EXPIRY_MARGIN
from beat.leader.maintenance import BURST_MAINTENANCE_INTERVAL, SUMMARY_INTERVAL
from beat.models import OverlapPolicy, RunState, RunToPublish
from beat.records import DatabaseClock
from beat.schedule.timing import Every
from beat.store.leader import Claim
from beat.store.stats import SummaryReport
from tests.fakes import FakeRun, Process, Sent, World, beat_config, deterministic_run_ids

#: Short settings, so that leases expire and standbys poll within seconds.
QUICK: dict[str, Any] = {
    "lock_ttl": 3.0,
    "standby_poll": 0.25,
    "max_wait": 1.0,
    "claim_ahead": 2.0,
}


def world(**settings: Any) -> World:
    return World(beat_config(**{**QUICK, **settings}))


def leader(w: World, name: str = "a") -> Process:
    """A process that leads after its first pass."""
    process = w.start(name)
    process.run_pass()
    assert process.leads
    return process


def standby(w: World, name: str = "b") -> Process:
    process = w.start(name)
    process.run_pass()
    assert not process.leads
    return process


def only_run(w: World, name: str) -> FakeRun:
    (run,) = w.store.runs_of(name)
    return run


def armed_in(process: Process) -> list[RunToPublish]:
    return [run for claim in process.claims for run in claim.armed]


def claim_of(process: Process, run: RunToPublish) -> Claim:
    (claim,) = [claim for claim in process.claims if run in claim.armed]
    return claim


def deadline_of(claim: Claim, run: RunToPublish) -> float:
    """The run's fire time on the claiming process's clock, through ``Claim.clock``."""
    assert run.fire_at is not None
    return claim.clock + (run.fire_at - claim.now).total_seconds()


# -- standby and leader ------------------------------------------------------------------------


def test_a_standby_does_not_claim_and_waits_standby_poll() -> None:
    w = world(standby_poll=0.7)
    w.lease_server.acquire("someone-else", 60.0, 0)
    w.store.add_schedule("due", every=1, in_seconds=-0.5)

    b = w.start("b")
    b.run_pass()

    assert not b.leads
    assert w.store.count("claim_due") == w.store.count("pending_runs") == 0
    assert b.waiter.waits == [0.7]
    assert b.next_run == pytest.approx(w.clock() + 0.7)
    w.run_for(5)
    assert w.sent == []
    assert w.store.runs == {}
    assert b.passes == pytest.approx(5 / 0.7 + 1, abs=1)


def test_the_leader_publishes_due_runs_at_once_and_marks_them_published() -> None:
    w = world()
    w.store.add_schedule("due", every=60, in_seconds=-0.5)
    w.store.add_schedule("later", every=60, in_seconds=30)
    started, now = w.clock(), w.clock.now()

    a = leader(w)

    (sent,) = w.sent
    run = only_run(w, "due")
    assert sent.run.id == run.id
    assert (sent.clock, sent.deadline) == (started, None), "sent in the first pass, not armed"
    assert run.state is RunState.QUEUED
    assert run.published_at == now
    assert w.store.mark_published([run.id]) == 0, "pending -> queued once"
    assert w.store.runs_of("later") == []
    assert a.waiter.waits, "then it waits"


@pytest.mark.parametrize("max_wait", [0.4, 30.0], ids=["over-passes", "within-a-pass"])
def test_runs_claimed_ahead_are_sent_at_their_fire_time_never_before(max_wait: float) -> None:
    w = world(claim_ahead=2.0, max_wait=max_wait)
    w.store.add_schedule("soon", every=60, in_seconds=1.5)
    a = w.start("a")
    sends_before: list[int] = []
    a.after_claim = lambda claim: sends_before.append(len(w.sent))

    w.run_for(5)

    (armed,) = armed_in(a)
    claim = claim_of(a, armed)
    (sent,) = w.sends_of(armed.id)
    assert sent.clock >= deadline_of(claim, armed), "sent before its fire time"
    assert sent.at == armed.fire_at, "sent at its fire time"
    assert sent.deadline == deadline_of(claim, armed), "from memory, not from the outbox"
    assert only_run(w, "soon").state is RunState.QUEUED
    assert sends_before[0] == 0
    if max_wait < 1.5:
        claim_pass = a.claims.index(claim)
        assert len(a.claims) > claim_pass + 2, "kept over passes until its time"


def test_the_leader_times_its_messages_expiry_by_the_database_s_clock_of_its_claims() -> None:
    """issue 38, finding 11: each send is given PostgreSQL's now as the last claim read
    it, placed on the monotonic clock (``beat.records.DatabaseClock``), never this host's wall
    clock: the messages' time to live counts from it."""
    w = world(claim_ahead=2.0)
    w.store.add_schedule("due", every=60, in_seconds=-0.5)
    w.store.add_schedule("soon", every=60, in_seconds=1.5)
    a = w.start("a")

    w.run_for(5)

    readings = [DatabaseClock(now=claim.now, clock=claim.clock) for claim in a.claims]
    given = a.publisher.databases
    assert len(given) == 2, "the run due, then the armed one at its fire time"
    assert given[0] == readings[0], "the claim that took the run due"
    assert all(reading in readings for reading in given)
    for reading in given:
        assert reading is not None
        assert reading.now_at(w.clock()) == w.clock.now(), "the database's time now"


def test_the_first_sends_after_a_takeover_are_timed_by_the_database_s_clock_it_read() -> None:
    """issue 38, finding 3 (the leader's first reading): a leader that takes over sends
    the outbox it inherits before its first claim; those messages are timed by
    PostgreSQL's now as the takeover read it (``beat.records.DatabaseClock``), not left
    without one (no time to live, a task's own ``expires`` from the host's clock)."""
    w = world(outbox_grace=0.5)
    w.store.add_schedule("due", every=600, in_seconds=-0.1)
    a = w.start("a")
    a.publisher.fail_next(1)  # the broker fails: the run stays in the outbox
    a.run_pass()
    assert only_run(w, "due").state is RunState.PENDING
    a.crash()
    b = w.start("b")

    w.run_for(8)

    (sent,) = w.sent
    assert sent.sender == "b"
    (claim_of_a,) = a.claims
    (reading,) = b.publisher.databases[:1]
    assert reading is not None, "the outbox was sent without the database's clock"
    assert reading != DatabaseClock(now=claim_of_a.now, clock=claim_of_a.clock)
    assert reading.now_at(sent.clock) == sent.at, "the database's time at the send"


def test_publish_lateness_is_measured_by_the_database_s_clock_not_the_host_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """issue 38, finding 3 (lateness): on a beat host whose wall clock is 2 minutes
    ahead, a run sent half a second after its fire time reads half a second late in the
    lateness metric, not 120 s: it is measured by the database's clock of the loop."""
    w = world()
    host_ahead = timedelta(seconds=120)

    class HostClock(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return w.clock.now() + host_ahead

    monkeypatch.setattr(reporting, "datetime", HostClock)
    w.store.add_schedule("due", every=600, in_seconds=-0.5)
    before = lateness_sum()

    leader(w)

    assert len(w.sent) == 1
    assert lateness_sum() - before == pytest.approx(0.5, abs=0.01)


def lateness_sum() -> float:
    value = metrics.REGISTRY.get_sample_value("habeat_run_lateness_seconds_sum")
    return value or 0.0


def test_the_leaders_own_outbox_leaves_its_armed_runs_alone() -> None:
    w = world(claim_ahead=3.0, max_wait=0.25, outbox_grace=10.0)
    w.store.add_schedule("soon", every=60, in_seconds=2.5)
    a = leader(w)
    (armed,) = armed_in(a)
    assert armed.fire_at is not None
    while only_run(w, "soon").state is RunState.PENDING:
        assert w.store.pending_runs(a.epoch or 0, grace=10.0, limit=10) == []
        w.clock.advance_to(a.next_run)
        a.run_pass()
    (sent,) = w.sent
    assert (sent.run.id, sent.at) == (armed.id, armed.fire_at)
    assert w.store.count("pending_runs") > 8


def test_a_jittered_run_waits_in_the_outbox_until_its_time() -> None:
    w = world()
    w.store.add_schedule("jittered", every=60, in_seconds=-0.1, jitter=5.0)
    leader(w)
    run = only_run(w, "jittered")
    assert run.not_before is not None
    assert run.fire_at is not None
    assert run.not_before > run.fire_at
    assert w.sent == []

    w.run_for(6)

    (sent,) = w.sent
    assert sent.at == run.not_before, "the leader wakes for it, and sends it then"


# -- bursts --------------------------------------------------------------------------------------


def test_a_full_batch_is_claimed_again_at_once_and_the_outbox_waits() -> None:
    w = world(claim_batch=3, claim_ahead=0.0)
    for index in range(8):
        w.store.add_schedule(f"s{index}", every=60, in_seconds=-0.5)

    a = leader(w)
    # A full batch: no wait, and its send is in flight while the next batch is claimed.
    assert (len(w.sent), a.waiter.waits, a.loop.sends.in_flight) == (0, [], True)
    a.run_pass()
    assert (len(w.sent), a.waiter.waits) == (3, []), "the first batch went before the second"
    a.run_pass()
    assert len(w.sent) == 8, "the last batch is not full: it is sent at once"
    assert not a.loop.sends.in_flight
    assert len(a.waiter.waits) == 1, "the last batch is not full: wait"
    assert w.store.count("pending_runs") == 1, "the outbox is read once within the second"
    claimed = [run.id for claim in a.claims for run in claim.runs]
    assert [sent.run.id for sent in w.sent] == claimed, "sent batch by batch, in claim order"


def test_during_a_long_burst_maintenance_runs_at_most_once_a_second() -> None:
    w = world(claim_batch=2, claim_ahead=0.0)
    w.store.latency = 0.05  # each statement takes 50 ms: the burst lasts seconds
    for index in range(120):
        w.store.add_schedule(f"s{index:03d}", every=3600, in_seconds=-0.5)
    a = w.start("a")

    w.run_for(10)

    assert len(w.sent) == 120
    claims = w.store.call_times("claim_due")
    burst_end = claims[59]  # the 60th claim took the last two
    reads = [at for at in w.store.call_times("pending_runs") if at <= burst_end]
    assert burst_end - claims[0] > 3 * BURST_MAINTENANCE_INTERVAL
    assert len(reads) >= 3, "maintenance still runs during a long burst"
    gaps = [later - earlier for earlier, later in itertools.pairwise(reads)]
    assert min(gaps) >= BURST_MAINTENANCE_INTERVAL
    assert a.waiter.waits, "once the burst is over, it waits"


def test_the_outbox_never_takes_a_batch_being_sent_for_one_left_pending() -> None:
    # The outbox publishes again what this leader left pending for outbox_grace: at 0,
    # a batch in flight would be taken too, and sent twice.
    w = world(claim_batch=3, claim_ahead=0.0, outbox_grace=0.0)
    w.store.latency = 0.3  # maintenance comes due between two claims of the burst
    for index in range(30):
        w.store.add_schedule(f"s{index:02d}", every=3600, in_seconds=-0.5)
    w.start("a")

    w.run_for(30)

    assert len(w.store.call_times("pending_runs")) >= 3, "maintenance ran during the burst"
    assert len(w.sent) == 30
    assert set(w.send_counts().values()) == {1}


def test_a_claim_that_fails_mid_burst_lets_the_batch_in_flight_go_first() -> None:
    w = world(claim_batch=3, claim_ahead=0.0)
    for index in range(9):
        w.store.add_schedule(f"s{index}", every=3600, in_seconds=-0.5)
    a = leader(w)
    assert a.loop.sends.in_flight
    w.store.hang_next_call(2.0, of="a")  # the next claim: PostgreSQL stops answering

    a.run_pass()

    assert [type(error) for error in a.errors] == [StoreUnavailable]
    assert len(w.sent) == 3, "sent while this process still leads, not left to the outbox"
    assert not a.loop.sends.in_flight
    w.run_for(5)
    assert len(w.sent) == 9
    assert set(w.send_counts().values()) == {1}


def test_a_batch_claimed_while_the_send_before_it_failed_goes_after_the_back_off() -> None:
    # Not after the outbox's grace (30 s here): without the overlap, this batch would
    # have been claimed and sent in the pass after the back-off.
    w = world(claim_batch=3, claim_ahead=0.0, outbox_grace=30.0)
    for index in range(9):
        w.store.add_schedule(f"s{index}", every=3600, in_seconds=-0.5)
    a = leader(w)  # the first batch's send is in flight
    a.publisher.fail_next(1)  # ...and it fails
    a.run_pass()  # claims the second batch, then learns of the failure
    assert len(a.errors) == 1
    second = [run.id for run in a.claims[1].runs]
    assert not {sent.run.id for sent in w.sent} & set(second)

    w.run_for(10)

    sent_at = {sent.run.id: sent.clock for sent in w.sent}
    assert set(second) <= set(sent_at)
    assert max(sent_at[run_id] for run_id in second) < a.claims[1].clock + 5
    first = [run.id for run in a.claims[0].runs]
    assert not set(first) & set(sent_at), "the failed batch waits for the outbox's grace"
    assert set(w.send_counts().values()) == {1}


def test_armed_runs_whose_time_comes_mid_burst_wait_for_the_batch_in_flight() -> None:
    # One send at a time: an armed fire time sent from the pass while a batch is in
    # flight would be sent beside it, out of the loop's order.
    w = world(claim_batch=3, claim_ahead=2.0)
    w.store.latency = 0.2
    for index in range(30):
        w.store.add_schedule(f"late{index:02d}", every=3600, in_seconds=-0.5)
    w.store.add_schedule("armed", every=3600, in_seconds=1.0)
    a = w.start("a")
    beside_a_batch: list[bool] = []
    checked = a.publisher.on_send

    def sending(runs: Any) -> None:
        if any(run.schedule_name == "armed" for run in runs):
            beside_a_batch.append(a.loop.sends.in_flight)
        checked(runs)

    a.publisher.on_send = sending

    w.run_for(30)

    assert len(w.sent) == 31
    assert set(w.send_counts().values()) == {1}
    (armed,) = [sent for sent in w.sent if sent.run.schedule_name == "armed"]
    assert armed.run.fire_at is not None
    assert armed.at >= armed.run.fire_at, "never early"
    assert beside_a_batch == [False]
    claims = w.store.call_times("claim_due")
    assert claims[0] < armed.clock < claims[-1], "its time came mid-burst"


def test_the_leader_summarises_finished_runs_once_a_minute_and_a_standby_never() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    leader(w, "a")
    standby(w, "b")

    w.run_for(150)

    times = w.store.call_times("summarise", of="a")
    assert len(times) == 3, times  # at 0 s, 60 s and 120 s
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= SUMMARY_INTERVAL
    assert w.store.count("summarise", of="b") == 0
    assert w.store.summarised_until is not None


def test_a_summary_that_fails_stops_no_claim_and_is_tried_again_a_minute_later() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    leader(w, "a")

    def broken(**_: object) -> SummaryReport:
        w.store._enter("summarise")
        raise RuntimeError("a statistics bug")

    w.store.summarise = broken  # type: ignore[method-assign]
    w.run_for(130)

    assert len(w.sent) >= 25, "the schedule fired every 5 s all along"
    times = w.store.call_times("summarise", of="a")
    assert len(times) == 3, times
    assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= SUMMARY_INTERVAL


# -- how long the leader waits ---------------------------------------------------------------------


def test_the_leader_waits_until_the_next_fire_time_less_claim_ahead() -> None:
    w = world(claim_ahead=3.0, max_wait=60.0)
    w.store.add_schedule("in-10s", every=60, in_seconds=10)
    a = leader(w)
    assert a.waiter.waits == [pytest.approx(7.0)]
    w.run_for(7.0)
    assert len(a.claims) == 2
    assert [run.schedule_name for run in armed_in(a)] == ["in-10s"]


def test_the_wait_is_capped_by_max_wait() -> None:
    w = world(max_wait=5.0)
    w.store.add_schedule("in-100s", every=600, in_seconds=100)
    a = leader(w)
    w.run_for(20)
    assert a.waiter.waits == [5.0] * 5


def test_a_trigger_committed_just_after_a_new_leaders_first_claim_wakes_it() -> None:
    w = world(max_wait=30.0)
    w.store.add_schedule("hourly", every=3600, in_seconds=3600)
    a = w.start("a")
    a.after_claim = lambda claim: a.waiter.wake()  # NOTIFY of a trigger after the claim read

    a.run_pass()

    assert a.leads
    assert a.waiter.waits == [30.0]
    assert a.next_run == w.clock(), "woken at once, not after max_wait: it listened first"


def test_a_listen_that_cannot_connect_does_not_stop_the_claims() -> None:
    """A server that takes no new connection ("too many clients") while the pool's
    still work: the pass claims and sends as before; the wait reports the error."""
    w = world()
    w.store.add_schedule("due", every=60, in_seconds=-0.5)
    a = w.start("a")

    def refuse() -> None:
        raise StoreUnavailable("PostgreSQL (fake): too many clients")

    a.waiter.listen = refuse  # type: ignore[method-assign]
    a.run_pass()

    assert a.leads
    assert [sent.run.schedule_name for sent in w.sent] == ["due"]


def test_a_schedule_that_cannot_be_claimed_ahead_is_waited_for_until_its_own_time() -> None:
    w = world(claim_ahead=3.0, max_wait=60.0)
    w.store.add_schedule("skip-in-1s", every=60, in_seconds=1, overlap=OverlapPolicy.SKIP)
    a = leader(w)
    assert a.waiter.waits == [pytest.approx(1.0)], "not claim_ahead before it: it is not taken"
    w.store.add_schedule("allow-due", every=60, in_seconds=-0.1)
    a.run_pass()
    assert a.waiter.waits[1:] == [], "something was claimed: claim again at once"


def test_the_leader_wakes_when_a_workers_lease_expires_and_publishes_the_run_again() -> None:
    w = world(max_wait=60.0, claim_ahead=0.0)
    w.store.add_schedule("job", every=600, in_seconds=-0.1)
    a = leader(w)
    run = only_run(w, "job")
    w.store.start_run(run.id, worker="w1", lease_seconds=2.0)

    a.run_pass()

    assert a.waiter.waits[-1] == pytest.approx(2.0 + LEASE_EXPIRY_MARGIN)
    w.run_for(2.1)
    assert [sent.run.id for sent in w.sent] == [run.id, run.id], "reclaimed and sent again"
    assert run.state is RunState.QUEUED
    assert run.attempt == 1


# -- losing the lease -----------------------------------------------------------------------------


def lose_renewer(w: World, a: Process) -> None:
    """Its renewer dies (last renewal at 1 s): the key expires at 4 s, a stops at 3.7 s."""
    a.lease.crash()


def lose_to_a_pause(w: World, a: Process) -> None:
    """Stopped past its lease: b takes over when the key expires at 5 s."""
    a.pause(6.0)


def lose_the_epoch(w: World, a: Process) -> None:
    """A newer epoch in PostgreSQL: a's next claim is refused (StaleEpoch)."""
    assert w.store.take_leadership(99, "an intruder")


def lose_redis(w: World, a: Process) -> None:
    """Redis restarts empty: b takes the key and a newer epoch; a's renewer notices."""
    w.lease_server.restart_empty()


@pytest.mark.parametrize(
    ("lose", "at"),
    [(lose_renewer, 1.6), (lose_to_a_pause, 2.7), (lose_the_epoch, 2.7), (lose_redis, 2.7)],
    ids=["renewer-crash", "paused-past-ttl", "stale-epoch", "redis-restart"],
)
def test_a_leader_that_loses_its_lease_sends_none_of_its_armed_runs(lose: Any, at: float) -> None:
    """Whoever leads next (b, or a again with a new epoch) publishes them from the
    outbox at their fire time, exactly once."""
    w = world(lock_ttl=3.0, claim_ahead=2.0, max_wait=1.0, standby_poll=0.25)
    a = leader(w)
    w.start("b")
    w.store.add_schedule("soon", every=60, in_seconds=4.5)  # claimed ahead from 2.5 s
    w.store.add_schedule("later", every=60, in_seconds=6.0)
    w.after(at, lambda: lose(w, a))

    w.run_for(12)

    (armed, *_) = armed_in(a)
    run = only_run(w, "soon")
    assert (armed.id, run.epoch) == (run.id, 1), "a armed it in its first term"
    (sent,) = w.sends_of(run.id)
    assert sent.deadline is None, "sent from the memory of a lost term, not from the outbox"
    assert run.fire_at is not None
    assert sent.at >= run.fire_at
    if lose is not lose_to_a_pause:  # someone led again before the fire time: on time
        assert sent.at == run.fire_at
    assert run.state is RunState.QUEUED
    (later,) = w.sends_of(only_run(w, "later").id)
    assert later.at == only_run(w, "later").fire_at
    assert [process.epoch for process in w.leaders] == [w.store.current_epoch()]
    assert w.violations == [], "a process sent runs while it did not lead with the newest epoch"
    if lose is not lose_redis:  # only a Redis that forgot the key lets two believe they lead
        assert w.double_leaders == []


def test_a_clean_hand_over_lets_a_standby_lead_at_once() -> None:
    w = world(standby_poll=30.0, claim_ahead=2.0)
    w.store.add_schedule("soon", every=60, in_seconds=1.5)
    a = leader(w)
    b = standby(w)
    assert len(a.armed) == 1
    assert b.next_run == pytest.approx(w.clock() + 30)

    handed_over_at = w.clock()
    a.hand_over()
    w.run_until(handed_over_at)

    assert b.leads, "woken by the hand-over, it leads at once"
    assert (b.epoch or 0) > 1
    assert w.lease_server.acquisitions[-1][0] == handed_over_at
    w.run_for(3)
    run = only_run(w, "soon")
    (sent,) = w.sends_of(run.id)
    assert (sent.sender, sent.at) == ("b", run.fire_at), "a's armed run, on time, from b"


def test_a_broker_failure_while_sending_armed_runs_keeps_them_for_the_next_pass() -> None:
    w = world(claim_ahead=2.0, max_wait=30.0, outbox_grace=10.0)
    w.store.add_schedule("soon", every=60, in_seconds=1.0)
    a = w.start("a")
    a.publisher.fail_next(1)

    a.run_pass()  # claims ahead, waits for the fire time, the send fails

    (armed,) = armed_in(a)
    assert w.sent == []
    assert isinstance(a.errors[-1], ConnectionError)
    assert len(a.armed) == 1, "kept for the next pass"
    failed_at = w.clock()
    w.run_for(2)
    (sent,) = w.sent
    assert sent.run.id == armed.id
    assert sent.deadline is not None, "from memory, not the outbox"
    assert sent.clock - failed_at < 1.0, "sent again at the next pass, not after outbox_grace"
    assert only_run(w, "soon").state is RunState.QUEUED


def test_a_broker_failure_leaves_runs_claimed_now_to_the_outbox() -> None:
    w = world(outbox_grace=5.0)
    w.store.add_schedule("due", every=600, in_seconds=-0.1)
    a = w.start("a")
    a.publisher.fail_next(1)
    claimed_at = w.clock()
    a.run_pass()
    assert w.sent == []
    assert only_run(w, "due").state is RunState.PENDING

    w.run_for(8)

    (sent,) = w.sent
    assert 5.0 < sent.clock - claimed_at <= 5.0 + 1.0, "at the first pass after outbox_grace"


def test_an_unpublishable_run_is_failed_and_its_schedule_quarantined() -> None:
    w = world()
    w.store.add_schedule("bad", every=60, in_seconds=-0.1)
    w.store.add_schedule("good", every=60, in_seconds=-0.1)
    a = w.start("a")
    a.publisher.unpublishable = {"bad"}

    a.run_pass()

    assert [sent.run.schedule_name for sent in w.sent] == ["good"]
    bad = only_run(w, "bad")
    assert bad.state is RunState.FAILED
    assert "cannot be published" in (bad.error or "")
    assert not w.store.schedule("bad").enabled
    assert w.store.schedule("good").enabled


# -- the health watchdog ---------------------------------------------------------------------------


def test_the_watchdog_lets_the_lease_go_when_the_loop_makes_no_progress() -> None:
    w = world(lock_ttl=3.0, max_wait=1.0, claim_ahead=1.0)  # longest step: 5 s
    a = leader(w)
    w.start("b")
    w.store.add_schedule("every-second", every=1, in_seconds=0.5)
    w.run_for(3)
    assert a.leads
    w.store.cut_off.add("a")  # PostgreSQL unreachable from a only
    cut_at = w.clock()
    last_progress = max(w.store.call_times("claim_due", of="a"))

    w.run_for(10)

    taken = [at for at, holder, _ in w.lease_server.acquisitions if holder == "b"]
    assert taken, "b never led"
    longest_step = 3.0 + 1.0 + 1.0
    assert last_progress + longest_step <= taken[0] <= last_progress + longest_step + 1.5
    assert not a.leads, "a cannot take it back while it cannot read the epoch"
    assert all(isinstance(error, StoreUnavailable) for error in a.errors)
    assert w.violations == []
    late = [sent.at - sent.run.fire_at for sent in w.sent if sent.run.fire_at]
    assert max(late) < timedelta(seconds=longest_step + 1.5)
    assert cut_at < taken[0]


def test_the_watchdog_lets_the_lease_go_when_a_claim_hangs() -> None:
    w = world(lock_ttl=3.0, max_wait=1.0, claim_ahead=1.0)
    a = leader(w)
    b = w.start("b")
    w.store.add_schedule("every-second", every=1, in_seconds=0.5)
    w.run_for(2)
    w.store.hang_next_call(30.0, of="a")  # its next statement never answers

    w.run_for(12)

    assert b.leads
    assert not a.leads
    assert w.violations == w.double_leaders == []
    fire_times = Counter(sent.run.fire_at for sent in w.sent)
    assert set(fire_times.values()) == {1}


def test_a_healthy_leader_waiting_long_keeps_its_lease() -> None:
    w = world(lock_ttl=3.0, max_wait=5.0, claim_ahead=0.0)  # waits longer than the TTL
    a = leader(w)
    b = w.start("b")
    w.run_for(60)
    assert a.leads
    assert not b.leads
    assert len(w.lease_server.acquisitions) == 1
    assert len(a.lease.renewals) == pytest.approx(60 / 1.0, abs=1)


# -- many processes, over time ---------------------------------------------------------------------

#: Settings of the simulated cluster: a short lease, small batches (bursts happen).
CLUSTER: dict[str, Any] = {
    "lock_ttl": 3.0,
    "standby_poll": 0.5,
    "max_wait": 2.0,
    "claim_ahead": 1.0,
    "claim_batch": 3,
}
SCHEDULES: list[tuple[str, float, float, OverlapPolicy, float]] = [
    # name, every (s), first fire in (s), overlap policy, jitter (s)
    ("fast", 1.3, 0.2, OverlapPolicy.ALLOW, 0.0),
    ("second", 1.0, 0.5, OverlapPolicy.ALLOW, 0.0),
    ("same-time-a", 2.0, 1.0, OverlapPolicy.ALLOW, 0.0),
    ("same-time-b", 2.0, 1.0, OverlapPolicy.ALLOW, 0.0),
    ("jittered", 2.5, 0.3, OverlapPolicy.ALLOW, 1.5),
    ("skip", 1.5, 0.4, OverlapPolicy.SKIP, 0.0),
]
FAULTS = (
    "crash",
    "pause",
    "hand_over",
    "broker",
    "renewer",
    "redis_down",  # the lease's Redis, for every process
    "redis_cut",  # one process cut from the lease's Redis
)
fault = st.tuples(
    st.floats(min_value=0.0, max_value=8.0),  # seconds after the previous fault
    st.sampled_from(FAULTS),
    st.integers(min_value=0, max_value=1),  # which live process
    st.floats(min_value=0.1, max_value=12.0),  # how long (pause, restart delay) or how many
)


def apply_fault(w: World, kind: str, target: int, length: float, names: Iterator[str]) -> None:
    live = [process for process in w.processes if process.runnable]
    if not live:
        w.start(next(names))
        return
    process = live[target % len(live)]
    if kind == "crash":
        process.crash()
        w.start(next(names), delay=length)
    elif kind == "hand_over":
        process.hand_over()
        w.start(next(names), delay=length)
    elif kind == "pause":
        process.pause(length)
    elif kind == "broker":
        process.publisher.fail_next(1 + int(length) % 3)
    elif kind in ("redis_down", "redis_cut"):
        cut_off(w, kind, process, seconds=3 * length)  # up to 36 s: past the row's hold
    else:
        process.lease.crash()  # its renewer thread dies; the process goes on


def cut_off(w: World, kind: str, process: Process, *, seconds: float) -> None:
    """The lease's Redis unreachable for ``seconds``, from every process (``redis_down``)
    or from ``process`` alone; each call fails at once. (A cut from PostgreSQL is not
    among these faults: a send whose ``mark_published`` failed is sent again from the
    outbox, a second message by design, which the workers' guard and receipt drop.)"""
    if kind == "redis_down":
        w.lease_server.reachable = False
        w.after(seconds, lambda: setattr(w.lease_server, "reachable", True))
    else:
        process.lease.cut_off = True
        w.after(seconds, lambda: setattr(process.lease, "cut_off", False))


def check_every_fire_time_published_once(w: World, until: datetime) -> None:
    assert w.violations == []
    assert w.double_leaders == []
    counts = w.send_counts()
    assert set(counts.values()) <= {1}, "a run was sent twice"
    for sent in w.sent:
        check_not_early(sent)
    for schedule in w.store.schedules.values():
        assert isinstance(schedule.trigger, Every)
        runs = {run.fire_at: run for run in w.store.runs_of(schedule.name)}
        expected = []
        fire_at = schedule.trigger.anchor
        while fire_at <= until:
            expected.append(fire_at)
            fire_at += timedelta(seconds=schedule.trigger.seconds)
        for fire_at in expected:
            run = runs.get(fire_at)
            assert run is not None, f"{schedule.name} {fire_at}: never claimed"
            if run.state is RunState.SKIPPED:
                assert schedule.overlap_policy is OverlapPolicy.SKIP, run.reason
                assert (run.reason or "").startswith("overlap"), run.reason
                continue
            assert run.state is RunState.QUEUED, f"{schedule.name} {fire_at}: {run.state}"
            assert counts[run.id] == 1


def check_not_early(sent: Sent) -> None:
    run = sent.run
    assert run.fire_at is not None
    assert sent.at >= run.fire_at, "sent before its fire time"
    if run.not_before is not None:
        assert sent.at >= run.not_before, "sent before its jittered time"
    if sent.deadline is not None:
        assert sent.clock >= sent.deadline


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(faults=st.lists(fault, max_size=6))
def test_processes_never_both_lead_and_every_fire_time_is_published_once(
    faults: list[tuple[float, str, int, float]],
) -> None:
    w = World(beat_config(**CLUSTER))
    for name, every, first_in, overlap, jitter in SCHEDULES:
        w.store.add_schedule(name, every=every, in_seconds=first_in, overlap=overlap, jitter=jitter)
    w.start("p0")
    w.start("p1")
    names = (f"p{index}" for index in itertools.count(2))
    at = w.clock()
    for gap, kind, target, length in faults:
        at += gap
        w.at(at, functools.partial(apply_fault, w, kind, target, length, names))
    with deterministic_run_ids():
        w.run_until(at)
        if not any(process.runnable for process in w.processes):
            w.start(next(names))
        w.run_for(45)  # quiet: whoever leads catches up (a cut may still last 36 s)

    check_every_fire_time_published_once(w, w.clock.now() - timedelta(seconds=4))


# -- faults the fakes found in the loop (each test failed before its fix) ----------------------


def test_runs_claimed_further_ahead_than_outbox_grace_are_sent_once() -> None:
    w = world(claim_ahead=12.0, outbox_grace=10.0, max_wait=2.0)  # the default grace
    w.store.latency = 0.01  # each statement takes 10 ms
    w.store.add_schedule("every-second", every=1, in_seconds=0.5)
    w.start("a")

    w.run_for(20)

    assert w.violations == [], w.violations[0]
    assert set(w.send_counts().values()) == {1}


def test_a_leader_paused_after_its_claim_commits_sends_nothing_once_deposed() -> None:
    w = world(lock_ttl=3.0, standby_poll=0.25)
    w.store.add_schedule("due", every=600, in_seconds=-0.1)
    a = w.start("a")
    w.start("b")

    def stall(claim: Claim) -> None:
        if claim.runs:
            a.pause(5.0)  # SIGSTOP, a VM pause, a long GC
            w.sleep_until(w.clock())

    a.after_claim = stall

    w.run_for(10)

    run = only_run(w, "due")
    assert [sent.sender for sent in w.sends_of(run.id)] == ["b"]
    assert w.violations == []
