"""`celery -A app schedules ...` against real PostgreSQL and Redis.

Most tests invoke Celery's own ``celery`` click group in-process (with an app
object built for this session's database and Redis prefix, passed as ``-A``);
a few run the real ``python -m celery -A app schedules`` as a subprocess, which
also proves the command is registered through the ``celery.commands`` entry point.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from celery.schedules import crontab
from click.testing import Result
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.factory import create_app
from beat.lease.holder import lock_key
from beat.models import RunState
from beat.ops.schedules import Schedules
from beat.ops.user_input import parse_duration
from beat.scheduler import HAScheduler
from beat.store import schema
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import (
    as_json,
    broker_messages,
    celery_cli,
    error_lines,
    invoke,
    make_due,
    run_rows,
    schedule_row,
    slow_client_clock,
    table_rows,
    task_ids,
)

pytestmark = pytest.mark.integration

UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

Cli = Callable[..., Result]


# -- helpers -----------------------------------------------------------------------------------


def insert_run(store: Store, **fields: Any) -> uuid.UUID:
    """A run row as the scheduler and the workers would leave it; times are ages in seconds."""
    run_id = uuid.uuid4()
    ages = {
        key: fields.pop(key)
        for key in ("fire_ago", "claimed_ago", "published_ago", "started_ago", "finished_ago")
        if key in fields
    }
    values: dict[str, Any] = {
        "id": run_id,
        "schedule_name": "history",
        "task": "tasks.demo.add",
        "state": RunState.SUCCEEDED.value,
        "attempt": 1,
        "worker": "w1@host",
        "error": None,
    } | fields
    columns = list(values)
    times = {
        "fire_at": ages.get("fire_ago"),
        "claimed_at": ages.get("claimed_ago", ages.get("fire_ago", 0)),
        "published_at": ages.get("published_ago"),
        "started_at": ages.get("started_ago"),
        "finished_at": ages.get("finished_ago"),
    }
    time_sql = {
        column: f"now() - make_interval(secs => :{column})"
        for column, age in times.items()
        if age is not None
    }
    params = values | {column: age for column, age in times.items() if age is not None}
    with store.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO beat_runs ({', '.join([*columns, *time_sql])})"
                f" VALUES ({', '.join([*(f':{c}' for c in columns), *time_sql.values()])})"
            ),
            params,
        )
    return run_id


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    """This session's app, on empty tables and without Redis keys."""
    return create_app(test_env.settings(lock_ttl=3.0, max_wait=0.2))


@pytest.fixture
def cli(app: Celery) -> Cli:
    return lambda *args: invoke(app, *args)


# -- schedules: add, show, list, update, pause, resume, remove ---------------------------------


def test_a_schedule_round_trips_through_every_command_as_json(cli: Cli) -> None:
    created = as_json(
        cli(
            "add",
            "nightly",
            "tasks.demo.report",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--kwargs",
            '{"size": 2}',
            "--queue",
            "reports",
            "--json",
        )
    )
    assert created["name"] == "nightly"
    assert created["schedule"] == "cron 30 2 * * *"
    assert created["timezone"] == "Europe/Berlin"
    assert created["kwargs"] == {"size": 2}
    assert created["options"] == {"queue": "reports"}
    assert created["enabled"] is True
    as_json(cli("add", "often", "tasks.demo.add", "--every", "60", "--args", "[1, 2]", "--json"))

    listed = as_json(cli("list", "--json"))
    assert [entry["name"] for entry in listed] == ["nightly", "often"]
    assert all(entry["last_run"] is None for entry in listed)

    shown = as_json(cli("show", "nightly", "--json"))
    upcoming = shown["upcoming"]
    assert len(upcoming) == 5
    utc = [datetime.fromisoformat(fire["utc"]) for fire in upcoming]
    local = [datetime.fromisoformat(fire["local"]) for fire in upcoming]
    assert utc == sorted(utc)
    assert len(set(utc)) == 5
    assert utc[0] == datetime.fromisoformat(shown["next_fire_at"])
    assert all(moment.strftime("%H:%M") == "02:30" for moment in local), "local wall time"
    assert [moment.astimezone(UTC) for moment in local] == utc
    assert shown["recent_runs"] == []

    updated = as_json(
        cli("update", "nightly", "--cron", "0 4 * * *", "--max-attempts", "5", "--json")
    )
    assert updated["schedule"] == "cron 0 4 * * *"
    assert updated["max_attempts"] == 5
    assert updated["kwargs"] == {"size": 2}, "fields not given are kept"
    assert updated["next_fire_at"] != created["next_fire_at"], "new timing, new next fire"

    paused = as_json(cli("pause", "nightly", "--json"))
    assert paused["enabled"] is False
    assert as_json(cli("show", "nightly", "--json"))["upcoming"], "shows fire times if resumed"
    resumed = as_json(cli("resume", "nightly", "--json"))
    assert resumed["enabled"] is True

    assert as_json(cli("remove", "often", "--json")) == {"removed": "often"}
    assert [entry["name"] for entry in as_json(cli("list", "--json"))] == ["nightly"]


