"""`celery -A app schedules audit` and `restore` against real PostgreSQL: a change made
with the CLI is recorded as the CLI's, with its user and host, and read back; an
earlier version comes back as a new change."""

from __future__ import annotations

import getpass
import socket

import pytest
import redis
from celery import Celery

from app.factory import create_app
from beat.store.all_roles import Store
from tests.conftest import SessionEnv
from tests.integration.helpers import as_json, celery_cli, error_lines, invoke, table_rows

pytestmark = pytest.mark.integration


@pytest.fixture
def app(test_env: SessionEnv, store: Store, redis_client: redis.Redis) -> Celery:
    return create_app(test_env.settings(lock_ttl=3.0, max_wait=0.2))


def test_changes_made_with_the_cli_are_listed_with_who_and_what(app: Celery) -> None:
    invoke(app, "add", "report", "tasks.demo.report", "--cron", "0 2 * * *")
    invoke(app, "update", "report", "--cron", "30 4 * * *")
    paused = invoke(app, "pause", "report", "--note", "moving the reports table")
    assert paused.exit_code == 0, paused.stderr

    listed = as_json(invoke(app, "audit", "report", "--json"))
    text = invoke(app, "audit", "report")

    assert [(c["version"], c["action"], c["entry"]) for c in listed] == [
        (3, "pause", "cli"),
        (2, "update", "cli"),
        (1, "create", "cli"),
    ]
    assert {(c["actor"], c["host"]) for c in listed} == {(getpass.getuser(), socket.gethostname())}
    assert listed[1]["changes"] == {"cron": {"before": "0 2 * * *", "after": "30 4 * * *"}}
    assert listed[0]["note"] == "moving the reports table"
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["WHEN", "(UTC)", "SCHEDULE", "VERSION", "ACTION", "BY", "WHAT"]
    assert 'cron: "0 2 * * *" -> "30 4 * * *"' in lines[2]
    assert "note: moving the reports table" in lines[1]
    shown = as_json(invoke(app, "show", "report", "--json"))
    assert shown["version"] == 3
    assert shown["disabled_reason"] == "moving the reports table"


def test_an_earlier_version_is_restored_from_the_cli(app: Celery) -> None:
    invoke(app, "add", "report", "tasks.demo.report", "--cron", "0 2 * * *")
    invoke(app, "update", "report", "--cron", "30 4 * * *")

    restored = invoke(app, "restore", "report", "--version", "1")

    assert restored.exit_code == 0, restored.stderr
    assert restored.stdout.startswith("restored report to version 1 (now version 3): next fire")
    assert as_json(invoke(app, "show", "report", "--json"))["schedule"] == "cron 0 2 * * *"
    [last, *_] = as_json(invoke(app, "audit", "report", "--json"))
    assert (last["action"], last["note"]) == ("restore", "to version 1")


def test_a_version_the_log_does_not_hold_is_refused_and_nothing_written(
    app: Celery, store: Store
) -> None:
    invoke(app, "add", "report", "tasks.demo.report", "--cron", "0 2 * * *")
    before = table_rows(store)

    missing = invoke(app, "restore", "report", "--version", "7")
    zero = invoke(app, "restore", "report", "--version", "0")

    assert missing.exit_code == 2
    assert error_lines(missing) == [
        "Error: no version 7 of schedule 'report' in the audit log:"
        " `celery -A app schedules audit report` lists the versions it keeps"
    ]
    assert zero.exit_code == 2
    assert table_rows(store) == before


def test_the_audit_command_is_registered_for_the_real_celery_command(
    test_env: SessionEnv, app: Celery
) -> None:
    invoke(app, "add", "report", "tasks.demo.report", "--every", "60")

    done = celery_cli(test_env, "audit", "--since", "1h")

    assert done.returncode == 0, done.stderr
    assert "report" in done.stdout
    assert "create" in done.stdout
