"""Settings from the environment, and the defaults they give new schedules."""

from __future__ import annotations

import pytest

from app.factory import create_app
from app.settings import Settings
from beat.code_schedules import collect
from beat.config import BeatConfig
from beat.errors import ConfigError


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
    assert "beat.poison_messages" in app.conf.imports
    config = BeatConfig.from_celery_conf(app.conf)
    assert (config.dead_letter_key, config.dead_letter_max_length) == ("habeat.dead_letter", 0)