def test_human_output_is_aligned_tables(cli: Cli) -> None:
    assert cli("add", "nightly", "tasks.demo.report", "--cron", "30 2 * * *").exit_code == 0
    assert cli("add", "often", "tasks.demo.heartbeat", "--every", "60", "--paused").exit_code == 0

    listing = cli("list")
    assert listing.exit_code == 0
    lines = listing.stdout.splitlines()
    assert lines[0].split() == [
        "NAME", "TASK", "SCHEDULE", "ZONE", "ENABLED", "NEXT", "FIRE", "(UTC)", "LAST", "RUN"
    ]  # fmt: skip
    assert lines[2].startswith("often")
    assert "paused" in lines[2]
    columns = [line.index("tasks.demo") for line in lines[1:]]
    assert len(set(columns)) == 1, "columns are aligned"

    shown = cli("show", "nightly")
    assert shown.exit_code == 0
    assert "next fire times" in shown.stdout
    assert "latest runs (0)" in shown.stdout
    assert re.search(r"^task\s+tasks\.demo\.report$", shown.stdout, re.MULTILINE)

    assert cli("pause", "nightly").stdout == "paused nightly\n"
    assert cli("resume", "nightly").stdout.startswith("resumed nightly: next fire ")
    assert cli("update", "nightly", "--tz", "Asia/Tokyo").stdout.startswith("updated nightly")
    assert cli("remove", "nightly").stdout == "removed nightly\n"


def test_migrate_reports_the_head_revision(cli: Cli) -> None:
    document = as_json(cli("migrate", "--json"))
    assert document["revision"] == schema.head_revision()
    assert "habeat_test_" in document["database"]
    assert cli("migrate").stdout.startswith(f"schema is at revision {schema.head_revision()}")


# -- bad input: exit 2, nothing written ---------------------------------------------------------


BAD_INPUT = [
    pytest.param(["add", "x", "tasks.demo.add", "--cron", "banana"], id="add-bad-cron"),
    pytest.param(["add", "x", "tasks.demo.add", "--cron", "* * * * *", "--tz", "Mars/Base"],
                 id="add-bad-zone"),
    pytest.param(["add", "x", "tasks.demo.add", "--cron", "* * * * *", "--every", "5"],
                 id="add-two-timings"),
    pytest.param(["add", "x", "tasks.demo.add", "--every", "5", "--args", '{"a": 1}'],
                 id="add-args-not-a-list"),
    pytest.param(["add", "x", "no.such.task", "--every", "5"], id="add-unknown-task"),
    pytest.param(["add", "existing", "tasks.demo.heartbeat", "--every", "5"], id="add-existing"),
    pytest.param(["update", "nope", "--cron", "* * * * *"], id="update-unknown"),
    pytest.param(["update", "existing"], id="update-nothing"),
    pytest.param(["update", "existing", "--cron", "61 * * * *"], id="update-bad-cron"),
    pytest.param(["update", "existing", "--task", "no.such.task"], id="update-unknown-task"),
    pytest.param(["show", "nope"], id="show-unknown"),
    pytest.param(["pause", "nope"], id="pause-unknown"),
    pytest.param(["resume", "nope"], id="resume-unknown"),
    pytest.param(["remove", "nope"], id="remove-unknown"),
    pytest.param(["trigger", "nope"], id="trigger-unknown"),
    pytest.param(["prune", "--older-than", "banana"], id="prune-banana"),
    pytest.param(["prune", "--older-than", "0d"], id="prune-zero"),
    pytest.param(["prune"], id="prune-no-cutoff"),
    pytest.param(["prune", "--older-than", "1d", "--batch", "0"], id="prune-batch-zero"),
    pytest.param(["runs", "--since", "yesterday"], id="runs-bad-since"),
    pytest.param(["runs", "--state", "exploded"], id="runs-bad-state"),
    pytest.param(["runs", "--limit", "0"], id="runs-zero-limit"),
]  # fmt: skip


