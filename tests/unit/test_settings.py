"""Settings from the environment, and the defaults they give new schedules."""

from __future__ import annotations

import kombu
import pytest
from celery import Celery

from app.factory import create_app
from app.settings import Settings
from beat.config import BeatConfig, uses_this_scheduler
from beat.errors import ConfigError
from beat.schedule.code import collect


def config_from(env: dict[str, str]) -> BeatConfig:
    return BeatConfig.from_celery_conf(create_app(Settings.from_env(env)).conf)


def test_policy_defaults_come_from_the_environment() -> None:
    config = config_from({"HABEAT_MISFIRE_POLICY": "skip", "HABEAT_OVERLAP_POLICY": "queue_one"})
    assert config.schedule_defaults() == {"misfire_policy": "skip", "overlap_policy": "queue_one"}


def test_a_bad_policy_default_names_the_setting() -> None:
    with pytest.raises(ConfigError, match="habeat_default_overlap_policy='sometimes': use one of"):
        config_from({"HABEAT_OVERLAP_POLICY": "sometimes"})


def test_code_schedules_take_the_defaults_unless_they_say_otherwise() -> None:
    app = create_app(Settings())
    app.conf.beat_schedule = {
        "a": {"task": "t", "schedule": 10.0},
        "b": {"task": "t", "schedule": 10.0, "overlap_policy": "allow"},
    }
    defaults = {"misfire_policy": "fire_all", "overlap_policy": "skip"}
    found = {d.name: d for d, _ in collect(app, default_tz="UTC", defaults=defaults)}
    assert (found["a"].misfire_policy.value, found["a"].overlap_policy.value) == (
        "fire_all",
        "skip",
    )
    assert found["b"].overlap_policy.value == "allow"


@pytest.mark.parametrize("name", ["HABEAT_LOCK_TTL", "HABEAT_LEASE_TIMEOUT"])
def test_a_setting_that_is_not_a_number_is_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}='soon' is not a number"):
        Settings.from_env({name: "soon"})


def test_workers_install_the_poison_message_guard_and_size_its_dead_letter_list() -> None:
    app = create_app(Settings.from_env({"HABEAT_DEAD_LETTER_MAX_LENGTH": "0"}))
    assert "beat.worker" in app.conf.imports
    config = BeatConfig.from_celery_conf(app.conf)
    assert (config.dead_letter_key, config.dead_letter_max_length) == ("habeat.dead_letter", 0)


def test_a_reconnected_threads_worker_never_sends_basic_qos_from_a_pool_thread() -> None:
    # Celery's prefetch restore after a reconnect runs in the acknowledgement's callback,
    # on a pool thread of the threads pool, beside the consumer's own basic.qos on the same
    # py-amqp channel: the worker hung for good (RabbitMQ chaos, seed 5, twice).
    conf = create_app(Settings.from_env({})).conf
    assert conf.worker_enable_prefetch_count_reduction is False
    assert conf.worker_cancel_long_running_tasks_on_connection_loss is True


# -- an existing project's app: app.conf first, then the environment ---------------------


def bare_app(**conf: object) -> Celery:
    app = Celery("theirs")
    app.conf.update(conf)
    return app


def test_an_app_that_names_no_database_is_refused_with_the_settings_that_work() -> None:
    with pytest.raises(ConfigError) as refused:
        BeatConfig.from_celery_conf(bare_app(broker_url="redis://h/1").conf, environ={})
    message = str(refused.value)
    assert "set habeat_database_url in the app's configuration" in message
    assert "HABEAT_DATABASE_URL in the environment" in message
    assert "\n" not in message


def test_app_conf_comes_before_the_environment() -> None:
    app = bare_app(broker_url="redis://h/1", habeat_database_url="postgresql://conf/db")
    config = BeatConfig.from_celery_conf(
        app.conf, environ={"HABEAT_DATABASE_URL": "postgresql://env/db", "HABEAT_LOCK_TTL": "7"}
    )
    assert config.database_url == "postgresql://conf/db"
    assert config.database_setting == "habeat_database_url"
    assert config.lock_ttl == 7.0


