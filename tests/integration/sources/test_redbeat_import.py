"""`schedules import redbeat` against entries saved by RedBeat itself
(``RedBeatSchedulerEntry.save()``, and its own step after a run for the run count):
each keeps its meaning and history, and fires next when RedBeat's scheduler would
have fired it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from celery.schedules import crontab, schedule
from click.testing import Result

from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import error_lines, invoke, table_rows
from tests.integration.sources.checks import assert_importing_again_changes_nothing
from tests.integration.sources.oracle import (
    entry_steps,
    last_wall_time,
    our_fires,
    source_fires,
    to_the_second,
)

pytestmark = [
    pytest.mark.integration,
    # RedBeat warns of its own settings it will stop reading (broker_transport_options).
    pytest.mark.filterwarnings("ignore::DeprecationWarning:redbeat"),
]

ZONE = "Europe/Berlin"

Import = Callable[..., Result]


@pytest.fixture
def redbeat_app(test_env: SessionEnv, redbeat_prefix: str) -> Celery:
    """The app RedBeat ran with: its Redis, its key prefix, its zone."""
    app = Celery("redbeat-source", set_as_current=False)
    app.conf.update(
        redbeat_redis_url=test_env.redis_url,
        redbeat_key_prefix=redbeat_prefix,
        redbeat_redis_options={},
        broker_url=test_env.redis_url,
        timezone=ZONE,
    )
    return app


@pytest.fixture
def run_import(source_app: Celery, test_env: SessionEnv, redbeat_prefix: str) -> Import:
    source_app.conf.timezone = ZONE  # the app moved keeps the zone RedBeat read crontabs in

    def run(*args: str, prefix: str = redbeat_prefix) -> Result:
        return invoke(
            source_app,
            "import",
            "redbeat",
            "--redis-url",
            test_env.redis_url,
            "--key-prefix",
            prefix,
            *args,
        )

    return run


def now() -> datetime:
    return datetime.now(UTC)


def save(
    app: Celery, name: str, every: Any, *, last_run: datetime | None, runs: int = 0, **fields: Any
) -> Any:
    """An entry saved as RedBeat saves one; with a last run, stepped as RedBeat's beat
    steps it after running it (its meta then holds the run count)."""
    from redbeat import RedBeatSchedulerEntry

    entry = RedBeatSchedulerEntry(
        name,
        fields.pop("task", "tasks.demo.add"),
        every,
        app=app,
        total_run_count=max(runs - 1, 0),
        **fields,
    )
    entry.save()
    if last_run is not None:
        entry = entry._next_instance(last_run_at=last_run)
    return entry


def last_quarter() -> datetime:
    moment = now()
    return moment.replace(minute=moment.minute // 15 * 15, second=0, microsecond=0)


def every_kind(app: Celery) -> dict[str, Any]:
    return {
        "interval-10m": save(
            app, "interval-10m", schedule(timedelta(minutes=10)),
            last_run=now() - timedelta(minutes=3), runs=41, args=[1, 2],
            options={"queue": "reports", "priority": 3},
        ),
        "quarter-hours": save(
            app, "quarter-hours", crontab(minute="*/15"), last_run=last_quarter(), runs=1000,
            args=[3, 4],
        ),
        # 100 weeks: four changes of summer time, in and out.
        "mornings": save(
            app, "mornings", crontab(minute=0, hour=9, day_of_week="mon"), runs=300,
            last_run=last_wall_time(ZONE, hour=9, minute=0, weekday=0),
            task="tasks.demo.report", kwargs={"size": 5},
        ),
        "first-monday": save(
            app, "first-monday", crontab(minute=0, hour=9, day_of_month="1-7", day_of_week="mon"),
            last_run=last_wall_time(ZONE, hour=9, minute=0), runs=2, task="tasks.demo.report",
        ),
    }  # fmt: skip


def redbeat_is_due(
    key: str, app: Celery
) -> tuple[Callable[[datetime], tuple[bool, float]], Callable[[datetime], None]]:
    """RedBeat's own entry, read back from Redis, on a clock the test moves."""
    from redbeat import RedBeatSchedulerEntry

    entry = RedBeatSchedulerEntry.from_key(key, app=app)
    return entry_steps(entry, ZONE)


