"""Typed settings from the environment, turned into the Celery app's configuration.

The scheduler's ``HABEAT_*`` settings are read through its table
(``beat.config.SETTINGS``, shown in docs/reference/configuration.md): the same
variables, defaults, parsers and errors as ``BeatConfig.from_celery_conf``. The
fields below pick which of them this app reads itself and puts in ``app.conf``
(``BeatConfig`` reads the others from the environment); it adds variables of its own:

| variable | default | meaning |
| --- | --- | --- |
| DATABASE_URL | ``BeatConfig().database_url`` | schedule store (``postgresql://``: psycopg 3) |
| REDIS_URL | ``BeatConfig().redis_url`` | leader lease |
| CELERY_BROKER_URL | REDIS_URL | Celery broker (``sentinel://...?master_name=NAME`` too) |
| HABEAT_BROKER_KEY_PREFIX | (none) | the Redis broker's ``global_keyprefix`` |
| CELERY_RESULT_BACKEND | (none) | Celery's result backend (a workflow's chord needs one) |
| HABEAT_IMPORTS | (none) | extra comma-separated task modules to import |
| PROMETHEUS_MULTIPROC_DIR | (none) | prefork workers: empty dir where pool children keep metrics |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from beat.config import CONF_PREFIX, setting
from beat.redis_urls import as_kombu_sentinel_url, is_sentinel

DEFAULT_DATABASE_URL: str = setting("database_url").default
DEFAULT_REDIS_URL: str = setting("redis_url").default
#: Task modules of this project, always imported by workers and beat.
TASK_MODULES = ("tasks.demo",)
#: Modules that extend the worker itself: the run tracking (receipt of runs, plain
#: tasks' runs, expired deliveries, see ``beat.delivery.tracking``) and the guard that
#: sets aside messages it cannot decode or unpack, instead of dying on them.
WORKER_MODULES = ("beat.worker",)
#: Where a field of ``Settings`` names the scheduler's setting it fills.
_SETTING = "habeat_setting"


def _scheduler(name: str) -> Any:
    """A field that fills the scheduler's setting ``name`` (``habeat_<name>``): its
    default, variables, parser and check are that setting's."""
    return field(default=setting(name).default, metadata={_SETTING: name})


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    database_url: str = DEFAULT_DATABASE_URL
    redis_url: str = DEFAULT_REDIS_URL
    broker_url: str = DEFAULT_REDIS_URL
    key_prefix: str = _scheduler("key_prefix")
    lock_ttl: float = _scheduler("lock_ttl")
    standby_poll: float = _scheduler("standby_poll")
    max_wait: float = _scheduler("max_wait")
    claim_batch: int = _scheduler("claim_batch")
    claim_ahead: float = _scheduler("claim_ahead")
    claim_ahead_max: float = _scheduler("claim_ahead_max")
    max_armed: int = _scheduler("max_armed")
    misfire_grace: float = _scheduler("misfire_grace")
    timezone: str = _scheduler("default_timezone")
    history_retention_days: float = _scheduler("history_retention_days")
    misfire_policy: str = _scheduler("default_misfire_policy")
    overlap_policy: str = _scheduler("default_overlap_policy")
    visibility_timeout: float = _scheduler("visibility_timeout")
    lease_timeout: float = _scheduler("lease_timeout")
    max_attempts: int = _scheduler("max_attempts")
    dead_letter_max_length: int = _scheduler("dead_letter_max_length")
    broker_key_prefix: str = ""
    result_backend: str | None = None
    imports: tuple[str, ...] = ()
    metrics_port: int | None = _scheduler("metrics_port")
    worker_metrics_port: int | None = _scheduler("worker_metrics_port")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        scheduler: dict[str, Any] = {}
        for item, name in scheduler_fields().items():
            found = setting(name).from_environment(env)
            if found is not None:
                scheduler[item] = found[1]
        redis_url = env.get("REDIS_URL", DEFAULT_REDIS_URL)
        return cls(
            database_url=_database_url(env.get("DATABASE_URL", DEFAULT_DATABASE_URL)),
            redis_url=redis_url,
            broker_url=env.get("CELERY_BROKER_URL", redis_url),
            broker_key_prefix=env.get("HABEAT_BROKER_KEY_PREFIX", ""),
            result_backend=env.get("CELERY_RESULT_BACKEND") or None,
            imports=tuple(
                name.strip() for name in env.get("HABEAT_IMPORTS", "").split(",") if name.strip()
            ),
            **scheduler,
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
        broker_url = self.broker_url
        sentinel_urls: dict[str, str] = {}
        if is_sentinel(broker_url):
            broker_url, transport_options["master_name"] = as_kombu_sentinel_url(
                broker_url, "CELERY_BROKER_URL"
            )
            # Celery prefers the CELERY_BROKER_URL variable to ``broker_url``, and would
            # hand kombu the URL with its ``?master_name=``: the read and write URLs come
            # first for every connection Celery opens.
            sentinel_urls = {"broker_read_url": broker_url, "broker_write_url": broker_url}
        backend: dict[str, Any] = {}
        if self.result_backend is not None:
            backend["result_backend"] = self.result_backend
            # A backend that is down fails a send in seconds, not after Celery's 20
            # retries: beat sends a workflow's chord, and would not schedule meanwhile.
            options: dict[str, Any] = {"retry_policy": {"max_retries": 3}}
            if self.broker_key_prefix:  # the broker's prefix keeps the results beside it
                options["global_keyprefix"] = self.broker_key_prefix
            backend["result_backend_transport_options"] = options
        return {
            "broker_url": broker_url,
            **sentinel_urls,
            **backend,
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
            **{
                CONF_PREFIX + name: getattr(self, item) for item, name in scheduler_fields().items()
            },
            # A worker that loses the broker connection cancels what it runs: the
            # broker will redeliver it anyway, and the lease keeps the run single.
            "worker_cancel_long_running_tasks_on_connection_loss": True,
            # After a reconnect Celery lowers the prefetch count, then raises it again
            # from the callback of each acknowledgement: on the threads pool that is a
            # pool thread, sending basic.qos on the channel the consumer's thread uses.
            # py-amqp is not thread-safe: both waited for the one reply, and the worker
            # stopped consuming for good, holding its prefetched messages (seen with
            # RabbitMQ restarted under a threads worker). The requests it ran were
            # cancelled at the loss anyway: there is nothing to be careful of.
            "worker_enable_prefetch_count_reduction": False,
        }


def _database_url(url: str) -> str:
    """Accept plain ``postgresql://`` URLs too, and use psycopg 3 for them."""
    for plain in ("postgresql://", "postgres://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def scheduler_fields() -> dict[str, str]:
    """The fields of ``Settings`` that fill the scheduler's settings: field -> setting."""
    chosen = [item for item in fields(Settings) if _SETTING in item.metadata]
    return {item.name: item.metadata[_SETTING] for item in chosen}