def test_the_environment_fills_what_app_conf_leaves_out_and_hints_name_it() -> None:
    config = BeatConfig.from_celery_conf(
        bare_app(broker_url="amqp://guest@h//").conf,
        environ={
            "HABEAT_DATABASE_URL": "postgresql://env/db",
            "HABEAT_REDIS_URL": "redis://lease/2",
            "HABEAT_CLAIM_BATCH": "50",
        },
    )
    assert (config.database_url, config.redis_url, config.claim_batch) == (
        "postgresql://env/db",
        "redis://lease/2",
        50,
    )
    assert (config.database_setting, config.redis_setting) == (
        "HABEAT_DATABASE_URL",
        "HABEAT_REDIS_URL",
    )


def test_the_lease_uses_a_redis_broker_unless_told_otherwise() -> None:
    app = bare_app(broker_url="redis://broker:6379/3", habeat_database_url="postgresql://d/b")
    assert BeatConfig.from_celery_conf(app.conf, environ={}).redis_url == "redis://broker:6379/3"


def test_a_broker_that_is_not_redis_needs_a_lease_redis() -> None:
    app = bare_app(broker_url="amqp://guest@h//", habeat_database_url="postgresql://d/b")
    with pytest.raises(ConfigError, match=r"habeat_redis_url.*HABEAT_REDIS_URL"):
        BeatConfig.from_celery_conf(app.conf, environ={})


def test_a_bad_number_in_the_environment_names_the_variable() -> None:
    app = bare_app(broker_url="redis://h/1", habeat_database_url="postgresql://d/b")
    with pytest.raises(ConfigError, match=r"HABEAT_CLAIM_BATCH='many' is not a number"):
        BeatConfig.from_celery_conf(app.conf, environ={"HABEAT_CLAIM_BATCH": "many"})


def test_django_settings_with_the_celery_namespace_are_read() -> None:
    class DjangoSettings:
        CELERY_BROKER_URL = "redis://h/4"
        CELERY_HABEAT_DATABASE_URL = "postgresql://django/db"
        CELERY_HABEAT_LOCK_TTL = 12

    app = Celery("django_project")
    app.config_from_object(DjangoSettings, namespace="CELERY")
    config = BeatConfig.from_celery_conf(app.conf, environ={})
    assert (config.database_url, config.lock_ttl, config.redis_url) == (
        "postgresql://django/db",
        12,
        "redis://h/4",
    )


class OldStyleDjangoSettings:
    """Settings as Sentry writes them: Celery's old names, loaded without a namespace."""

    BROKER_URL = "redis://h/5"
    CELERY_TIMEZONE = "Europe/Berlin"
    CELERYBEAT_SCHEDULE = {"x": {"task": "t", "schedule": 60}}
    CELERY_HABEAT_DATABASE_URL = "postgresql://sentry/db"
    CELERY_HABEAT_LOCK_TTL = 9


def test_django_settings_loaded_without_a_namespace_are_read_as_celery_reads_them() -> None:
    """issue 36, finding 3: app.config_from_object(settings) with old-style names
    (CELERYBEAT_SCHEDULE, CELERY_*): CELERY_HABEAT_* is read as Celery reads
    CELERY_TIMEZONE there, and an app that sets none is told that key."""
    app = Celery("sentry_like")
    app.config_from_object(OldStyleDjangoSettings)
    config = BeatConfig.from_celery_conf(app.conf, environ={})
    assert (config.database_url, config.lock_ttl, config.redis_url) == (
        "postgresql://sentry/db",
        9,
        "redis://h/5",
    )
    assert config.database_setting == "CELERY_HABEAT_DATABASE_URL", "hints name it so"
    assert uses_this_scheduler(app.conf, environ={})

    class Unset(OldStyleDjangoSettings):
        CELERY_HABEAT_DATABASE_URL = None

    bare = Celery("sentry_like")
    bare.config_from_object(Unset)
    with pytest.raises(ConfigError, match="set CELERY_HABEAT_DATABASE_URL in the app's"):
        BeatConfig.from_celery_conf(bare.conf, environ={})


def test_a_namespaced_app_is_told_its_namespaced_key() -> None:
    """issue 36, finding 3: the key named is the one this app reads."""
    app = Celery("django_project")
    app.config_from_object({"CELERY_BROKER_URL": "redis://h/4"}, namespace="CELERY")
    with pytest.raises(ConfigError, match="set CELERY_HABEAT_DATABASE_URL in the app's"):
        BeatConfig.from_celery_conf(app.conf, environ={})


