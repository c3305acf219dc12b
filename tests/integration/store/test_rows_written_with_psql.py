"""Rows written around the API (with psql, a careless migration): a value the program
cannot read (PostgreSQL's ``infinity``, a cron that never fires, an infinite
interval, an unknown zone, args far over the API's limits) is quarantined alone at
the claim, shown with its problem wherever schedules are listed, and never stops
nor hides the others. Issue 29, findings 1, 4 and 6."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import text

from app.factory import create_app
from beat.models import RunState
from beat.ops.schedules import MAX_PAYLOAD_BYTES, Schedules
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import broker_messages, invoke, make_due, run_rows

pytestmark = pytest.mark.integration

SchedulerFactory = Callable[..., HAScheduler]

#: Each bad row, as psql writes it: the columns set besides name and task, due now.
INFINITE_TIMES = {
    "end-infinity": "trigger_kind, every_seconds, anchor_at, next_fire_at, end_at)"
    " VALUES ('every', 1, now(), now(), 'infinity'",
    "start-minus-infinity": "trigger_kind, every_seconds, anchor_at, next_fire_at, start_at)"
    " VALUES ('every', 1, now(), now(), '-infinity'",
    "once-at-infinity": "trigger_kind, run_at, next_fire_at) VALUES ('once', 'infinity', now()",
    "next-minus-infinity": "trigger_kind, every_seconds, anchor_at, next_fire_at)"
    " VALUES ('every', 1, now(), '-infinity'",
    "anchor-infinity": "trigger_kind, every_seconds, anchor_at, next_fire_at)"
    " VALUES ('every', 1, 'infinity', now()",
}
NEVER_FIRING = {
    "cron-february-30": "trigger_kind, cron, next_fire_at) VALUES ('cron', '0 0 30 2 *', now()",
    "every-infinity": "trigger_kind, every_seconds, anchor_at, next_fire_at)"
    " VALUES ('every', 'infinity', now(), now()",
    "every-1e300": "trigger_kind, every_seconds, anchor_at, next_fire_at)"
    " VALUES ('every', 1e300, now(), now()",
    "zone-on-mars": "trigger_kind, cron, timezone, next_fire_at)"
    " VALUES ('cron', '* * * * *', 'Mars/Olympus_Mons', now()",
}
#: Args of 10 MB, and args nested deeper than Python's json reads (psycopg raised for
#: the whole result of a query that read them).
OVERSIZED = {
    "kwargs-10mb": "trigger_kind, every_seconds, anchor_at, next_fire_at, kwargs)"
    " VALUES ('every', 1, now(), now(), jsonb_build_object('blob', repeat('x', 10000000))",
    "args-1500-deep": "trigger_kind, every_seconds, anchor_at, next_fire_at, args)"
    " VALUES ('every', 1, now(), now(), (repeat('[', 1500) || repeat(']', 1500))::jsonb",
}


def insert_rows(store: Store, rows: dict[str, str]) -> None:
    """Insert each row as psql would: no check of the API applies."""
    with store.engine.begin() as conn:
        for name, columns in rows.items():
            conn.execute(
                text(
                    f"INSERT INTO beat_schedules (name, task, {columns})".replace(
                        "VALUES (", f"VALUES ('{name}', 'tasks.demo.add', "
                    )
                )
            )


def add_canary(store: Store) -> None:
    Schedules(store).create(
        "canary", "tasks.demo.add", every=1, start_at=datetime.now(UTC), allow_unregistered=True
    )


def tick_for(scheduler: HAScheduler, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        scheduler.tick()


def assert_canary_fired_every_second(store: Store, at_least: int) -> None:
    canary = [row for row in run_rows(store) if row.schedule_name == "canary"]
    published = [row for row in canary if row.state == RunState.QUEUED.value]
    assert len(published) >= at_least, f"the canary fired {len(published)} times"
    gaps = {later.fire_at - earlier.fire_at for earlier, later in itertools.pairwise(canary)}
    assert gaps == {timedelta(seconds=1)}, "every fire time of the canary ran"


def assert_quarantined(store: Store, name: str, *words: str) -> None:
    with store.engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT enabled, quarantined_at, disabled_reason FROM beat_schedules"
                " WHERE name = :name"
            ),
            {"name": name},
        ).one()
    assert (row.enabled, row.quarantined_at is not None) == (False, True), name
    for word in words:
        assert word in row.disabled_reason, (name, row.disabled_reason)


# -- finding 1: an infinite time in one row ----------------------------------------------


def test_an_infinite_time_in_one_row_stops_no_other_schedule_and_is_quarantined(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Issue 29, finding 1: on a0b959d every tick failed (psycopg.DataError: timestamp
    too large) and the canary claimed nothing."""
    add_canary(store)
    insert_rows(store, INFINITE_TIMES)
    scheduler = make_scheduler()

    tick_for(scheduler, 4.0)

    assert_canary_fired_every_second(store, at_least=3)
    column = {
        "end-infinity": "end_at = infinity",
        "start-minus-infinity": "start_at = -infinity",
        "once-at-infinity": "run_at = infinity",
        "next-minus-infinity": "next_fire_at = -infinity",
        "anchor-infinity": "anchor_at = infinity",
    }
    for name in INFINITE_TIMES:
        assert_quarantined(store, name, column[name], "write a time")
    assert {row.schedule_name for row in run_rows(store)} == {"canary"}, "no bad row fired"


