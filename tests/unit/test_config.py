"""The scheduler's settings: one table, read from app.conf and the environment."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import redis

from app.settings import Settings, scheduler_fields
from beat.config import CONF_PREFIX, ENV_PREFIX, SETTINGS, BeatConfig, markdown_table, setting
from beat.errors import ConfigError
from beat.lease.holder import LeaderLease

CONFIGURATION_DOC = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"
#: A conf that names the two URLs, so that only the setting under test is missing.
BASE_CONF = {"broker_url": "redis://h/1", "habeat_database_url": "postgresql://d/b"}

#: For every setting: the text of its variable, and the value app.conf would hold.
SAMPLES: dict[str, tuple[str, Any]] = {
    "database_url": ("postgresql://env/db", "postgresql://env/db"),
    "redis_url": ("redis://lease/2", "redis://lease/2"),
    "key_prefix": ("other", "other"),
    "lock_ttl": ("7", 7.0),
    "lead_without_redis": ("off", False),
    "standby_poll": ("0.5", 0.5),
    "max_wait": ("2.5", 2.5),
    "claim_batch": ("50", 50),
    "claim_ahead": ("0", 0.0),
    "claim_ahead_max": ("12.5", 12.5),
    "max_armed": ("50000", 50000),
    "outbox_grace": ("20", 20.0),
    "misfire_grace": ("0", 0.0),
    "max_catchup": ("1e3", 1000),
    "default_timezone": ("Europe/Berlin", "Europe/Berlin"),
    "default_misfire_policy": ("skip", "skip"),
    "default_overlap_policy": ("queue_one", "queue_one"),
    "claim_idle_timeout": ("4", 4.0),
    "lease_timeout": ("12", 12.0),
    "heartbeat_interval": ("5", 5.0),
    "max_attempts": ("5.0", 5),
    "history_retention_days": ("0", 0.0),
    "visibility_timeout": ("7200", 7200.0),
    "metrics_port": ("9808", 9808),
    "worker_metrics_port": ("9809", 9809),
    "metrics_address": ("0.0.0.0", "0.0.0.0"),
    "metrics_schedule_limit": ("5000", 5000),
    "alert_after_failures": ("5", 5),
    "pause_after_failures": ("10", 10),
    "dead_letter_key": ("poison", "poison"),
    "dead_letter_max_length": ("0", 0),
}

#: Texts a setting's variable refuses, with what the one-line error must say.
REFUSED_TEXTS = [
    ("lock_ttl", "soon", "HABEAT_LOCK_TTL='soon' is not a number: set it to a number"),
    ("lock_ttl", "0.5", "habeat_lock_ttl=0.5: must be at least 1 second"),
    ("lead_without_redis", "maybe", "HABEAT_LEAD_WITHOUT_REDIS='maybe' must be true or false"),
    ("standby_poll", "0", "habeat_standby_poll=0.0: must be positive"),
    ("max_wait", "-1", "habeat_max_wait=-1.0: must be positive"),
    ("claim_batch", "many", "HABEAT_CLAIM_BATCH='many' is not a number"),
    ("claim_batch", "1.5", "HABEAT_CLAIM_BATCH='1.5' must be a whole number"),
    ("claim_batch", "0", "habeat_claim_batch=0: must be at least 1"),
    ("claim_ahead", "31", "habeat_claim_ahead=31.0: use 0 (off) to 30 seconds"),
    ("claim_ahead_max", "60", "habeat_claim_ahead_max=60.0: use 0 (off) to 30 seconds"),
    ("max_armed", "-5", "habeat_max_armed=-5: must be at least 0"),
    ("max_catchup", "0", "habeat_max_catchup=0: must be at least 1"),
    ("default_misfire_policy", "often", "habeat_default_misfire_policy='often': use one of"),
    ("default_overlap_policy", "sometimes", "habeat_default_overlap_policy='sometimes': use"),
    ("lease_timeout", "1", "habeat_lease_timeout=1.0: must be at least 2 seconds"),
    ("max_attempts", "0", "habeat_max_attempts=0: must be at least 1"),
    ("metrics_port", "http", "HABEAT_METRICS_PORT='http' must be a TCP port"),
    ("metrics_port", "70000", "habeat_metrics_port=70000: must be a TCP port"),
    ("worker_metrics_port", "-1", "habeat_worker_metrics_port=-1: must be a TCP port"),
    ("metrics_schedule_limit", "-1", "habeat_metrics_schedule_limit=-1: must be at least 0"),
    ("metrics_schedule_limit", "10.5", "HABEAT_METRICS_SCHEDULE_LIMIT='10.5' must be a whole"),
    ("dead_letter_max_length", "-1", "habeat_dead_letter_max_length=-1: must be 0"),
    ("alert_after_failures", "101", "habeat_alert_after_failures=101: must be from 0 (never)"),
    ("pause_after_failures", "-1", "habeat_pause_after_failures=-1: must be from 0 (never)"),
    ("pause_after_failures", "2.5", "HABEAT_PAUSE_AFTER_FAILURES='2.5' must be a whole"),
]

#: Values app.conf may not hold, with the key the error names.
REFUSED_VALUES = [
    ("key_prefix", ""),
    ("lock_ttl", 0.5),
    ("lead_without_redis", "false"),
    ("standby_poll", 0),
    ("max_wait", 0),
    ("claim_batch", 0),
    ("claim_ahead", -1),
    ("claim_ahead_max", 31),
    ("max_armed", -1),
    ("max_catchup", 0),
    ("default_misfire_policy", "often"),
    ("default_overlap_policy", "sometimes"),
    ("lease_timeout", 1.5),
    ("max_attempts", 0),
    ("metrics_port", 70000),
    ("worker_metrics_port", -1),
    ("metrics_schedule_limit", -1),
    ("alert_after_failures", 101),
    ("pause_after_failures", -1),
    ("dead_letter_key", ""),
    ("dead_letter_max_length", -1),
]


def from_conf(**conf: Any) -> BeatConfig:
    return BeatConfig.from_celery_conf({**BASE_CONF, **conf}, environ={})


def from_env(environ: dict[str, str]) -> BeatConfig:
    return BeatConfig.from_celery_conf({"broker_url": "redis://h/1"}, environ=environ)


def error_of(read: Any) -> str:
    with pytest.raises(ConfigError) as refused:
        read()
    message = str(refused.value)
    assert "\n" not in message
    return message


# -- the table ---------------------------------------------------------------------------


def test_every_field_but_the_hint_names_is_a_setting_with_its_default() -> None:
    names = [row.name for row in SETTINGS]
    assert set(names) | {"database_setting", "redis_setting"} == {
        item.name for item in fields(BeatConfig)
    }
    assert len(names) == len(set(names))
    defaults = BeatConfig()
    for row in SETTINGS:
        assert getattr(defaults, row.name) == row.default
        assert setting(row.name) is row
        assert row.key == CONF_PREFIX + row.name
        assert row.variables[-1] == ENV_PREFIX + row.name.upper()
        assert row.meaning
        assert "\n" not in row.meaning
        assert "|" not in row.meaning


def test_every_setting_has_a_sample_here() -> None:
    assert set(SAMPLES) == {row.name for row in SETTINGS}


@pytest.mark.parametrize("name", list(SAMPLES))
def test_the_environment_and_app_conf_give_the_same_config(name: str) -> None:
    raw, value = SAMPLES[name]
    from_key = from_conf(**{CONF_PREFIX + name: value})
    from_variable = from_env(
        {"HABEAT_DATABASE_URL": BASE_CONF["habeat_database_url"], setting(name).variable: raw}
    )
    assert getattr(from_key, name) == value != setting(name).default
    # Only the hints differ: they name the variable that was set.
    hints = {"database_setting": from_key.database_setting, "redis_setting": from_key.redis_setting}
    assert replace(from_variable, **hints) == from_key


@pytest.mark.parametrize(("name", "raw", "says"), REFUSED_TEXTS)
def test_a_refused_variable_is_one_line_naming_it_and_the_fix(
    name: str, raw: str, says: str
) -> None:
    variable = setting(name).variable
    message = error_of(lambda: from_env({"HABEAT_DATABASE_URL": "x", variable: raw}))
    assert message.startswith(says)
    assert variable in message


@pytest.mark.parametrize(("name", "value"), REFUSED_VALUES)
def test_a_refused_conf_value_is_one_line_naming_the_key(name: str, value: Any) -> None:
    message = error_of(lambda: from_conf(**{CONF_PREFIX + name: value}))
    assert message.startswith(f"{CONF_PREFIX}{name}={value!r}: ")
    assert message == error_of(lambda: BeatConfig(**{name: value}).validate())


def test_the_heartbeat_must_be_shorter_than_the_lease() -> None:
    message = error_of(lambda: from_conf(habeat_lease_timeout=6, habeat_heartbeat_interval=6))
    assert message.startswith("habeat_heartbeat_interval=6: must be shorter than")
    assert from_conf(habeat_lease_timeout=6, habeat_heartbeat_interval=0).lease_heartbeat == 2


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:pa@ss-Zq7@db:5432/habeat",
        "postgresql+psycopg://app:a/b@ss-Zq7@db/habeat",
        "postgresql+psycopg://app:p:@ss-Zq7@db:5432/habeat",
    ],
)
def test_a_database_password_with_a_bare_at_is_refused_without_showing_it(url: str) -> None:
    """issue 29, finding 8: SQLAlchemy ends the password at its first ``@`` and takes the
    rest for the host, which PostgreSQL's errors then quote."""
    message = error_of(lambda: from_conf(habeat_database_url=url))
    assert message.startswith("habeat_database_url: its password holds an '@'")
    assert "ss-Zq7" not in message


