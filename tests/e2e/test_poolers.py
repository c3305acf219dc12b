"""Beats and workers that reach PostgreSQL through PgBouncer (Debian's), in session
and in transaction mode, with real `celery beat` and `celery worker` processes: the
leader SIGKILLed mid-run, every fire time still runs once. Crash detection is off
behind a pooler (a pooled backend proves nothing about our process), so the leases
decide. In transaction mode psycopg's prepared statements must be off, as they are
unless the URL turns them on: a statement prepared on one server connection is not
there on the next (or is another client's)."""

from __future__ import annotations

import signal
import time

import pytest

from beat.store.all_roles import Store
from tests.e2e.cluster import START_UP, Cluster, wait_until
from tests.e2e.pgbouncer import running_pgbouncer
from tests.e2e.test_crash_fast import longest_gap_between_publications
from tests.e2e.test_ha_cluster import (
    assert_each_fire_time_once,
    assert_each_run_executed_once,
    create_second_schedules,
)

pytestmark = pytest.mark.e2e

LOCK_TTL = 3.0
#: Long enough for each process to repeat its statements past the fifth run, where
#: psycopg would prepare them if the URL turned that on.
WARM = 6.0


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_behind_pgbouncer_a_killed_leader_is_replaced_and_each_fire_time_runs_once(
    cluster: Cluster, store: Store, mode: str
) -> None:
    with running_pgbouncer(cluster.env.database_url, mode) as bouncer:
        cluster.settings = {"DATABASE_URL": bouncer.url(), "HABEAT_LOCK_TTL": str(LOCK_TTL)}
        anchor = create_second_schedules(store)
        cluster.worker("worker0")
        cluster.beat("beat0")
        wait_until(lambda: cluster.leading_process() is not None, timeout=30)
        cluster.beat("beat1")
        time.sleep(START_UP + WARM)
        leader = cluster.leading_process()
        assert leader is not None
        (epoch_before, _) = cluster.leader_holder() or (0, "")

        killed_at = store.now()
        leader.signal(signal.SIGKILL)
        wait_until(lambda: (cluster.leader_holder() or (0, ""))[0] > epoch_before, timeout=30)
        time.sleep(WARM)
        until = store.now()

        gap = longest_gap_between_publications(store, killed_at)
        print(f"PgBouncer in {mode} mode: longest gap between publications {gap:.1f} s")
        assert_each_fire_time_once(store, anchor, until)
        assert_each_run_executed_once(cluster, store)
        logs = cluster.logs()
        assert "prepared statement" not in logs, "a statement prepared on another backend"
        assert "crash detection is off" in logs, "a pooled backend counted as a beacon"
