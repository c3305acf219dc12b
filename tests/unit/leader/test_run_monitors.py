"""The run monitors in the leader loop (``Maintenance._watch_runs``), on the in-memory
fakes: the leader alone looks, after the failing monitor, every ``MONITOR_INTERVAL``;
the runs its pass ended past their max_runtime are terminated once the pass committed;
neither a failed pass nor a failed broadcast stops the claims."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from beat.errors import StoreUnavailable
from beat.leader.maintenance import MONITOR_INTERVAL, MONITOR_RETRY
from beat.store.leader.run_monitors import RunMonitorReport
from tests.fakes import World, beat_config

QUICK: dict[str, Any] = {"lock_ttl": 3.0, "standby_poll": 0.25, "max_wait": 1.0}


def world() -> World:
    return World(beat_config(**QUICK))


def test_the_leader_alone_looks_after_the_failing_monitor_every_interval() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    w.start("a")
    w.start("b")
    w.run_for(60)

    looks = w.store.call_times("watch_runs", of="a")
    assert w.store.call_times("watch_runs", of="b") == []
    assert len(looks) >= 60 / MONITOR_INTERVAL - 3
    failing = w.store.call_times("watch_failures", of="a")
    assert all(any(first <= look for first in failing) for look in looks)


def test_the_runs_a_pass_ended_past_their_max_runtime_are_terminated_once_after_it() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    leader = w.start("a")
    w.run_for(10)
    w.store.overrunning = ["run-1", "run-2"]
    w.run_for(3 * MONITOR_INTERVAL)

    assert leader.publisher.terminated == ["run-1", "run-2"]


def test_a_failed_broadcast_is_said_and_the_claims_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world()
    w.store.add_schedule("steady", every=5, in_seconds=1)

    def unreachable(task_ids: Any) -> None:
        raise ConnectionError("the broker (fake) is down")

    leader = w.start("a")
    leader.publisher.terminate = unreachable  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING)
    w.run_for(10)
    w.store.overrunning = ["run-1"]
    w.run_for(30)

    assert len(w.store.runs_of("steady")) >= 40 / 5 - 2
    assert any(
        "could not broadcast the revocation of 1 runs" in r.getMessage() for r in caplog.records
    )


def test_a_run_monitor_that_fails_leaves_the_claims_going_and_is_tried_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world()
    w.store.add_schedule("steady", every=5, in_seconds=1)
    calls: list[float] = []

    def broken(epoch: int, **_: Any) -> RunMonitorReport:
        calls.append(w.clock())
        raise StoreUnavailable("PostgreSQL (fake) refused the monitor's statement")

    w.store.watch_runs = broken  # type: ignore[method-assign]
    w.start("a")
    caplog.set_level(logging.WARNING)
    w.run_for(3 * MONITOR_RETRY)

    assert len(w.store.runs_of("steady")) >= 3 * MONITOR_RETRY / 5 - 2
    assert 2 <= len(calls) <= 4
    assert any("late or missed" in r.getMessage() for r in caplog.records)
