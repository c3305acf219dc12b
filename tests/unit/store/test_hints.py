"""The fix named when PostgreSQL cannot be used names the real cause and the setting."""

from __future__ import annotations

import psycopg

from beat.store.db import unreachable

URL = "postgresql+psycopg://app:***@db:5432/habeat"


def test_a_refused_login_names_the_credentials_not_starting_a_server() -> None:
    error = psycopg.OperationalError(
        'connection failed: connection to server at "10.0.0.5", port 5432 failed:'
        ' FATAL:  password authentication failed for user "app"'
    )
    message = unreachable(URL, error, "DATABASE_URL")
    assert "authentication failed, check the user and password in DATABASE_URL" in message
    assert "docker compose" not in message


def test_an_unknown_role_is_a_refused_login_too() -> None:
    error = psycopg.OperationalError('FATAL:  role "nosuch" does not exist')
    assert "check the user and password in habeat_database_url" in unreachable(
        URL, error, "habeat_database_url"
    )


def test_a_server_that_does_not_answer_is_to_be_started_or_the_setting_checked() -> None:
    error = psycopg.OperationalError(
        'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused'
    )
    message = unreachable(URL, error, "HABEAT_DATABASE_URL")
    assert "start it (`docker compose up -d postgres`) or check HABEAT_DATABASE_URL" in message
