"""Network partitions that drop packets, not connections: a worker or a beat in a
network namespace of the test's own (``tests.e2e.netns``), its link to PostgreSQL,
Redis and the broker cut with iptables (both ways, or only the servers' answers;
to every server or to one), then healed. No socket is closed, so the leases and
the epoch decide.

Nothing closes a socket on a partition, but the servers may: a PostgreSQL or Redis
whose TCP keepalives are short (``tcp_keepalives_idle``, ``tcp-keepalive``; managed
services often set them so) ends the sessions of a peer that stopped answering
within seconds. To crash detection that would read as a death, and a run
reclaimed from a living worker executes twice. So the servers here use keepalives
of a few seconds: a worker cut off for less than a run's lease keeps its runs (each
body started once, on the worker that took it, its effect once), and a leader cut
off is replaced within its TTL (its watchdog's longest step more when only
PostgreSQL is cut) and never claims again under its old epoch."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import make_url

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.chaos.servers import (
    MissingBinaries,
    PrivatePostgres,
    PrivateRedis,
    find_binaries,
    workspace,
)
from tests.conftest import IN_CI
from tests.e2e.cluster import CELERY, START_UP, Cluster, Process, cluster_on, wait_until
from tests.e2e.netns import Host, NetnsUnavailable
from tests.e2e.test_crash_fast import longest_gap_between_publications
from tests.e2e.test_ha_cluster import (
    assert_each_fire_time_once,
    assert_each_run_executed_once,
    create_second_schedules,
)
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

PREFIX = "habeat-partition"
#: Servers that end a silent peer's sessions within about five seconds.
POSTGRES_KEEPALIVES = {
    "tcp_keepalives_idle": "2",
    "tcp_keepalives_interval": "1",
    "tcp_keepalives_count": "2",
}
REDIS_KEEPALIVE = ["--tcp-keepalive", "2"]
#: A run's lease (the default): the partition below is shorter.
LEASE = 30.0
PARTITION = 12.0
#: The leader's settings in the leader test (the defaults: 10 s, 5 s and 3 s).
LOCK_TTL, MAX_WAIT, CLAIM_AHEAD = 5.0, 1.0, 3.0
#: A leader whose loop makes no progress for this long lets its lease go (its watchdog).
LONGEST_STEP = LOCK_TTL + MAX_WAIT + CLAIM_AHEAD
#: Packets lost on the lossy link, each way, and for how long.
LOSS, LOSSY_FOR = 0.33, 12.0
#: The effects of the idempotent and the plain long run when each body started once.
EACH_STARTED_ONCE = {"idempotent:start": 1, "idempotent": 1, "plain:start": 1, "plain": 1}


class PartitionedCluster:
    """A cluster on private servers that listen on this side of ``host``'s link too."""

    def __init__(
        self, cluster: Cluster, host: Host, postgres: PrivatePostgres, redis_server: PrivateRedis
    ) -> None:
        self.cluster = cluster
        self.host = host
        self.postgres = postgres
        self.redis = redis_server

    def across_the_link(self) -> dict[str, str]:
        """The environment of a process in ``host``'s namespace: every server is
        reached over the link."""
        database = make_url(self.cluster.env.database_url).set(host=self.host.server_address)
        redis_url = f"redis://{self.host.server_address}:{self.redis.port}/0"
        return {
            "DATABASE_URL": database.render_as_string(hide_password=False),
            "REDIS_URL": redis_url,
            "CELERY_BROKER_URL": redis_url,
            "E2E_EFFECTS_DSN": database.set(drivername="postgresql").render_as_string(
                hide_password=False
            ),
        }

    def port_of(self, server: str) -> int | None:
        """The port of ``server`` (``postgres``, ``redis``); None for ``every``."""
        return {"postgres": self.postgres.port, "redis": self.redis.port}.get(server)

    def redis_clients_across(self) -> list[str]:
        """The addresses of the Redis clients connected from ``host``."""
        client = redis.Redis(port=self.redis.port)
        try:
            addresses = [str(entry["addr"]) for entry in client.client_list()]
        finally:
            client.close()
        return [address for address in addresses if address.startswith(f"{self.host.address}:")]

    def postgres_sessions_across(self) -> int:
        """The PostgreSQL sessions connected from ``host``."""
        with psycopg.connect(self.postgres.admin_dsn) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE client_addr = %s",
                (self.host.address,),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def worker_across_the_link(
        self, name: str, concurrency: int, pool: str = "threads", **environment: str
    ) -> Process:
        """A worker in ``host``'s namespace; ``environment`` overrides the servers'."""
        return self.cluster.worker(
            name,
            concurrency=concurrency,
            pool=pool,
            program=self.host.command(CELERY),
            **(self.across_the_link() | environment),
        )

    def beat_across_the_link(self, name: str, **environment: str) -> Process:
        return self.cluster.beat(
            name, program=self.host.command(CELERY), **(self.across_the_link() | environment)
        )


