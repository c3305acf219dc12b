"""The scheduler's configuration, read from namespaced keys on ``app.conf``.

Each setting is read from the app's configuration (``app.conf.habeat_lock_ttl``;
``CELERY_HABEAT_LOCK_TTL`` in Django settings loaded with ``namespace="CELERY"``),
else from the environment (``HABEAT_LOCK_TTL``), else it takes the default here.
The schedule database has no default: an app that does not name one is not
using this scheduler, and a beat started on it says which setting to add
rather than writing to whatever PostgreSQL happens to listen on localhost.
The lease's Redis defaults to the broker when the broker is Redis.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from beat.errors import ConfigError
from beat.tables import MisfirePolicy, OverlapPolicy

#: Prefix of every key this package reads from ``app.conf``.
CONF_PREFIX = "habeat_"
#: Prefix of the environment variables read when ``app.conf`` leaves a key out.
ENV_PREFIX = "HABEAT_"
#: Values of Celery's ``beat_scheduler`` that name this scheduler.
SCHEDULER_NAMES = frozenset({"ha", "beat.scheduler:HAScheduler", "beat.scheduler.HAScheduler"})
#: How to name the database setting in a hint, for any app.
DATABASE_SETTING = (
    "habeat_database_url in the app's configuration (CELERY_HABEAT_DATABASE_URL in"
    " Django settings), or HABEAT_DATABASE_URL in the environment"
)
#: The URL fields, and the fields that say which setting they came from (set by
#: whoever fills ``app.conf`` from variables of its own, read from nowhere else).
_URL_SETTINGS = {"database_url": "database_setting", "redis_url": "redis_setting"}
_PROVENANCE = frozenset(_URL_SETTINGS.values())


@dataclass(frozen=True, kw_only=True, slots=True)
class BeatConfig:
    """Typed settings of the scheduler. Durations are in seconds."""

    #: SQLAlchemy URL of the schedule store (``from_celery_conf`` requires it to be set).
    database_url: str = "postgresql+psycopg://postgres@127.0.0.1:5432/habeat"
    #: Redis URL of the leader lease (may differ from the broker; default: the broker
    #: when it is Redis).
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: The setting a user changes to fix ``database_url``, named in error hints
    #: (an app that fills ``habeat_database_url`` from its own variable names that one).
    database_setting: str = "habeat_database_url"
    #: The same for ``redis_url``.
    redis_setting: str = "habeat_redis_url"
    #: Prefix of every Redis key of the lease, and name of the leader row.
    key_prefix: str = "habeat"
    #: Time to live of the leader lease; a dead leader is replaced after about this long.
    lock_ttl: float = 10.0
    #: How often a standby tries to take the lease (it is also woken on a clean hand-over).
    standby_poll: float = 1.0
    #: Longest wait between two ticks of the leader (picks up edits made outside the API).
    max_wait: float = 5.0
    #: Most schedules claimed in one transaction.
    claim_batch: int = 1000
    #: Schedules due within this many seconds (overlap policy ``allow``) are claimed
    #: ahead and their messages built before the fire time, then sent at it; 0: claim
    #: only what is due. It bounds the lateness of large bursts, not correctness.
    claim_ahead: float = 3.0
    #: A run left ``pending`` by this process for longer than this is published again.
    outbox_grace: float = 10.0
    #: A fire time later than this when claimed is a misfire, handled by the misfire policy.
    misfire_grace: float = 60.0
    #: Most missed fire times one claim turns into runs (``fire_all``) or skip records.
    max_catchup: int = 100
    #: Time zone of schedules created without one.
    default_timezone: str = "UTC"
    #: Misfire and overlap policies of schedules created without one.
    default_misfire_policy: str = "fire_once"
    default_overlap_policy: str = "allow"
    #: Longest a claim transaction may stay idle before PostgreSQL aborts it
    #: (so a leader paused mid-claim cannot block a takeover).
    claim_idle_timeout: float = 10.0
    #: A worker's lease on a run; a run whose lease expires is reclaimed by the leader.
    lease_timeout: float = 30.0
    #: How often a worker extends its lease (default: a third of the lease).
    heartbeat_interval: float | None = None
    #: Attempts of a run whose worker keeps dying before it is marked lost (Celery retries aside).
    max_attempts: int = 3
    #: Finished runs older than this many days are deleted by the leader (0: keep them all).
    history_retention_days: float = 30.0
    #: The Redis broker's visibility timeout; a run queued for twice this long is published again.
    visibility_timeout: float = 3600.0
    #: TCP port of beat's Prometheus endpoint (``/metrics``), opened on the first tick;
    #: None or 0: no endpoint.
    metrics_port: int | None = None
    #: TCP port of a worker's Prometheus endpoint, opened at ``worker_init``; None or 0: none.
    worker_metrics_port: int | None = None
    #: Address the metrics endpoints bind to (beat's, and a worker's when it has a port).
    #: Loopback by default: the endpoints have no authentication; set ``0.0.0.0`` (or
    #: one interface's address) for a Prometheus on another host.
    metrics_address: str = "127.0.0.1"
    #: Redis list, on the broker (after its ``global_keyprefix``), where workers keep
    #: the messages they cannot decode or unpack (``beat.poison_messages``).
    dead_letter_key: str = "habeat.dead_letter"
    #: Most messages kept in that list; the oldest go first (0: keep none, only log them).
    dead_letter_max_length: int = 1000

    @classmethod
    def from_celery_conf(cls, conf: Any, environ: Mapping[str, str] | None = None) -> BeatConfig:
        """Read ``habeat_*`` keys from a Celery ``app.conf``, then ``HABEAT_*`` variables
        from the environment; what neither sets takes the default."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field in fields(cls):
            value = conf.get(CONF_PREFIX + field.name)
            if value is not None:
                values[field.name] = value
            elif field.name not in _PROVENANCE:
                raw = env.get(ENV_PREFIX + field.name.upper(), "")
                if raw.strip():
                    values[field.name] = _from_environment(field.name, str(field.type), raw)
                    if field.name in _URL_SETTINGS:
                        variable = ENV_PREFIX + field.name.upper()
                        values.setdefault(_URL_SETTINGS[field.name], variable)
        if "database_url" not in values:
            raise ConfigError(f"no schedule database is configured: set {DATABASE_SETTING}")
        if "redis_url" not in values:
            values["redis_url"] = _broker_redis_url(conf)
            values.setdefault("redis_setting", "the broker URL (or habeat_redis_url)")
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Refuse settings that would break the lease or the claim, naming the key to fix."""
        if self.lock_ttl < 1:
            raise ConfigError(f"habeat_lock_ttl={self.lock_ttl}: must be at least 1 second")
        if self.standby_poll <= 0 or self.max_wait <= 0:
            raise ConfigError("habeat_standby_poll and habeat_max_wait must be positive")
        if not 0 <= self.claim_ahead <= 30:
            raise ConfigError(f"habeat_claim_ahead={self.claim_ahead}: use 0 (off) to 30 seconds")
        if self.claim_batch < 1 or self.max_catchup < 1:
            raise ConfigError("habeat_claim_batch and habeat_max_catchup must be at least 1")
        if self.lease_timeout < 2 or self.lease_heartbeat >= self.lease_timeout:
            raise ConfigError(
                "habeat_lease_timeout must be at least 2 seconds and longer than the heartbeat"
            )
        policies = (
            (self.default_misfire_policy, MisfirePolicy, "habeat_default_misfire_policy"),
            (self.default_overlap_policy, OverlapPolicy, "habeat_default_overlap_policy"),
        )
        for value, kind, key in policies:
            if value not in {member.value for member in kind}:
                choices = ", ".join(member.value for member in kind)
                raise ConfigError(f"{key}={value!r}: use one of {choices}")
        if self.max_attempts < 1:
            raise ConfigError("habeat_max_attempts must be at least 1")
        for key, port in (
            ("habeat_metrics_port", self.metrics_port),
            ("habeat_worker_metrics_port", self.worker_metrics_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise ConfigError(f"{key}={port}: must be a TCP port (0 or unset: off)")
        if not self.key_prefix:
            raise ConfigError("habeat_key_prefix must not be empty")
        if not self.dead_letter_key or self.dead_letter_max_length < 0:
            raise ConfigError(
                "habeat_dead_letter_key must not be empty and habeat_dead_letter_max_length"
                " must be 0 (keep none) or more"
            )

    def schedule_defaults(self) -> dict[str, str]:
        """Fields a schedule gets when its definition leaves them out."""
        return {
            "misfire_policy": self.default_misfire_policy,
            "overlap_policy": self.default_overlap_policy,
        }

    @property
    def lease_heartbeat(self) -> float:
        """Three heartbeats per lease, so one slow heartbeat does not lose it."""
        return self.heartbeat_interval or self.lease_timeout / 3

    @property
    def renew_interval(self) -> float:
        """The lease is renewed three times per TTL, so two lost renewals in a row are survived."""
        return self.lock_ttl / 3


def uses_this_scheduler(conf: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Whether an app is set up for this scheduler: its beat uses it, or it names a
    schedule database. Workers of other apps, in the same environment, are left alone."""
    env = os.environ if environ is None else environ
    scheduler = conf.get("beat_scheduler")
    if isinstance(scheduler, type):
        scheduler = f"{scheduler.__module__}:{scheduler.__qualname__}"
    return (
        scheduler in SCHEDULER_NAMES
        or conf.get(CONF_PREFIX + "database_url") is not None
        or bool(env.get(ENV_PREFIX + "DATABASE_URL", "").strip())
    )


