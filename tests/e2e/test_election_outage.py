"""The election outage: the lease's Redis down while PostgreSQL and the broker are up,
with real `celery beat` and `celery worker` processes (the lease on a private Redis,
the broker on another). What goes on, what the operator sees, what comes back:

- by default (``habeat_lead_without_redis``), once the leader row's hold has ended a
  beat leads on the row in PostgreSQL alone, fenced by the same epoch, and schedules
  on; ``schedules health`` fails on Redis and names who leads on the row; when Redis
  answers again, the lease goes back to it with a newer epoch. Every fire time runs
  once throughout;
- with the fallback off, no process can take or renew the lease, so once the leader's
  lease ends nothing is claimed: scheduling stops. Every process still looks for a
  stall (PostgreSQL answers), opens the cluster's stall incident, and sends its
  notification (a real HTTP receiver gets it); ``schedules health`` fails, naming the
  lease; once Redis is back, a beat takes the lease within a poll and catches up as
  each schedule's misfire policy says (here ``fire_all``: every fire time runs once)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.chaos.servers import PrivateRedis, binaries_for_a_test, workspace
from tests.e2e.cluster import START_UP, Cluster, wait_until
from tests.e2e.test_ha_cluster import (
    assert_each_fire_time_once,
    assert_each_run_executed_once,
    create_second_schedules,
)
from tests.integration.helpers import run_rows
from tests.receivers import http_receiver

pytestmark = pytest.mark.e2e

#: The lease's TTL: a stall is six of them (12 s) without a claim.
LOCK_TTL = 2.0
#: Long enough for the stall look (every 15 s) to open the incident and for a process
#: that does not lead to send its notification (30 s overdue, looked for every 5 s).
OUTAGE_LIMIT = 90.0


@pytest.fixture
def lease_redis() -> Iterator[PrivateRedis]:
    binaries = binaries_for_a_test()
    with workspace() as workdir:
        server = PrivateRedis(binaries.redis_server, workdir)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def lease_on(lease_redis: PrivateRedis, **more: str) -> dict[str, str]:
    """The cluster's settings: the lease on ``lease_redis``, a short TTL, ``more``."""
    return {
        "REDIS_URL": lease_redis.url(0),
        "HABEAT_LOCK_TTL": str(LOCK_TTL),
        "HABEAT_STANDBY_POLL": "0.5",
        **more,
    }


def start_schedules_and_cluster(cluster: Cluster, store: Store) -> datetime:
    """Every-second schedules (``fire_all``), a worker, a leading beat and a standby; the
    schedules' anchor."""
    anchor = create_second_schedules(store, misfire_policy="fire_all")
    cluster.worker("worker0")
    cluster.beat("beat0")
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    cluster.beat("beat1")
    time.sleep(START_UP)
    return anchor


def claims_between(store: Store, start: datetime, end: datetime) -> int:
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text("SELECT count(*) FROM beat_runs WHERE claimed_at > :start AND claimed_at < :end"),
            {"start": start, "end": end},
        ).scalar_one()
    return count


def pending_until(store: Store, until: datetime) -> list[datetime]:
    """Fire times up to ``until`` not yet claimed and sent."""
    return [
        row.fire_at
        for row in run_rows(store, task="e2e.record")
        if row.fire_at <= until and row.state == RunState.PENDING.value
    ]


def test_with_the_leases_redis_down_and_the_fallback_off_scheduling_stops_and_all_catch_up(
    cluster: Cluster, store: Store, lease_redis: PrivateRedis
) -> None:
    cluster.settings = lease_on(lease_redis, HABEAT_LEAD_WITHOUT_REDIS="false")
    with http_receiver() as receiver:
        Schedules(store).add_webhook("ops", receiver.url("/habeat"))
        anchor = start_schedules_and_cluster(cluster, store)

        lease_redis.stop()
        down_at = store.now()
        wait_until(lambda: receiver.posts, timeout=OUTAGE_LIMIT, interval=0.5)
        told_in = (store.now() - down_at).total_seconds()
        health = cluster.command("schedules", "health")
        back_at = store.now()
        lease_redis.start()
        wait_until(lambda: claims_between(store, back_at, store.now()) > 0, timeout=30)
        resumed_in = (store.now() - back_at).total_seconds()
        until = store.now()
        # The catch-up: every fire time since the lease ended claimed and sent.
        wait_until(lambda: not pending_until(store, until), timeout=60, interval=0.5)

    [post] = receiver.posts[:1]
    print(
        f"lease's Redis down for {(back_at - down_at).total_seconds():.0f} s: stall told"
        f" after {told_in:.0f} s; claims resumed {resumed_in:.1f} s after Redis came back"
    )
    assert "stall" in str(post.body).lower(), post.body
    assert health.returncode == 1, health.stdout
    assert "Redis" in health.stderr, health.stderr
    silent_from = down_at.timestamp() + LOCK_TTL + 1  # the leader's lease has ended
    assert claims_between(store, datetime.fromtimestamp(silent_from, down_at.tzinfo), back_at) == 0
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)