def test_health_reports_a_leader_that_claims_nothing_while_schedules_are_due(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Issue 29, finding 1: on a0b959d `schedules health` exited 0, every line ok,
    while the leader's every tick failed and schedules waited unclaimed."""
    add_canary(store)
    scheduler = make_scheduler(lock_ttl=30.0)
    scheduler.tick()
    assert scheduler.epoch == 1
    make_due(store, 120)  # the leader leads, its lease is valid, and it claims nothing

    result = invoke(scheduler.app, "health", "--json")

    checks = json.loads(result.stdout)["checks"]
    print(checks)
    assert result.exit_code == 1
    assert checks["leader"]["ok"] is True
    assert checks["claims"]["ok"] is False
    assert "1 schedule is due and unclaimed" in checks["claims"]["detail"]
    assert "canary" in checks["claims"]["detail"]
    assert "beat tick failed" in checks["claims"]["detail"]

    tick_for(scheduler, 1.0)  # it claims again: the check passes
    after = json.loads(invoke(scheduler.app, "health", "--json").stdout)["checks"]
    assert after["claims"]["ok"] is True, after["claims"]


def test_the_lists_show_a_row_with_an_infinite_time_with_its_problem(store: Store) -> None:
    """Issue 29, finding 1: on a0b959d `schedules list` exited 1 with a traceback
    (psycopg.DataError: timestamp too large), and so did every listing."""
    add_canary(store)
    insert_rows(store, {"end-infinity": INFINITE_TIMES["end-infinity"]})
    schedules = Schedules(store)

    rows = {row.schedule.name: row for row in schedules.page().rows}
    assert set(rows) == {"canary", "end-infinity"}
    assert rows["canary"].problem is None
    assert "end_at = infinity" in (rows["end-infinity"].problem or "")
    assert "end_at = infinity" in (schedules.details("end-infinity").problem or "")


# -- finding 4: a cron that never fires, an infinite interval, an unknown zone ------------


def test_a_row_that_cannot_fire_is_listed_with_its_problem_and_quarantined_at_its_claim(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """Issue 29, finding 4: on a0b959d page() (so `/` and `/api/schedules`) raised
    InvalidSchedule (invalid cron expression '0 0 30 2 *': it never fires) for every
    schedule, and details() of the zone on Mars raised (unknown time zone)."""
    add_canary(store)
    insert_rows(store, NEVER_FIRING)
    schedules = Schedules(store)
    problems = {
        "cron-february-30": "it never fires",
        "every-infinity": "invalid interval inf",
        "every-1e300": "longer than a datetime can span",
        "zone-on-mars": "unknown time zone 'Mars/Olympus_Mons'",
    }

    rows = {row.schedule.name: row for row in schedules.page().rows}
    assert set(rows) == {"canary", *NEVER_FIRING}
    for name, problem in problems.items():
        assert problem in (rows[name].problem or ""), (name, rows[name].problem)
        details = schedules.details(name)
        assert problem in (details.problem or "")
        assert details.upcoming == []
    assert schedules.details("canary").problem is None

    scheduler = make_scheduler()
    tick_for(scheduler, 3.0)

    assert_canary_fired_every_second(store, at_least=2)
    for name, problem in problems.items():
        assert_quarantined(store, name, problem)


def test_the_cli_says_one_line_for_a_row_it_cannot_read(store: Store, app_for_cli: Any) -> None:
    """Issue 29, finding 4: on a0b959d `schedules list` raised InvalidSchedule (never
    fires) and `show` of it too."""
    add_canary(store)
    insert_rows(store, {"cron-february-30": NEVER_FIRING["cron-february-30"]})

    listed = invoke(app_for_cli, "list")
    shown = invoke(app_for_cli, "show", "cron-february-30")
    documents = json.loads(invoke(app_for_cli, "list", "--json").stdout)

    assert listed.exit_code == 0, listed.output
    lines = [line for line in listed.stdout.splitlines() if "cron-february-30" in line]
    assert len(lines) == 1
    assert "it never fires" in lines[0]
    assert any(line.startswith("canary ") for line in listed.stdout.splitlines())
    assert shown.exit_code == 0, shown.output
    assert "it never fires" in shown.stdout
    assert "Traceback" not in shown.output
    by_name = {document["name"]: document for document in documents}
    assert "it never fires" in by_name["cron-february-30"]["problem"]
    assert by_name["canary"]["problem"] is None


# -- finding 6: a row far over the API's limits -------------------------------------------


def test_a_row_over_the_apis_limits_is_quarantined_at_the_claim_and_never_published(
    make_scheduler: SchedulerFactory,
    store: Store,
    redis_client: redis.Redis,
    test_env: SessionEnv,
) -> None:
    """Issue 29, finding 6: on a0b959d the 10 MB row was claimed and published (a
    14 MB message); the row nested 1,500 deep stopped every claim (RecursionError)."""
    add_canary(store)
    insert_rows(store, OVERSIZED)
    scheduler = make_scheduler()

    tick_for(scheduler, 3.0)

    assert_canary_fired_every_second(store, at_least=2)
    assert_quarantined(store, "kwargs-10mb", f"over the {MAX_PAYLOAD_BYTES}-byte limit")
    assert_quarantined(store, "args-1500-deep", "nested more than 32 levels")
    assert {row.schedule_name for row in run_rows(store)} == {"canary"}
    sizes = [len(json.dumps(m)) for m in broker_messages(redis_client, test_env.broker_key_prefix)]
    assert sizes, "the canary's messages wait in the queue"
    assert max(sizes) < 10_000, f"largest message: {max(sizes)} bytes"

    rows = {row.schedule.name: row for row in Schedules(store).page().rows}
    assert f"over the {MAX_PAYLOAD_BYTES}-byte limit" in (rows["kwargs-10mb"].problem or "")
    assert "nested more than 32 levels" in (rows["args-1500-deep"].problem or "")


def test_a_manual_trigger_of_a_row_over_the_limits_is_refused(store: Store) -> None:
    """Issue 29, finding 6: on a0b959d a trigger queued a run with the 10 MB kwargs."""
    insert_rows(store, {"kwargs-10mb": OVERSIZED["kwargs-10mb"]})

    with pytest.raises(Exception, match="over the 65536-byte limit"):
        Schedules(store).trigger_run("kwargs-10mb")

    assert run_rows(store) == []


@pytest.fixture
def app_for_cli(test_env: SessionEnv) -> Any:
    return create_app(test_env.settings())
