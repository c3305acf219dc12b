"""The failing monitor in the leader loop (``Maintenance._watch_failures``), on the
in-memory fakes: the leader alone looks, every ``MONITOR_INTERVAL``, with the cluster's
thresholds; a schedule it pauses is claimed no more; a monitor that fails does not stop
the claims. Every process looks for a stall of the cluster; a standby sends only the
notifications the leader left."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from beat import metrics
from beat.errors import StoreUnavailable
from beat.leader.maintenance import (
    MONITOR_INTERVAL,
    MONITOR_RETRY,
    STALL_CHECK_INTERVAL,
    STANDBY_SEND_AFTER,
)
from beat.models import RunState
from beat.store.leader import MonitorReport
from beat.store.leader.notifications import PendingNotification
from tests.fakes import World, beat_config

QUICK: dict[str, Any] = {"lock_ttl": 3.0, "standby_poll": 0.25, "max_wait": 1.0}


@pytest.fixture(autouse=True)
def no_incidents_counted() -> Iterator[None]:
    metrics.forget_incidents()
    yield
    metrics.forget_incidents()


def world(**settings: Any) -> World:
    return World(beat_config(**{**QUICK, **settings}))


def fail_sent_runs(w: World, name: str) -> int:
    """Every run of ``name`` sent so far fails; how many did."""
    failed = 0
    for run in w.store.runs_of(name):
        if run.state is RunState.QUEUED:
            run.state, run.error = RunState.FAILED, "ValueError: boom"
            failed += 1
    return failed


def open_incidents() -> float | None:
    return metrics.REGISTRY.get_sample_value("habeat_incidents_open", {"kind": "failing"})


def test_the_leader_alone_looks_every_interval_with_the_cluster_s_thresholds() -> None:
    w = world(alert_after_failures=4, pause_after_failures=9)
    w.store.add_schedule("often", every=5, in_seconds=1)
    seen: list[tuple[int, int]] = []
    watch = w.store.watch_failures

    def recorded(
        epoch: int, *, alert_after: int, pause_after: int, idle_timeout: float
    ) -> MonitorReport:
        seen.append((alert_after, pause_after))
        return watch(
            epoch, alert_after=alert_after, pause_after=pause_after, idle_timeout=idle_timeout
        )

    w.store.watch_failures = recorded  # type: ignore[method-assign]
    w.start("a")
    w.start("b")
    w.run_for(100)

    times = w.store.call_times("watch_failures", of="a")
    assert w.store.call_times("watch_failures", of="b") == []
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert len(times) >= 100 / MONITOR_INTERVAL - 3
    assert min(gaps) >= MONITOR_INTERVAL
    assert set(seen) == {(4, 9)}


def test_a_schedule_failing_in_a_row_opens_an_incident_and_is_paused_then_claimed_no_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world(alert_after_failures=2, pause_after_failures=3)
    schedule = w.store.add_schedule("flaky", every=10, in_seconds=1)
    w.start("a")
    caplog.set_level(logging.WARNING)
    for _ in range(4):
        w.run_for(10)
        fail_sent_runs(w, "flaky")
    w.run_for(2 * MONITOR_INTERVAL)

    assert not schedule.enabled
    assert schedule.disabled_reason is not None
    assert open_incidents() == 1
    said = [record.getMessage() for record in caplog.records]
    assert sum("incident opened" in line for line in said) == 1
    assert sum("paused after" in line for line in said) == 1
    claimed = len(w.store.runs_of("flaky"))
    w.run_for(60)
    assert len(w.store.runs_of("flaky")) == claimed, "a paused schedule is not claimed"


def test_a_monitor_that_fails_leaves_the_claims_going_and_is_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world()
    w.store.add_schedule("steady", every=5, in_seconds=1)
    calls: list[float] = []

    def broken(epoch: int, **_: Any) -> MonitorReport:
        calls.append(w.clock())
        raise StoreUnavailable("PostgreSQL (fake) refused the monitor's statement")

    w.store.watch_failures = broken  # type: ignore[method-assign]
    w.start("a")
    caplog.set_level(logging.WARNING)
    w.run_for(3 * MONITOR_RETRY)

    assert len(w.store.runs_of("steady")) >= 3 * MONITOR_RETRY / 5 - 2
    assert 2 <= len(calls) <= 4
    assert any("could not look for schedules failing" in r.getMessage() for r in caplog.records)


def test_a_process_that_stands_by_counts_no_open_incident() -> None:
    """The gauge is the leader's: a process that stands by (``LeaderLoop.stand_by``)
    drops it, as the per-schedule series."""
    w = world(alert_after_failures=1)
    w.store.add_schedule("flaky", every=10, in_seconds=1)
    leader = w.start("a")
    w.run_for(11)
    fail_sent_runs(w, "flaky")
    w.run_for(2 * MONITOR_INTERVAL)
    assert open_incidents() == 1

    leader.loop.stand_by()

    assert open_incidents() is None


def test_a_schedule_paused_by_the_leader_has_none_of_its_runs_claimed_ahead_sent() -> None:
    """The pause cancels the runs claimed ahead of their time in the database, and the
    leader forgets those it holds armed: a plain task has no guard that would refuse a
    cancelled run sent anyway."""
    w = world(claim_ahead=3.0, pause_after_failures=2)
    w.store.add_schedule("every-second", every=1, in_seconds=1)
    w.start("a")
    for _ in range(30):
        w.run_for(1)
        fail_sent_runs(w, "every-second")
        if not w.store.schedules[1].enabled:
            break
    schedule = w.store.schedules[1]
    assert not schedule.enabled
    paused_at = w.clock()
    w.run_for(10)

    cancelled = [run for run in w.store.runs_of("every-second") if run.state is RunState.CANCELLED]
    sent_after = [sent for sent in w.sent if sent.clock > paused_at]
    assert cancelled, "runs were claimed ahead when the schedule was paused"
    assert sent_after == []


def test_every_process_looks_for_a_stall_first_thing_and_then_every_interval() -> None:
    """A process looks before it leads (an outage of every leader is told by the first
    process back, before its claims catch up), and a standby goes on looking."""
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    w.start("a")
    w.start("b", delay=1)
    w.run_for(60)

    for name in ("a", "b"):
        times = w.store.call_times("watch_stall", of=name)
        assert len(times) >= 60 / STALL_CHECK_INTERVAL - 1
        assert min(later - earlier for earlier, later in itertools.pairwise(times)) >= (
            STALL_CHECK_INTERVAL
        )
    first_claim = w.store.call_times("claim_due", of="a")[0]
    assert w.store.call_times("watch_stall", of="a")[0] <= first_claim, "before its first claim"


def test_a_process_back_after_an_outage_opens_the_stall_then_its_claims_resolve_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world()
    w.store.add_schedule("often", every=5, first=w.clock.now() - timedelta(minutes=3))
    caplog.set_level(logging.INFO)
    w.start("a")
    w.run_for(2 * STALL_CHECK_INTERVAL)

    said = [record.getMessage() for record in caplog.records]
    assert any("no fire time is being claimed" in line for line in said)
    assert any("fire times are claimed again" in line for line in said)
    assert not w.store.stalled


def test_a_standby_sends_only_what_the_leader_left_and_the_leader_all_that_is_due() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    takes: list[tuple[str | None, int | None, timedelta]] = []
    take = w.store.take_notifications

    def recorded(epoch: int | None, **options: Any) -> list[PendingNotification]:
        takes.append((w.store.caller(), epoch, options.get("overdue_by", timedelta(0))))
        return take(epoch, **options)

    w.store.take_notifications = recorded  # type: ignore[method-assign]
    w.start("a")
    w.start("b", delay=1)
    w.run_for(30)

    leader = {(epoch, overdue) for caller, epoch, overdue in takes if caller == "a"}
    standby = {(epoch, overdue) for caller, epoch, overdue in takes if caller == "b"}
    assert leader == {(1, timedelta(0))}
    assert standby == {(None, STANDBY_SEND_AFTER)}


def test_while_the_leases_redis_is_down_every_process_still_sends_what_is_overdue() -> None:
    """An election outage (the lease's Redis down, PostgreSQL up): nobody can lead, and
    every pass fails at the lease. The stall incident is opened all the same (its look
    comes first), and its notification must go out too: it is how the operator learns
    that nothing is scheduled. A process that cannot reach the lease sends what is
    overdue, as a standby does. (With ``lead_without_redis``, the default, a process
    leads on the leader row instead: ``tests/unit/leader/test_leading_without_redis.py``.)"""
    w = world(lead_without_redis=False)
    w.store.add_schedule("often", every=5, in_seconds=1)
    w.start("a")
    w.start("b", delay=1)
    w.run_for(10)
    takes: list[tuple[str | None, float]] = []
    take = w.store.take_notifications

    def recorded(epoch: int | None, **options: Any) -> list[PendingNotification]:
        takes.append((w.store.caller(), w.clock()))
        return take(epoch, **options)

    w.store.take_notifications = recorded  # type: ignore[method-assign]
    w.lease_server.reachable = False
    down_at = w.clock()
    w.run_for(120)

    assert w.store.stalled, "the stall incident opened during the outage"
    assert {caller for caller, at in takes if at > down_at + 30} == {"a", "b"}