#: The row's hold with these settings: the lock TTL, max_wait and claim_ahead, plus a TTL.
HOLD = LOCK_TTL + 1 + 1 + LOCK_TTL
#: How long the lease's Redis stays down in the fallback's test (seconds).
FALLBACK_OUTAGE = 40.0


def row_term(store: Store) -> tuple[int, bool]:
    """The leader row's epoch, and whether its term leads on the row alone (now)."""
    with store.engine.connect() as conn:
        epoch, on_database = conn.execute(
            text(
                "SELECT epoch, coalesce(held_on_database AND held_epoch = epoch"
                " AND held_until > clock_timestamp(), false) FROM beat_leader"
            )
        ).one()
    return int(epoch), bool(on_database)


def claim_times(store: Store, start: datetime, end: datetime) -> list[datetime]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT DISTINCT claimed_at FROM beat_runs"
                    " WHERE claimed_at >= :start AND claimed_at <= :end ORDER BY claimed_at"
                ),
                {"start": start, "end": end},
            ).scalars()
        )


def longest_gap(times: list[datetime]) -> float:
    return max(
        ((later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)),
        default=0.0,
    )


def test_with_the_leases_redis_down_a_beat_leads_on_postgresql_and_every_fire_time_runs_once(
    cluster: Cluster, store: Store, lease_redis: PrivateRedis
) -> None:
    cluster.settings = lease_on(lease_redis, HABEAT_MAX_WAIT="1", HABEAT_CLAIM_AHEAD="1")
    anchor = start_schedules_and_cluster(cluster, store)
    before = store.leader_info()
    assert before is not None

    lease_redis.stop()
    down_at = store.now()
    on_row_after = wait_until(lambda: row_term(store)[1], timeout=HOLD + 20, interval=0.2)
    on_row_epoch = row_term(store)[0]
    time.sleep(max(0.0, FALLBACK_OUTAGE - (store.now() - down_at).total_seconds()))
    health = cluster.command("schedules", "health")
    back_at = store.now()
    lease_redis.start()
    returned_in = wait_until(
        lambda: row_term(store) >= (on_row_epoch + 1, False) and not row_term(store)[1],
        timeout=30,
        interval=0.2,
    )
    after = store.leader_info()
    assert after is not None
    time.sleep(3)
    until = store.now()
    wait_until(lambda: not pending_until(store, until), timeout=60, interval=0.5)

    # From the leader's last claim before the outage (every second: within 1 s of it).
    gap = longest_gap(claim_times(store, down_at - timedelta(seconds=2), until))
    print(
        f"lease's Redis down for {(back_at - down_at).total_seconds():.0f} s: a beat led on"
        f" the leader row {on_row_after:.1f} s after (hold {HOLD:g} s), the longest time"
        f" without a claim was {gap:.1f} s; the lease went back to Redis {returned_in:.1f} s"
        f" after it came back (epochs {before.epoch} -> {on_row_epoch} -> {after.epoch})"
    )
    assert on_row_epoch in (before.epoch, before.epoch + 1), "the same term, or the next"
    assert gap <= HOLD + 5, "scheduling went on through the outage"
    assert health.returncode == 1, health.stdout
    assert "Redis" in health.stderr, health.stderr
    assert "leads on the leader row in PostgreSQL alone" in health.stdout, health.stdout
    assert any("leads on the leader row in PostgreSQL" in p.output() for p in cluster.processes)
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)
