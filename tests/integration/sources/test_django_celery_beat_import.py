"""`schedules import django-celery-beat` against a database made by django-celery-beat
itself (its migrations, its models): every kind of row keeps its meaning and its
history, so that the fire times after the import are the ones django-celery-beat's
own scheduler would have used next."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from click.testing import Result

from beat.models import Origin, Schedule
from beat.schedule.timing import Cron, Every, Once
from beat.store.all_roles import Store
from tests.integration.helpers import as_json, error_lines, invoke, table_rows
from tests.integration.sources.checks import assert_importing_again_changes_nothing
from tests.integration.sources.conftest import DjangoDatabases
from tests.integration.sources.oracle import (
    assert_same_fires,
    last_wall_time,
    our_fires,
    source_fires,
)

pytestmark = pytest.mark.integration

Import = Callable[..., Result]

#: A wait past any horizon: the entry never fires again.
NEVER = 1e10


@pytest.fixture
def run_import(source_app: Celery, django_databases: DjangoDatabases) -> Import:
    def run(*args: str, url: str | None = None) -> Result:
        return invoke(
            source_app,
            "import",
            "django-celery-beat",
            "--database-url",
            url or django_databases.current,
            *args,
        )

    return run


def now() -> datetime:
    return datetime.now(UTC)


def crontab(models: Any, zone: str = "UTC", **fields: Any) -> Any:
    spec = {"minute": "*", "hour": "*", "day_of_week": "*", "day_of_month": "*"}
    spec |= {"month_of_year": "*"} | fields
    return models.CrontabSchedule.objects.create(timezone=zone, **spec)


def interval(models: Any, every: int, period: str) -> Any:
    return models.IntervalSchedule.objects.create(every=every, period=period)


def periodic(models: Any, name: str, **fields: Any) -> Any:
    return models.PeriodicTask.objects.create(
        name=name, task=fields.pop("task", "tasks.demo.add"), **fields
    )


def every_kind(models: Any) -> dict[str, Any]:
    """A row of every kind django-celery-beat has, each with a history that puts its
    next fire time ahead (none due at the import)."""
    moment = now()
    quarter = moment.replace(minute=moment.minute // 15 * 15, second=0, microsecond=0)
    return {
        "interval-10m": periodic(
            models,
            "interval-10m",
            interval=interval(models, 10, "minutes"),
            last_run_at=now() - timedelta(minutes=3),
            total_run_count=41,
            args="[1, 2]",
        ),
        "daily-interval": periodic(
            models,
            "daily-interval",
            interval=interval(models, 1, "days"),
            last_run_at=now() - timedelta(hours=20),
            total_run_count=7,
            args="[3, 4]",
        ),
        "quarter-hours-berlin": periodic(
            models,
            "quarter-hours-berlin",
            crontab=crontab(models, "Europe/Berlin", minute="*/15"),
            last_run_at=quarter,
            total_run_count=1000,
            args="[5, 6]",
        ),
        "mornings-berlin": periodic(
            models,
            "mornings-berlin",
            crontab=crontab(models, "Europe/Berlin", minute="0", hour="9"),
            last_run_at=last_wall_time("Europe/Berlin", hour=9, minute=0),
            total_run_count=300,
            task="tasks.demo.report",
            kwargs='{"size": 5}',
        ),
        "nights-new-york": periodic(
            models,
            "nights-new-york",
            crontab=crontab(models, "America/New_York", minute="30", hour="1"),
            last_run_at=last_wall_time("America/New_York", hour=1, minute=30),
            total_run_count=12,
            task="tasks.demo.report",
        ),
        # 100 weeks: four changes of summer time, in and out.
        "monday-mornings-berlin": periodic(
            models,
            "monday-mornings-berlin",
            crontab=crontab(models, "Europe/Berlin", minute="0", hour="9", day_of_week="mon"),
            last_run_at=last_wall_time("Europe/Berlin", hour=9, minute=0, weekday=0),
            total_run_count=52,
            task="tasks.demo.report",
        ),
        # Sundays at 02:30: the changes of summer time in Europe fall on Sunday at 02:00.
        "sunday-nights-berlin": periodic(
            models,
            "sunday-nights-berlin",
            crontab=crontab(models, "Europe/Berlin", minute="30", hour="2", day_of_week="sun"),
            last_run_at=last_wall_time("Europe/Berlin", hour=2, minute=30, weekday=6),
            total_run_count=9,
            task="tasks.demo.report",
        ),
        # Celery's crontab: a day must match both day fields (the first Monday).
        "first-monday": periodic(
            models,
            "first-monday",
            crontab=crontab(
                models, "Europe/Berlin", minute="0", hour="9", day_of_month="1-7", day_of_week="mon"
            ),
            task="tasks.demo.report",
        ),
        "clocked": periodic(
            models,
            "clocked",
            clocked=models.ClockedSchedule.objects.create(clocked_time=now() + timedelta(days=2)),
            one_off=True,
            args="[7, 8]",
        ),
        "starts-later": periodic(
            models,
            "starts-later",
            interval=interval(models, 30, "minutes"),
            start_time=now() + timedelta(hours=5, seconds=30),
            args="[9, 10]",
        ),
        "crontab-starts-later": periodic(
            models,
            "crontab-starts-later",
            crontab=crontab(models, "UTC", minute="0", hour="*/6"),
            start_time=now() + timedelta(hours=3, minutes=7),
            task="tasks.demo.report",
        ),
        "expires": periodic(
            models,
            "expires",
            interval=interval(models, 1, "hours"),
            last_run_at=now() - timedelta(minutes=10),
            expires=now() + timedelta(hours=30, minutes=5),
            args="[11, 12]",
        ),
        "one-off-crontab": periodic(
            models,
            "one-off-crontab",
            crontab=crontab(models, "UTC", minute="0", hour="4"),
            one_off=True,
            task="tasks.demo.report",
        ),
    }


def django_is_due(
    model: Any, app: Celery
) -> tuple[Callable[[datetime], tuple[bool, float]], Callable[[datetime], None]]:
    """django-celery-beat's own entry for ``model``, on a clock the test moves."""
    from django_celery_beat.schedulers import ModelEntry

    clock = [now()]
    entry = ModelEntry(model, app=app)
    entry._default_now = lambda: clock[0]
    schedule = entry.schedule
    schedule.nowfun = lambda: clock[0].astimezone(getattr(schedule, "tz", UTC))

    def is_due(at: datetime) -> tuple[bool, float]:
        clock[0] = at
        if not model.enabled:
            return False, NEVER  # it disabled itself (a one-off that ran, an expired task)
        due, wait = entry.is_due()
        start = model.start_time
        if start is not None and at < start:
            # Its beat wakes at least every 5 s (DatabaseScheduler's max_interval): it
            # finds the entry due as soon as start_time has come.
            wait = min(wait, (start - at).total_seconds())
        return bool(due), float(wait)

    def ran(at: datetime) -> None:
        entry.last_run_at = at
        model.total_run_count += 1

    return is_due, ran


