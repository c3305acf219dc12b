"""One bad schedule must not stop the others: a schedule or run that cannot be planned
or published is quarantined, the rest goes on, and health is red meanwhile."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery.bin.celery import celery as celery_main
from click.testing import CliRunner, Result
from sqlalchemy import text

from beat.claim.policies import plan_fires
from beat.errors import InvalidSchedule
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.scheduler import HAScheduler
from beat.store.all_roles import Store
from tests.integration.helpers import run_rows

pytestmark = pytest.mark.integration

SchedulerFactory = Callable[..., HAScheduler]


def invoke(app: Any, *args: str) -> Result:
    return CliRunner().invoke(celery_main, ["-A", app, "schedules", *args], catch_exceptions=False)


def insert_bad_schedule(store: Store, name: str, *, jitter: float, options: str) -> None:
    """A schedule due now, written with psql: around every check of the API."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_schedules (name, task, trigger_kind, every_seconds, anchor_at,"
                " next_fire_at, jitter_seconds, options)"
                " VALUES (:name, 'tasks.demo.add', 'every', 1, now(), now(), :jitter,"
                " CAST(:options AS jsonb))"
            ),
            {"name": name, "jitter": jitter, "options": options},
        )


def insert_pending_run(store: Store, schedule_name: str, *, not_before: str | None) -> None:
    """A run waiting in the outbox with unusable headers; of a removed schedule if there
    is no schedule of that name."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO beat_runs (id, schedule_id, schedule_name, task, options, fire_at,"
                " state, not_before)"
                " SELECT gen_random_uuid(), (SELECT id FROM beat_schedules WHERE name = :name),"
                " :name, 'tasks.demo.add', '{\"headers\": \"oops\"}', now(), 'pending',"
                f" {not_before or 'NULL'}"
            ),
            {"name": schedule_name},
        )


def schedule_row(store: Store, name: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(
            text("SELECT * FROM beat_schedules WHERE name = :name"), {"name": name}
        ).one()


def health(app: Any) -> tuple[int, dict[str, Any]]:
    result = invoke(app, "health", "--json")
    return result.exit_code, json.loads(result.stdout)["checks"]["schedules"]


def tick_for(scheduler: HAScheduler, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert scheduler.tick() == 0.0, "a tick failed"


def test_a_schedule_that_cannot_be_planned_or_published_is_quarantined_alone(
    make_scheduler: SchedulerFactory, store: Store
) -> None:
    """A schedule that cannot be planned or sent is quarantined alone. Finding 14 of issue 15."""
    schedules = Schedules(store)
    schedules.create(
        "canary", "tasks.demo.add", every=1, start_at=datetime.now(UTC), allow_unregistered=True
    )
    insert_bad_schedule(store, "bad-jitter", jitter=1e15, options="{}")
    insert_bad_schedule(store, "bad-headers", jitter=0, options='{"headers": "oops"}')
    insert_pending_run(store, "bad-headers", not_before="now() + interval '1 hour'")
    insert_pending_run(store, "removed-long-ago", not_before=None)
    scheduler = make_scheduler()

    tick_for(scheduler, 4.0)

    assert scheduler.epoch == 1, "the leader kept its lease"
    canary = [row for row in run_rows(store) if row.schedule_name == "canary"]
    print(f"canary runs in 4 s: {len(canary)}")
    queued = [row for row in canary if row.state == RunState.QUEUED.value]
    armed = [row for row in canary if row.state == RunState.PENDING.value]
    assert len(queued) >= 3
    assert len(queued) + len(armed) == len(canary)
    assert all(row.fire_at > queued[-1].fire_at for row in armed), "only runs claimed ahead wait"
    gaps = {later.fire_at - earlier.fire_at for earlier, later in itertools.pairwise(canary)}
    assert gaps == {timedelta(seconds=1)}, "every fire time of the canary ran"

    jitter = schedule_row(store, "bad-jitter")
    assert (jitter.enabled, jitter.quarantined_at is not None) == (False, True)
    assert "jitter_seconds is 1e+15" in jitter.disabled_reason
    headers = schedule_row(store, "bad-headers")
    assert (headers.enabled, headers.quarantined_at is not None) == (False, True)
    assert "options.headers must be a JSON object, got str" in headers.disabled_reason
    bad_runs = [row for row in run_rows(store) if row.schedule_name != "canary"]
    assert {row.schedule_name for row in bad_runs} == {"bad-headers", "removed-long-ago"}
    assert {row.state for row in bad_runs} == {RunState.FAILED.value}, "none left in the outbox"
    assert all("options.headers" in row.error for row in bad_runs)

    app = scheduler.app
    code, check = health(app)
    assert (code, check["ok"]) == (1, False)
    assert "bad-jitter" in check["detail"]
    assert "bad-headers" in check["detail"]
    assert "jitter_seconds is 1e+15" in check["detail"]
    listed = [line for line in invoke(app, "list").stdout.splitlines() if "bad-" in line]
    assert len(listed) == 2
    assert all(" quarantined " in line for line in listed)

    with store.engine.begin() as conn:  # the operator fixes the rows, then resumes them
        conn.execute(text("UPDATE beat_schedules SET jitter_seconds = 0.5, options = '{}'"))
    for name in ("bad-jitter", "bad-headers"):
        assert invoke(app, "resume", name).exit_code == 0
        assert Schedules(store).get(name).quarantined_at is None
    assert health(app)[1]["ok"] is True
    tick_for(scheduler, 2.0)
    assert schedule_row(store, "bad-jitter").quarantined_at is None, "it plans again"
    fired = {row.schedule_name for row in run_rows(store) if row.state == RunState.QUEUED.value}
    assert {"bad-jitter", "bad-headers"} <= fired


def test_a_huge_jitter_or_headers_that_are_no_object_are_refused_at_input(
    store: Store,
) -> None:
    """A huge jitter or headers that are no object are refused at input. Finding 14 of issue 15."""
    schedules = Schedules(store)
    with pytest.raises(
        InvalidSchedule, match=r"jitter must be a number of seconds from 0 to 86400"
    ):
        schedules.create("j", "tasks.demo.add", every=5, jitter=1e15, allow_unregistered=True)
    with pytest.raises(InvalidSchedule, match=r"options.headers must be a JSON object, got str"):
        schedules.create(
            "h", "tasks.demo.add", every=5, options={"headers": "x"}, allow_unregistered=True
        )
    assert schedules.list() == []


def test_a_row_that_cannot_be_read_is_quarantined_in_the_claim(store: Store) -> None:
    """A zone or a cron that only psql could write: the claim sets that row aside.
    Finding 14 of issue 15."""
    Schedules(store).create(
        "good", "tasks.demo.add", every=1, start_at=datetime.now(UTC), allow_unregistered=True
    )
    insert_bad_schedule(store, "bad-zone", jitter=0, options="{}")
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE beat_schedules SET timezone = 'Mars/Olympus_Mons' WHERE name = 'bad-zone'")
        )
        conn.execute(text("UPDATE beat_schedules SET next_fire_at = now() - interval '1 second'"))
    assert store.take_leadership(1, "me")

    claim = store.claim_due(
        1,
        batch=10,
        plan=lambda due, now, until: plan_fires(
            due, now, until=until, misfire_grace=60, max_catchup=100
        ),
    )

    assert {run.schedule_name for run in claim.runs} == {"good"}
    assert [(entry.name, entry.reason.split(":")[0]) for entry in claim.quarantined] == [
        ("bad-zone", "its stored definition cannot be read")
    ]
    row = schedule_row(store, "bad-zone")
    assert (row.enabled, row.quarantined_at is not None) == (False, True)
    assert "Mars/Olympus_Mons" in row.disabled_reason
