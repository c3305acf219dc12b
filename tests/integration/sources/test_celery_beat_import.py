"""`schedules import celery-beat` with a schedule file written by celery's own
``PersistentScheduler``: the app's ``beat_schedule`` entries keep their last runs and
fire next when celery beat would have, and beat's sync of the code keeps them so."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.beat import PersistentScheduler
from celery.schedules import crontab
from click.testing import Result

from beat.models import Origin
from beat.store.all_roles import Store
from tests.integration.helpers import as_json, error_lines, invoke, table_rows
from tests.integration.sources.oracle import (
    entry_steps,
    last_wall_time,
    our_fires,
    source_fires,
    to_the_second,
)

pytestmark = pytest.mark.integration

ZONE = "Europe/Berlin"

Import = Callable[..., Result]


def now() -> datetime:
    return datetime.now(UTC)


def beat_schedule() -> dict[str, dict[str, Any]]:
    return {
        "every-10-minutes": {"task": "tasks.demo.add", "schedule": 600.0, "args": (1, 2)},
        "quarter-hours": {
            "task": "tasks.demo.add", "schedule": crontab(minute="*/15"), "args": (3, 4)
        },
        # 100 weeks: four changes of summer time, in and out.
        "mornings": {
            "task": "tasks.demo.report", "schedule": crontab(minute=0, hour=9, day_of_week="mon")
        },
        "first-monday": {
            "task": "tasks.demo.report",
            "schedule": crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon"),
        },
        "not-run-yet": {"task": "tasks.demo.add", "schedule": timedelta(hours=2), "args": (5, 6)},
    }  # fmt: skip


def last_runs() -> dict[str, tuple[datetime, int]]:
    moment = now()
    quarter = moment.replace(minute=moment.minute // 15 * 15, second=0, microsecond=0)
    return {
        "every-10-minutes": (moment - timedelta(minutes=3), 4),
        "quarter-hours": (quarter, 3),
        "mornings": (last_wall_time(ZONE, hour=9, minute=0, weekday=0), 2),
        "first-monday": (last_wall_time(ZONE, hour=9, minute=0), 1),
    }


@pytest.fixture
def source_app(source_app: Celery) -> Celery:
    source_app.conf.timezone = ZONE
    source_app.conf.beat_schedule = beat_schedule()
    return source_app


@pytest.fixture
def recorded() -> dict[str, tuple[datetime, int]]:
    """Each entry's last run and run count in the file."""
    return last_runs()


@pytest.fixture
def schedule_file(
    tmp_path: Path, source_app: Celery, recorded: dict[str, tuple[datetime, int]]
) -> Path:
    """The file celery beat keeps, written by its PersistentScheduler: each entry run as
    its beat runs one (``_next_instance``), at the times of :func:`last_runs`."""
    path = tmp_path / "celerybeat-schedule"
    scheduler = PersistentScheduler(app=source_app, schedule_filename=str(path))
    for name, (last_run, runs) in recorded.items():
        for _ in range(runs):
            scheduler.schedule[name] = scheduler.schedule[name]._next_instance(last_run)
    scheduler.sync()
    scheduler.close()
    return path


@pytest.fixture
def run_import(source_app: Celery, schedule_file: Path) -> Import:
    def run(*args: str) -> Result:
        return invoke(
            source_app, "import", "celery-beat", "--schedule-file", str(schedule_file), *args
        )

    return run


def celery_is_due(
    app: Celery, path: Path, name: str
) -> tuple[Callable[[datetime], tuple[bool, float]], Callable[[datetime], None]]:
    """celery beat's own entry as it starts on the file (beat_schedule merged in)."""
    scheduler = PersistentScheduler(app=app, schedule_filename=str(path))
    entry = scheduler.schedule[name]
    scheduler.close()
    return entry_steps(entry, ZONE)


def test_every_entry_fires_next_when_celery_beat_would_have(
    run_import: Import, source_app: Celery, schedule_file: Path, store: Store
) -> None:
    start = now()
    result = run_import()
    assert result.exit_code == 0, result.stderr
    for name in last_runs():
        is_due, ran = celery_is_due(source_app, schedule_file, name)
        theirs = source_fires(is_due, ran, start=start, count=100, horizon=timedelta(days=3660))
        ours = our_fires(store.get_schedule(name), 100)
        assert len(ours) == 100, name
        assert to_the_second(ours) == to_the_second(theirs), name


def test_last_runs_and_run_counts_are_kept_and_beats_sync_keeps_them(
    run_import: Import, source_app: Celery, store: Store, recorded: dict[str, Any]
) -> None:
    assert run_import().exit_code == 0
    imported = {schedule.name: schedule for schedule in store.list_schedules()}
    for name, (last_run, runs) in recorded.items():
        schedule = imported[name]
        assert schedule.definition.origin is Origin.CODE  # type: ignore[union-attr]
        assert (schedule.last_fire_at, schedule.runs_count) == (last_run, runs), name
    not_run = imported["not-run-yet"]
    assert not_run.last_fire_at is None
    assert not_run.runs_count == 0
    synced = as_json(invoke(source_app, "sync", "--json"))
    assert synced["created"] == synced["updated"] == []
    assert store.list_schedules() == list(imported.values())


def test_code_synced_before_the_import_gets_its_history_with_on_conflict_update(
    run_import: Import, source_app: Celery, store: Store, recorded: dict[str, Any]
) -> None:
    as_json(invoke(source_app, "sync", "--json"))  # our beat started before the import
    stopped = run_import()
    assert stopped.exit_code == 2
    assert "a schedule of that name exists, defined in code" in error_lines(stopped)[0]
    assert run_import("--on-conflict", "update").exit_code == 0
    ten = store.get_schedule("every-10-minutes")
    assert (ten.last_fire_at, ten.runs_count) == recorded["every-10-minutes"]
    assert {line["action"] for line in as_json(run_import("--json"))["schedules"]} == {"unchanged"}


def test_a_file_written_with_another_zone_is_refused(
    run_import: Import, source_app: Celery, store: Store
) -> None:
    source_app.conf.timezone = "UTC"
    before = table_rows(store)
    result = run_import()
    assert result.exit_code == 2
    [error] = error_lines(result)
    assert "was written with timezone='Europe/Berlin'" in error
    assert table_rows(store) == before


def test_a_missing_file_is_one_line(source_app: Celery, tmp_path: Path, store: Store) -> None:
    result = invoke(source_app, "import", "celery-beat", "--schedule-file", str(tmp_path / "none"))
    assert result.exit_code == 2
    [error] = error_lines(result)
    assert "cannot read celery beat's schedule file" in error