def test_a_prepare_threshold_that_is_no_count_is_refused_naming_the_fix() -> None:
    url = "postgresql+psycopg://app@pgbouncer:6432/habeat?prepare_threshold=off"
    message = error_of(lambda: from_conf(habeat_database_url=url))
    assert message == (
        "habeat_database_url: prepare_threshold='off': give a count of executions, or none"
        " (no prepared statements, for PgBouncer in transaction mode)"
    )
    assert from_conf(habeat_database_url=url.replace("off", "none")).database_url.endswith("none")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:pa%40ss@db:5432/habeat",
        "postgresql+psycopg://app:pw@db/habeat?application_name=ops@example",
        "postgresql+psycopg://app@db/habeat",
    ],
)
def test_a_database_url_read_whole_by_sqlalchemy_is_taken(url: str) -> None:
    assert from_conf(habeat_database_url=url).database_url == url


def test_an_empty_variable_is_unset_and_a_port_of_0_is_none() -> None:
    config = from_env(
        {"HABEAT_DATABASE_URL": "x", "HABEAT_LOCK_TTL": " ", "HABEAT_METRICS_PORT": "0"}
    )
    assert (config.lock_ttl, config.metrics_port) == (10.0, None)
    assert from_conf(habeat_metrics_port=0).metrics_port == 0  # off as well


