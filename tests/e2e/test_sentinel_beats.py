"""Real `celery beat` processes whose lease is on Redis Sentinel (a primary, a replica,
three sentinels; ``tests.sentinel``), the primary SIGKILLed mid-run: RedBeat's worst
bug (#163) was two schedulers after such a failover. The replica may or may not have
the lease's key when it is promoted (replication is asynchronous); either way the
epoch in PostgreSQL keeps the claims single."""

from __future__ import annotations

import time

import pytest

from beat.store.all_roles import Store
from tests.e2e.cluster import START_UP, Cluster, wait_until
from tests.e2e.test_crash_fast import longest_gap_between_publications
from tests.e2e.test_ha_cluster import (
    assert_each_fire_time_once,
    assert_each_run_executed_once,
    create_second_schedules,
)
from tests.e2e.test_network_partitions import claims_after_the_next_epoch_began
from tests.sentinel import SentinelCluster, sentinels

pytestmark = pytest.mark.e2e

__all__ = ["sentinels"]  # the fixture, for this module's tests

LOCK_TTL = 5.0


def test_beats_on_sentinel_run_each_fire_time_once_across_a_failover(
    cluster: Cluster, store: Store, sentinels: SentinelCluster
) -> None:
    """Two beats and a worker, the lease and the broker on Sentinel; the primary
    SIGKILLed while runs come due every second. Whoever leads after the failover (the
    same beat, if its key came over; else the first to take the lease on the new
    primary, with a higher epoch), every fire time has one run, every run's effect
    exists once, and no claim is made under an epoch after a later one began. The
    worker follows the broker's primary (kombu fails over from sentinel to sentinel);
    a message the promoted replica had not received is found missing and sent again."""
    cluster.settings = {
        "REDIS_URL": sentinels.url,
        "CELERY_BROKER_URL": sentinels.url,
        "HABEAT_LOCK_TTL": str(LOCK_TTL),
    }
    anchor = create_second_schedules(store)
    cluster.worker("worker0")
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    cluster.beat("beat1")
    time.sleep(START_UP)
    (epoch_before, _) = cluster.leader_holder() or (0, "")

    killed_at = store.now()
    sentinels.kill_primary_and_wait_for_the_failover()
    failed_over_in = (store.now() - killed_at).total_seconds()
    time.sleep(LOCK_TTL + 5)  # the lease is held on the new primary, runs flow again
    until = store.now()

    holder = cluster.leader_holder()
    assert holder is not None
    assert all(process.alive() for process in cluster.processes), cluster.logs()
    assert claims_after_the_next_epoch_began(store, epoch_before) == 0, (
        "a claim under the old epoch after the new one began"
    )
    gap = longest_gap_between_publications(store, killed_at)
    print(
        f"failover in {failed_over_in:.1f} s; epochs {epoch_before} -> {holder[0]};"
        f" longest gap between publications {gap:.1f} s"
    )
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)
