"""Real `celery beat` and `celery worker` processes: several beats on the same
schedules, leader kills and clean hand-overs. Every fire time must have exactly
one run, and every run must execute exactly once."""

from __future__ import annotations

import signal
import time
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

SCHEDULES = 5
LOCK_TTL = 3.0
#: Seconds the several-beats test runs: long enough for every beat to poll dozens of times.
RUN_FOR = 30
#: Beats in that test: a leader and two standbys contending for every lapse of the lease.
BEATS = 3


def create_second_schedules(store: Store, **options: Any) -> datetime:
    """``SCHEDULES`` schedules of ``e2e.record`` every second from now (``options``: more
    of their definition); now, by the database's clock."""
    anchor = store.now()
    schedules = Schedules(store)
    for index in range(SCHEDULES):
        schedules.create(
            f"every-second-{index}",
            "e2e.record",
            every=1,
            start_at=anchor,
            args=[f"s{index}"],
            allow_unregistered=True,
            **options,
        )
    return anchor


def assert_each_fire_time_once(store: Store, anchor: datetime, until: datetime) -> int:
    """Every 1-second fire time in (anchor, until] has exactly one run, none is left pending.

    Runs claimed after ``until`` may be pending: a beat stopped between a claim's
    commit and its publish leaves them to the next leader (the outbox), and these
    tests stop every beat."""
    rows = run_rows(store, task="e2e.record")
    stuck = [
        row.fire_at for row in rows if row.state == RunState.PENDING.value and row.fire_at <= until
    ]
    assert not stuck, f"runs left unpublished: {stuck}"
    expected = int((until - anchor).total_seconds())
    for index in range(SCHEDULES):
        fire_times = sorted(
            row.fire_at for row in rows if row.schedule_name == f"every-second-{index}"
        )
        assert len(fire_times) == len(set(fire_times)), "a fire time has two runs"
        offsets = [(t - anchor) / timedelta(seconds=1) for t in fire_times]
        assert offsets[0] == 1, f"first fire time is anchor+{offsets[0]}s: runs were lost at start"
        gaps = [b - a for a, b in pairwise(offsets) if b - a != 1]
        assert not gaps, f"schedule {index}: fire times missing (gaps {gaps})"
        assert offsets[-1] >= expected, (
            f"schedule {index}: stops at +{offsets[-1]}s, expected >= +{expected}s"
        )
    return len(rows)


def assert_each_run_executed_once(cluster: Cluster, store: Store) -> None:
    published = [row for row in run_rows(store, task="e2e.record") if row.state != "pending"]
    run_ids = {str(row.id) for row in published}
    wait_until(lambda: set(cluster.effects()) >= run_ids, timeout=60, interval=0.5)

    def states_of_those_runs() -> set[str]:
        # A beat may still lead and publish more runs: only those read above are judged.
        return {row.state for row in run_rows(store, task="e2e.record") if str(row.id) in run_ids}

    # The effect commits with the run's completion record, but it is read apart from it.
    wait_until(lambda: states_of_those_runs() == {RunState.SUCCEEDED.value}, timeout=10)
    effects = cluster.effects()
    existing = {str(row.id) for row in run_rows(store, task="e2e.record")}
    assert set(effects) <= existing, "executions of runs that do not exist"
    assert max(effects.values()) == 1, "a run executed twice"


