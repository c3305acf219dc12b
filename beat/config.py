"""The scheduler's configuration, read from namespaced keys on ``app.conf``.

Each setting is read from the app's configuration (``app.conf.habeat_lock_ttl``;
``CELERY_HABEAT_LOCK_TTL`` in Django settings loaded with ``namespace="CELERY"``),
else from the environment (``HABEAT_LOCK_TTL``), else it takes the default here.
The schedule database has no default: an app that does not name one is not
using this scheduler, and a beat started on it says which setting to add
rather than writing to whatever PostgreSQL happens to listen on localhost.
The lease's Redis defaults to the broker when the broker is Redis.

The settings are one table (``SETTINGS``): each field of ``BeatConfig`` is declared
with its default, the parser of its environment variable's text, the check of its
value (whichever source it came from: ``beat.config_values``) and its meaning. ``from_celery_conf``,
``validate``, the demo app's ``app.settings`` and the configuration reference's table
(``markdown_table``) come from it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, TypeVar

from beat.celery_reports import hide_urls_in_celery_reports
from beat.config_values import (
    Check,
    Parser,
    Refused,
    a_switch,
    at_least,
    claim_window,
    failure_threshold,
    kept_messages,
    not_empty,
    one_of,
    parse_number,
    parse_port,
    parse_switch,
    parse_text,
    parse_whole_number,
    positive,
    tcp_port,
)
from beat.database_urls import database_url_refusal
from beat.errors import ConfigError
from beat.models import MisfirePolicy, OverlapPolicy
from beat.redis_urls import lease_url_of_broker

#: Prefix of every key this package reads from ``app.conf``.
CONF_PREFIX = "habeat_"
#: Prefix of the environment variables read when ``app.conf`` leaves a key out.
ENV_PREFIX = "HABEAT_"
#: Values of Celery's ``beat_scheduler`` that name this scheduler.
SCHEDULER_NAMES = frozenset({"ha", "beat.scheduler:HAScheduler", "beat.scheduler.HAScheduler"})
#: Prefix of Celery's old setting names (``CELERY_TIMEZONE``), which an app configured
#: with them (``config_from_object(settings)`` without a namespace) uses for ours too.
OLD_CONF_PREFIX = "CELERY_"
#: The URL fields, and the fields that say which setting they came from (set by
#: whoever fills ``app.conf`` from variables of its own, read from nowhere else).
_URL_SETTINGS = {"database_url": "database_setting", "redis_url": "redis_setting"}
_PROVENANCE = frozenset(_URL_SETTINGS.values())

T = TypeVar("T")

# -- the table -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: a field of ``BeatConfig``, the key and variables that set it, its
    default, how its text is parsed and its value checked, and what it means."""

    #: Name of the ``BeatConfig`` field; the key in ``app.conf`` is ``habeat_<name>``.
    name: str
    default: Any
    parse: Parser[Any]
    check: Check[Any] | None
    #: One line for the configuration reference's table.
    meaning: str
    #: The variable the reference names (``HABEAT_<NAME>`` unless the demo app named it
    #: otherwise); ``HABEAT_<NAME>`` is read too.
    variable: str
    #: The default as the configuration reference shows it, when the value alone would not say it.
    shown_default: str | None = None

    @property
    def key(self) -> str:
        """The key in ``app.conf``."""
        return CONF_PREFIX + self.name

    @property
    def variables(self) -> tuple[str, ...]:
        """The environment variables that set it, the first set one winning."""
        derived = ENV_PREFIX + self.name.upper()
        return (self.variable,) if self.variable == derived else (self.variable, derived)

    def refusal(self, value: Any, variable: str | None = None) -> ConfigError | None:
        """The error for a value this setting refuses (naming the variable it came from,
        if any), or None when the value is fine."""
        reason = None if self.check is None else self.check(value)
        if reason is None:
            return None
        source = "" if variable is None else f" (set by {variable})"
        return ConfigError(f"{self.key}={value!r}: {reason}{source}")

    def from_environment(self, environ: Mapping[str, str]) -> tuple[str, Any] | None:
        """The variable that sets this setting and its value, parsed and checked; None
        when no variable does (unset or blank)."""
        for variable in self.variables:
            raw = environ.get(variable, "")
            if not raw.strip():
                continue
            try:
                value = self.parse(raw)
            except Refused as refused:
                raise ConfigError(f"{variable}={raw!r} {refused}") from None
            error = self.refusal(value, variable)
            if error is not None:
                raise error
            return variable, value
        return None

    def markdown_row(self) -> str:
        """This setting's row of the configuration reference's table."""
        variables = f"`{self.variables[0]}`"
        if len(self.variables) > 1:
            variables += " (or " + ", ".join(f"`{name}`" for name in self.variables[1:]) + ")"
        default = self.shown_default or f"`{_shown(self.default)}`"
        return f"| `{self.key}` | {variables} | {default} | {self.meaning} |"


