"""A schedule defined in code sets its failing monitor: ``beat_schedule`` entries and
``@periodic`` take ``alert_after_failures`` and ``pause_after_failures``; a schedule
that sets neither keeps the hash it had before they existed, so upgrading syncs
nothing anew."""

from __future__ import annotations

from datetime import timedelta

import pytest
from celery import Celery

from beat.errors import ConfigError
from beat.schedule.code import collect, periodic
from tests.unit.schedule.test_crontab import beat_app

#: The hash of that entry (every 60 s of tasks.demo.add, in UTC) by the release before
#: the monitor existed.
HASH_BEFORE_MONITORS = "602ee8ad4ddf0434017360964e6dfb202fa05386655d2de25b81f5d16d9ce1de"


def test_a_beat_schedule_entry_sets_its_thresholds() -> None:
    app = beat_app({"schedule": 60.0, "alert_after_failures": 2, "pause_after_failures": 6})
    [(definition, _)] = collect(app, default_tz="UTC")
    assert (definition.alert_after_failures, definition.pause_after_failures) == (2, 6)


def test_periodic_sets_its_thresholds() -> None:
    app = Celery("code-monitors", set_as_current=False)

    @periodic(every=60, pause_after_failures=3)
    @app.task(name="tests.code_monitors.report")
    def report() -> None: ...

    [(definition, _)] = collect(app, default_tz="UTC")
    assert (definition.alert_after_failures, definition.pause_after_failures) == (None, 3)


def test_a_threshold_out_of_range_in_code_is_refused_naming_the_entry() -> None:
    app = beat_app({"schedule": 60.0, "pause_after_failures": 500})
    with pytest.raises(ConfigError, match="pause_after_failures must be from 0"):
        collect(app, default_tz="UTC")


def test_thresholds_change_the_hash_and_none_keeps_the_one_before() -> None:
    [(_, unset)] = collect(beat_app({"schedule": 60.0}), default_tz="UTC")
    [(_, set_)] = collect(beat_app({"schedule": 60.0, "alert_after_failures": 1}), default_tz="UTC")
    assert unset == HASH_BEFORE_MONITORS
    assert set_ != unset


def test_a_beat_schedule_entry_sets_its_run_monitors_and_channels() -> None:
    entry = {
        "schedule": 60.0,
        "max_runtime": 600,
        "revoke_after_max_runtime": True,
        "late_after": 30,
        "missed_after": 120.0,
        "channels": ["ops-hook"],
    }
    [(definition, hashed)] = collect(beat_app(entry), default_tz="UTC")
    assert definition.max_runtime_seconds == 600
    assert definition.revoke_after_max_runtime is True
    assert (definition.late_after_seconds, definition.missed_after_seconds) == (30, 120)
    assert definition.channels == ("ops-hook",)
    assert hashed != HASH_BEFORE_MONITORS


def test_periodic_sets_its_max_runtime_as_a_timedelta() -> None:
    app = Celery("code-run-monitors", set_as_current=False)

    @periodic(every=60, max_runtime=timedelta(minutes=5), channels=["team"])
    @app.task(name="tests.code_monitors.export")
    def export() -> None: ...

    [(definition, _)] = collect(app, default_tz="UTC")
    assert (definition.max_runtime_seconds, definition.channels) == (300, ("team",))


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"late_after": 0}, "late_after must be a number of seconds >= 1"),
        ({"channels": "ops-hook"}, "channels must be a list of channel names"),
        ({"revoke_after_max_runtime": True}, "needs a max_runtime"),
    ],
)
def test_a_bad_run_monitor_in_code_is_refused_naming_the_fix(
    extra: dict[str, object], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        collect(beat_app({"schedule": 60.0, **extra}), default_tz="UTC")