def test_several_beats_for_30_seconds_claim_each_fire_time_exactly_once(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = {"HABEAT_LOCK_TTL": str(LOCK_TTL)}
    anchor = create_second_schedules(store)
    cluster.worker("worker1")
    processes = [cluster.beat(f"beat{n}") for n in range(BEATS)]

    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    time.sleep(RUN_FOR)
    assert all(process.alive() for process in processes), cluster.logs()
    until = store.now() - timedelta(seconds=1)
    leaders = {holder for holder in [cluster.leader_holder()]}
    for process in processes:
        process.signal(signal.SIGTERM)
    for process in processes:
        process.popen.wait(timeout=15)

    total = assert_each_fire_time_once(store, anchor, until)
    assert total >= SCHEDULES * RUN_FOR
    assert len(leaders) == 1
    assert_each_run_executed_once(cluster, store)


def two_beats_with_a_leader(
    cluster: Cluster, store: Store, *, settle: float
) -> tuple[datetime, Process, int]:
    """Second schedules, a worker and two beats, ``settle`` seconds after one leads:
    (the schedules' anchor, the leading process, its epoch)."""
    anchor = create_second_schedules(store)
    cluster.worker("worker1")
    cluster.beat("beat0")
    cluster.beat("beat1")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    time.sleep(settle)
    leader, holder = cluster.leading_process(), cluster.leader_holder()
    assert leader is not None
    assert holder is not None
    return anchor, leader, holder[0]


def wait_for_a_newer_epoch(cluster: Cluster, epoch: int) -> float:
    """Seconds until a leader with an epoch above ``epoch`` is recorded."""
    return wait_until(
        lambda: (cluster.leader_holder() or (0, ""))[0] > epoch, timeout=30, interval=0.02
    )


def test_killing_the_leader_hands_over_within_ttl_and_loses_no_run(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = {"HABEAT_LOCK_TTL": str(LOCK_TTL)}
    anchor, leader, epoch_before = two_beats_with_a_leader(cluster, store, settle=3)

    killed_at = time.monotonic()
    leader.signal(signal.SIGKILL)
    failover = wait_for_a_newer_epoch(cluster, epoch_before)
    took = time.monotonic() - killed_at
    print(f"failover after SIGKILL: {took:.2f}s (ttl {LOCK_TTL}s, renew every {LOCK_TTL / 3:.1f}s)")
    assert failover <= LOCK_TTL + LOCK_TTL / 3 + 1.0, f"took {took:.2f}s"

    time.sleep(4)
    until = store.now() - timedelta(seconds=1)
    assert_each_fire_time_once(store, anchor, until)
    # Runs the dead leader published but had not marked may be published twice: the
    # idempotent task base still runs each once.
    assert_each_run_executed_once(cluster, store)
    cluster.stop_all()


def test_a_clean_shutdown_hands_over_within_a_second(cluster: Cluster, store: Store) -> None:
    cluster.settings = {"HABEAT_LOCK_TTL": "10"}  # a hand-over must not wait for the TTL
    anchor, leader, epoch_before = two_beats_with_a_leader(cluster, store, settle=2)

    stopped_at = time.monotonic()
    leader.signal(signal.SIGTERM)
    wait_for_a_newer_epoch(cluster, epoch_before)
    took = time.monotonic() - stopped_at
    print(f"hand-over after SIGTERM: {took:.2f}s")
    assert took < 2.0, f"hand-over took {took:.2f}s"
    leader.popen.wait(timeout=10)
    assert "released the leader lease" in leader.output()

    time.sleep(3)
    until = store.now() - timedelta(seconds=1)
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)


def test_runs_claimed_ahead_by_a_stopped_leader_are_sent_by_the_next_at_their_time(
    cluster: Cluster, store: Store
) -> None:
    """A leader spends most of its time waiting for the fire times it claimed ahead.
    On SIGTERM it hands over at once; the next leader publishes those runs from the
    outbox, at their time: none stranded, none early, none twice."""
    anchor, leader, epoch_before = two_beats_with_a_leader(cluster, store, settle=2.3)
    leader.signal(signal.SIGTERM)
    wait_for_a_newer_epoch(cluster, epoch_before)
    leader.popen.wait(timeout=15)
    time.sleep(5)  # past every fire time the stopped leader had claimed ahead

    until = store.now() - timedelta(seconds=1)
    assert_each_fire_time_once(store, anchor, until)
    rows = [row for row in run_rows(store, task="e2e.record") if row.fire_at <= until]
    early = [row.fire_at for row in rows if row.published_at and row.published_at < row.fire_at]
    assert not early, f"published before their fire time: {early}"
    assert_each_run_executed_once(cluster, store)
