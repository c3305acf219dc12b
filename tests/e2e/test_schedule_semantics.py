"""Scheduling semantics with real `celery beat` and `celery worker` processes:
misfire policies after a downtime, and overlap policies of a slow job."""

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
from tests.e2e.cluster import Cluster, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

#: The schedules fire every PERIOD seconds; no beat runs for DOWNTIME seconds, so
#: several fire times are missed, those older than GRACE at the claim being misfires.
PERIOD = 5
DOWNTIME = 32
GRACE = 12.0


def rows_of(store: Store, name: str) -> list[Any]:
    return [row for row in run_rows(store) if row.schedule_name == name]


def test_misfire_policies_after_half_a_minute_without_a_beat(
    cluster: Cluster, store: Store
) -> None:
    # No claiming ahead: beat0 must miss the fire times after it stops, not hold one
    # it claimed ahead (its next leader would send that from the outbox, on time).
    cluster.settings = {
        "HABEAT_MISFIRE_GRACE": str(GRACE),
        "HABEAT_LOCK_TTL": "3",
        "HABEAT_CLAIM_AHEAD": "0",
        "HABEAT_CLAIM_AHEAD_MAX": "0",
    }
    schedules = Schedules(store)
    for policy in ("fire_once", "fire_all", "skip"):
        schedules.create(
            f"minutely-{policy}",
            "e2e.record",
            cron=f"*/{PERIOD} * * * * *",
            args=[policy],
            misfire_policy=policy,
            allow_unregistered=True,
        )
    first_fire = min(s.next_fire_at for s in schedules.list() if s.next_fire_at)
    beat = cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    beat.signal(signal.SIGTERM)  # every beat is down from here
    beat.popen.wait(timeout=15)
    down_from = store.now()
    time.sleep(DOWNTIME)
    cluster.beat("beat1")

    def claimed_by_beat1() -> list[datetime]:
        # beat0 may have claimed a fire time that came while it led: not one of these.
        return [r.claimed_at for r in rows_of(store, "minutely-skip") if r.claimed_at > down_from]

    wait_until(claimed_by_beat1, timeout=30)
    claimed_at = min(claimed_by_beat1())
    cluster.stop_all()

    # The fire times no beat was there for: every PERIOD s from the first one after the stop.
    missed: list[datetime] = []
    step = timedelta(seconds=PERIOD)
    after_stop = down_from.replace(microsecond=0) + timedelta(seconds=1)
    after_stop += timedelta(seconds=-after_stop.second % PERIOD)
    moment = max(first_fire, after_stop)
    while moment <= claimed_at:
        missed.append(moment)
        moment += step
    late = [t for t in missed if t <= claimed_at - timedelta(seconds=GRACE)]
    on_time = [t for t in missed if t not in late]
    print(f"missed {len(missed)} fire times: {len(late)} misfires, {len(on_time)} on time")
    assert len(late) >= 2

    def outcome(name: str) -> tuple[list[datetime], list[datetime]]:
        rows = [row for row in rows_of(store, name) if row.fire_at in missed]
        fired = sorted(row.fire_at for row in rows if row.state != RunState.SKIPPED.value)
        skipped = sorted(row.fire_at for row in rows if row.state == RunState.SKIPPED.value)
        return fired, skipped

    assert outcome("minutely-fire_all") == (missed, [])
    assert outcome("minutely-fire_once") == ([late[-1], *on_time], late[:-1])
    assert outcome("minutely-skip") == (on_time, late)
    for row in rows_of(store, "minutely-skip"):
        if row.state == RunState.SKIPPED.value:
            assert row.reason == "misfire: skip policy"


def intervals(rows: list[Any]) -> list[tuple[datetime, datetime]]:
    return sorted(
        (row.started_at, row.finished_at) for row in rows if row.started_at and row.finished_at
    )


def overlapping(spans: list[tuple[datetime, datetime]]) -> bool:
    return any(later[0] < earlier[1] for earlier, later in pairwise(spans))


def test_overlap_policies_of_a_three_second_job_every_second(
    cluster: Cluster, store: Store
) -> None:
    cluster.settings = {"HABEAT_LEASE_TIMEOUT": "3", "HABEAT_MAX_WAIT": "1"}
    schedules = Schedules(store)
    for policy in ("allow", "skip", "cancel_previous"):
        schedules.create(
            f"slow-{policy}",
            "e2e.slow",
            every=1,
            args=[policy, 3],
            overlap_policy=policy,
            allow_unregistered=True,
        )
    schedules.create(
        "slow-queue_one",
        "e2e.slow",
        every=1,
        args=["queue_one", 3],
        overlap_policy="queue_one",
        queue="serial",
        allow_unregistered=True,
    )
    cluster.worker("worker1", concurrency=16)
    cluster.start(
        "serial",
        "worker",
        "-l",
        "info",
        "-P",
        "threads",
        "-c",
        "1",
        "-Q",
        "serial",
        "-n",
        "serial@%h",
        "--without-gossip",
        "--without-mingle",
    )
    beat = cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    time.sleep(12)
    beat.signal(signal.SIGTERM)
    beat.popen.wait(timeout=15)
    # Runs the stopped beat claimed ahead (allow) stay pending for the next leader.
    active = (RunState.QUEUED.value, RunState.RUNNING.value)
    wait_until(
        lambda: not [r for r in run_rows(store) if r.state in active], timeout=60, interval=0.5
    )

    allow = [r for r in rows_of(store, "slow-allow") if r.state != RunState.PENDING.value]
    assert {row.state for row in allow} == {RunState.SUCCEEDED.value}
    assert overlapping(intervals(allow)), "allow: runs overlap"

    skip = rows_of(store, "slow-skip")
    assert not overlapping(intervals(skip)), "skip: never two at once"
    assert any(
        row.state == RunState.SKIPPED.value and "overlap (skip)" in (row.reason or "")
        for row in skip
    )

    queue_one = rows_of(store, "slow-queue_one")
    assert not overlapping(intervals(queue_one)), "one serial worker runs them one by one"
    assert any("overlap (queue_one)" in (row.reason or "") for row in queue_one), (
        "a second waiter is refused"
    )
    assert {row.state for row in queue_one} <= {RunState.SUCCEEDED.value, RunState.SKIPPED.value}

    cancel = rows_of(store, "slow-cancel_previous")
    states = [row.state for row in sorted(cancel, key=lambda row: row.fire_at)]
    assert states.count(RunState.CANCELLED.value) >= 5
    assert states[-1] == RunState.SUCCEEDED.value, "the newest run is the one that completes"
    assert states.count(RunState.SUCCEEDED.value) == 1
    succeeded = {str(row.id) for row in cancel if row.state == RunState.SUCCEEDED.value}
    assert {
        task_id for task_id in cluster.effects() if task_id in {str(r.id) for r in cancel}
    } == succeeded