def test_this_projects_app_names_its_own_variables_in_hints() -> None:
    config = config_from({"DATABASE_URL": "postgresql://x/y"})
    assert (config.database_setting, config.redis_setting) == ("DATABASE_URL", "REDIS_URL")


@pytest.mark.parametrize(
    ("conf", "environ", "expected"),
    [
        ({}, {}, False),
        ({"beat_scheduler": "celery.beat:PersistentScheduler"}, {}, False),
        ({"beat_scheduler": "ha"}, {}, True),
        ({"beat_scheduler": "beat.scheduler:HAScheduler"}, {}, True),
        ({"habeat_database_url": "postgresql://d/b"}, {}, True),
        ({}, {"HABEAT_DATABASE_URL": "postgresql://d/b"}, True),
        ({}, {"DATABASE_URL": "postgresql://django/app"}, False),
    ],
)
def test_workers_of_other_apps_are_left_alone(
    conf: dict[str, str], environ: dict[str, str], expected: bool
) -> None:
    assert uses_this_scheduler(bare_app(**conf).conf, environ) is expected


def test_a_sentinel_broker_gets_the_primarys_name_as_kombu_reads_it() -> None:
    """kombu reads ``master_name`` from the transport options; left in the URL, it
    stops a worker with a TypeError when kombu fails over to the next sentinel."""
    url = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26379/0?master_name=beat"
    conf = Settings(redis_url=url, broker_url=url).celery_config()
    assert conf["broker_transport_options"]["master_name"] == "beat"
    kombu_url = "sentinel://10.0.0.1:26379/0;sentinel://10.0.0.2:26379/0"
    assert conf["broker_url"] == conf["broker_read_url"] == conf["broker_write_url"] == kombu_url
    assert conf["habeat_redis_url"] == url, "the lease reads the name from its URL"


@pytest.mark.parametrize(
    "url",
    [
        "sentinel://:s3cret@a:26379;sentinel://b:26380/3?master_name=beat",
        "sentinel://a:26379/3?master_name=beat;sentinel://:s3cret@b:26380",
        "sentinel://a:26379;sentinel://:s3cret@b:26380/3?master_name=beat&ssl_cert_reqs=none",
    ],
)
def test_kombu_fails_over_through_every_sentinel_on_one_database_with_one_password(
    url: str,
) -> None:
    """kombu reads the database, password and query of the URL it switches to at each
    connection error: a part that gave them alone would move a worker to another
    database at the failover, or stop it (a parameter kombu takes as an argument)."""
    conf = Settings(redis_url=url, broker_url=url).celery_config()
    connection = kombu.Connection(
        conf["broker_url"], transport_options=conf["broker_transport_options"]
    )
    seen = set()
    for alternate in [*connection.alt, *connection.alt]:
        connection.switch(alternate)  # what kombu does at a failover
        seen.add((connection.virtual_host, connection.password, str(connection.ssl)))
    assert len(seen) == 1, seen
    [(database, password, _)] = seen
    assert (database, password) == ("3", "s3cret")


def test_a_sentinel_broker_parameter_kombu_would_choke_on_is_refused_naming_the_fix() -> None:
    url = "sentinel://a:26379;sentinel://b:26380/0?master_name=beat&socket_timeout=2"
    with pytest.raises(ConfigError, match=r"\?socket_timeout=.*broker_transport_options"):
        Settings(redis_url=url, broker_url=url).celery_config()


@pytest.mark.parametrize(
    ("broker", "options", "lease"),
    [
        (
            "sentinel://a:26379;sentinel://b:26379/0",
            {"master_name": "beat"},
            "sentinel://a:26379;sentinel://b:26379/0?master_name=beat",
        ),
        (
            "sentinel://a:26379;sentinel://b:26379/0?master_name=beat",
            {},
            "sentinel://a:26379;sentinel://b:26379/0?master_name=beat",
        ),
        ("redis://a:6379/1;redis://b:6379/1", {}, "redis://a:6379/1"),
    ],
)
def test_the_lease_follows_a_redis_or_sentinel_broker(
    broker: str, options: dict[str, str], lease: str
) -> None:
    app = bare_app(
        broker_url=broker, broker_transport_options=options, habeat_database_url="postgresql://d/b"
    )
    assert BeatConfig.from_celery_conf(app.conf, environ={}).redis_url == lease
