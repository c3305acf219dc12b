"""What `schedules import` does with names: --only, --prefix, and a schedule of the same
name that the import did not make, or that changed since (--on-conflict); shown on a
django-celery-beat source."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from click.testing import Result
from sqlalchemy import text

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import as_json, error_lines, invoke, table_rows
from tests.integration.sources.conftest import DjangoDatabases

pytestmark = pytest.mark.integration


@pytest.fixture
def rows(django_rows: Any) -> Any:
    every = django_rows.IntervalSchedule.objects.create(every=10, period="minutes")
    for name, args in (("alpha", "[1, 2]"), ("beta", "[3, 4]")):
        django_rows.PeriodicTask.objects.create(
            name=name,
            task="tasks.demo.add",
            interval=every,
            args=args,
            last_run_at=datetime.now(UTC) - timedelta(minutes=2),
            total_run_count=5,
        )
    return django_rows


def run(app: Celery, databases: DjangoDatabases, *args: str) -> Result:
    return invoke(app, "import", "django-celery-beat", "--database-url", databases.current, *args)


def actions(result: Result) -> dict[str, str]:
    return {line["name"]: line["action"] for line in as_json(result)["schedules"]}


def test_only_and_prefix_choose_and_rename(
    rows: Any, source_app: Celery, django_databases: DjangoDatabases, store: Store
) -> None:
    result = run(source_app, django_databases, "--only", "beta", "--prefix", "old-", "--json")
    assert actions(result) == {"old-beta": "create"}
    assert [schedule.name for schedule in store.list_schedules()] == ["old-beta"]
    missing = run(source_app, django_databases, "--only", "gamma")
    assert missing.exit_code == 2
    assert error_lines(missing) == [
        "Error: --only 'gamma': the source has no schedule of that name (its names are listed"
        " by a --dry-run without --only)"
    ]


def test_a_schedule_made_here_is_kept_skipped_or_written_over_as_told(
    rows: Any, source_app: Celery, django_databases: DjangoDatabases, store: Store
) -> None:
    Schedules(store, app=source_app).create("alpha", "tasks.demo.report", cron="0 * * * *")
    before = table_rows(store)
    stopped = run(source_app, django_databases)
    assert stopped.exit_code == 2
    assert error_lines(stopped) == [
        f"Error: alpha ({rows.PeriodicTask.objects.get(name='alpha').id}): a schedule of that"
        " name exists, made here: give --on-conflict update to write over it, or skip to keep"
        " it"
    ]
    assert table_rows(store) == before
    skipped = run(source_app, django_databases, "--on-conflict", "skip", "--json")
    assert actions(skipped) == {"alpha": "skip", "beta": "create"}
    assert store.get_schedule("alpha").definition.task == "tasks.demo.report"
    updated = run(source_app, django_databases, "--on-conflict", "update", "--json")
    assert actions(updated) == {"alpha": "update", "beta": "unchanged"}
    alpha = store.get_schedule("alpha")
    assert (alpha.definition.task, alpha.runs_count) == ("tasks.demo.add", 5)
    assert actions(run(source_app, django_databases, "--json")) == {
        "alpha": "unchanged",
        "beta": "unchanged",
    }


def test_an_update_keeps_the_history_made_here_since_the_import(
    rows: Any, source_app: Celery, django_databases: DjangoDatabases, store: Store
) -> None:
    assert run(source_app, django_databases).exit_code == 0
    # It ran here since, twice, as a claim records it.
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE beat_schedules SET last_fire_at = next_fire_at,"
                " next_fire_at = next_fire_at + interval '20 minutes',"
                " runs_count = runs_count + 2 WHERE name = 'alpha'"
            )
        )
    ran_here = store.get_schedule("alpha")
    rows.PeriodicTask.objects.filter(name="alpha").update(args="[7, 8]")
    assert actions(run(source_app, django_databases, "--on-conflict", "update", "--json")) == {
        "alpha": "update",
        "beta": "unchanged",
    }
    alpha = store.get_schedule("alpha")
    assert alpha.definition.args == (7, 8)
    assert (alpha.next_fire_at, alpha.last_fire_at, alpha.runs_count) == (
        ran_here.next_fire_at,
        ran_here.last_fire_at,
        7,
    )
