"""Beat's Prometheus metrics: HAScheduler in-process against real PostgreSQL and Redis,
its endpoint scraped over HTTP.

The metrics live on one registry per process (``beat.metrics.REGISTRY``), shared
by every scheduler a test builds: counters are compared before and after, and the
other leader of a standby test is a bare lease, not a second scheduler.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from app.factory import create_app
from app.settings import Settings
from beat import metrics
from beat.config import BeatConfig
from beat.errors import ConfigError
from beat.lease.holder import LeaderLease, lock_key
from beat.ops.schedules import Schedules
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from beat.store.leader import Claim
from tests.conftest import SessionEnv
from tests.integration.helpers import add_interval_schedules, make_due

pytestmark = pytest.mark.integration

SchedulerFactory = Callable[..., HAScheduler]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def with_metrics(port: int) -> dict[str, Any]:
    return {"habeat_metrics_port": port, "habeat_metrics_address": "127.0.0.1"}


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def current() -> Samples:
    """The registry's values now, read in-process (before any endpoint exists)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
    }


def bound(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def test_the_leader_serves_its_claims_and_publications(
    make_scheduler: SchedulerFactory, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    # Two fire times past each (15 and 5 s ago), the next 5 s away: a first tick slowed
    # by a loaded machine cannot make a third one due.
    add_interval_schedules(Schedules(store), 3, every=10, start_at=datetime.now(UTC))
    make_due(store, seconds_ago=15)
    port = free_port()
    # Claiming ahead would add the next fire times too: this counts the overdue ones.
    scheduler = make_scheduler(conf=with_metrics(port), claim_ahead=0.0)
    before = current()

    with caplog.at_level(logging.INFO, logger="beat.scheduler"):
        scheduler.tick()

    assert scheduler.is_leader
    after = scrape(port)

    def moved(name: str, **labels: str) -> float:
        return delta(after, before, name, **labels)

    assert value(after, "habeat_leader") == 1.0
    assert value(after, "habeat_leader_epoch") == scheduler.epoch
    assert moved("habeat_leadership_changes_total", change="acquired") == 1
    assert moved("habeat_claims_total") == 1
    assert moved("habeat_runs_claimed_total") == 6
    assert moved("habeat_runs_published_total") == 6
    assert moved("habeat_run_lateness_seconds_count") == 6
    # Each run was due 5 or 15 s before the claim, and a little more (the database's clock).
    assert 3 * (15 + 5) <= moved("habeat_run_lateness_seconds_sum") <= 3 * (15 + 5) + 6 * 5
    assert moved("habeat_run_lateness_seconds_bucket", le="0.001") == 0
    assert moved("habeat_run_lateness_seconds_bucket", le="300.0") == 6
    assert moved("habeat_claim_duration_seconds_count") >= 1
    assert moved("habeat_publish_errors_total") == 0
    assert moved("habeat_tick_errors_total") == 0
    assert "process_cpu_seconds_total" in {name for name, _ in after}
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("claimed 6"))
    assert " from 3 schedules in " in line, line
    assert "max lateness" in line

    scheduler.close()
    closed = current()
    assert value(closed, "habeat_leader") == 0.0
    assert delta(closed, before, "habeat_leadership_changes_total", change="released") == 1


def test_a_standby_reports_zero_until_it_takes_over(
    make_scheduler: SchedulerFactory, redis_client: redis.Redis, test_env: SessionEnv
) -> None:
    other = LeaderLease(redis_client, prefix=test_env.key_prefix, ttl=2.0)
    assert other.try_acquire(0) is not None  # another process leads
    port = free_port()
    scheduler = make_scheduler(conf=with_metrics(port))
    before = current()

    scheduler.tick()

    assert not scheduler.is_leader
    standby = scrape(port)
    assert value(standby, "habeat_leader") == 0.0
    assert value(standby, "habeat_leader_epoch") == 0.0

    other.release()
    scheduler.tick()
    leading = scrape(port)
    assert scheduler.is_leader
    assert value(leading, "habeat_leader") == 1.0
    assert value(leading, "habeat_leader_epoch") == scheduler.epoch
    assert delta(leading, before, "habeat_leadership_changes_total", change="acquired") == 1

    scheduler.lease.abandon("simulated pause")  # the lease is lost while the process lives
    assert value(scrape(port), "habeat_leader") == 0.0, "reported at once, not on the next tick"
    redis_client.delete(lock_key(test_env.key_prefix))  # ... it expires, another one leads
    assert other.try_acquire(0) is not None
    scheduler.tick()
    lost = scrape(port)
    assert not scheduler.is_leader
    assert value(lost, "habeat_leader") == 0.0
    assert delta(lost, before, "habeat_leadership_changes_total", change="lost") == 1
    other.release()


def test_skipped_fire_times_are_counted_by_policy(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    schedules = Schedules(store)
    schedules.create("o", "t", every=1, overlap_policy="skip", allow_unregistered=True)
    make_due(store, seconds_ago=2.5)  # three fire times in one claim: two superseded
    scheduler = make_scheduler()
    claims: list[Claim] = []
    scheduler.after_claim_commit = claims.append
    before = current()

    scheduler.tick()
    schedules.create("m", "t", every=1, allow_unregistered=True)
    make_due(store, seconds_ago=120)  # beyond misfire_grace: fire_once coalesces the rest
    scheduler.tick()

    after = current()
    overlap = delta(after, before, "habeat_runs_skipped_total", reason="overlap")
    misfire = delta(after, before, "habeat_runs_skipped_total", reason="misfire")
    assert overlap >= 2
    assert misfire > 0
    assert overlap + misfire == sum(claim.skipped for claim in claims)


def test_no_endpoint_without_a_port_and_none_before_the_first_tick(
    make_scheduler: SchedulerFactory, test_env: SessionEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[int, str]] = []
    monkeypatch.setattr(
        metrics, "start_metrics_server", lambda port, addr: started.append((port, addr))
    )
    port = free_port()
    app = create_app(test_env.settings(lock_ttl=2.0, max_wait=0.2))
    app.conf.update(with_metrics(port))
    for _ in range(3):  # as celery beat does for its banner
        HAScheduler(app=app, lazy=True)
    assert started == []
    assert not bound(port)

    unset = make_scheduler()
    unset.tick()
    unset.tick()
    assert started == []

    configured = make_scheduler(conf=with_metrics(port))
    configured.tick()
    configured.tick()
    assert started == [(port, "127.0.0.1")], "started once, on the first tick"


def test_the_endpoint_is_idempotent_and_a_taken_port_does_not_stop_beat(
    make_scheduler: SchedulerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    assert metrics.start_metrics_server(port, "127.0.0.1") is True
    assert metrics.start_metrics_server(port, "127.0.0.1") is False
    assert "habeat_leader" in {name for name, _ in scrape(port)}

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        scheduler = make_scheduler(conf=with_metrics(busy))
        with caplog.at_level(logging.ERROR, logger="beat.scheduler"):
            scheduler.tick()
    assert scheduler.is_leader
    assert any("cannot serve metrics" in r.getMessage() for r in caplog.records)


def test_the_ports_are_read_from_the_environment() -> None:
    settings = Settings.from_env({"HABEAT_METRICS_PORT": "9808", "HABEAT_WORKER_METRICS_PORT": ""})
    conf = settings.celery_config()
    assert (conf["habeat_metrics_port"], conf["habeat_worker_metrics_port"]) == (9808, None)
    assert Settings.from_env({"HABEAT_METRICS_PORT": "0"}).metrics_port is None
    assert Settings.from_env({"HABEAT_WORKER_METRICS_PORT": "9809"}).worker_metrics_port == 9809
    for wrong in ("http", "70000", "-1"):
        with pytest.raises(ConfigError, match="HABEAT_METRICS_PORT"):
            Settings.from_env({"HABEAT_METRICS_PORT": wrong})
    with pytest.raises(ConfigError, match="habeat_metrics_port"):
        BeatConfig(metrics_port=70000).validate()