def imported(store: Store, name: str) -> Schedule:
    return store.get_schedule(name)


# -- the meaning and the history of every kind ---------------------------------------------


def test_every_kind_of_row_fires_next_when_django_celery_beat_would_have(
    run_import: Import, django_rows: Any, store: Store, source_app: Celery
) -> None:
    rows = every_kind(django_rows)
    start = now()
    result = run_import()
    assert result.exit_code == 0, result.stderr
    for name, row in rows.items():
        row.refresh_from_db()
        is_due, ran = django_is_due(row, source_app)
        theirs = source_fires(is_due, ran, start=start, count=100, horizon=timedelta(days=3660))
        schedule = imported(store, name)
        ours = our_fires(schedule, 100)
        assert_same_fires(ours, theirs, schedule.definition.timezone, name)
        # The one-offs fire once; "expires" 30 times, hourly until it expires.
        assert len(ours) == {"clocked": 1, "one-off-crontab": 1, "expires": 30}.get(name, 100)


def test_history_and_options_are_carried_over(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    rows = every_kind(django_rows)
    periodic(
        django_rows,
        "routed",
        interval=interval(django_rows, 5, "minutes"),
        queue="reports",
        exchange="jobs",
        routing_key="reports.daily",
        priority=7,
        headers='{"tenant": "acme"}',
        expire_seconds=120,
        args="[1, 2]",
        description="Daily reports, routed to their own workers",
    )
    assert run_import().exit_code == 0
    quarter = imported(store, "quarter-hours-berlin")
    assert quarter.runs_count == 1000
    assert quarter.last_fire_at == rows["quarter-hours-berlin"].last_run_at
    assert quarter.definition.trigger == Cron(expression="*/15 * * * *", both_days=True)
    assert quarter.definition.timezone == "Europe/Berlin"
    first_monday = imported(store, "first-monday").definition.trigger
    assert first_monday == Cron(expression="0 9 1-7 * 1", both_days=True)
    ten = imported(store, "interval-10m")
    assert ten.definition.trigger == Every(seconds=600, anchor=ten.next_fire_at)  # type: ignore[arg-type]
    assert ten.next_fire_at == rows["interval-10m"].last_run_at + timedelta(minutes=10)
    assert ten.definition.args == (1, 2)
    assert isinstance(imported(store, "clocked").definition.trigger, Once)
    assert imported(store, "one-off-crontab").definition.max_runs == 1
    assert imported(store, "routed").description == "Daily reports, routed to their own workers"
    routed = imported(store, "routed").definition
    assert routed.options == {
        "queue": "reports",
        "exchange": "jobs",
        "routing_key": "reports.daily",
        "priority": 7,
        "headers": {"tenant": "acme", "periodic_task_name": "routed"},
        "expires": 120,
    }
    with store.engine.connect() as conn:
        sources = dict(
            conn.exec_driver_sql(
                "SELECT name, source || ' ' || source_id FROM beat_schedules WHERE name = 'routed'"
            ).all()
        )
    routed_id = django_rows.PeriodicTask.objects.get(name="routed").id
    assert sources == {"routed": f"django-celery-beat {routed_id}"}


def test_a_schedule_due_while_no_beat_ran_fires_once_at_the_import(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    periodic(
        django_rows,
        "overdue",
        interval=interval(django_rows, 10, "minutes"),
        last_run_at=now() - timedelta(hours=2),
        total_run_count=3,
    )
    before = now()
    assert run_import().exit_code == 0
    overdue = imported(store, "overdue")
    # Django's beat would run it at its first tick, then every 10 minutes from then.
    assert before - timedelta(seconds=5) <= overdue.next_fire_at <= now()  # type: ignore[operator]
    assert our_fires(overdue, 2)[1] == overdue.next_fire_at + timedelta(minutes=10)  # type: ignore[operator]


def test_a_one_off_that_ran_never_fires_again(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    ran_at = now() - timedelta(hours=1)
    periodic(
        django_rows,
        "ran-once",
        clocked=django_rows.ClockedSchedule.objects.create(clocked_time=ran_at),
        one_off=True,
        last_run_at=ran_at,
        total_run_count=1,
    )
    disabled = periodic(
        django_rows,
        "ran-and-disabled",
        clocked=django_rows.ClockedSchedule.objects.create(clocked_time=ran_at),
        one_off=True,
    )
    # As django-celery-beat's scheduler leaves a row it disabled (save() would clear it).
    django_rows.PeriodicTask.objects.filter(id=disabled.id).update(
        enabled=False, last_run_at=ran_at
    )
    assert run_import().exit_code == 0
    for name in ("ran-once", "ran-and-disabled"):
        schedule = imported(store, name)
        assert (schedule.next_fire_at, schedule.definition.enabled) == (None, False), name
        assert schedule.last_fire_at == ran_at


# -- once and only once --------------------------------------------------------------------


def test_importing_twice_changes_nothing(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    every_kind(django_rows)
    assert_importing_again_changes_nothing(run_import, store)


def test_a_dry_run_writes_nothing_and_says_what_it_would_do(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    every_kind(django_rows)
    before = table_rows(store)
    result = run_import("--dry-run")
    assert result.exit_code == 0, result.stderr
    assert table_rows(store) == before
    lines = result.stdout.splitlines()
    assert lines[0].startswith("import from django-celery-beat tables at postgresql://")
    assert "(dry run, nothing written)" in lines[0]
    assert lines[-1] == (
        "13 to create, 0 to update, 0 unchanged, 0 skipped, 0 in conflict, 0 refused"
    )
    print(result.stdout)


# -- bad input: one line, exit 2, nothing written ------------------------------------------


def assert_refused(result: Result, store: Store, before: list[Any], *expected: str) -> None:
    assert result.exit_code == 2, result.stdout + result.stderr
    errors = error_lines(result)
    assert errors, result.stderr
    for text in expected:
        assert any(text in line for line in errors), (text, errors)
    assert table_rows(store) == before


def test_an_unreachable_database_is_one_line(run_import: Import, store: Store) -> None:
    before = table_rows(store)
    result = run_import(url="postgresql://postgres@127.0.0.1:1/nowhere")
    assert_refused(result, store, before, "cannot read the django-celery-beat tables at")
    assert len(error_lines(result)) == 1


def test_tables_of_another_schema_version_are_refused(
    run_import: Import, django_databases: DjangoDatabases, store: Store
) -> None:
    before = table_rows(store)
    result = run_import(url=django_databases.older)
    assert_refused(
        result,
        store,
        before,
        "django_celery_beat_periodictask has no column expire_seconds",
        "python manage.py migrate django_celery_beat",
    )


def test_a_crontab_that_does_not_parse_stops_the_import(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    every_kind(django_rows)
    periodic(django_rows, "broken", crontab=crontab(django_rows, minute="75"))
    before = table_rows(store)
    assert_refused(run_import(), store, before, "broken (", "does not parse")


def test_a_task_the_app_does_not_know_stops_the_import(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    periodic(django_rows, "typo", interval=interval(django_rows, 1, "hours"), task="tasks.demo.ad")
    before = table_rows(store)
    assert_refused(run_import(), store, before, "typo (", "'tasks.demo.ad' is not registered")


def test_skip_invalid_imports_the_rest_and_lists_each_refusal(
    run_import: Import, django_rows: Any, store: Store
) -> None:
    every_kind(django_rows)
    periodic(
        django_rows,
        "sunrise",
        solar=django_rows.SolarSchedule.objects.create(
            event="sunrise", latitude=52.5, longitude=13.4
        ),
    )
    periodic(django_rows, "typo", interval=interval(django_rows, 1, "hours"), task="tasks.demo.ad")
    result = run_import("--skip-invalid")
    assert result.exit_code == 0, result.stderr
    refused = [line for line in result.stdout.splitlines() if line.startswith("refuse")]
    assert len(refused) == 2
    assert "SolarSchedule (sunrise) is not supported" in refused[0]
    assert "not registered" in refused[1]
    assert len(store.list_schedules()) == 13


def test_an_entry_of_the_apps_beat_schedule_stays_in_code_with_its_history(
    run_import: Import, django_rows: Any, store: Store, source_app: Celery
) -> None:
    from celery.schedules import crontab as celery_crontab
    from django_celery_beat.schedulers import ModelEntry

    entry = {"task": "tasks.demo.report", "schedule": celery_crontab(minute="*/30")}
    source_app.conf.beat_schedule = {"half-hours": entry}
    # As django-celery-beat's DatabaseScheduler copies beat_schedule into its table.
    ModelEntry.from_entry("half-hours", app=source_app, **entry)
    moment = now()
    last_run = moment.replace(minute=moment.minute // 30 * 30, second=0, microsecond=0)
    django_rows.PeriodicTask.objects.filter(name="half-hours").update(
        last_run_at=last_run, total_run_count=17
    )
    assert run_import("--prefix", "dj-").exit_code == 0
    half_hours = imported(store, "half-hours")  # its name in code, not prefixed
    assert half_hours.definition.origin is Origin.CODE
    assert (half_hours.last_fire_at, half_hours.runs_count) == (last_run, 17)
    assert half_hours.next_fire_at == last_run + timedelta(minutes=30)
    synced = as_json(invoke(source_app, "sync", "--json"))
    assert synced["unchanged"] == ["half-hours"]
    assert imported(store, "half-hours") == half_hours
