"""Typed settings from the environment, turned into the Celery app's configuration.

| variable | default | meaning |
| --- | --- | --- |
| DATABASE_URL | postgresql+psycopg://postgres@127.0.0.1:5432/habeat | schedule store |
| REDIS_URL | redis://127.0.0.1:6379/0 | leader lease |
| CELERY_BROKER_URL | REDIS_URL | Celery broker |
| HABEAT_KEY_PREFIX | habeat | Redis key prefix of the lease; name of the leader row |
| HABEAT_LOCK_TTL | 10 | seconds; a dead leader is replaced after about this long |
| HABEAT_STANDBY_POLL | 1 | seconds between a standby's attempts to lead |
| HABEAT_MAX_WAIT | 5 | longest wait between two ticks, seconds |
| HABEAT_CLAIM_BATCH | 1000 | schedules claimed per transaction |
| HABEAT_MISFIRE_GRACE | 60 | seconds late before a fire time is a misfire |
| HABEAT_TIMEZONE | UTC | zone of schedules created without one |
| HABEAT_HISTORY_RETENTION_DAYS | 30 | the leader deletes finished runs older than this (0: keep) |
| HABEAT_MISFIRE_POLICY | fire_once | misfire policy of schedules created without one |
| HABEAT_OVERLAP_POLICY | allow | overlap policy of schedules created without one |
| HABEAT_VISIBILITY_TIMEOUT | 3600 | seconds before the Redis broker redelivers an unacked message |
| HABEAT_LEASE_TIMEOUT | 30 | seconds a worker's lease on a run lasts without a heartbeat |
| HABEAT_MAX_ATTEMPTS | 3 | attempts of a run whose workers die, before it is marked lost |
| HABEAT_DEAD_LETTER_MAX_LENGTH | 1000 | malformed messages kept in `habeat.dead_letter` (0: none) |
| HABEAT_IMPORTS | (none) | extra comma-separated task modules to import |
| HABEAT_METRICS_PORT | (none: off) | port of beat's Prometheus endpoint `/metrics` (0: off) |
| HABEAT_WORKER_METRICS_PORT | (none: off) | port of a worker's Prometheus endpoint (0: off) |
| PROMETHEUS_MULTIPROC_DIR | (none) | prefork workers: empty dir where pool children keep metrics |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from beat.errors import ConfigError

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/habeat"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: Task modules of this project, always imported by workers and beat.
TASK_MODULES = ("tasks.demo",)
#: Modules that extend the worker itself: the run tracking (receipt of runs, plain
#: tasks' runs, expired deliveries, see ``beat.run_tracking``) and the guard that
#: sets aside messages it cannot decode or unpack, instead of dying on them.
WORKER_MODULES = ("beat.worker",)


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    key_prefix: str = "habeat"
    lock_ttl: float = 10.0
    standby_poll: float = 1.0
    max_wait: float = 5.0
    claim_batch: int = 1000
    claim_ahead: float = 3.0
    misfire_grace: float = 60.0
    timezone: str = "UTC"
    history_retention_days: float = 30.0
    misfire_policy: str = "fire_once"
    overlap_policy: str = "allow"
    visibility_timeout: int = 3600
    lease_timeout: float = 30.0
    max_attempts: int = 3
    dead_letter_max_length: int = 1000
    broker_key_prefix: str = ""
    imports: tuple[str, ...] = ()
    metrics_port: int | None = None
    worker_metrics_port: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        redis_url = env.get("REDIS_URL", DEFAULT_REDIS_URL)
        return cls(
            database_url=_database_url(env.get("DATABASE_URL", DEFAULT_DATABASE_URL)),
            redis_url=redis_url,
            broker_url=env.get("CELERY_BROKER_URL", redis_url),
            key_prefix=env.get("HABEAT_KEY_PREFIX", "habeat"),
            lock_ttl=_number(env, "HABEAT_LOCK_TTL", 10.0),
            standby_poll=_number(env, "HABEAT_STANDBY_POLL", 1.0),
            max_wait=_number(env, "HABEAT_MAX_WAIT", 5.0),
            claim_batch=int(_number(env, "HABEAT_CLAIM_BATCH", 1000)),
            claim_ahead=_number(env, "HABEAT_CLAIM_AHEAD", 3.0, allow_zero=True),
            misfire_grace=_number(env, "HABEAT_MISFIRE_GRACE", 60.0),
            timezone=env.get("HABEAT_TIMEZONE", "UTC"),
            history_retention_days=_number(
                env, "HABEAT_HISTORY_RETENTION_DAYS", 30.0, allow_zero=True
            ),
            misfire_policy=env.get("HABEAT_MISFIRE_POLICY", "fire_once"),
            overlap_policy=env.get("HABEAT_OVERLAP_POLICY", "allow"),
            visibility_timeout=int(_number(env, "HABEAT_VISIBILITY_TIMEOUT", 3600)),
            lease_timeout=_number(env, "HABEAT_LEASE_TIMEOUT", 30.0),
            max_attempts=int(_number(env, "HABEAT_MAX_ATTEMPTS", 3)),
            dead_letter_max_length=int(
                _number(env, "HABEAT_DEAD_LETTER_MAX_LENGTH", 1000, allow_zero=True)
            ),
            broker_key_prefix=env.get("HABEAT_BROKER_KEY_PREFIX", ""),
            imports=tuple(
                name.strip() for name in env.get("HABEAT_IMPORTS", "").split(",") if name.strip()
            ),
            metrics_port=_port(env, "HABEAT_METRICS_PORT"),
            worker_metrics_port=_port(env, "HABEAT_WORKER_METRICS_PORT"),
        )

    def celery_config(self) -> dict[str, Any]:
        """The Celery configuration: JSON only, late acks, one message prefetched per process."""
        transport_options: dict[str, Any] = {
            "visibility_timeout": self.visibility_timeout,
            # Sweep for messages of dead workers every 10 s rather than every ~100 s
            # (kombu's default throttle): redelivery then waits only for the timeout.
            "unacked_restore_interval": 10,
            "unacked_restore_throttle": 1,
            # The sweep holds a Redis mutex for milliseconds; a worker killed while
            # holding it would block every sweep for kombu's default 300 s.
            "unacked_mutex_expire": 30,
        }
        if self.broker_key_prefix:
            transport_options["global_keyprefix"] = self.broker_key_prefix
        return {
            "broker_url": self.broker_url,
            "broker_transport_options": transport_options,
            "broker_connection_retry_on_startup": True,
            "task_serializer": "json",
            "result_serializer": "json",
            "accept_content": ["json"],
            "task_acks_late": True,
            "task_reject_on_worker_lost": True,
            "worker_prefetch_multiplier": 1,
            "worker_send_task_events": True,
            "timezone": self.timezone,
            "enable_utc": True,
            "imports": (*WORKER_MODULES, *TASK_MODULES, *self.imports),
            "beat_scheduler": "beat.scheduler:HAScheduler",
            "beat_max_loop_interval": self.max_wait,
            "habeat_database_url": self.database_url,
            "habeat_redis_url": self.redis_url,
            # Hints name this app's variables, not the generic keys they fill.
            "habeat_database_setting": "DATABASE_URL",
            "habeat_redis_setting": "REDIS_URL",
            "habeat_key_prefix": self.key_prefix,
            "habeat_lock_ttl": self.lock_ttl,
            "habeat_standby_poll": self.standby_poll,
            "habeat_max_wait": self.max_wait,
            "habeat_claim_batch": self.claim_batch,
            "habeat_claim_ahead": self.claim_ahead,
            "habeat_misfire_grace": self.misfire_grace,
            "habeat_default_timezone": self.timezone,
            "habeat_history_retention_days": self.history_retention_days,
            "habeat_default_misfire_policy": self.misfire_policy,
            "habeat_default_overlap_policy": self.overlap_policy,
            "habeat_lease_timeout": self.lease_timeout,
            "habeat_max_attempts": self.max_attempts,
            "habeat_dead_letter_max_length": self.dead_letter_max_length,
            "habeat_visibility_timeout": self.visibility_timeout,
            "habeat_metrics_port": self.metrics_port,
            "habeat_worker_metrics_port": self.worker_metrics_port,
            # A worker that loses the broker connection cancels what it runs: the
            # broker will redeliver it anyway, and the lease keeps the run single.
            "worker_cancel_long_running_tasks_on_connection_loss": True,
        }


def _database_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs too, and use psycopg 3 for them."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def _number(
    env: Mapping[str, str], name: str, default: float, *, allow_zero: bool = False
) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(
            f"{name}={raw!r} is not a number: set it to a number of seconds (or a count)"
        ) from None
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name}={raw!r} must be positive")
    return value


def _port(env: Mapping[str, str], name: str) -> int | None:
    """A TCP port, or None when unset, empty or 0 (off)."""
    raw = env.get(name, "").strip()
    if raw in {"", "0"}:
        return None
    try:
        port = int(raw)
    except ValueError:
        port = -1
    if not 0 < port <= 65535:
        raise ConfigError(f"{name}={raw!r} must be a TCP port (1-65535), or 0 or unset for none")
    return port