@pytest.fixture
def partitioned(tmp_path: Path) -> Iterator[PartitionedCluster]:
    try:
        binaries = find_binaries()
        host = Host("e2e").open()
    except (MissingBinaries, NetnsUnavailable) as exc:
        if IN_CI:
            pytest.fail(str(exc), pytrace=False)
        pytest.skip(str(exc))
    try:
        with workspace() as workdir:
            postgres = PrivatePostgres(
                binaries,
                workdir,
                addresses=(host.server_address,),
                settings=POSTGRES_KEEPALIVES,
            )
            redis_server = PrivateRedis(
                binaries.redis_server,
                workdir,
                addresses=(host.server_address,),
                extra=REDIS_KEEPALIVE,
            )
            try:
                postgres.init()
                postgres.start()
                redis_server.start()
                with cluster_on(postgres, redis_server.url(0), tmp_path, prefix=PREFIX) as cluster:
                    yield PartitionedCluster(cluster, host, postgres, redis_server)
            finally:
                redis_server.stop()
                if postgres.running():
                    postgres.stop("immediate")
    finally:
        host.close()


def rows_of_the_test(store: Store) -> list[Any]:
    """The runs of the test's schedules (the demo's code schedules run beside them)."""
    return [row for row in run_rows(store) if row.task in {"e2e.long", "e2e.plain_long"}]


def running_rows(store: Store) -> list[Any]:
    return [row for row in rows_of_the_test(store) if row.state == RunState.RUNNING.value]


def test_a_worker_partitioned_for_less_than_a_lease_keeps_its_runs_though_servers_end_its_sessions(
    partitioned: PartitionedCluster,
) -> None:
    cluster, store = partitioned.cluster, partitioned.cluster.store
    schedules = Schedules(store)
    schedules.create("idempotent", "e2e.long", in_seconds=2, args=["idempotent", 24])
    schedules.create("plain", "e2e.plain_long", in_seconds=2, args=["plain", 24])
    partitioned.worker_across_the_link("across", concurrency=2)
    cluster.beat("beat0")  # the leader: its reaper acts on crash detection
    wait_until(lambda: len(running_rows(store)) == 2, timeout=60, interval=0.2)
    taken = {row.id: row.worker for row in rows_of_the_test(store)}
    assert all(worker.startswith("across@") for worker in taken.values())
    cluster.worker("spare", concurrency=2)  # takes whatever is sent again
    time.sleep(START_UP)

    cut_at = time.monotonic()
    partitioned.host.partition()
    # The servers' keepalives end the worker's connections: what crash detection sees.
    wait_until(lambda: not partitioned.redis_clients_across(), timeout=PARTITION)
    ended = time.monotonic() - cut_at
    time.sleep(max(0.0, PARTITION - ended))
    beacons_left = partitioned.postgres_sessions_across()
    partitioned.host.heal()
    print(f"Redis ended the cut worker's connections {ended:.1f} s into a {PARTITION:g} s cut")
    assert beacons_left >= 1, "the beacon's PostgreSQL session outlives the cut"

    wait_until(
        lambda: all(
            row.state not in {"running", "pending", "queued"} for row in rows_of_the_test(store)
        ),
        timeout=LEASE + 40,
        interval=0.5,
    )
    rows = rows_of_the_test(store)
    assert {row.state for row in rows} == {RunState.SUCCEEDED.value}, [
        (row.task, row.state, row.error) for row in rows
    ]
    assert {row.id: row.worker for row in rows} == taken, "a run moved to another worker"
    assert cluster.labels() == EACH_STARTED_ONCE, "each body started once and had its effect once"
    assert all(row.attempt == 1 for row in rows)


