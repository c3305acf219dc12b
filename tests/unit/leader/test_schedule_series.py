"""The per-schedule series the leader serves to Prometheus (``beat.leader.schedule_series``),
on the in-memory fakes: the leader alone serves them, read every
``SCHEDULE_SERIES_INTERVAL``, one label value per schedule up to the limit, none past it."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from beat import metrics
from beat.errors import StoreUnavailable
from beat.leader.maintenance import SCHEDULE_SERIES_INTERVAL
from beat.leader.schedule_series import ScheduleSeriesGauges
from beat.models import RunState
from beat.store.schedule_series import ScheduleSeries
from tests.fakes import World, beat_config

QUICK: dict[str, Any] = {"lock_ttl": 3.0, "standby_poll": 0.25, "max_wait": 1.0}


@pytest.fixture(autouse=True)
def no_series_left() -> Iterator[None]:
    """The gauges are the process's: each test starts and ends without any."""
    metrics.forget_schedule_series()
    yield
    metrics.forget_schedule_series()


def world(**settings: Any) -> World:
    return World(beat_config(**{**QUICK, "metrics_port": 9808, **settings}))


def failures(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "habeat_schedule_consecutive_failures", {"schedule": name}
    )


def last_success(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "habeat_schedule_last_success_timestamp_seconds", {"schedule": name}
    )


def capped() -> float | None:
    return metrics.REGISTRY.get_sample_value("habeat_schedule_series_capped")


def fail_every_run(w: World, name: str) -> None:
    for run in w.store.runs_of(name):
        if run.state is not RunState.SUCCEEDED:
            run.state = RunState.FAILED


def test_the_leader_serves_failures_in_a_row_and_the_last_success_of_each_schedule() -> None:
    w = world()
    w.store.add_schedule("nightly", every=10, in_seconds=1)
    w.store.add_schedule("quiet", every=3600, in_seconds=3000)
    leader = w.start("a")
    w.run_for(15)  # two runs of nightly, sent
    first, second = sorted(w.store.runs_of("nightly"), key=lambda run: run.fire_at or 0)
    first.state = RunState.SUCCEEDED
    second.state = RunState.FAILED
    w.run_for(SCHEDULE_SERIES_INTERVAL)

    assert leader.leads
    assert failures("nightly") == 1
    assert first.fire_at is not None
    assert last_success("nightly") == first.fire_at.timestamp()
    assert failures("quiet") == 0
    assert last_success("quiet") is None, "absent while no run succeeded"
    assert capped() == 0

    fail_every_run(w, "nightly")  # every run sent so far fails; the next ones stay queued
    w.run_for(SCHEDULE_SERIES_INTERVAL)
    failed = [run for run in w.store.runs_of("nightly") if run.state is RunState.FAILED]
    assert failures("nightly") == len(failed)


def test_the_series_are_read_every_interval_and_only_by_the_leader() -> None:
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    w.start("a")
    w.start("b")
    w.run_for(100)

    times = w.store.call_times("schedule_series", of="a")
    assert len(times) == 4, times  # at 0, 30, 60 and 90 s
    assert min(b - a for a, b in itertools.pairwise(times)) >= SCHEDULE_SERIES_INTERVAL
    assert w.store.count("schedule_series", of="b") == 0


def test_past_the_limit_no_schedule_is_served_and_the_capped_gauge_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = world(metrics_schedule_limit=1)
    w.store.add_schedule("one", every=5, in_seconds=1)
    w.start("a")
    w.run_for(10)
    assert failures("one") == 0
    assert capped() == 0

    w.store.add_schedule("two", every=5, in_seconds=1)
    w.run_for(2 * SCHEDULE_SERIES_INTERVAL)

    assert failures("one") is None, "the series of a schedule served before are dropped"
    assert failures("two") is None
    assert capped() == 1
    said = [r for r in caplog.records if "habeat_metrics_schedule_limit" in r.getMessage()]
    assert len(said) == 1, "said once"


def test_a_removed_schedule_loses_its_series() -> None:
    w = world()
    w.store.add_schedule("kept", every=5, in_seconds=1)
    w.store.add_schedule("removed", every=5, in_seconds=1)
    w.start("a")
    w.run_for(10)
    assert failures("removed") == 0
    (gone,) = [key for key, one in w.store.schedules.items() if one.name == "removed"]
    del w.store.schedules[gone]
    w.run_for(SCHEDULE_SERIES_INTERVAL)
    assert failures("removed") is None
    assert failures("kept") == 0


def test_a_process_that_stands_by_serves_no_series() -> None:
    """Every pass of a process that does not lead stands by (``LeaderLoop.stand_by``):
    it drops the series it served while it led."""
    w = world()
    w.store.add_schedule("often", every=5, in_seconds=1)
    a = w.start("a")
    w.run_for(5)
    assert failures("often") == 0
    a.loop.stand_by()
    assert failures("often") is None
    assert capped() == 0


@pytest.mark.parametrize("settings", [{"metrics_port": None}, {"metrics_schedule_limit": 0}])
def test_without_metrics_or_with_a_limit_of_zero_nothing_is_read(settings: dict[str, Any]) -> None:
    w = world(**settings)
    w.store.add_schedule("often", every=5, in_seconds=1)
    w.start("a")
    w.run_for(60)
    assert w.store.count("schedule_series", of="a") == 0
    assert failures("often") is None


class Deferred:
    """Starts a read when the test says: what a thread would do, at a chosen moment."""

    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def __call__(self, work: Callable[[], None]) -> None:
        self.pending.append(work)

    def finish(self) -> None:
        work = self.pending.pop(0)
        work()


def one(name: str, failures_in_a_row: int = 0) -> list[ScheduleSeries]:
    return [ScheduleSeries(name=name, consecutive_failures=failures_in_a_row, last_success=None)]


def test_a_read_that_ends_after_the_process_stopped_leading_serves_nothing() -> None:
    started = Deferred()
    gauges = ScheduleSeriesGauges(start=started)
    gauges.read(lambda: one("nightly", 4), limit=10)
    gauges.forget()  # it stopped leading while the read ran
    started.finish()
    assert failures("nightly") is None
    gauges.read(lambda: one("nightly", 5), limit=10)
    started.finish()
    assert failures("nightly") == 5


def test_one_read_at_a_time_and_a_failed_read_keeps_the_last_values(
    caplog: pytest.LogCaptureFixture,
) -> None:
    started = Deferred()
    gauges = ScheduleSeriesGauges(start=started)
    gauges.read(lambda: one("nightly", 1), limit=10)
    gauges.read(lambda: one("nightly", 2), limit=10)
    assert len(started.pending) == 1, "a read runs already: none more is started"
    started.finish()
    assert failures("nightly") == 1

    def broken() -> list[ScheduleSeries]:
        raise StoreUnavailable("PostgreSQL at db:5432 is unreachable")

    gauges.read(broken, limit=10)
    started.finish()
    assert failures("nightly") == 1, "kept until a read succeeds"
    assert any("schedules' series" in record.getMessage() for record in caplog.records)
    gauges.read(lambda: one("nightly", 3), limit=10)
    started.finish()
    assert failures("nightly") == 3
