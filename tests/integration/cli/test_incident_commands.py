"""The failing monitor from the command line, against real PostgreSQL: each schedule's
thresholds set by ``add`` and ``update`` (``default`` gives the cluster's back), refused
in one line with exit 2 when out of range, and ``schedules incidents`` listing what the
leader opened."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import redis
from celery import Celery
from click.testing import Result
from sqlalchemy import text

from app.factory import create_app
from beat.models import RunState
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import as_json, error_lines, finished_runs, invoke, table_rows

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


def heartbeats_under_a_leader(cli: Cli, store: Store, *names: str) -> None:
    """Schedules ``names`` added by the command, and a leader (epoch 1) to watch them."""
    for name in names:
        as_json(cli("add", name, "tasks.demo.heartbeat", "--every", "60", "--json"))
    assert store.take_leadership(1, "leader")


def test_incidents_lists_the_open_ones_and_with_all_the_resolved_too(
    cli: Cli, store: Store
) -> None:
    heartbeats_under_a_leader(cli, store, "flaky", "fine")
    finished_runs(store, "flaky", [RunState.FAILED] * 3, error="RuntimeError: upstream down")
    finished_runs(
        store,
        "fine",
        [RunState.FAILED] * 3 + [RunState.SUCCEEDED],
        error="RuntimeError: upstream down",
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


def channel_rows(store: Store) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text("SELECT * FROM beat_channels"))]


def test_channels_are_added_listed_with_their_secrets_hidden_and_removed(
    cli: Cli, store: Store
) -> None:
    hook = cli(
        "channels", "add", "ops-hook", "--webhook", "https://hooks.example.com/habeat?token=s3cret"
    )
    slack = cli(
        "channels", "add", "ops-slack", "--slack", "https://hooks.slack.com/services/T0/B0/s3cret"
    )
    mail = cli(
        "channels", "add", "ops-mail", "--email", "smtps://beat:s3cret@mail.example.com",
        "--from", "beat@example.com", "--to", "ops@example.com", "--to", "oncall@example.com",
    )  # fmt: skip
    assert [hook.exit_code, slack.exit_code, mail.exit_code] == [0, 0, 0]
    assert hook.stdout.strip() == "added channel ops-hook (webhook)"

    listed = as_json(cli("channels", "list", "--json"))
    text_ = cli("channels", "list").stdout

    assert [(channel["name"], channel["kind"]) for channel in listed] == [
        ("ops-hook", "webhook"), ("ops-mail", "email"), ("ops-slack", "slack"),
    ]  # fmt: skip
    assert "s3cret" not in text_
    assert "s3cret" not in str(listed)
    assert "https://hooks.slack.com/***" in text_
    assert "oncall%40example.com" in text_

    assert cli("channels", "remove", "ops-hook").exit_code == 0
    assert [channel["name"] for channel in as_json(cli("channels", "list", "--json"))] == [
        "ops-mail", "ops-slack",
    ]  # fmt: skip
    gone = cli("channels", "remove", "ops-hook")
    assert gone.exit_code == 2
    assert "no channel named 'ops-hook'" in error_lines(gone)[0]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--webhook", "ftp://example.com/x"], "posts to an http(s) URL"),
        (["--slack", "https://hooks.slack.com:99999/x"], "port from 1 to 65535"),
        (["--email", "smtp://mail:0", "--from", "a@b.c", "--to", "d@e.f"], "port from 1"),
        (["--email", "smtp://mail", "--to", "d@e.f"], "one sender address"),
        (["--email", "smtp://mail", "--from", "a@b.c"], "recipient addresses"),
        (["--webhook", "https://a.example.com", "--slack", "https://b.example.com"], "give one of"),
        ([], "give one of --webhook URL, --slack URL or --email SMTP_URL"),
        (
            ["--webhook", "https://a.example.com", "--to", "d@e.f"],
            "--from and --to go with --email",
        ),
        (["--pager", "x"], "No such option '--pager'"),
    ],
)
def test_a_channel_that_cannot_be_used_is_refused_in_one_line_and_nothing_is_written(
    cli: Cli, store: Store, args: list[str], says: str
) -> None:
    refused = cli("channels", "add", "ops", *args)

    assert refused.exit_code == 2
    [line] = error_lines(refused)
    assert says in line
    assert channel_rows(store) == []


def test_a_channel_name_taken_is_refused(cli: Cli, store: Store) -> None:
    assert cli("channels", "add", "ops", "--webhook", "https://a.example.com/x").exit_code == 0
    before = channel_rows(store)
    again = cli("channels", "add", "ops", "--slack", "https://hooks.slack.com/services/x")
    assert again.exit_code == 2
    assert "a channel named ops exists already" in error_lines(again)[0]
    assert channel_rows(store) == before


def flaky_with_an_incident(cli: Cli, store: Store) -> None:
    """Schedules ``flaky`` and ``broken``; ``flaky`` failed 3 times: its incident is open."""
    heartbeats_under_a_leader(cli, store, "flaky", "broken")
    finished_runs(store, "flaky", [RunState.FAILED] * 3)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)


def test_health_lists_open_incidents_and_is_red_while_the_scheduler_paused_a_schedule(
    cli: Cli, store: Store
) -> None:
    flaky_with_an_incident(cli, store)

    # No lease is held here: health fails on its leader line; the incidents line is read.
    failing = json.loads(cli("health", "--json").stdout)["checks"]["incidents"]
    assert failing["ok"] is True
    assert (
        failing["detail"] == "still firing: flaky (failed 3 times in a row) (`schedules incidents`)"
    )

    as_json(cli("update", "broken", "--pause-after-failures", "3", "--json"))
    finished_runs(store, "broken", [RunState.FAILED] * 3)
    store.watch_failures(1, alert_after=3, pause_after=0, idle_timeout=5)
    paused = cli("health", "--json")

    incident = json.loads(paused.stdout)["checks"]["incidents"]
    assert incident["ok"] is False
    assert incident["detail"].startswith(
        "paused by the scheduler after failures in a row: broken (failed 3 times in a row);"
        " fix each"
    )


def test_health_fails_on_the_incident_kinds_asked_and_refuses_an_unknown_one(
    cli: Cli, store: Store
) -> None:
    flaky_with_an_incident(cli, store)

    asked = cli("health", "--json", "--fail-on-incidents", "overran,failing")
    incident = json.loads(asked.stdout)["checks"]["incidents"]
    assert incident == {
        "ok": False,
        "detail": "flaky (failed 3 times in a row) (`schedules incidents`)",
    }
    assert asked.exit_code == 1

    unknown = cli("health", "--fail-on-incidents", "overran,stalled")
    assert unknown.exit_code == 2
    assert (
        "'stalled' is not an incident kind: give some of failing, overran, late, missed"
        in (error_lines(unknown)[0])
    )
