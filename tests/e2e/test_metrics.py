"""The Prometheus endpoints of real `celery beat` and `celery worker` processes."""

from __future__ import annotations

import ipaddress
import signal
import socket
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.e2e.cluster import Cluster, Process, wait_until
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.e2e

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
FAST = {"HABEAT_LOCK_TTL": "3", "HABEAT_MAX_WAIT": "1", "HABEAT_STANDBY_POLL": "0.5"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(port: int) -> Samples | None:
    """The endpoint's samples, or None while nothing answers there."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            body = response.read().decode()
    except OSError:
        return None
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def listening_on(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.split(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(str(ipaddress.IPv4Address(bytes.fromhex(address)[::-1])))
    return found


def value(port: int, name: str, **labels: str) -> float | None:
    samples = scrape(port)
    return None if samples is None else samples.get((name, tuple(sorted(labels.items()))))


def start_beat(cluster: Cluster, name: str, port: int) -> Process:
    schedule = str(cluster.workdir / f"{name}-schedule")
    return cluster.start(
        name, "beat", "-l", "info", "--pidfile=", "-s", schedule, HABEAT_METRICS_PORT=str(port)
    )


def state_of(store: Store, task_id: str) -> str | None:
    rows = run_rows(store, id=uuid.UUID(task_id))
    return rows[0].state if rows else None


def test_each_beat_process_says_whether_it_leads(cluster: Cluster) -> None:
    cluster.settings = FAST
    ports = {"beat0": free_port(), "beat1": free_port()}
    processes = {name: start_beat(cluster, name, port) for name, port in ports.items()}
    wait_until(lambda: cluster.leading_process() is not None, timeout=30)
    leader = cluster.leading_process()
    assert leader is not None
    standby = next(name for name in processes if name != leader.name)
    wait_until(lambda: value(ports[leader.name], "habeat_leader") == 1.0, timeout=15)
    wait_until(lambda: value(ports[standby], "habeat_leader") == 0.0, timeout=15)
    assert (value(ports[leader.name], "habeat_leader_epoch") or 0) >= 1
    # No authentication on the endpoint: by default only this host reaches it.
    assert {port: listening_on(port) for port in ports.values()} == {
        port: {"127.0.0.1"} for port in ports.values()
    }

    leader.signal(signal.SIGTERM)  # a clean hand-over: the standby takes over
    wait_until(lambda: value(ports[standby], "habeat_leader") == 1.0, timeout=15)
    assert value(ports[standby], "habeat_leadership_changes_total", change="acquired") == 1.0


def test_the_leader_serves_each_schedule_s_failures_in_a_row_and_last_success(
    cluster: Cluster, store: Store
) -> None:
    """What Prometheus alerts on per schedule (``HabeatScheduleFailing``): a schedule
    whose task fails every time counts its failures in a row, one that works has none
    and the fire time of its last success."""
    cluster.settings = FAST
    port = free_port()
    start_beat(cluster, "beat0", port)
    cluster.worker("worker0", concurrency=2)
    schedules = Schedules(store)
    schedules.create("always-fails", "e2e.plain_fail", every=2, args=["x"], allow_unregistered=True)
    schedules.create("works", "e2e.plain_record", every=2, args=["y"], allow_unregistered=True)

    def failures(name: str) -> float | None:
        return value(port, "habeat_schedule_consecutive_failures", schedule=name)

    # Read by the leader every 30 s: the second read sees the runs of its first seconds.
    wait_until(lambda: (failures("always-fails") or 0) >= 3, timeout=90, interval=1)
    assert failures("works") == 0
    success = value(port, "habeat_schedule_last_success_timestamp_seconds", schedule="works")
    assert success is not None
    assert success <= store.now().timestamp()
    assert (
        value(port, "habeat_schedule_last_success_timestamp_seconds", schedule="always-fails")
        is None
    )
    assert value(port, "habeat_schedule_series_capped") == 0.0


def test_a_threads_worker_counts_its_runs_and_the_duplicates_it_refused(
    cluster: Cluster, store: Store
) -> None:
    port = free_port()
    cluster.worker("worker1", concurrency=2, HABEAT_WORKER_METRICS_PORT=str(port))
    wait_until(lambda: scrape(port) is not None, timeout=30)
    assert listening_on(port) == {"127.0.0.1"}
    task_id = str(uuid.uuid4())
    app = cluster.app()
    with app.producer_or_acquire() as producer:
        for _ in range(2):  # the same run delivered twice at once
            app.send_task("e2e.slow", args=["twice", 2], task_id=task_id, producer=producer)

    wait_until(
        lambda: state_of(store, task_id) == RunState.SUCCEEDED.value, timeout=60, interval=0.2
    )
    wait_until(lambda: value(port, "habeat_worker_duplicate_deliveries_total") == 1.0, timeout=15)
    assert value(port, "habeat_worker_run_duration_seconds_count", state="succeeded") == 1.0
    assert (value(port, "habeat_worker_run_duration_seconds_sum", state="succeeded") or 0) >= 2
    assert value(port, "habeat_worker_requeued_total") == 0.0
    assert cluster.effects() == {task_id: 1}


def test_a_prefork_worker_sums_its_children_in_multiprocess_mode(
    cluster: Cluster, store: Store, tmp_path: Path
) -> None:
    port = free_port()
    shared = tmp_path / "prometheus"
    shared.mkdir()
    cluster.start(
        "worker1",
        "worker",
        "-l",
        "info",
        "-P",
        "prefork",
        "-c",
        "2",
        "-n",
        "worker1@%h",
        "--without-gossip",
        "--without-mingle",
        HABEAT_WORKER_METRICS_PORT=str(port),
        PROMETHEUS_MULTIPROC_DIR=str(shared),
    )
    wait_until(lambda: scrape(port) is not None, timeout=30)
    app = cluster.app()
    task_ids = [str(uuid.uuid4()) for _ in range(4)]
    for task_id in task_ids:
        app.send_task("e2e.record", args=["prefork"], task_id=task_id)

    wait_until(
        lambda: all(state_of(store, t) == RunState.SUCCEEDED.value for t in task_ids),
        timeout=60,
        interval=0.2,
    )
    wait_until(
        lambda: value(port, "habeat_worker_run_duration_seconds_count", state="succeeded") == 4.0,
        timeout=15,
    )


def test_a_prefork_worker_without_multiprocess_mode_says_what_to_do(cluster: Cluster) -> None:
    port = free_port()
    worker = cluster.worker(
        "worker1", concurrency=1, pool="prefork", HABEAT_WORKER_METRICS_PORT=str(port)
    )
    wait_until(lambda: scrape(port) is not None, timeout=30)
    wait_until(lambda: "PROMETHEUS_MULTIPROC_DIR" in worker.output(), timeout=10)


def test_the_metrics_address_is_set_from_the_environment(cluster: Cluster) -> None:
    port = free_port()
    cluster.worker(
        "worker1",
        concurrency=1,
        HABEAT_WORKER_METRICS_PORT=str(port),
        HABEAT_METRICS_ADDRESS="0.0.0.0",  # for a Prometheus on another host
    )
    wait_until(lambda: scrape(port) is not None, timeout=30)
    assert listening_on(port) == {"0.0.0.0"}