def test_every_kind_of_entry_fires_next_when_redbeat_would_have(
    run_import: Import, redbeat_app: Celery, store: Store
) -> None:
    entries = every_kind(redbeat_app)
    start = now()
    result = run_import()
    assert result.exit_code == 0, result.stderr
    for name, entry in entries.items():
        is_due, ran = redbeat_is_due(entry.key, redbeat_app)
        theirs = source_fires(is_due, ran, start=start, count=100, horizon=timedelta(days=3660))
        ours = our_fires(store.get_schedule(name), 100)
        assert len(ours) == 100, name
        assert to_the_second(ours) == to_the_second(theirs), name


def test_history_options_and_origin_are_carried_over(
    run_import: Import, redbeat_app: Celery, store: Store, redbeat_prefix: str
) -> None:
    entries = every_kind(redbeat_app)
    assert run_import().exit_code == 0
    ten = store.get_schedule("interval-10m")
    assert (ten.runs_count, ten.last_fire_at) == (41, entries["interval-10m"].last_run_at)
    assert ten.definition.options == {"queue": "reports", "priority": 3}
    quarter = store.get_schedule("quarter-hours")
    assert (quarter.definition.timezone, quarter.runs_count) == (ZONE, 1000)
    with store.engine.connect() as conn:
        origin = conn.exec_driver_sql(
            "SELECT source, source_id FROM beat_schedules WHERE name = 'mornings'"
        ).one()
    assert tuple(origin) == ("redbeat", f"{redbeat_prefix}mornings")


def test_an_entry_saved_but_never_run_fires_when_redbeat_would(
    run_import: Import, redbeat_app: Celery, store: Store
) -> None:
    # RedBeat records the time it was saved as its last run: due an interval later.
    entry = save(redbeat_app, "new", schedule(timedelta(hours=1)), last_run=None)
    start = now()
    assert run_import().exit_code == 0
    is_due, ran = redbeat_is_due(entry.key, redbeat_app)
    theirs = source_fires(is_due, ran, start=start, count=3, horizon=timedelta(days=1))
    ours = our_fires(store.get_schedule("new"), 3)
    assert to_the_second(ours) == to_the_second(theirs)
    assert ours[0] == entry.last_run_at + timedelta(hours=1)


def test_importing_twice_changes_nothing(
    run_import: Import, redbeat_app: Celery, store: Store
) -> None:
    every_kind(redbeat_app)
    assert_importing_again_changes_nothing(run_import, store)


def test_an_rrule_is_refused_with_its_reason_and_the_rest_imported_with_skip_invalid(
    run_import: Import, redbeat_app: Celery, store: Store
) -> None:
    from redbeat.schedules import rrule

    every_kind(redbeat_app)
    save(redbeat_app, "weekly-rrule", rrule("WEEKLY", dtstart=now()), last_run=None)
    before = table_rows(store)
    stopped = run_import()
    assert stopped.exit_code == 2
    assert error_lines(stopped) == [
        f"Error: weekly-rrule ({redbeat_app.conf.redbeat_key_prefix}weekly-rrule): its rrule"
        " schedule is not supported (beat fires crontabs, intervals and one-offs): recreate"
        " it as a crontab or an interval, or leave it out (--skip-invalid)"
    ]
    assert table_rows(store) == before
    result = run_import("--skip-invalid")
    assert result.exit_code == 0, result.stderr
    assert [line.split()[:2] for line in result.stdout.splitlines() if "rrule" in line] == [
        ["refuse", "weekly-rrule"]
    ]
    assert len(store.list_schedules()) == 4


def test_an_unreachable_redis_or_an_empty_prefix_is_one_line(
    source_app: Celery, store: Store, redbeat_prefix: str
) -> None:
    before = table_rows(store)
    for url, prefix, expected in (
        ("redis://127.0.0.1:1/0", "redbeat", "cannot read the RedBeat entries redbeat:* at"),
        ("redis://127.0.0.1:6379/14", redbeat_prefix, "no RedBeat schedule at"),
    ):
        result = invoke(source_app, "import", "redbeat", "--redis-url", url, "--key-prefix", prefix)
        assert result.exit_code == 2
        [error] = error_lines(result)
        assert expected in error
    assert table_rows(store) == before
