"""The failing monitor from the command line, against real PostgreSQL: each schedule's
thresholds set by ``add`` and ``update`` (``default`` gives the cluster's back), refused
in one line with exit 2 when out of range, and ``schedules incidents`` listing what the
leader opened."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
import redis
from celery import Celery
from click.testing import Result
from sqlalchemy import insert

from app.factory import create_app
from beat.models import RunState
from beat.store.all_roles import Store
from beat.store.tables import runs
from tests.conftest import SessionEnv
from tests.integration.helpers import as_json, error_lines, invoke, table_rows

pytestmark = pytest.mark.integration

Cli = Callable[..., Result]


@pytest.fixture
def cli(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Cli:
    app: Celery = create_app(test_env.settings(lock_ttl=3.0, max_wait=0.2))
    return lambda *args: invoke(app, *args)


def test_thresholds_are_set_kept_and_given_back_to_the_cluster_s_default(cli: Cli) -> None:
    created = as_json(
        cli(
            "add", "nightly", "tasks.demo.heartbeat", "--cron", "0 3 * * *",
            "--alert-after-failures", "2", "--pause-after-failures", "5", "--json",
        )
    )  # fmt: skip
    assert (created["alert_after_failures"], created["pause_after_failures"]) == (2, 5)

    kept = as_json(cli("update", "nightly", "--cron", "0 4 * * *", "--json"))
    assert (kept["alert_after_failures"], kept["pause_after_failures"]) == (2, 5)

    reset = as_json(
        cli("update", "nightly", "--alert-after-failures", "default",
            "--pause-after-failures", "0", "--json")
    )  # fmt: skip
    assert (reset["alert_after_failures"], reset["pause_after_failures"]) == (None, 0)

    shown = cli("show", "nightly")
    rows = {line[:16].strip(): line[16:].strip() for line in shown.stdout.splitlines()}
    assert rows["alert after"] == "the cluster's default"
    assert rows["pause after"] == "never"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("101", "alert_after_failures must be from 0 (never) to 100 failures in a row, got 101"),
        ("-1", "alert_after_failures must be from 0 (never) to 100 failures in a row, got -1"),
        ("three", "'three' is not a number of failures: give 0 (never) to 100, or default"),
    ],
)
def test_a_threshold_out_of_range_is_refused_in_one_line_and_nothing_is_written(
    cli: Cli, store: Store, value: str, says: str
) -> None:
    before = table_rows(store)

    refused = cli("add", "bad", "tasks.demo.heartbeat", "--every", "60",
                  "--alert-after-failures", value)  # fmt: skip

    assert refused.exit_code == 2
    [line] = error_lines(refused)
    assert says in line
    assert table_rows(store) == before


def test_incidents_lists_the_open_ones_and_with_all_the_resolved_too(
    cli: Cli, store: Store
) -> None:
    as_json(cli("add", "flaky", "tasks.demo.heartbeat", "--every", "60", "--json"))
    as_json(cli("add", "fine", "tasks.demo.heartbeat", "--every", "60", "--json"))
    assert store.take_leadership(1, "leader")
    now = store.now()
    for name, states in (
        ("flaky", [RunState.FAILED] * 3),
        ("fine", [RunState.FAILED] * 3 + [RunState.SUCCEEDED]),
    ):
        schedule = store.get_schedule(name)
        with store.engine.begin() as conn:
            conn.execute(
                insert(runs),
                [
                    {
                        "id": uuid.uuid4(),
                        "schedule_id": schedule.id,
                        "schedule_name": name,
                        "task": "tasks.demo.heartbeat",
                        "state": state.value,
                        "fire_at": now.replace(microsecond=0).replace(second=index),
                        "finished_at": now,
                        "error": "RuntimeError: upstream down",
                    }
                    for index, state in enumerate(states)
                ],
            )
    assert cli("incidents").stdout.strip() == "no open incidents"
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)

    [listed] = as_json(cli("incidents", "--json"))
    text = cli("incidents").stdout

    assert (listed["schedule"], listed["kind"], listed["failures"], listed["open"]) == (
        "flaky", "failing", 3, True,
    )  # fmt: skip
    assert listed["last_error"] == "RuntimeError: upstream down"
    assert "flaky" in text
    assert "RuntimeError: upstream down" in text
    assert "fine" not in text
    assert as_json(cli("incidents", "--all", "--json")) == [listed]
