"""The paths users write stay where they are, whatever moves inside the package: the
package's exports, the scheduler class Celery loads by name, the module a worker
imports, the settings, and the entry points that register the ``schedules`` command
and the ``ha`` scheduler alias."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import celery.beat

import beat
import beat.config
import beat.worker

EXPORTS = {
    "HABeatError",
    "IdempotentTask",
    "MisfirePolicy",
    "RunState",
    "Schedule",
    "ScheduleDefinition",
    "Schedules",
    "define",
    "periodic",
}


def test_the_package_exports_what_users_import_from_it() -> None:
    assert set(beat.__all__) == EXPORTS
    for name in EXPORTS:
        assert getattr(beat, name) is not None


def test_the_scheduler_class_is_where_celery_beat_is_told_to_find_it() -> None:
    from beat.scheduler import HAScheduler

    assert issubclass(HAScheduler, celery.beat.Scheduler)
    assert "beat.scheduler:HAScheduler" in beat.config.SCHEDULER_NAMES


def test_the_settings_module_keeps_its_readers() -> None:
    assert callable(beat.config.BeatConfig.from_celery_conf)
    assert beat.config.SETTINGS


def test_the_workers_module_installs_its_parts_in_the_same_order() -> None:
    """Importing ``beat.worker`` (through the package's own imports) loads run
    tracking, then the idempotent base, then the poison-message guard: their
    import-time effects (signal handlers, the consumer step) come in that order, as
    before the package was split."""
    assert beat.worker.__all__ == ["poison_messages", "run_tracking", "task"]
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, json; before = set(sys.modules); import beat.worker;"
            " print(json.dumps([m for m in sys.modules if m not in before]))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    order = json.loads(loaded.stdout)
    parts = [beat.worker.run_tracking, beat.worker.task, beat.worker.poison_messages]
    positions = [order.index(part.__name__) for part in parts]
    assert positions == sorted(positions)


def test_the_entry_points_name_the_command_and_the_scheduler_alias() -> None:
    (command,) = entry_points(group="celery.commands", name="schedules")
    (scheduler,) = entry_points(group="celery.beat_schedulers", name="ha")
    assert command.value == "beat.cli:schedules"
    assert scheduler.value == "beat.scheduler:HAScheduler"
    assert command.load().name == "schedules"
    from beat.scheduler import HAScheduler

    assert scheduler.load() is HAScheduler