@pytest.mark.parametrize(
    ("name", "documented", "derived"),
    [
        ("default_timezone", "HABEAT_TIMEZONE", "HABEAT_DEFAULT_TIMEZONE"),
        ("default_misfire_policy", "HABEAT_MISFIRE_POLICY", "HABEAT_DEFAULT_MISFIRE_POLICY"),
        ("default_overlap_policy", "HABEAT_OVERLAP_POLICY", "HABEAT_DEFAULT_OVERLAP_POLICY"),
    ],
)
def test_the_documented_variable_and_habeat_plus_the_key_both_work(
    name: str, documented: str, derived: str
) -> None:
    assert setting(name).variables == (documented, derived)
    raw, value = SAMPLES[name]
    url = {"HABEAT_DATABASE_URL": "x"}
    assert getattr(from_env({**url, documented: raw}), name) == value
    assert getattr(from_env({**url, derived: raw}), name) == value
    default = setting(name).default
    assert getattr(from_env({**url, documented: default, derived: raw}), name) == default


# -- the demo app reads the same table ------------------------------------------------


def test_the_demo_app_fills_app_conf_with_the_tables_defaults() -> None:
    conf = Settings().celery_config()
    defaults = BeatConfig()
    for key, value in conf.items():
        name = key.removeprefix(CONF_PREFIX)
        if key.startswith(CONF_PREFIX) and name not in {"database_setting", "redis_setting"}:
            assert value == getattr(defaults, name), key


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [case for case in REFUSED_TEXTS if case[0] in scheduler_fields().values()],
)
def test_the_demo_app_refuses_a_variable_as_the_scheduler_does(
    name: str, raw: str, says: str
) -> None:
    environ = {setting(name).variable: raw}
    message = error_of(lambda: Settings.from_env(environ))
    assert message == error_of(lambda: from_env({"HABEAT_DATABASE_URL": "x", **environ}))
    assert message.startswith(says)


def test_the_demo_app_reads_each_of_its_variables_as_the_scheduler_does() -> None:
    for field_name, name in scheduler_fields().items():
        raw, value = SAMPLES[name]
        settings = Settings.from_env({setting(name).variable: raw})
        assert getattr(settings, field_name) == value, field_name
        config = BeatConfig.from_celery_conf(settings.celery_config(), environ={})
        assert getattr(config, name) == value, name


# -- the configuration reference shows the table ---------------------------------------


def documented_table() -> str:
    section = CONFIGURATION_DOC.read_text(encoding="utf-8").split("# Configuration\n", 1)[1]
    lines = section.split("\n## ", 1)[0].splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    end = next(
        (index for index, line in enumerate(lines[start:], start) if not line.startswith("|")),
        len(lines),
    )
    return "\n".join(lines[start:end])


def test_the_configuration_reference_shows_the_settings_table() -> None:
    assert documented_table() == markdown_table(), (
        "docs/reference/configuration.md's table differs from beat.config.markdown_table():"
        " paste the output of"
        " `python -c 'from beat.config import markdown_table; print(markdown_table())'`"
    )


# -- the lease renews at the configured interval -----------------------------------------


def test_the_lease_renews_at_the_interval_it_is_given_else_a_third_of_its_ttl() -> None:
    client = redis.Redis()  # never connected: building a lease sends nothing
    assert LeaderLease(client, prefix="p", ttl=9.0).renew_interval == 3.0
    config = BeatConfig(lock_ttl=12.0)
    lease = LeaderLease(
        client, prefix="p", ttl=config.lock_ttl, renew_interval=config.renew_interval
    )
    assert lease.renew_interval == 4.0
    assert LeaderLease(client, prefix="p", ttl=9.0, renew_interval=1.5).renew_interval == 1.5