def _shown(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


#: Where a ``BeatConfig`` field keeps its row of the table (the field's own default
#: is the setting's default).
_ROW = "habeat_setting"


def _setting(
    default: T,
    meaning: str,
    *,
    parse: Parser[T],
    check: Check[T] | None = None,
    variable: str | None = None,
    shown_default: str | None = None,
) -> T:
    """Declares a field of ``BeatConfig`` as a setting (see ``Setting``)."""
    row = {
        "parse": parse,
        "check": check,
        "meaning": meaning,
        "variable": variable,
        "shown_default": shown_default,
    }
    return field(default=default, metadata={_ROW: row})


def _policy(default: MisfirePolicy | OverlapPolicy, kind: str) -> str:
    """The ``kind`` policy of schedules created without one (``HABEAT_<KIND>_POLICY``)."""
    return _setting(
        default.value,
        f"{kind} policy of schedules created without one",
        parse=parse_text,
        check=one_of(type(default)),
        variable=f"{ENV_PREFIX}{kind.upper()}_POLICY",
    )


def _port_setting(meaning: str) -> int | None:
    """A TCP port, off by default."""
    return _setting(None, meaning, parse=parse_port, check=tcp_port, shown_default="off")


@dataclass(frozen=True, kw_only=True, slots=True)
class BeatConfig:
    """Typed settings of the scheduler. Durations are in seconds.

    Each field but the two ``*_setting`` ones is a row of the settings table
    (``SETTINGS``): its default, parser, check and meaning are declared with it."""

    database_url: str = _setting(
        "postgresql+psycopg://postgres@127.0.0.1:5432/habeat",
        "SQLAlchemy URL of the schedules and runs (PostgreSQL)",
        parse=parse_text,
        shown_default="required",
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0",
        "Redis URL of the leader lease (may differ from the broker); rediss:// for TLS,"
        " sentinel://host:port;sentinel://host:port/0?master_name=NAME for Sentinel",
        parse=parse_text,
        shown_default="the broker, if it is Redis",
    )
    #: The setting a user changes to fix ``database_url``, named in error hints
    #: (an app that fills ``habeat_database_url`` from its own variable names that one).
    database_setting: str = "habeat_database_url"
    #: The same for ``redis_url``.
    redis_setting: str = "habeat_redis_url"
    key_prefix: str = _setting(
        "habeat",
        "prefix of the lease's Redis keys and name of the leader row (one per cluster)",
        parse=parse_text,
        check=not_empty,
    )
    lock_ttl: float = _setting(
        10.0,
        "seconds the leader lease lives unrenewed; a dead leader is replaced after about this long",
        parse=parse_number,
        check=at_least(1, " second"),
    )
    lead_without_redis: bool = _setting(
        True,
        "while the lease's Redis is unreachable, a beat leads on the leader row in PostgreSQL"
        " once its hold ended (the lock TTL, `max_wait` and `claim_ahead`, plus a lock TTL)"
        " and schedules on, fenced by the same epoch; `false`: scheduling waits for Redis",
        parse=parse_switch,
        check=a_switch,
        shown_default="`true`",
    )
    standby_poll: float = _setting(
        1.0,
        "seconds between a standby's attempts to lead (a clean hand-over wakes it at once)",
        parse=parse_number,
        check=positive,
    )
    max_wait: float = _setting(
        5.0,
        "longest wait of the leader between ticks, seconds (edits made with psql are seen"
        " within it)",
        parse=parse_number,
        check=positive,
    )
    claim_batch: int = _setting(
        # A burst is claimed batch after batch: a transaction's round trips and commit
        # are paid per batch. 2,000 claimed a burst of 100,000 about 15% faster than
        # 1,000 (and 4,000 no faster) on a 2-core host (docs/benchmarks).
        2000,
        "schedules claimed per transaction",
        parse=parse_whole_number,
        check=at_least(1),
    )
    claim_ahead: float = _setting(
        3.0,
        "seconds; runs of `allow` schedules due this soon are always claimed and built"
        " ahead and sent at their fire time (0: off)",
        parse=parse_number,
        check=claim_window,
    )
    claim_ahead_max: float = _setting(
        30.0,
        "seconds; how far ahead a burst is claimed, so that all of it is built by its fire"
        " time (the window widens with what is due and how fast this leader claims;"
        " 0: never wider than habeat_claim_ahead)",
        parse=parse_number,
        check=claim_window,
    )
    max_armed: int = _setting(
        200_000,
        "most runs held in memory claimed ahead (about 3 KiB each, message included); later"
        " ones are claimed nearer their fire time",
        parse=parse_whole_number,
        check=at_least(0),
    )
    outbox_grace: float = _setting(
        10.0,
        "seconds a run this process claimed may stay `pending` before it publishes it again",
        parse=parse_number,
    )
    misfire_grace: float = _setting(
        60.0,
        "seconds late before a fire time counts as missed (the misfire policy then decides)",
        parse=parse_number,
    )
    max_catchup: int = _setting(
        100,
        "most missed fire times one claim turns into runs (`fire_all`) or skip records",
        parse=parse_whole_number,
        check=at_least(1),
    )
    default_timezone: str = _setting(
        "UTC",
        "zone of schedules created without one",
        parse=parse_text,
        variable="HABEAT_TIMEZONE",
    )
    default_misfire_policy: str = _policy(MisfirePolicy.FIRE_ONCE, "misfire")
    default_overlap_policy: str = _policy(OverlapPolicy.ALLOW, "overlap")
    claim_idle_timeout: float = _setting(
        10.0,
        "seconds a claim transaction may stay idle before PostgreSQL aborts it (a leader"
        " paused mid-claim cannot block a takeover)",
        parse=parse_number,
    )
    lease_timeout: float = _setting(
        30.0,
        "seconds a worker's lease on a run lasts without a heartbeat; the leader reclaims"
        " a run whose lease expired",
        parse=parse_number,
        check=at_least(2, " seconds"),
    )
    heartbeat_interval: float | None = _setting(
        None,
        "seconds between a worker's heartbeats on its run (shorter than the lease)",
        parse=parse_number,
        shown_default="a third of the lease",
    )
    max_attempts: int = _setting(
        3,
        "attempts of a run whose worker process crashes or hangs under it before it is"
        " marked `lost` (per schedule: `--max-attempts`); an attempt ended by its whole"
        " worker dying (killed, restarted) does not count, up to 10",
        parse=parse_whole_number,
        check=at_least(1),
    )
    history_retention_days: float = _setting(
        30.0,
        "the leader deletes finished runs older than this many days, as fast as they come,"
        " and incidents resolved and notifications sent that long ago (0: keep them)",
        parse=parse_number,
    )
    visibility_timeout: float = _setting(
        3600.0,
        "the Redis broker's visibility timeout, seconds; a run queued for twice this long"
        " is published again",
        parse=parse_number,
        check=positive,
    )
    metrics_port: int | None = _port_setting(
        "port of beat's Prometheus endpoint `/metrics`, opened on its first tick (see Metrics)"
    )
    worker_metrics_port: int | None = _port_setting(
        "port of a worker's Prometheus endpoint, opened at `worker_init`"
    )
    metrics_address: str = _setting(
        "127.0.0.1",
        "address both endpoints bind to; `0.0.0.0` (or one interface's address) for a"
        " Prometheus on another host (the endpoints have no authentication)",
        parse=parse_text,
    )
    metrics_schedule_limit: int = _setting(
        1000,
        "the leader serves a series per schedule (failures in a row, last success) while"
        " the cluster holds at most this many schedules: a label value each (0: never)",
        parse=parse_whole_number,
        check=at_least(0),
    )
    alert_after_failures: int = _setting(
        3,
        "a schedule's failing monitor opens an incident once this many of its runs in a row"
        " failed, were lost or expired (its own `alert_after_failures` overrides it; 0: never)",
        parse=parse_whole_number,
        check=failure_threshold,
    )
    pause_after_failures: int = _setting(
        0,
        "the scheduler pauses a schedule after this many of its runs in a row failed, with"
        " the reason as its pause note (its own `pause_after_failures` overrides it; 0: never)",
        parse=parse_whole_number,
        check=failure_threshold,
    )
    dead_letter_key: str = _setting(
        "habeat.dead_letter",
        "Redis list on the broker (after its `global_keyprefix`) where workers keep the"
        " messages they cannot decode or unpack",
        parse=parse_text,
        check=not_empty,
    )
    dead_letter_max_length: int = _setting(
        1000,
        "most messages kept in that list, the oldest going first (0: none, only the log line)",
        parse=parse_whole_number,
        check=kept_messages,
    )

    @classmethod
    def from_celery_conf(cls, conf: Any, environ: Mapping[str, str] | None = None) -> BeatConfig:
        """Read ``habeat_*`` keys from a Celery ``app.conf``, then ``HABEAT_*`` variables
        from the environment; what neither sets takes the default."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name in _PROVENANCE:
            if (value := conf_value(conf, CONF_PREFIX + name)) is not None:
                values[name] = value
        for row in SETTINGS:
            if (value := conf_value(conf, row.key)) is not None:
                values[row.name] = value
                if row.name in _URL_SETTINGS:
                    values.setdefault(_URL_SETTINGS[row.name], app_key(conf, row.key))
            elif (found := row.from_environment(env)) is not None:
                variable, values[row.name] = found
                if row.name in _URL_SETTINGS:
                    values.setdefault(_URL_SETTINGS[row.name], variable)
        if "database_url" not in values:
            raise ConfigError(
                f"no schedule database is configured: set {app_key(conf, 'habeat_database_url')}"
                " in the app's configuration, or HABEAT_DATABASE_URL in the environment"
            )
        if "redis_url" not in values:
            values["redis_url"] = _broker_redis_url(conf)
            values.setdefault("redis_setting", "the broker URL (or habeat_redis_url)")
        config = cls(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Refuse settings that would break the lease or the claim, naming the key to fix."""
        for row in SETTINGS:
            if (error := row.refusal(getattr(self, row.name))) is not None:
                raise error
        if (refusal := database_url_refusal(self.database_url, self.database_setting)) is not None:
            raise refusal
        if self.lease_heartbeat >= self.lease_timeout:
            raise ConfigError(
                f"habeat_heartbeat_interval={self.heartbeat_interval!r}: must be shorter than"
                f" habeat_lease_timeout={self.lease_timeout!r} (or unset: a third of it)"
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


def _rows(config_fields: tuple[Field[Any], ...]) -> tuple[Setting, ...]:
    """The settings table, from the fields of ``BeatConfig`` declared with ``_setting``."""
    rows = []
    for item in config_fields:
        if _ROW in item.metadata:
            row = dict(item.metadata[_ROW])
            row["variable"] = row["variable"] or ENV_PREFIX + item.name.upper()
            rows.append(Setting(name=item.name, default=item.default, **row))
    return tuple(rows)


#: The settings table: one row per setting, in the order docs/reference/configuration.md lists them.
SETTINGS: tuple[Setting, ...] = _rows(fields(BeatConfig))
_BY_NAME = {row.name: row for row in SETTINGS}


def setting(name: str) -> Setting:
    """The row of the ``BeatConfig`` field ``name``."""
    return _BY_NAME[name]


def markdown_table() -> str:
    """The table of settings that docs/reference/configuration.md shows."""
    lines = [
        "| setting | environment | default | meaning |",
        "| --- | --- | --- | --- |",
        *(row.markdown_row() for row in SETTINGS),
    ]
    return "\n".join(lines)


def uses_this_scheduler(conf: Any, environ: Mapping[str, str] | None = None) -> bool:
    """Whether an app is set up for this scheduler: its beat uses it, or it names a
    schedule database. Workers of other apps, in the same environment, are left alone."""
    env = os.environ if environ is None else environ
    scheduler = conf.get("beat_scheduler")
    if isinstance(scheduler, type):
        scheduler = f"{scheduler.__module__}:{scheduler.__qualname__}"
    return (
        scheduler in SCHEDULER_NAMES
        or conf_value(conf, CONF_PREFIX + "database_url") is not None
        or bool(env.get(ENV_PREFIX + "DATABASE_URL", "").strip())
    )


def _broker_redis_url(conf: Any) -> str:
    """The broker's URL when the broker is Redis: the lease then needs no setting of its own."""
    url = lease_url_of_broker(conf.get("broker_url"), conf.get("broker_transport_options"))
    if url is not None:
        return url
    raise ConfigError(
        "no Redis for the leader lease: the broker is not Redis, so set"
        f" {app_key(conf, 'habeat_redis_url')} in the app's configuration, or"
        " HABEAT_REDIS_URL in the environment"
    )


def conf_value(conf: Any, key: str) -> Any:
    """Our ``key`` (``habeat_lock_ttl``) in ``conf``, found as Celery finds its own
    settings: Celery's ``Settings`` adds the app's namespace (``CELERY_HABEAT_LOCK_TTL``
    with ``namespace="CELERY"``) and reads each setting by its old name as well
    (``CELERY_TIMEZONE`` for ``timezone``), whose spelling for ours is
    ``CELERY_HABEAT_LOCK_TTL``. None when neither is set."""
    value = conf.get(key)
    return conf.get(_old_name(key)) if value is None else value


def app_key(conf: Any, key: str) -> str:
    """The name of our ``key`` that this app's configuration is written with: the
    namespaced one, the old-style one when its settings use Celery's old names, else
    ``key`` itself."""
    prefix = getattr(conf, "prefix", None)
    if isinstance(prefix, str) and prefix:
        name = prefix + key
        return name.upper() if prefix.isupper() else name.lower()
    old_style = conf.get("deprecated_settings") if hasattr(conf, "get") else None
    return _old_name(key) if old_style else key


def _old_name(key: str) -> str:
    return OLD_CONF_PREFIX + key.upper()


# Every process that reads this configuration masks its URLs in Celery's reports.
hide_urls_in_celery_reports()