def _from_environment(name: str, annotation: str, raw: str) -> Any:
    """An environment variable's text as the field's type, or one line naming the fix."""
    variable = ENV_PREFIX + name.upper()
    if annotation.startswith("str"):
        return raw
    try:
        number = float(raw)
    except ValueError:
        raise ConfigError(f"{variable}={raw!r} is not a number: set it to a number") from None
    if annotation.startswith("int"):
        if not number.is_integer():
            raise ConfigError(f"{variable}={raw!r} must be a whole number")
        return int(number)
    return number


def _broker_redis_url(conf: Any) -> str:
    """The broker's URL when the broker is Redis: the lease then needs no setting of its own."""
    broker = conf.get("broker_url") or ""
    first = str(broker).split(";")[0].strip()
    if first.startswith(("redis://", "rediss://", "unix://")):
        return first
    raise ConfigError(
        "no Redis for the leader lease: the broker is not Redis, so set habeat_redis_url in"
        " the app's configuration (CELERY_HABEAT_REDIS_URL in Django settings), or"
        " HABEAT_REDIS_URL in the environment"
    )


def hide_urls_in_celery_reports() -> None:
    """Make Celery mask this package's URL settings wherever it shows the configuration.

    Celery masks settings by name only (``API|TOKEN|KEY|SECRET|PASS|...|DATABASE``) and
    broker or backend URLs: ``habeat_redis_url`` and any URL named otherwise would reach
    ``celery inspect conf``, Flower's worker pages and ``celery report`` with their
    passwords. Its pattern is a module global read on every call, so widening it here
    (once, in every process that imports this package) covers all of them.
    """
    from celery.app import utils

    if _OUR_URLS not in utils.HIDDEN_SETTINGS.pattern:
        utils.HIDDEN_SETTINGS = re.compile(
            f"{utils.HIDDEN_SETTINGS.pattern}|{_OUR_URLS}", utils.HIDDEN_SETTINGS.flags
        )


#: Names of settings Celery must mask (case-insensitive), added to its own pattern.
_OUR_URLS = "HABEAT_[A-Z_]*URL"

hide_urls_in_celery_reports()
