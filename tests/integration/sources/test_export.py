"""`schedules export`: the way back to celery beat. The Python it prints defines a
``beat_schedule`` that Celery's own code reads as firing when these schedules fire;
what celery beat cannot express is left out with the reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab

from beat.ops.schedules import Schedules
from beat.store.all_roles import Store
from tests.integration.helpers import invoke

pytestmark = pytest.mark.integration


@pytest.fixture
def schedules(source_app: Celery, store: Store) -> Schedules:
    manager = Schedules(store, app=source_app)
    manager.create("mornings", "tasks.demo.report", cron="0 9 * * 1-5", kwargs={"size": 2})
    manager.create("ten-minutes", "tasks.demo.add", every=600, args=[1, 2], queue="fast")
    manager.create("once", "tasks.demo.add", at=datetime.now(UTC) + timedelta(days=1), args=[3, 4])
    manager.create("paused", "tasks.demo.add", every=60, args=[5, 6], enabled=False)
    manager.create("berlin", "tasks.demo.report", cron="30 6 * * *", tz="Europe/Berlin")
    return manager


def test_the_python_export_is_a_beat_schedule_celery_reads(
    source_app: Celery, schedules: Schedules
) -> None:
    result = invoke(source_app, "export")
    assert result.exit_code == 0, result.stderr
    namespace: dict[str, Any] = {}
    exec(result.stdout, namespace)  # the module a user pastes into the app's settings
    exported = namespace["beat_schedule"]
    assert exported["mornings"] == {
        "task": "tasks.demo.report",
        "schedule": crontab(
            minute="0", hour="9", day_of_month="*", month_of_year="*", day_of_week="1-5"
        ),
        "kwargs": {"size": 2},
    }
    assert exported["ten-minutes"]["schedule"] == timedelta(seconds=600)
    assert exported["ten-minutes"]["options"] == {"queue": "fast"}
    assert set(exported) == {"mornings", "ten-minutes", "berlin"}
    assert "# left out once: a one-off: celery beat has none" in result.stdout
    assert "# left out paused: paused" in result.stdout
    assert (
        "# berlin: its cron is read in Europe/Berlin, celery beat reads it in the app's zone UTC"
        in result.stdout
    )


def test_the_json_export_lists_what_it_leaves_out(source_app: Celery, schedules: Schedules) -> None:
    result = invoke(
        source_app, "export", "--format", "json", "--only", "once", "--only", "mornings"
    )
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["beat_schedule"] == {
        "mornings": {
            "task": "tasks.demo.report",
            "schedule": {
                "crontab": {
                    "minute": "0",
                    "hour": "9",
                    "day_of_month": "*",
                    "month_of_year": "*",
                    "day_of_week": "1-5",
                }
            },
            "kwargs": {"size": 2},
        }
    }
    assert [entry["name"] for entry in document["left_out"]] == ["once"]