@pytest.mark.parametrize(
    ("direction", "server"),
    [("both", "every"), ("from-servers", "every"), ("both", "postgres"), ("both", "redis")],
)
def test_a_partitioned_leader_is_replaced_and_never_claims_again(
    partitioned: PartitionedCluster, direction: str, server: str
) -> None:
    """Cut from every server both ways, or only from their answers (its statements and
    renewals may still arrive, unanswered), or from PostgreSQL or Redis alone: the
    lease lapses within its TTL, the standby takes over with a higher epoch, and the
    partitioned leader, healed, claims nothing under its old one. Every fire time runs
    once; every run's effect exists once."""
    cluster, store = partitioned.cluster, partitioned.cluster.store
    cluster.settings = {
        "HABEAT_LOCK_TTL": str(LOCK_TTL),
        "HABEAT_MAX_WAIT": str(MAX_WAIT),
        "HABEAT_CLAIM_AHEAD": str(CLAIM_AHEAD),
    }
    # The lease lapses a TTL after its last renewal: one sent up to its socket timeout
    # (2 s) after the cut may still arrive. Cut from PostgreSQL alone, the leader still
    # renews until its watchdog finds its loop stuck for its longest step. A standby
    # then takes the lease within its poll (1 s) and publishes at the next fire time
    # (every second).
    bound = (LONGEST_STEP if server == "postgres" else 0.0) + LOCK_TTL + 4
    anchor = create_second_schedules(store)
    cluster.worker("worker0")
    cut_off = partitioned.beat_across_the_link("beat0")
    wait_until(lambda: cluster.leading_process() is cut_off, timeout=30)
    cluster.beat("beat1")
    time.sleep(START_UP)
    (epoch_before, _) = cluster.leader_holder() or (0, "")

    cut_at = store.now()
    partitioned.host.partition(direction, port=partitioned.port_of(server))
    time.sleep(bound)
    partitioned.host.heal()
    time.sleep(4)  # the healed one sees its lease gone, and stands by

    holder = cluster.leader_holder()
    assert holder is not None
    assert holder[0] > epoch_before, "no standby took over"
    assert cluster.leading_process() is not cut_off
    assert cut_off.alive(), "the partitioned leader lives on, as a standby"
    assert claims_after_the_next_epoch_began(store, epoch_before) == 0, (
        "the deposed leader claimed under its old epoch after the new one began"
    )
    gap = longest_gap_between_publications(store, cut_at)
    print(f"leader cut ({direction}, {server}): longest gap between publications {gap:.2f} s")
    assert gap <= bound, f"the gap was {gap:.2f} s"
    until = store.now() - timedelta(seconds=1)
    assert_each_fire_time_once(store, anchor, until)
    assert_each_run_executed_once(cluster, store)


def claims_after_the_next_epoch_began(store: Store, epoch: int) -> int:
    """Runs claimed under ``epoch`` after the first claim of a later epoch."""
    with store.engine.connect() as conn:
        count: int = conn.execute(
            text(
                "SELECT count(*) FROM beat_runs WHERE epoch = :epoch AND claimed_at >"
                " (SELECT min(claimed_at) FROM beat_runs WHERE epoch > :epoch)"
            ),
            {"epoch": epoch},
        ).scalar_one()
    return count


