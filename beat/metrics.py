"""Prometheus metrics of beat, of the workers' idempotent task base and of their
poison message guard.

Every metric is defined once, here, on :data:`REGISTRY`: a registry of our own
rather than ``prometheus_client``'s default one. Flower (and users' own code)
register their metrics on the default registry in the same processes; ours
cannot clash with them, and importing this module twice (tests, reloads) or
building the scheduler class several times never registers anything twice.
Nothing here connects or binds: the HTTP endpoint exists only once
:func:`start_metrics_server` is called (beat: on its first tick, when
``habeat_metrics_port`` is set; a worker: at ``worker_init`` when
``habeat_worker_metrics_port`` is set).

One beat process runs one scheduler and has its own endpoint, so the gauges
(``habeat_leader``, ``habeat_leader_epoch``) describe that process: 1 on the
leader, 0 on a standby. There is no ``node`` label: Prometheus adds
``instance`` from the scrape target.

Prefork workers: the pool children count, the main process serves. With
``PROMETHEUS_MULTIPROC_DIR`` set in the worker's environment (an empty
directory, writable, wiped at each start, one per worker), prometheus_client's
multiprocess mode stores every child's values in that directory and the
endpoint adds them up (beat always serves its own process's values).
Without it, a prefork worker's endpoint shows only the main process's values,
which stay at zero (a warning says so at start); thread, solo, gevent and
eventlet pools need nothing.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

logger = logging.getLogger(__name__)

#: The registry of every habeat metric (served by :func:`start_metrics_server`).
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: Environment variable that turns on prometheus_client's multiprocess mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# -- beat ------------------------------------------------------------------------------

LEADER = Gauge(
    "habeat_leader",
    "1 while this beat process leads (holds the lease with a recorded epoch), 0 on a standby.",
    multiprocess_mode="max",
    registry=REGISTRY,
)
LEADER_EPOCH = Gauge(
    "habeat_leader_epoch",
    "Fencing epoch of this process's current term as leader; 0 on a standby.",
    multiprocess_mode="max",
    registry=REGISTRY,
)
LEADING_ON_DATABASE = Gauge(
    "habeat_leader_on_database",
    "1 while this beat process leads on the leader row in PostgreSQL alone: the lease's"
    " Redis is unreachable (scheduling goes on; restore Redis).",
    multiprocess_mode="max",
    registry=REGISTRY,
)
LEADERSHIP_CHANGES = Counter(
    "habeat_leadership_changes_total",
    "Leadership transitions of this process: acquired, lost (lease expired or a newer"
    " epoch exists) or released (clean shutdown).",
    ["change"],
    registry=REGISTRY,
)
CLAIMS = Counter(
    "habeat_claims_total",
    "Claim transactions that claimed at least one due schedule.",
    registry=REGISTRY,
)
RUNS_CLAIMED = Counter(
    "habeat_runs_claimed_total",
    "Runs created by claim transactions (jittered ones included, skip records excluded).",
    registry=REGISTRY,
)
RUNS_PUBLISHED = Counter(
    "habeat_runs_published_total",
    "Runs published to the broker (new, from the outbox, or reclaimed).",
    registry=REGISTRY,
)
PUBLISH_ERRORS = Counter(
    "habeat_publish_errors_total",
    "Publish batches stopped by a broker error (the unpublished runs stay in the outbox).",
    registry=REGISTRY,
)
CLAIM_DURATION = Histogram(
    "habeat_claim_duration_seconds",
    "Duration of claim transactions (every claim, including those that found nothing due).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
RUN_LATENESS = Histogram(
    "habeat_run_lateness_seconds",
    "First publication of a run minus its due time (fire time, or jittered time).",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
    registry=REGISTRY,
)
OUTBOX_REPUBLISHED = Counter(
    "habeat_outbox_republished_total",
    "Runs found claimed but unpublished (crash or broker error) and published from the outbox.",
    registry=REGISTRY,
)
LEASES_RECLAIMED = Counter(
    "habeat_leases_reclaimed_total",
    "Runs put back in the outbox by the reaper because their worker's lease expired.",
    registry=REGISTRY,
)
MESSAGES_LOST = Counter(
    "habeat_messages_lost_total",
    "Runs published again because the broker no longer held their message (seen twice).",
    registry=REGISTRY,
)
RUNS_EXPIRED = Counter(
    "habeat_runs_expired_total",
    "Runs ended by the leader because their expires passed before any worker took them.",
    registry=REGISTRY,
)
RUNS_LOST = Counter(
    "habeat_runs_lost_total",
    "Runs marked lost by the reaper: their workers kept dying until attempts ran out.",
    registry=REGISTRY,
)
RUNS_GIVEN_UP = Counter(
    "habeat_runs_given_up_total",
    "Runs marked lost by lost-message recovery: their message was sent its bound of times"
    " and no worker recorded it (a consumer that does not record runs may have taken it).",
    registry=REGISTRY,
)
UNRECORDED_CONSUMERS = Gauge(
    "habeat_unrecorded_consumers",
    "Consumers of a queue that do not record runs (not in beat_workers), as the leader last"
    " found them with Celery's remote control; queue * counts 1 when no worker answered."
    " Lost-message recovery falls back to the visibility timeout for these queues.",
    ["queue"],
    multiprocess_mode="max",
    registry=REGISTRY,
)
SCHEDULE_CONSECUTIVE_FAILURES = Gauge(
    "habeat_schedule_consecutive_failures",
    "The schedule's newest finished runs that failed, were lost or expired, in a row"
    " (counted up to 100). Served by the leader, while the cluster holds at most"
    " habeat_metrics_schedule_limit schedules.",
    ["schedule"],
    multiprocess_mode="max",
    registry=REGISTRY,
)
SCHEDULE_LAST_SUCCESS = Gauge(
    "habeat_schedule_last_success_timestamp_seconds",
    "The fire time of the schedule's newest run that succeeded (Unix time); absent while"
    " none did. Served by the leader, as habeat_schedule_consecutive_failures.",
    ["schedule"],
    multiprocess_mode="max",
    registry=REGISTRY,
)
SCHEDULE_SERIES_CAPPED = Gauge(
    "habeat_schedule_series_capped",
    "1 on the leader while the cluster holds more schedules than"
    " habeat_metrics_schedule_limit: the per-schedule series are left out.",
    multiprocess_mode="max",
    registry=REGISTRY,
)
INCIDENTS_OPEN = Gauge(
    "habeat_incidents_open",
    "Incidents open, by kind (failing: a schedule's runs failed so many times in a row), as"
    " the leader's failing monitor last counted them; 0 on a standby.",
    ["kind"],
    multiprocess_mode="max",
    registry=REGISTRY,
)
INCIDENTS_OPENED = Counter(
    "habeat_incidents_opened_total",
    "Incidents the leader opened, by kind.",
    ["kind"],
    registry=REGISTRY,
)
SCHEDULES_AUTO_PAUSED = Counter(
    "habeat_schedules_auto_paused_total",
    "Schedules the leader paused after their runs failed pause_after_failures times in a row.",
    registry=REGISTRY,
)
NOTIFICATIONS_SENT = Counter(
    "habeat_notifications_sent_total",
    "Notifications of incidents a channel took, by channel kind (webhook, slack, email).",
    ["kind"],
    registry=REGISTRY,
)
NOTIFICATION_FAILURES = Counter(
    "habeat_notification_failures_total",
    "Sends of notifications that failed (tried again after a back-off), by channel kind.",
    ["kind"],
    registry=REGISTRY,
)
NOTIFICATIONS_GIVEN_UP = Counter(
    "habeat_notifications_given_up_total",
    "Notifications given up after their sends had failed for a day.",
    registry=REGISTRY,
)
RUNS_SKIPPED = Counter(
    "habeat_runs_skipped_total",
    "Fire times recorded as skipped, by policy: misfire or overlap.",
    ["reason"],
    registry=REGISTRY,
)
RUNS_CANCELLED = Counter(
    "habeat_runs_cancelled_total",
    "Active runs cancelled by the overlap policy cancel_previous.",
    registry=REGISTRY,
)
TICK_ERRORS = Counter(
    "habeat_tick_errors_total",
    "Beat ticks that failed (PostgreSQL, Redis or broker unreachable, ...) and were retried.",
    registry=REGISTRY,
)

# -- workers (beat.delivery.task.IdempotentTask, beat.delivery.poison) ---------------------------

WORKER_DUPLICATE_DELIVERIES = Counter(
    "habeat_worker_duplicate_deliveries_total",
    "Deliveries refused by the guard: the run was finished or held by a live lease.",
    registry=REGISTRY,
)
WORKER_LEASE_LOSSES = Counter(
    "habeat_worker_lease_losses_total",
    "Runs whose lease this worker lost while running them (found by the heartbeat).",
    registry=REGISTRY,
)
WORKER_RUN_DURATION = Histogram(
    "habeat_worker_run_duration_seconds",
    "Duration of recorded run attempts on this worker, by the state recorded.",
    ["state"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
    registry=REGISTRY,
)
WORKER_REQUEUED = Counter(
    "habeat_worker_requeued_total",
    "Deliveries handed back to the broker because the guard could not reach PostgreSQL.",
    registry=REGISTRY,
)
WORKER_MESSAGES_SET_ASIDE = Counter(
    "habeat_worker_messages_set_aside_total",
    "Broker messages this worker could not decode or unpack (or whose task it does not"
    " know), removed from their queue and kept in the dead-letter list, by reason.",
    ["reason"],
    registry=REGISTRY,
)


def forget_schedule_series() -> None:
    """Drop the per-schedule series (this process no longer leads, or they are off)."""
    SCHEDULE_CONSECUTIVE_FAILURES.clear()
    SCHEDULE_LAST_SUCCESS.clear()
    SCHEDULE_SERIES_CAPPED.set(0)


def forget_incidents() -> None:
    """Count no open incident (this process no longer leads)."""
    INCIDENTS_OPEN.clear()


#: The ``change`` label values of :data:`LEADERSHIP_CHANGES`.
ACQUIRED, LOST, RELEASED = "acquired", "lost", "released"
#: The ``state`` label values of :data:`WORKER_RUN_DURATION`.
WORKER_RUN_STATES = ("succeeded", "failed", "retrying")

for _change in (ACQUIRED, LOST, RELEASED):
    LEADERSHIP_CHANGES.labels(change=_change)
for _reason in ("misfire", "overlap"):
    RUNS_SKIPPED.labels(reason=_reason)
for _state in WORKER_RUN_STATES:
    WORKER_RUN_DURATION.labels(state=_state)

# -- the endpoint ------------------------------------------------------------------------

_servers: dict[tuple[int, str, int], Any] = {}
_servers_lock = threading.Lock()


def start_metrics_server(port: int, addr: str = "127.0.0.1", *, multiprocess: bool = False) -> bool:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; idempotent per process.

    Returns True if this call started the server, False if this process already
    serves on that address. Raises ``OSError`` if the port is taken by another
    process. With ``multiprocess`` (a prefork worker) and ``PROMETHEUS_MULTIPROC_DIR``
    set, it serves the sum over every process writing to that directory instead of
    this process's own values.
    """
    key = (os.getpid(), addr, port)
    with _servers_lock:
        if key in _servers:
            return False
        registry: CollectorRegistry = REGISTRY
        if multiprocess and multiprocess_mode():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        server, _thread = start_http_server(port, addr=addr, registry=registry)
        _servers[key] = server
    logger.info("serving Prometheus metrics on http://%s:%d/metrics", addr, port)
    return True


def multiprocess_mode() -> bool:
    """True when metric values are shared through ``PROMETHEUS_MULTIPROC_DIR``."""
    return bool(os.environ.get(MULTIPROC_ENV))