@pytest.mark.parametrize("args", BAD_INPUT)
def test_bad_input_exits_2_with_one_error_line_and_writes_nothing(
    cli: Cli, store: Store, args: list[str]
) -> None:
    assert cli("add", "existing", "tasks.demo.heartbeat", "--every", "60").exit_code == 0
    insert_run(store, schedule_name="existing", fire_ago=86400 * 40, finished_ago=86400 * 40)
    before = table_rows(store)

    result = cli(*args)

    assert result.exit_code == 2, result.output
    assert len(error_lines(result)) == 1, result.stderr
    assert result.stdout == ""
    assert table_rows(store) == before


def test_an_unreachable_database_exits_1_with_one_actionable_line(test_env: SessionEnv) -> None:
    app = create_app(test_env.settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/x"))
    result = invoke(app, "list", "--json")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert "is unreachable" in line
    assert "DATABASE_URL" in line


def test_a_refused_login_names_the_credentials_not_a_server_to_start(
    test_env: SessionEnv,
) -> None:
    refused = make_url(test_env.database_url).set(username="habeat_no_such_role")
    app = create_app(test_env.settings(database_url=refused.render_as_string(False)))
    result = invoke(app, "list", "--json")
    assert result.exit_code == 1
    [line] = result.stderr.splitlines()
    assert "authentication failed, check the user and password in DATABASE_URL" in line
    assert "docker compose" not in line


# -- trigger -----------------------------------------------------------------------------------


def test_trigger_queues_a_run_that_the_leader_publishes_with_the_run_id_as_task_id(
    cli: Cli,
    store: Store,
    redis_client: redis.Redis,
    test_env: SessionEnv,
    make_scheduler: Callable[..., HAScheduler],
) -> None:
    created = as_json(
        cli("add", "hourly", "tasks.demo.add", "--every", "3600", "--args", "[2, 3]", "--json")
    )
    before = schedule_row(store, "hourly")

    result = cli("trigger", "hourly")

    assert result.exit_code == 0, result.stderr
    [printed] = UUID_PATTERN.findall(result.stdout)
    [row] = run_rows(store)
    assert str(row.id) == printed
    assert row.state == RunState.PENDING.value
    assert row.epoch is None
    assert row.schedule_id == before.id
    assert row.schedule_name == "hourly"
    assert (row.task, row.args, row.kwargs) == ("tasks.demo.add", [2, 3], {})
    assert row.max_attempts == 3
    assert abs((row.fire_at - store.now()).total_seconds()) < 5
    assert schedule_row(store, "hourly").next_fire_at == before.next_fire_at

    scheduler = make_scheduler()
    scheduler.tick()

    assert scheduler.is_leader
    assert task_ids(broker_messages(redis_client, test_env.broker_key_prefix)) == [printed]
    message = broker_messages(redis_client, test_env.broker_key_prefix)[0]
    assert message["headers"]["task"] == "tasks.demo.add"
    assert message["headers"]["habeat_schedule"] == "hourly"
    [row] = run_rows(store)
    assert row.state == RunState.QUEUED.value
    assert schedule_row(store, "hourly").next_fire_at == before.next_fire_at
    assert created["next_fire_at"] == as_json(cli("show", "hourly", "--json"))["next_fire_at"]
    [history] = as_json(cli("runs", "hourly", "--json"))
    assert history["id"] == printed
    assert history["state"] == "queued"
    assert history["reason"] == "triggered manually"
    assert history["lateness_seconds"] >= 0


def test_trigger_json_api_and_paused_schedules(cli: Cli, store: Store, app: Celery) -> None:
    cli("add", "paused-one", "tasks.demo.heartbeat", "--every", "60", "--paused")

    document = as_json(cli("trigger", "paused-one", "--json"))
    api_run_id = Schedules(store, app=app).trigger("paused-one")

    assert document["state"] == "pending"
    assert document["schedule"] == "paused-one"
    assert document["epoch"] is None
    ids = {str(row.id) for row in run_rows(store)}
    assert ids == {document["id"], api_run_id}, "a paused schedule can be run by hand"
    assert schedule_row(store, "paused-one").enabled is False


def test_trigger_wakes_a_waiting_leader_at_once(
    cli: Cli, store: Store, make_scheduler: Callable[..., HAScheduler]
) -> None:
    cli("add", "later", "tasks.demo.heartbeat", "--every", "3600")
    scheduler = make_scheduler(max_wait=30.0)  # without NOTIFY, it would sleep 30 s
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            scheduler.tick()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not scheduler.is_leader and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the leader is now waiting for a notification
        triggered_at = time.monotonic()
        run_id = as_json(cli("trigger", "later", "--json"))["id"]
        while time.monotonic() < triggered_at + 10:
            if run_rows(store, id=uuid.UUID(run_id))[0].state == RunState.QUEUED.value:
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - triggered_at
    finally:
        stop.set()
        cli("trigger", "later")  # wake the loop so that it sees the stop flag
        thread.join(timeout=10)
    assert run_rows(store, id=uuid.UUID(run_id))[0].state == RunState.QUEUED.value
    assert elapsed < 3, f"published {elapsed:.2f}s after the trigger: NOTIFY did not wake it"


# -- runs --------------------------------------------------------------------------------------


def test_runs_lists_history_newest_first_with_filters(cli: Cli, store: Store) -> None:
    old = insert_run(store, fire_ago=3 * 3600, published_ago=3 * 3600 - 0.25, finished_ago=10000)
    failed = insert_run(
        store,
        state=RunState.FAILED.value,
        fire_ago=3600,
        published_ago=3598,
        started_ago=3597,
        finished_ago=3590,
        attempt=2,
        error="RuntimeError: the upstream API answered 503 " + "x" * 200,
    )
    other = insert_run(store, schedule_name="other", fire_ago=60, published_ago=59)
    running = insert_run(
        store, state=RunState.RUNNING.value, fire_ago=30, published_ago=29, started_ago=28
    )

    everything = as_json(cli("runs", "--json"))
    assert [run["id"] for run in everything] == [str(running), str(other), str(failed), str(old)]
    assert everything[3]["lateness_seconds"] == pytest.approx(0.25, abs=0.01)
    assert everything[2]["error"].endswith("x" * 200), "--json gives the whole error"

    assert [run["id"] for run in as_json(cli("runs", "history", "--json"))] == [
        str(running),
        str(failed),
        str(old),
    ]
    assert [run["id"] for run in as_json(cli("runs", "--state", "failed", "--json"))] == [
        str(failed)
    ]
    assert [run["id"] for run in as_json(cli("runs", "--since", "2h", "--json"))] == [
        str(running),
        str(other),
        str(failed),
    ]
    since = (store.now() - timedelta(minutes=5)).isoformat()
    assert [run["id"] for run in as_json(cli("runs", "--since", since, "--json"))] == [
        str(running),
        str(other),
    ]
    assert len(as_json(cli("runs", "--limit", "1", "--json"))) == 1
    cli("add", "nothing-ran", "tasks.demo.heartbeat", "--every", "60")
    assert as_json(cli("runs", "nothing-ran", "--json")) == []

    table = cli("runs", "history")
    assert table.exit_code == 0
    header, *lines = table.stdout.splitlines()
    assert header.split()[:4] == ["RUN", "ID", "SCHEDULE", "FIRE"]
    for column in ("PUBLISHED", "STARTED", "FINISHED", "LATENESS", "WORKER", "ATTEMPT", "STATE"):
        assert column in header
    failed_line = next(line for line in lines if line.startswith(str(failed)))
    assert "failed" in failed_line
    assert "2/3" in failed_line
    assert "w1@host" in failed_line
    assert failed_line.endswith("..."), "long errors are truncated"
    assert "2.000s" in failed_line, "lateness = published - fire time"
    assert cli("runs", "nothing-ran").stdout == "no runs match\n"


def test_show_and_list_report_the_latest_runs(cli: Cli, store: Store) -> None:
    cli("add", "history", "tasks.demo.heartbeat", "--every", "60")
    insert_run(store, fire_ago=120, finished_ago=100)
    newest = insert_run(store, state=RunState.FAILED.value, fire_ago=60, finished_ago=50)

    [listed] = as_json(cli("list", "--json"))
    assert listed["last_run"]["id"] == str(newest)
    assert listed["last_run"]["state"] == "failed"
    assert cli("list").stdout.splitlines()[1].endswith("failed")
    shown = as_json(cli("show", "history", "--json"))
    assert next(run["id"] for run in shown["recent_runs"]) == str(newest)
    assert len(shown["recent_runs"]) == 2


# -- prune -------------------------------------------------------------------------------------


def test_prune_deletes_only_old_finished_runs_in_batches(cli: Cli, store: Store) -> None:
    day = 86400
    doomed = {
        insert_run(store, state=state.value, fire_ago=40 * day, finished_ago=40 * day)
        for state in (
            RunState.SUCCEEDED,
            RunState.FAILED,
            RunState.LOST,
            RunState.SKIPPED,
            RunState.CANCELLED,
        )
    }
    # A finished run without finished_at counts from when it was claimed.
    doomed.add(insert_run(store, state=RunState.CANCELLED.value, claimed_ago=31 * day))
    kept = {
        insert_run(store, fire_ago=40 * day, finished_ago=29 * day),  # finished recently
        insert_run(store, state=RunState.SUCCEEDED.value, claimed_ago=20 * day),
        *(
            insert_run(store, state=state.value, fire_ago=40 * day)  # never finished
            for state in (
                RunState.PENDING,
                RunState.QUEUED,
                RunState.RUNNING,
                RunState.RETRYING,
            )
        ),
    }

    report = as_json(cli("prune", "--older-than", "30d", "--batch", "4", "--json"))

    assert report["deleted"] == 6
    assert report["batches"] == 2
    assert datetime.fromisoformat(report["cutoff"]) < store.now() - timedelta(days=29)
    assert {row.id for row in run_rows(store)} == kept
    assert not doomed & {row.id for row in run_rows(store)}
    assert (report["incidents"], report["notifications"]) == (0, 0)
    again = cli("prune", "--older-than", "30d")
    assert again.stdout.startswith("deleted 0 finished runs older than ")
    assert again.stdout.rstrip().endswith(
        "0 incidents resolved, 0 notifications sent or given up and 0 changes of the audit"
        " log made before it"
    )


def test_retention_deletes_expired_runs_too(cli: Cli, store: Store) -> None:
    """An expired run never runs: it is finished business, or it would pile up for ever.
    Finding 15 of issue 15."""
    insert_run(store, state=RunState.EXPIRED.value, fire_ago=40 * 86400, finished_ago=40 * 86400)
    recent = insert_run(store, state=RunState.EXPIRED.value, fire_ago=60, finished_ago=60)

    report = as_json(cli("prune", "--older-than", "30d", "--json"))

    assert report["deleted"] == 1
    assert "expired" in report["states"]
    assert [row.id for row in run_rows(store)] == [recent]


def test_prune_commits_each_batch_on_its_own(store: Store) -> None:
    for _ in range(5):
        insert_run(store, fire_ago=7200, finished_ago=7200)
    seen: list[int] = []

    def after_batch(count: int) -> None:
        seen.append(count)
        # Committed already: another connection sees the rows gone.
        assert len(run_rows(store)) == 5 - sum(seen)

    report = store.prune(timedelta(hours=1), batch=2, on_batch=after_batch)

    assert seen == [2, 2, 1]
    assert (report.deleted, report.batches) == (5, 3)
    assert run_rows(store) == []


@pytest.mark.parametrize(
    ("given", "seconds"),
    [("30d", 30 * 86400), ("12h", 43200), ("1h30m", 5400), ("90s", 90), ("2w", 1209600),
     ("0.5m", 30)],
)  # fmt: skip
def test_durations(given: str, seconds: float) -> None:
    assert parse_duration(given) == timedelta(seconds=seconds)


# -- leader and health -------------------------------------------------------------------------


def test_health_fails_without_a_leader_and_passes_while_one_leads(
    cli: Cli,
    test_env: SessionEnv,
    redis_client: redis.Redis,
    make_scheduler: Callable[..., HAScheduler],
) -> None:
    leaderless = cli("health", "--json")
    assert leaderless.exit_code == 1
    report = json.loads(leaderless.stdout)
    assert report["healthy"] is False
    assert {name: check["ok"] for name, check in report["checks"].items()} == {
        "postgres": True,
        "schema": True,
        "redis": True,
        "leader": False,
        "claims": True,
        "schedules": True,
    }
    human = cli("health")
    assert human.exit_code == 1
    [line] = error_lines(human)
    assert line.startswith("Error: leader: nobody holds the lease")

    scheduler = make_scheduler()
    scheduler.tick()
    assert scheduler.is_leader

    healthy = cli("health")
    assert healthy.exit_code == 0, healthy.stderr
    assert len(healthy.stdout.splitlines()) == 6
    assert all(line.startswith("ok") for line in healthy.stdout.splitlines())
    report = as_json(cli("health", "--json"))
    assert report["healthy"] is True
    assert scheduler.lease.holder in report["checks"]["leader"]["detail"]

    scheduler.close()  # a clean hand-over releases the lease
    assert cli("health").exit_code == 1

    redis_client.set(lock_key(test_env.key_prefix), "impostor", px=10_000)
    impostor = cli("health")
    assert impostor.exit_code == 1
    [line] = error_lines(impostor)
    assert "held by impostor but the leader row names" in line


def test_health_names_every_failing_check(test_env: SessionEnv) -> None:
    app = create_app(
        test_env.settings(
            database_url="postgresql+psycopg://nobody@127.0.0.1:1/x",
            redis_url="redis://127.0.0.1:1/0",
        )
    )
    result = invoke(app, "health")
    assert result.exit_code == 1
    lines = error_lines(result)
    assert [line.split(":")[1].strip() for line in lines] == [
        "postgres",
        "schema",
        "redis",
        "leader",
        "claims",
        "schedules",
    ]
    assert "PostgreSQL at" in lines[0]
    assert "Redis at 127.0.0.1:1/0" in lines[2]


def test_health_names_the_apps_own_database_setting_when_postgres_is_down(
    test_env: SessionEnv,
) -> None:
    """The postgres check's hint names the setting this app fills (DATABASE_URL), as
    every other command's does, not the generic habeat_database_url."""
    app = create_app(test_env.settings(database_url="postgresql+psycopg://nobody@127.0.0.1:1/x"))
    result = invoke(app, "health")
    assert result.exit_code == 1
    [postgres] = [line for line in error_lines(result) if ": postgres" in line]
    assert "DATABASE_URL" in postgres
    assert "habeat_database_url" not in postgres


def test_leader_shows_holder_epoch_since_and_lease_expiry(
    cli: Cli, make_scheduler: Callable[..., HAScheduler]
) -> None:
    nobody = as_json(cli("leader", "--json"))
    assert nobody["leader"] is None
    assert nobody["lease"]["holder"] is None
    assert nobody["lease"]["expires_in_seconds"] is None
    assert nobody["valid"] is False
    assert "nobody holds the lease" in cli("leader").stdout

    scheduler = make_scheduler(lock_ttl=5.0)
    scheduler.tick()
    document = as_json(cli("leader", "--json"))

    assert document["valid"] is True
    assert document["leader"]["holder"] == scheduler.lease.holder
    assert document["lease"]["holder"] == scheduler.lease.holder
    assert document["leader"]["epoch"] == scheduler.epoch
    assert 0 < document["lease"]["expires_in_seconds"] <= 5.0
    assert datetime.fromisoformat(document["leader"]["since"]) <= datetime.now(UTC)
    human = cli("leader").stdout
    assert re.search(rf"^holder\s+{re.escape(scheduler.lease.holder)}$", human, re.MULTILINE)
    assert re.search(r"^status\s+leading$", human, re.MULTILINE)


# -- sync --------------------------------------------------------------------------------------


def test_sync_pushes_the_schedules_defined_in_code(app: Celery, cli: Cli, store: Store) -> None:
    app.conf.beat_schedule = {
        "code-nightly": {
            "task": "tasks.demo.add",
            "schedule": crontab(minute="15", hour="3"),
            "args": (1, 2),
        },
        "code-often": {"task": "tasks.demo.add", "schedule": 30.0},
    }
    cli("add", "code-often", "tasks.demo.heartbeat", "--every", "60")  # made at runtime: left alone

    first = as_json(cli("sync", "--json"))
    assert first == {
        "created": ["code-nightly"],
        "updated": [],
        "unchanged": [],
        "removed": [],
        "conflicts": ["code-often"],
    }
    nightly = as_json(cli("show", "code-nightly", "--json"))
    assert (nightly["origin"], nightly["schedule"]) == ("code", "cron 15 3 * * *")

    again = cli("sync")
    assert again.exit_code == 0
    assert again.stdout.startswith("synced 2 code schedules: 0 created, 0 updated, 1 unchanged")
    assert "code-often" in again.stderr

    app.conf.beat_schedule = {}
    refused = cli("sync", "--json")
    assert refused.exit_code == 2, "code that lost every schedule removes none without --prune"
    assert "--prune" in error_lines(refused)[0]
    assert as_json(cli("sync", "--prune", "--json"))["removed"] == ["code-nightly"]
    assert [entry["name"] for entry in as_json(cli("list", "--json"))] == ["code-often"]


# -- the real command line ---------------------------------------------------------------------


def test_the_real_command_line(
    test_env: SessionEnv, store: Store, redis_client: redis.Redis
) -> None:
    refused = celery_cli(test_env, "add", "x", "tasks.demo.add", "--cron", "banana")
    assert refused.returncode == 2
    assert refused.stderr.startswith("Error: invalid cron expression 'banana'")
    assert table_rows(store) == []

    added = celery_cli(test_env, "add", "cli", "tasks.demo.heartbeat", "--every", "60", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["name"] == "cli"

    triggered = celery_cli(test_env, "trigger", "cli", "--json")
    assert triggered.returncode == 0, triggered.stderr
    assert [str(row.id) for row in run_rows(store)] == [json.loads(triggered.stdout)["id"]]

    health = celery_cli(test_env, "health", "--json")
    assert health.returncode == 1
    assert json.loads(health.stdout)["checks"]["leader"]["ok"] is False

    usage = celery_cli(test_env, "prune", "--older-than", "banana")
    assert usage.returncode == 2
    assert "Invalid value for '--older-than'" in usage.stderr


def test_overlap_jitter_window_and_one_off_options(cli: Cli) -> None:
    created = as_json(
        cli(
            "add",
            "trial",
            "tasks.demo.heartbeat",
            "--cron",
            "0 9 * * *",
            "--overlap-policy",
            "skip",
            "--jitter",
            "30",
            "--max-runs",
            "14",
            "--start-at",
            "2030-01-01T00:00:00+00:00",
            "--end-at",
            "2030-12-31T00:00:00+00:00",
            "--json",
        )
    )
    assert (created["overlap_policy"], created["jitter_seconds"], created["max_runs"]) == (
        "skip",
        30.0,
        14,
    )
    assert created["next_fire_at"] == "2030-01-01T09:00:00+00:00", "no fire time before start_at"
    assert created["end_at"] == "2030-12-31T00:00:00+00:00"
    updated = as_json(cli("update", "trial", "--overlap-policy", "cancel_previous", "--json"))
    assert updated["overlap_policy"] == "cancel_previous"
    assert updated["max_runs"] == 14, "unchanged fields stay"
    soon = as_json(cli("add", "soon", "tasks.demo.heartbeat", "--in", "90s", "--json"))
    assert soon["schedule"].startswith("at ")
    bad = cli("add", "bad", "tasks.demo.heartbeat", "--every", "5", "--overlap-policy", "sometimes")
    assert bad.exit_code == 2


def test_in_on_add_and_update_counts_from_the_database_clock(
    cli: Cli, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--in on add and update counts from the database's clock. Finding 9 of issue 15."""
    slow_client_clock(monkeypatch, timedelta(seconds=120))

    as_json(cli("add", "soon", "tasks.demo.heartbeat", "--in", "90s", "--json"))
    added = schedule_row(store, "soon")
    as_json(cli("update", "soon", "--in", "10m", "--json"))
    updated = schedule_row(store, "soon")

    assert added.next_fire_at == added.created_at + timedelta(seconds=90)
    assert updated.next_fire_at == updated.updated_at + timedelta(minutes=10)


def test_backfill_creates_the_missing_runs_of_a_past_window(cli: Cli, store: Store) -> None:
    as_json(cli("add", "hourly", "tasks.demo.heartbeat", "--cron", "0 * * * *", "--json"))
    hour = store.now().replace(minute=0, second=0, microsecond=0)
    window = ("--from", (hour - timedelta(hours=6)).isoformat(), "--to", hour.isoformat())
    created = as_json(cli("backfill", "hourly", *window, "--json"))
    assert [run["fire_at"] for run in created] == [
        (hour - timedelta(hours=ago)).isoformat() for ago in range(6, -1, -1)
    ]
    assert {run["state"] for run in created} == {"pending"}
    again = as_json(cli("backfill", "hourly", *window, "--json"))
    assert again == [], "fire times that have a run are left alone"
    too_long = cli(
        "backfill",
        "hourly",
        "--from",
        (hour - timedelta(days=20)).isoformat(),
        "--to",
        (hour - timedelta(days=1)).isoformat(),
    )
    assert too_long.exit_code == 2
    assert "backfill a shorter window" in too_long.stderr
    assert len(run_rows(store)) == 7


def assert_refused(cli: Cli, store: Store, args: list[str], *says: str) -> None:
    """Exit 2, one error line that says what to do, nothing written."""
    before = table_rows(store)
    result = cli(*args)
    assert result.exit_code == 2, result.output
    [line] = error_lines(result)
    assert all(words in line for words in says), line
    assert result.stdout == ""
    assert table_rows(store) == before


def test_backfill_refuses_fire_times_still_to_come(cli: Cli, store: Store) -> None:
    """Backfill refuses fire times still to come. Finding 5 of issue 15."""
    as_json(cli("add", "minutely", "tasks.demo.heartbeat", "--cron", "* * * * *", "--json"))
    now = store.now()
    window = ["--from", (now - timedelta(minutes=30)).isoformat()]
    future = [*window, "--to", (now + timedelta(minutes=30)).isoformat()]

    assert_refused(cli, store, ["backfill", "minutely", *future], "--to", "end the window at now")
    past = as_json(cli("backfill", "minutely", *window, "--to", now.isoformat(), "--json"))
    assert len(past) in (30, 31), "a window that has passed is backfilled"


def test_backfill_refuses_a_window_older_than_the_history_retention(cli: Cli, store: Store) -> None:
    """After retention deleted the runs of a window, backfill cannot tell they ran.
    Finding 11 of issue 15."""
    as_json(cli("add", "hourly", "tasks.demo.heartbeat", "--cron", "0 * * * *", "--json"))
    hour = store.now().replace(minute=0, second=0, microsecond=0) - timedelta(days=31)
    for ago in range(3):
        fire_at = hour + timedelta(hours=ago)
        age = (store.now() - fire_at).total_seconds()
        insert_run(store, schedule_name="hourly", fire_at=fire_at, finished_ago=age)
    assert store.prune(timedelta(days=30)).deleted == 3
    window = ["--from", hour.isoformat(), "--to", (hour + timedelta(hours=2)).isoformat()]

    assert_refused(cli, store, ["backfill", "hourly", *window], "--from", "history_retention_days")
    now = store.now()
    recent = ["--from", (now - timedelta(days=29)).isoformat(), "--to", now.isoformat()]
    assert len(as_json(cli("backfill", "hourly", *recent, "--limit", "1000", "--json"))) > 600


def test_a_changed_interval_first_fires_one_period_after_the_change_as_a_new_one_does(
    cli: Cli, store: Store
) -> None:
    as_json(cli("add", "tick", "tasks.demo.add", "--args", "[1, 2]", "--every", "60", "--json"))
    make_due(store, seconds_ago=120)  # no beat ran: its fire time has passed

    as_json(cli("update", "tick", "--every", "5m", "--json"))
    updated = schedule_row(store, "tick")
    as_json(cli("add", "new", "tasks.demo.add", "--args", "[1, 2]", "--every", "5m", "--json"))
    added = schedule_row(store, "new")

    assert updated.next_fire_at == updated.updated_at + timedelta(minutes=5)
    assert added.next_fire_at == added.created_at + timedelta(minutes=5)


def test_a_changed_interval_keeps_a_window_that_has_not_started(cli: Cli, store: Store) -> None:
    start = (store.now() + timedelta(days=2)).replace(microsecond=0)
    window = ["--start-at", start.isoformat(), "--every", "60", "--json"]
    as_json(cli("add", "later", "tasks.demo.add", "--args", "[1, 2]", *window))

    updated = as_json(cli("update", "later", "--every", "120", "--json"))

    assert updated["start_at"] == start.isoformat()
    assert updated["next_fire_at"] == start.isoformat(), "no fire time before start_at"