def test_a_leader_on_a_lossy_link_runs_each_fire_time_once(
    partitioned: PartitionedCluster,
) -> None:
    """A third of the packets between the leader and every server lost, both ways, for
    12 s: its statements and renewals stall for retransmissions, some past the clients'
    timeouts with their work done or not on the server (a renewal, a publish). It may
    keep the lease or lose it to the standby; either way every fire time runs once,
    every run's effect exists once, and once the link is healed nothing is left
    behind."""
    cluster, store = partitioned.cluster, partitioned.cluster.store
    cluster.settings = {"HABEAT_LOCK_TTL": str(LOCK_TTL), "HABEAT_MAX_WAIT": str(MAX_WAIT)}
    anchor = create_second_schedules(store)
    cluster.worker("worker0")
    lossy = partitioned.beat_across_the_link("beat0")
    wait_until(lambda: cluster.leading_process() is lossy, timeout=30)
    cluster.beat("beat1")
    time.sleep(START_UP)

    partitioned.host.lose(LOSS)
    time.sleep(LOSSY_FOR)
    partitioned.host.heal()
    healed_at = store.now()
    # Whoever leads now catches up: what came due meanwhile is claimed and sent.
    time.sleep(LONGEST_STEP + LOCK_TTL)

    assert lossy.alive(), "the leader on a lossy link lives on"
    assert_each_fire_time_once(store, anchor, healed_at)
    assert_each_run_executed_once(cluster, store)
    print(f"epochs over the lossy link: {sorted({row.epoch for row in run_rows(store)})}")


#: The run lease of the next test, and a cut one way longer than it.
SHORT_LEASE, LONG_CUT, BODY = 8.0, 20.0, 12.0


@pytest.mark.parametrize("direction", ["to-servers", "from-servers"])
def test_a_worker_cut_one_way_for_longer_than_its_lease_loses_its_runs_without_a_second_effect(
    partitioned: PartitionedCluster, direction: str
) -> None:
    """Cut one way (what the worker sends is lost, or only the servers' answers are:
    then its statements still run, unanswered) for longer than its runs' lease: the
    leader takes them back once their lease ended by the database's clock. The
    idempotent run runs again on another worker and has its effect once (the cut
    worker's completion, arriving late or unanswered, is refused: its lease is gone);
    the plain run, taken, is never started again (it ends ``lost``, or ``succeeded``
    once its completion arrives after the cut). Nothing is left running."""
    cluster, store = partitioned.cluster, partitioned.cluster.store
    cluster.settings["HABEAT_LEASE_TIMEOUT"] = str(SHORT_LEASE)
    schedules = Schedules(store)
    schedules.create("idempotent", "e2e.long", in_seconds=2, args=["idempotent", BODY])
    schedules.create("plain", "e2e.plain_long", in_seconds=2, args=["plain", BODY])
    partitioned.worker_across_the_link("across", concurrency=2)
    cluster.beat("beat0")
    wait_until(lambda: len(running_rows(store)) == 2, timeout=60, interval=0.2)
    cluster.worker("spare", concurrency=2)
    time.sleep(START_UP)

    partitioned.host.partition(direction)
    time.sleep(LONG_CUT)
    partitioned.host.heal()

    wait_until(
        lambda: (
            all(
                row.state not in {"running", "pending", "queued"} for row in rows_of_the_test(store)
            )
            and cluster.labels().get("idempotent") == 1
        ),
        timeout=120,
        interval=0.5,
    )
    time.sleep(SHORT_LEASE)  # what the cut worker sent late has arrived, or never will
    rows = {row.task: row for row in rows_of_the_test(store)}
    labels = cluster.labels()
    ends = [(row.task, row.state, row.attempt, row.worker) for row in rows.values()]
    print(f"cut {direction} for {LONG_CUT:g} s: {labels}; {ends}")
    assert labels.get("idempotent") == 1, "the idempotent run's effect once"
    assert labels.get("plain:start") == 1, "the plain run, taken, never started again"
    assert rows["e2e.long"].state == RunState.SUCCEEDED.value
    assert rows["e2e.long"].worker.startswith("spare@"), "it ran again on the spare worker"
    # Taken back as lost when its lease ended; its completion, arriving once the cut
    # healed, records what happened: it ran, once.
    assert rows["e2e.plain_long"].state in {RunState.LOST.value, RunState.SUCCEEDED.value}
